"""Makes a small, randomly initialized Llama from transformers (no weights downloaded) use
ropejit for RoPE, and checks its logits against the same model unpatched. --rope picks the
config's RoPE: default, or a scaled variant (llama3: Llama 3.1's; yarn; longrope; dynamic NTK),
which ropejit reads from the config with its own reader and computes in the kernel. Needs a
CUDA GPU, torch and transformers; without a GPU it says so and exits 0.

    python examples/patch_llama.py [--dtype float32|bfloat16] [--tokens N] [--rope NAME]
"""

import argparse
import sys

import torch

import ropejit.nn
from ropejit.dropin import hf

HEAD_DIM = 32  # hidden_size 256 over 8 heads: 16 rotary pairs
# rope_scaling of each --rope choice. The trained lengths are shorter than the 48 tokens run by
# default, so that every variant's scaling is in play: llama3 and yarn interpolate the slow
# pairs at any length, longrope takes its long factors beyond 32 positions, dynamic NTK
# rescales its base beyond max_position_embeddings (it has no trained length of its own).
ROPES = {
    "default": (None, 1024),
    "llama3": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 256}, 1024),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}, 1024),
    "longrope": ({"rope_type": "longrope", "original_max_position_embeddings": 32, "factor": 32.0,
                  "short_factor": [1.0 + 0.02 * i for i in range(HEAD_DIM // 2)],
                  "long_factor": [1.0 + 0.6 * i for i in range(HEAD_DIM // 2)]}, 1024),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, 32),
}


def small_llama(dtype, device, rope="default"):
    from transformers import LlamaConfig, LlamaForCausalLM

    scaling, max_positions = ROPES[rope]
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=max_positions, rope_theta=500000.0,
                         rope_scaling=scaling)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()


def compare(dtype=torch.float32, device="cuda", batch=2, tokens=48, rope="default"):
    """(max |patched - unpatched| of the logits, max |unpatched|, ropejit calls per forward)."""
    from transformers.models.llama import modeling_llama

    model = small_llama(dtype, device, rope)
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=device)
    with torch.no_grad():
        expected = model(ids).logits.float()
    original = modeling_llama.apply_rotary_pos_emb
    calls = []
    try:
        replaced = ropejit.nn.patch_hf_model(model).rotary
        assert replaced, "the model has no rotary_emb module to replace"
        want = "computed" if rope == "default" else "dynamic_ntk" if rope == "dynamic" else rope
        assert model.model.rotary_emb.freqs == want, model.model.rotary_emb
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


def limit(dtype, scale):
    # fp32: ropejit's cos/sin (within 2.5e-7 of float64) against transformers' fp32 angles;
    # bf16: one rounding of q/k differs from transformers' bf16 products, and the layers carry
    # it on.
    return {torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype] * max(scale, 1.0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rope", default="default", choices=list(ROPES))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("patch_llama: SKIPPED: no CUDA GPU visible to torch")
        return 0
    dtype = getattr(torch, args.dtype)
    diff, scale, calls = compare(dtype, tokens=args.tokens, rope=args.rope)
    bound = limit(dtype, scale)
    print(f"patch_llama ({args.rope} RoPE): {calls} ropejit calls per forward; max |logits - "
          f"unpatched| = {diff:.3g} (max |logits| {scale:.3g}, limit {bound:.3g})")
    if calls != 2 or not diff <= bound:
        print("patch_llama: FAILED")
        return 1
    print("patch_llama: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
