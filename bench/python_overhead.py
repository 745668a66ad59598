"""Host cost of one ropejit call from Python, per entry point, next to the C++ call's (Google
Benchmark's host/apply_cached and host/bare_launch rows, when --bench names ropejit_bench):
the decode shape of those rows (64 tokens, 32 + 8 heads of 128, bf16, int64 position ids, fp32
half-width table; the llama3 rows compute Llama 3.1's frequencies in the kernel instead). Wall
time per call with the launch queue drained every 256 calls, median
of --reps rounds; the kernels themselves take a few microseconds of GPU time, so the host is
what is measured once it is slower than they are.

    python3 bench/python_overhead.py [--bench build-gpu/bench/ropejit_bench] [--out overhead.json]
    (a build tree without `pip install`: ROPEJIT_LIB=BUILD/libropejit.so PYTHONPATH=python)
"""

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time

import torch

import ropejit
from ropejit import _call, _capi, _tensors, ops
from ropejit.dropin import hf, vllm
from ropejit.nn import RotaryEmbedding

CALLS = 256


def per_call_us(fn, reps):
    for _ in range(CALLS):  # warm: compiled, loaded, caches filled
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - t0) / CALLS * 1e6)
    return statistics.median(rounds)


def cases():
    dev = "cuda"
    q = torch.randn(1, 64, 32, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 64, 8, 128, device=dev, dtype=torch.bfloat16)
    angles = torch.arange(8192, dtype=torch.float64, device=dev)[:, None] * 10000.0 ** (
        -torch.arange(0, 128, 2, dtype=torch.float64, device=dev) / 128)
    cos, sin = angles.cos().float(), angles.sin().float()
    ids = torch.randint(0, 8192, (64,), device=dev)
    kw = dict(cos=cos, sin=sin, position_ids=ids)
    # The C call alone: structs planned once, only ropejit_apply per call (the binding's floor).
    view = _tensors.from_torch
    spec, args = _call.plan(view("q", q), view("k", k), cos=view("cos", cos),
                            sin=view("sin", sin), position_ids=view("position_ids", ids))
    args.stream = torch.cuda.current_stream().cuda_stream
    spec_ref, args_ref = ctypes.byref(spec), ctypes.byref(args)
    apply_c = _capi.lib.ropejit_apply
    hf_q, hf_k = q.transpose(1, 2), k.transpose(1, 2)  # [b, h, s, d] views
    cos_full = torch.cat((cos, cos), -1)[ids][None].to(torch.bfloat16)
    sin_full = torch.cat((sin, sin), -1)[ids][None].to(torch.bfloat16)
    cache = torch.cat((cos, sin), -1).to(torch.bfloat16)
    q2d, k2d = q.view(64, -1), k.view(64, -1)
    x = torch.empty(1 << 16, device=dev)
    llama3 = ropejit.Scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_positions=8192)
    kw3 = dict(base=500000.0, freqs="llama3", scaling=llama3, position_ids=ids)
    rope = RotaryEmbedding(128, base=500000.0, max_position_embeddings=131072,
                           scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 4.0,
                                    "original_max_position_embeddings": 8192})
    return {
        "c_api (ctypes, structs prebuilt)": lambda: apply_c(spec_ref, args_ref),
        "ropejit.apply (torch tensors)": lambda: ropejit.apply(q, k, **kw),
        "ropejit.ops.rope_ (torch op, in place)": lambda: ops.rope_(q, k, **kw),
        "ropejit.ops.rope (torch op, new outputs)": lambda: ops.rope(q, k, **kw),
        "ropejit.ops.rope_ (llama3 computed in the kernel)": lambda: ops.rope_(q, k, **kw3),
        "nn.RotaryEmbedding.apply (llama3, new outputs)": lambda: rope.apply(q, k, ids,
                                                                             layout="bshd"),
        "dropin.vllm.rotary_embedding": lambda: vllm.rotary_embedding(ids, q2d, k2d, 128, cache,
                                                                      True),
        "dropin.hf.apply_rotary_pos_emb": lambda: hf.apply_rotary_pos_emb(hf_q, hf_k, cos_full,
                                                                          sin_full),
        "torch: x.add_(1) (one eager launch)": lambda: x.add_(1),
    }


def cpp_rows(bench):
    """host/* rows of ropejit_bench, µs per call."""
    out = subprocess.run([bench, "--benchmark_filter=^host/", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)["benchmarks"]
    return {f"C++ {r['name']}": r["real_time"] / (1e3 if r["time_unit"] == "ns" else 1)
            for r in rows if r["time_unit"] in ("ns", "us")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", help="ropejit_bench binary, for the C++ host/ rows")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", help="JSON output path")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("python_overhead: no CUDA device visible to torch; nothing to measure")
    rows = {name: per_call_us(fn, args.reps) for name, fn in cases().items()}
    if args.bench:
        rows.update(cpp_rows(args.bench))
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, ropejit "
          f"{ropejit.__version__}: host µs per call, decode 64 tokens, 32 + 8 heads, bf16\n")
    print("| entry point | µs per call |\n|---|---|")
    for name, us in rows.items():
        print(f"| {name} | {us:.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "ropejit": ropejit.__version__, "us_per_call": rows}, f, indent=2)


if __name__ == "__main__":
    main()
