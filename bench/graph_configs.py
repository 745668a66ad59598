#!/usr/bin/env python3
"""Decode under CUDA graph replay with forced launch configurations.

The tuner times candidates with CUDA events on a flushed L2; decode in a server runs under
graph replay with q, k and the table in L2. This writes one tuning file per configuration
(the llama key at 1, 64 and 256 tokens, 32q/8kv) with the fingerprint of an existing tuning
file of the same GPU, then runs ropejit_bench's graph rows with each, in frozen mode, twice.
--fused does the same for the fused Qwen3-style step (the bf16 `fused/qwen3_bf16_t*` rows: packed
QKV, per-head RMSNorm, RoPE, k and v appended to a paged cache; 32q/8kv/8v heads).

    python3 bench/graph_configs.py --like bench/tuning_h200.json --bench build-gpu/bench/ropejit_bench
    python3 bench/graph_configs.py --fused --like bench/tuning_h100.json
"""
import argparse
import json
import os
import subprocess
import tempfile

KEY = "rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip"
# name: (vec, heads per thread, max threads, rows, tokens per block, head groups)
CONFIGS = {
    "v8h2t512_r20_z1 (two-head kernel)": (8, 2, 512, 20, 1, 1),
    "v8h1t512_r40_z1 (one block per token)": (8, 1, 512, 40, 1, 1),
    "v4h1t1024_r40_z1": (4, 1, 1024, 40, 1, 1),
    "v8h1t512_r20_z1_y2": (8, 1, 512, 20, 1, 2),
    "v8h1t512_r10_z1_y4": (8, 1, 512, 10, 1, 4),
    "v8h1t512_r8_z1_y5": (8, 1, 512, 8, 1, 5),
    "v8h1t512_r4_z1_y10": (8, 1, 512, 4, 1, 10),
    "v8h2t512_r4_z1_y5": (8, 2, 512, 4, 1, 5),
    "v8h2t512_r8_z1_y3": (8, 2, 512, 8, 1, 3),
}
FUSED_KEY = "rope_thd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_q-nrms-cpaged_fwd_ip"
FUSED_CONFIGS = {
    "v8h2t512_r24_z1 (one block, two heads per thread)": (8, 2, 512, 24, 1, 1),
    "v8h1t512_r48_z1 (one block, one head per thread)": (8, 1, 512, 48, 1, 1),
    "v8h1t512_r24_z1_y2": (8, 1, 512, 24, 1, 2),
    "v8h1t512_r16_z1_y3": (8, 1, 512, 16, 1, 3),
    "v8h1t512_r12_z1_y4": (8, 1, 512, 12, 1, 4),
    "v8h1t512_r10_z1_y5": (8, 1, 512, 10, 1, 5),
    "v8h1t512_r8_z1_y6": (8, 1, 512, 8, 1, 6),
    "v8h1t512_r4_z1_y12": (8, 1, 512, 4, 1, 12),
    "v8h2t512_r8_z1_y3": (8, 2, 512, 8, 1, 3),
    "v4h1t512_r12_z1_y4": (4, 1, 512, 12, 1, 4),
    "v4h1t512_r8_z1_y6": (4, 1, 512, 8, 1, 6),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--like", required=True, help="a tuning file written on this GPU")
    ap.add_argument("--bench", default="build-gpu/bench/ropejit_bench")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fused", action="store_true", help="the fused step's rows instead")
    a = ap.parse_args()
    key, configs = (FUSED_KEY, FUSED_CONFIGS) if a.fused else (KEY, CONFIGS)
    rows_filter = "^fused/qwen3_bf16_t(1|16|64|256)/" if a.fused else "^graph/"
    reference = "copy_us" if a.fused else "two_copies_us"
    like = json.load(open(a.like))
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for rnd in range(a.rounds):
            for name, (vec, hpt, threads, r, z, groups) in configs.items():
                config = dict(vec=vec, heads_per_thread=hpt, max_threads=threads, rows=r,
                              tokens_per_block=z, blocks_per_sm=0)
                if groups > 1:
                    config["head_groups"] = groups
                entries = [dict(key=key, bucket=b, q_heads=32, k_heads=8, config=config, median_us=0.0,
                                gbps=0.0, default_us=0.0) for b in (1, 16, 64, 256)]
                path = os.path.join(d, "tuning.json")
                json.dump(dict(schema=like["schema"], fingerprint=like["fingerprint"], entries=entries),
                          open(path, "w"))
                out = os.path.join(d, "graph.json")
                env = dict(os.environ, ROPEJIT_TUNING="frozen", ROPEJIT_TUNING_FILE=path)
                subprocess.run([a.bench, f"--benchmark_filter={rows_filter}", f"--benchmark_out={out}",
                                "--benchmark_out_format=json"], env=env, check=True, capture_output=True)
                for b in json.load(open(out))["benchmarks"]:
                    t = "decode_t" + b["name"].split("/")[1].split("_t")[-1]
                    per_call = b["median_us"] if a.fused else b["us_per_call"]
                    rows.setdefault(name, {}).setdefault(t, []).append(per_call)
                    label = "a copy of the bytes" if a.fused else "two copies"
                    rows.setdefault(label, {}).setdefault(t, []).append(b[reference])
    tokens = sorted({t for by in rows.values() for t in by}, key=lambda t: int(t[8:]))
    print("| launch (µs per call, min of %d rounds) | " % a.rounds + " | ".join(t[7:] + " tokens" for t in tokens) + " |")
    print("|---|" + "---|" * len(tokens))
    for name, by in rows.items():
        print(f"| {name} | " + " | ".join(f"{min(by[t]):.2f}" for t in tokens) + " |")


if __name__ == "__main__":
    main()
