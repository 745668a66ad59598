"""Makes a small, randomly initialized Llama from transformers (no weights downloaded) use
ropejit for RoPE, and checks its logits against the same model unpatched. Needs a CUDA GPU,
torch and transformers; without a GPU it says so and exits 0.

    python examples/patch_llama.py [--dtype float32|bfloat16] [--tokens N]
"""

import argparse
import sys

import torch

import ropejit.nn
from ropejit.dropin import hf


def small_llama(dtype, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=1024, rope_theta=500000.0)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def compare(dtype=torch.float32, device="cuda", batch=2, tokens=48):
    """(max |patched - unpatched| of the logits, max |unpatched|, ropejit calls per forward)."""
    from transformers.models.llama import modeling_llama

    model = small_llama(dtype, device)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=device)
    with torch.no_grad():
        expected = model(ids).logits.float()
    original = modeling_llama.apply_rotary_pos_emb
    calls = []
    try:
        replaced = ropejit.nn.patch_hf_model(model)
        assert replaced, "the model has no rotary_emb module to replace"
        patched = modeling_llama.apply_rotary_pos_emb
        assert patched is hf.apply_rotary_pos_emb

        def counted(*args, **kwargs):
            calls.append(1)
            return patched(*args, **kwargs)

        modeling_llama.apply_rotary_pos_emb = counted
        with torch.no_grad():
            got = model(ids).logits.float()
    finally:
        modeling_llama.apply_rotary_pos_emb = original
    return (got - expected).abs().max().item(), expected.abs().max().item(), len(calls)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("patch_llama: SKIPPED: no CUDA GPU visible to torch")
        return 0
    dtype = getattr(torch, args.dtype)
    diff, scale, calls = compare(dtype, tokens=args.tokens)
    # fp32: ropejit's float64-built tables against transformers' fp32 angles; bf16: one
    # rounding of q/k differs from transformers' bf16 products, and the layers carry it on.
    limit = {torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype] * max(scale, 1.0)
    print(f"patch_llama: {calls} ropejit calls per forward; max |logits - unpatched| = "
          f"{diff:.3g} (max |logits| {scale:.3g}, limit {limit:.3g})")
    if calls != 2 or not diff <= limit:
        print("patch_llama: FAILED")
        return 1
    print("patch_llama: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
