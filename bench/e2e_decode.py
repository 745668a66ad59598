"""End to end: ms per generated token of a transformers model with random weights, unpatched,
with ropejit's RoPE only (patch_hf_model(fuse="rope")) and with the decode block
(fuse="all"), in eager mode and with a static cache under transformers' automatic
torch.compile; the weight-read floor from a same-run device copy; a torch.profiler breakdown
of one patched decode step. One JSON line per row (and a table) on stdout.

    python3 bench/e2e_decode.py --model llama3-8b --layers 8 --batch 1 --prompt 128 --new 64 \\
        --modes eager,compile

Run from the repository with the package importable (PYTHONPATH=python and ROPEJIT_LIB, or an
installed ropejit)."""

import argparse
import json
import time

import torch

import ropejit

CONFIGS = {
    # Llama-3-8B's shapes (config.json of meta-llama/Meta-Llama-3.1-8B).
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=128, max_position_embeddings=131072, rope_theta=500000.0,
                      rms_norm_eps=1e-5, tie_word_embeddings=False,
                      rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192}),
}


def build(name, layers):
    from transformers import LlamaConfig, LlamaForCausalLM
    fields = dict(CONFIGS[name])
    if layers:
        fields["num_hidden_layers"] = layers
    config = LlamaConfig(**fields)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    keep_float32_rope(model)
    return model.eval()


def keep_float32_rope(model):
    """As from_pretrained leaves it: the rotary module's inverse frequencies in float32
    (model.to(bfloat16) rounds them to bf16)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    rotary = model.model.rotary_emb
    init = (rotary.compute_default_rope_parameters if rotary.rope_type == "default"
            else ROPE_INIT_FUNCTIONS[rotary.rope_type])
    inv_freq, _ = init(rotary.config, rotary.inv_freq.device)
    rotary.inv_freq = inv_freq.float()
    rotary.original_inv_freq = inv_freq.float().clone()


def copy_gbps():
    """Device-to-device copy of 1 GiB: bytes read + written per second, median of 20."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    times = []
    for _ in range(22):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    del a, b
    return 2 * (1 << 30) / times[len(times) // 2] / 1e9


def weight_bytes(model):
    """Bytes read per decode step: every parameter but the embedding table (one row is read)."""
    embed = model.model.embed_tokens.weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)


def ms_per_token(model, batch, prompt, new, static, repeats=3):
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(0))
    kwargs = dict(do_sample=False, cache_implementation="static" if static else None,
                  pad_token_id=0)

    def run(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kwargs)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(new)  # warm-up: compiles (static cache) and loads every kernel
    run(new)
    rows = []
    for _ in range(repeats):
        rows.append((run(new) - run(1)) / (new - 1) * 1e3)
    rows.sort()
    return rows[len(rows) // 2]


def profile(model, batch, prompt):
    """The share of CUDA time per op over one eager decode step (after a prefill)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    with torch.no_grad():
        out = model(ids, use_cache=True)
        step = out.logits[:, -1:].argmax(-1)
        cache = out.past_key_values
        model(step, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(step, past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
    events = prof.key_averages()
    total = sum(e.device_time_total for e in events if e.device_time_total > 0) or 1
    top = sorted(events, key=lambda e: -e.device_time_total)[:12]
    return [(e.key[:70], round(e.device_time_total / total, 4), round(e.device_time_total, 1))
            for e in top if e.device_time_total > 0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(CONFIGS))
    parser.add_argument("--layers", type=int, default=8, help="decoder layers (0: all)")
    parser.add_argument("--batch", default="1", help="comma-separated batch sizes")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--modes", default="eager,compile", help="eager and/or compile")
    parser.add_argument("--patches", default="none,rope,all",
                        help="none (transformers), rope (fuse='rope'), all (fuse='all'), in order")
    parser.add_argument("--profile", action="store_true", help="a patched decode step's ops")
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name()
    model = build(args.model, args.layers)
    gbps = copy_gbps()
    floor_ms = weight_bytes(model) / (gbps * 1e9) * 1e3
    print(json.dumps(dict(gpu=gpu, model=args.model, layers=model.config.num_hidden_layers,
                          weight_gb=round(weight_bytes(model) / 1e9, 3),
                          copy_gbps=round(gbps, 1), floor_ms=round(floor_ms, 3))), flush=True)
    modes = args.modes.split(",")
    batches = [int(b) for b in args.batch.split(",")]
    results = []
    for patch in args.patches.split(","):
        if patch != "none":
            report = ropejit.nn.patch_hf_model(model, fuse=patch)
            if patch == "all" and report.not_fused:
                print(json.dumps(dict(not_fused=report.not_fused)), flush=True)
        for mode in modes:
            for batch in batches:
                ms = ms_per_token(model, batch, args.prompt, args.new, mode == "compile")
                row = dict(patch=patch, mode=mode, batch=batch, prompt=args.prompt,
                           ms_per_token=round(ms, 3), tokens_per_s=round(batch * 1e3 / ms, 1),
                           x_floor=round(ms / floor_ms, 2))
                results.append(row)
                print(json.dumps(row), flush=True)
        torch._dynamo.reset()
    if args.profile:
        for name, share, us in profile(model, batches[0], args.prompt):
            print(json.dumps(dict(op=name, share=share, cuda_us=us)), flush=True)
    print(f"\n{gpu}, {args.model} with {model.config.num_hidden_layers} layers, prompt "
          f"{args.prompt}, {args.new} new tokens; floor {floor_ms:.2f} ms "
          f"({weight_bytes(model) / 1e9:.2f} GB at {gbps:.0f} GB/s)")
    print("| patch | mode | batch | ms/token | × floor |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['patch']} | {r['mode']} | {r['batch']} | {r['ms_per_token']} | "
              f"{r['x_floor']} |")


if __name__ == "__main__":
    main()
