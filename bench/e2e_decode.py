"""End to end: ms per generated token of a transformers model with random weights, unpatched,
with ropejit's RoPE only (patch_hf_model(fuse="rope")) and with the decode block
(fuse="all"), in eager mode and with a static cache under transformers' automatic
torch.compile. A token's time is the median wall interval between generate()'s decode steps;
beside it the device time of a step (torch.profiler: a generate() less its prefill alone), the
weight-read floor from a same-run device copy, and with --profile N the step's N costliest
kernels. One JSON line per row (and a table) on stdout.

    python3 bench/e2e_decode.py --model llama3-8b --batch 1,8,32 --prompt 128 --new 64

(all layers by default; --layers 8 for a quick look). Each patch is timed in a fresh process
(a row timed after another patch's ran slower), and its device times come from one more,
since torch.profiler slows every later launch of the process it ran in; --gaps N adds where the
GPU sat idle between a step's kernels (the host's pace). --host-profile N lists
where the host's time per step goes (cProfile), --patches all:sync the fused model without the
deferred stop check.

Run from the repository with the package importable (PYTHONPATH=python and ROPEJIT_LIB, or an
installed ropejit)."""

import argparse
import json
import subprocess
import sys
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
    # Qwen2.5-7B's shapes (config.json of Qwen/Qwen2.5-7B-Instruct): q/k/v biases.
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=False),
    # Qwen3-8B's shapes (config.json of Qwen/Qwen3-8B): QK-norm, no RoPE scaling.
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, max_position_embeddings=40960, rope_theta=1000000.0,
                     rms_norm_eps=1e-6, tie_word_embeddings=False),
}


def build(name, layers, device="cuda"):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config
    fields = dict(CONFIGS[name])
    if layers:
        fields["num_hidden_layers"] = layers
    kind = Qwen3Config if name.startswith("qwen3") else Qwen2Config if name.startswith(
        "qwen2") else LlamaConfig
    config = kind(**fields)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    if device == "meta":  # shapes only: the floor's byte count
        return model
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


class _StepClock:
    """A stopping criterion that never stops generation and notes the time of each call: one call
    per generated token, so the intervals are the decode steps' wall time (generate waits for
    each step's tokens before the next). The answer is one preallocated tensor: no launch."""

    def __init__(self, batch):
        self.times = []
        self.never = torch.zeros(batch, dtype=torch.bool, device="cuda")

    def __call__(self, input_ids, scores, **kwargs):
        self.times.append(time.perf_counter())
        return self.never


def _generate(model, ids, new, static, clock=None):
    from transformers import StoppingCriteriaList
    kwargs = dict(do_sample=False, cache_implementation="static" if static else None,
                  pad_token_id=0)
    if clock is not None:
        kwargs["stopping_criteria"] = StoppingCriteriaList([clock])
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kwargs)
    torch.cuda.synchronize()


def _prompt(model, batch, prompt):
    return torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda",
                         generator=torch.Generator("cuda").manual_seed(0))


def ms_per_token(model, batch, prompt, new, static, repeats=3):
    """Median wall time of a decode step inside generate(), over `repeats` runs of `new` tokens
    after two warm-up runs (compilation, CUDA-graph recording, kernel loads); the first two
    steps of each run are left out."""
    ids = _prompt(model, batch, prompt)
    _generate(model, ids, new, static)
    _generate(model, ids, new, static)
    steps = []
    for _ in range(repeats):
        clock = _StepClock(batch)
        _generate(model, ids, new, static, clock)
        steps += [b - a for a, b in zip(clock.times[2:], clock.times[3:])]
    steps.sort()
    return steps[len(steps) // 2] * 1e3


def host_profile(model, batch, prompt, new, static, top):
    """cProfile of one generate() after the warm-ups of ms_per_token: the `top` functions by own
    and by cumulative time, [("own" | "cumulative", function, ms per decode step, calls per
    step)], to tell where the host's share of a step goes."""
    import cProfile
    import pstats
    ids = _prompt(model, batch, prompt)
    profiler = cProfile.Profile()
    profiler.enable()
    _generate(model, ids, new, static)
    profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = []
    for kind, index in (("own", 2), ("cumulative", 3)):  # pstats: (cc, nc, tt, ct, callers)
        for func, entry in sorted(stats.items(), key=lambda item: -item[1][index])[:top]:
            rows.append((kind, pstats.func_std_string(func), round(entry[index] / new * 1e3, 3),
                         round(entry[1] / new, 1)))
    return rows


def _kernel_times(model, ids, new, static, gaps=0):
    """({kernel name: (device µs, launches)}, idle_gaps with `gaps` pairs or {} for 0) over one
    generate() of `new` tokens."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        _generate(model, ids, new, static)
    times = {e.key: (e.self_device_time_total, e.count) for e in prof.key_averages()
             if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0}
    return times, (idle_gaps(prof, new, gaps) if gaps else {})


def idle_gaps(prof, new, top):
    """Where the device sat idle over the last 80% of the run's kernel span (decode steps only
    while the prefill takes less than a fifth of the run, as at short prompts): the idle share,
    the idle µs per step, and the `top` kernel pairs (the one before → the one after a gap) by
    idle µs per step. Idle time is what the host's pace, or a wait on the host, leaves between
    kernels (one stream: the kernels never overlap)."""
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                     if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e)
    if len(kernels) < 2:
        return {}
    begin = kernels[0][0] + 0.2 * (kernels[-1][1] - kernels[0][0])
    window = [k for k in kernels if k[0] >= begin]
    span = window[-1][1] - window[0][0]
    steps = 0.8 * max(new - 1, 1)
    pairs, idle, end = {}, 0.0, window[0][1]
    for (start, stop, name), (_, _, before) in zip(window[1:], window):
        if start > end:
            idle += start - end
            key = f"{before[:50]} -> {name[:50]}"
            pairs[key] = pairs.get(key, 0.0) + start - end
        end = max(end, stop)
    return dict(idle_share=round(idle / span, 3), idle_us_per_step=round(idle / steps, 1),
                top_gaps=[(k, round(v / steps, 1)) for k, v in
                          sorted(pairs.items(), key=lambda kv: -kv[1])[:top]])


def decode_kernels(model, batch, prompt, new, static, gaps=0):
    """(Device time per decode step and its kernels, [(name, µs per step, launches per step)],
    idle_gaps of the full call or {}) from two profiled generate() calls after ms_per_token's
    warm-ups: `new` tokens less one token (the prefill alone). The second call changes a static
    cache's length: run after the timings."""
    ids = _prompt(model, batch, prompt)
    for _ in range(2):  # as ms_per_token: compilation, CUDA-graph recording, kernel loads
        _generate(model, ids, new, static)
    full, idle = _kernel_times(model, ids, new, static, gaps)
    prefill, _ = _kernel_times(model, ids, 1, static)
    rows = []
    for name, (us, count) in full.items():
        base_us, base_count = prefill.get(name, (0.0, 0))
        if us - base_us > 0:
            rows.append((name, (us - base_us) / (new - 1), (count - base_count) / (new - 1)))
    rows.sort(key=lambda r: -r[1])
    return rows, idle


def _rows(model, args, measure):
    """measure(patch, mode, batch) for every row of `model` patched as --patches says (one
    patch: each runs in its own process)."""
    rows = []
    patch = args.patches
    fuse, _, stop = patch.partition(":")
    if fuse != "none":
        report = ropejit.nn.patch_hf_model(model, fuse=fuse)
        if fuse == "all" and report.not_fused:
            print(json.dumps(dict(not_fused=report.not_fused)), file=sys.stderr, flush=True)
    if stop:
        ropejit.nn.defer_stop(model, stop == "defer")
    for mode in args.modes.split(","):
        for batch in (int(b) for b in args.batch.split(",")):
            rows.append(dict(patch=patch, mode=mode, batch=batch, prompt=args.prompt,
                             **measure(patch, mode, batch)))
    return rows


def _children(argv, patches, kind):
    """The rows of every patch, each from a fresh process (`kind`: "timed" or "device"): rows
    measured in one process after another patch's ran slower there, and torch.profiler leaves
    CUPTI's callbacks in place, which slows every later launch of the process it ran in."""
    rows = []
    for patch in patches:
        child = subprocess.run([sys.executable, __file__, *argv, "--patches", patch, "--child",
                                kind], stdout=subprocess.PIPE, text=True, check=True)
        for line in child.stdout.splitlines():
            if line.startswith("{"):
                rows.append(json.loads(line))
                if kind == "timed":
                    print(line, flush=True)
    return rows


def _device_rows(argv, patches, floor_ms, top):
    """The device time per step of every row (see _children)."""
    rows = {}
    for row in _children(argv, patches, "device"):
        kernels = row.pop("kernels")
        gpu_ms = sum(k[1] for k in kernels) / 1e3
        row.update(gpu_ms=round(gpu_ms, 3), gpu_x_floor=round(gpu_ms / floor_ms, 2),
                   launches=round(sum(k[2] for k in kernels), 1))
        if top:
            row["kernels"] = [(name[:60], round(us, 1), round(n, 2))
                              for name, us, n in kernels[:top]]
        row.update(row.pop("idle", {}))
        rows[(row["patch"], row["mode"], row["batch"])] = row
    return rows


def _child_argv(argv):
    """argv less --patches and its value (the parent names one patch per child)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--patches":
            skip = True
        elif not arg.startswith("--patches="):
            out.append(arg)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama3-8b", choices=sorted(CONFIGS))
    parser.add_argument("--layers", type=int, default=0, help="decoder layers (0: all)")
    parser.add_argument("--batch", default="1,8,32", help="comma-separated batch sizes")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--modes", default="eager,compile", help="eager and/or compile")
    parser.add_argument("--patches", default="none,rope,all",
                        help="none (transformers), rope (fuse='rope'), all (fuse='all'), each in "
                        "a fresh process; a suffix :defer or :sync turns generate()'s deferred "
                        "stop check on or off (patch_hf_model's default: on for all)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="list each row's N costliest kernels per decode step")
    parser.add_argument("--host-profile", type=int, default=0, metavar="N",
                        help="list each row's N functions of most own host time per step "
                        "(cProfile, after the timing)")
    parser.add_argument("--gaps", type=int, default=0, metavar="N",
                        help="with the device time: where the GPU sat idle in a step, and the "
                        "N kernel pairs around the most idle time (short prompts)")
    parser.add_argument("--no-device-time", action="store_true",
                        help="skip the profiled second process (device time per step)")
    parser.add_argument("--child", choices=("timed", "device"), help=argparse.SUPPRESS)
    parser.add_argument("--floor-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    patches = args.patches.split(",")
    for patch in patches:
        fuse, _, stop = patch.partition(":")
        if fuse not in ("none", "rope", "all") or stop not in ("", "defer", "sync"):
            parser.error(f"--patches: {patch!r} is not none, rope or all with an optional :defer "
                         f"or :sync")
    if args.child:
        _child(args)
        return
    gpu = torch.cuda.get_device_name()
    gbps = copy_gbps()
    shapes = build(args.model, args.layers, device="meta")
    weights_gb = weight_bytes(shapes) / 1e9
    floor_ms = weights_gb / gbps * 1e3
    layers = shapes.config.num_hidden_layers
    del shapes
    print(json.dumps(dict(gpu=gpu, model=args.model, layers=layers,
                          weight_gb=round(weights_gb, 3), copy_gbps=round(gbps, 1),
                          floor_ms=round(floor_ms, 3))), flush=True)
    argv = _child_argv(sys.argv[1:]) + ["--floor-ms", str(floor_ms)]
    results = _children(argv, patches, "timed")
    if not args.no_device_time:
        device = _device_rows(argv, patches, floor_ms, args.profile)
        for r in results:
            r.update(device.get((r["patch"], r["mode"], r["batch"]), {}))
            print(json.dumps(r), flush=True)
    print(f"\n{gpu}, {args.model} with {layers} layers, prompt {args.prompt}, {args.new} new "
          f"tokens; floor {floor_ms:.2f} ms ({weights_gb:.2f} GB at {gbps:.0f} GB/s)")
    print("| patch | mode | batch | ms/token | tokens/s | × floor | GPU ms/step | GPU × floor |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['patch']} | {r['mode']} | {r['batch']} | {r['ms_per_token']} | "
              f"{r['tokens_per_s']} | {r['x_floor']} | {r.get('gpu_ms', '')} | "
              f"{r.get('gpu_x_floor', '')} |")


def _child(args):
    """One patch's rows, one JSON line each: timed (--child timed) or its kernels per step
    (--child device)."""
    model = build(args.model, args.layers)
    if args.child == "device":
        def device(patch, mode, batch):
            kernels, idle = decode_kernels(model, batch, args.prompt, args.new,
                                           mode == "compile", args.gaps)
            return dict(kernels=kernels, idle=idle)

        for row in _rows(model, args, device):
            print(json.dumps(row), flush=True)
        return
    floor_ms = args.floor_ms

    def timed(patch, mode, batch):
        ms = ms_per_token(model, batch, args.prompt, args.new, mode == "compile")
        row = dict(ms_per_token=round(ms, 3), tokens_per_s=round(batch * 1e3 / ms, 1),
                   x_floor=round(ms / floor_ms, 2))
        if args.host_profile:
            for kind, func, ms_step, calls in host_profile(
                    model, batch, args.prompt, args.new, mode == "compile", args.host_profile):
                print(f"  host {patch} {mode} b{batch} {kind}: {ms_step:8.3f} ms {calls:7.1f}x "
                      f"{func}", file=sys.stderr, flush=True)
        print(json.dumps(dict(patch=patch, mode=mode, batch=batch, prompt=args.prompt, **row)),
              flush=True)
        return row

    _rows(model, args, timed)


if __name__ == "__main__":
    main()
