"""Drop-in replacements for the RoPE functions of other libraries, same signatures and
semantics, running ropejit's kernels (through ropejit.ops, so differentiable, traceable by
torch.compile and capturable in CUDA graphs):

    ropejit.dropin.hf.apply_rotary_pos_emb            transformers' modeling_llama (and kin)
    ropejit.dropin.flash_attn.apply_rotary_emb        flash_attn.layers.rotary
    ropejit.dropin.vllm.rotary_embedding              vllm._custom_ops
    ropejit.dropin.transformer_engine.apply_rotary_pos_emb   transformer_engine.pytorch
    ropejit.dropin.liger.liger_rotary_pos_emb         liger_kernel.transformers.rope

The MLA ones run ropejit.mla.prepare (one launch each, capturable in CUDA graphs; a compiled
graph calls them with a graph break):

    ropejit.dropin.vllm.concat_and_cache_mla, concat_and_cache_mla_rope_fused
    ropejit.dropin.flashinfer.mla_rope_quantize_fp8   flashinfer.rope (MLA, FP8; with
        rope_quantize_fp8 and rope_quantize_fp8_append_paged_kv_cache in their MLA form)

What differs everywhere: ropejit computes in fp32 and rounds once to the output dtype, so
bf16/fp16 results can differ from a peer that computes in the activation dtype by one ulp,
while being closer to the exact (float64) value. Each module's docstring lists its own
differences."""
