"""The unfused torch decode block that ropejit's projection kernel replaces, timed on the GPU in
the same run as `ropejit_bench --benchmark_filter=proj/` (bench/run_gpu.sh proj): Llama-3-8B's
RMSNorm -> QKV projection -> RoPE at M = 1..4096 tokens, bf16, and the FFN's RMSNorm -> gate/up
projection -> SiLU(g) * u.

    unfused: HF's LlamaRMSNorm (fp32 statistics, weight times the bf16-rounded normalized x),
             F.linear with the packed [6144, 4096] weight (cuBLAS), split into q, k, v, HF's
             rotate_half RoPE on q and k with cos/sin gathered at the position ids;
    gemm:    F.linear alone (the cuBLAS GEMV/GEMM the fused kernel competes with);
    floor:   a device copy of 2 x the weight's bytes, halved (the weight read at copy bandwidth).

ropejit's `qkv_projection` and `ffn_gate_up` (automatic path, and each path forced) are timed in
the same harness under graph replay (`--no-ropejit` leaves them out): the same clock and flush as
torch's rows, so the ratios need no second process.

Each timed call starts with a cold L2 (the 50 MB weight is as large as the H100's L2). Plain
launches and CUDA-graph replays (one call per graph) are both timed; medians in µs. `--flush
read` (the default, as ropejit_bench's projection and FFN rows) empties the L2 by summing a
256 MB buffer, which leaves clean lines, as in a model's step after the previous layer's weight
reads; `--flush write` zeroes it instead, leaving dirty lines that the timed call writes back as
it evicts them (run ropejit_bench with ROPEJIT_FLUSH=write to match).

    python3 bench/compare_proj_torch.py --out $OUT/proj_torch.json [--flush write]
"""

import argparse
import importlib
import json
import statistics

import torch
import torch.nn.functional as F

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM = 4096, 32, 8, 128
COLUMNS = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
EPS = 1e-5
FLUSH_BYTES = 256 << 20


def rms_norm(x, w):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def rotate_half(t):
    a, b = t.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def unfused(x, norm_w, weight, cos, sin, ids):
    y = F.linear(rms_norm(x, norm_w), weight)
    m = x.shape[0]
    q, k, v = y.split([Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q = q.view(m, Q_HEADS, HEAD_DIM)
    k = k.view(m, KV_HEADS, HEAD_DIM)
    c = cos[ids].unsqueeze(1)
    s = sin[ids].unsqueeze(1)
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s, v.view(m, KV_HEADS, HEAD_DIM)


def ffn(x, norm_w, gate_up, inter):
    g, u = F.linear(rms_norm(x, norm_w), gate_up).split([inter, inter], dim=-1)
    return F.silu(g) * u


def time_us(fn, flush, reps, graph):
    """Median µs of `fn` over `reps` calls, each after `flush()`."""
    if graph:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        flush()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        samples.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--no-ropejit", action="store_true",
                    help="time torch alone (no ropejit rows)")
    ap.add_argument("--flush", choices=("write", "read"), default="read",
                    help="empty the L2 by zeroing a buffer (dirty lines left) or reading it (clean)")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    scratch = torch.zeros(FLUSH_BYTES // 8, dtype=torch.int64, device=dev)
    flush = scratch.zero_ if args.flush == "write" else scratch.sum
    weight = (torch.rand(COLUMNS, HIDDEN, device=dev) * 2 - 1).mul_((3 / HIDDEN) ** 0.5)
    weight = weight.to(torch.bfloat16)
    norm_w = (1 + 0.5 * (torch.rand(HIDDEN, device=dev) * 2 - 1)).to(torch.bfloat16)
    inv = 1.0 / (10000.0 ** (torch.arange(0, HEAD_DIM, 2, device=dev).float() / HEAD_DIM))
    angles = torch.arange(8192, device=dev).float()[:, None] * inv[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    src = torch.empty(2 * weight.numel() * 2 // 2, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_us = time_us(lambda: dst.copy_(src), flush, args.reps, graph=False)
    rj = None if args.no_ropejit else importlib.import_module("ropejit.decode")
    paths = ("auto", "fused", "unfused")
    rows = []
    print(f"GPU: {torch.cuda.get_device_name()}; torch {torch.__version__}; L2 flushed ({args.flush}) before each")
    extra = "".join(f" ropejit {p} graph µs |" for p in paths) if rj else ""
    print("| M | unfused µs | unfused graph µs | F.linear µs | F.linear graph µs | floor µs |" + extra)
    print("|---|---|---|---|---|---|" + "---|" * (len(paths) if rj else 0))
    for m in (1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096):
        x = torch.randn(m, HIDDEN, device=dev).to(torch.bfloat16)
        ids = torch.randint(0, 8192, (m,), device=dev)
        row = {"tokens": m, "floor_us": copy_us / 2}
        full = lambda: unfused(x, norm_w, weight, cos, sin, ids)  # noqa: E731
        gemm = lambda: F.linear(x, weight)  # noqa: E731
        row["unfused_us"] = time_us(full, flush, args.reps, graph=False)
        row["unfused_graph_us"] = time_us(full, flush, args.reps, graph=True)
        row["linear_us"] = time_us(gemm, flush, args.reps, graph=False)
        row["linear_graph_us"] = time_us(gemm, flush, args.reps, graph=True)
        cells = ""
        for p in paths if rj else ():
            call = lambda p=p: rj.qkv_projection(  # noqa: E731
                x, weight, q_heads=Q_HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                norm_weight=norm_w, eps=EPS, position_ids=ids, cos=cos, sin=sin, path=p)
            row[f"ropejit_{p}_graph_us"] = time_us(call, flush, args.reps, graph=True)
            cells += f" {row[f'ropejit_{p}_graph_us']:.1f} |"
        rows.append(row)
        print(f"| {m} | {row['unfused_us']:.1f} | {row['unfused_graph_us']:.1f} | "
              f"{row['linear_us']:.1f} | {row['linear_graph_us']:.1f} | {row['floor_us']:.1f} |"
              + cells)
    # The FFN's gate/up at Llama-3-8B's shape: RMSNorm -> F.linear with the merged [2 x 14336,
    # 4096] gate_up weight -> SiLU(g) * u, against F.linear alone and the weight-read floor.
    inter = 14336
    gate_up = (torch.rand(2 * inter, HIDDEN, device=dev) * 2 - 1).mul_((3 / HIDDEN) ** 0.5)
    gate_up = gate_up.to(torch.bfloat16)
    src = torch.empty(2 * gate_up.numel(), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ffn_copy_us = time_us(lambda: dst.copy_(src), flush, args.reps, graph=False)
    ffn_rows = []
    print("\nFFN gate/up (4096 -> 2 x 14336, bf16)")
    print("| M | unfused µs | unfused graph µs | F.linear µs | F.linear graph µs | floor µs |" + extra)
    print("|---|---|---|---|---|---|" + "---|" * (len(paths) if rj else 0))
    for m in (1, 4, 8, 16, 32, 64, 256, 1024, 4096):
        x = torch.randn(m, HIDDEN, device=dev).to(torch.bfloat16)
        row = {"tokens": m, "floor_us": ffn_copy_us / 2}
        full = lambda: ffn(x, norm_w, gate_up, inter)  # noqa: E731
        gemm = lambda: F.linear(x, gate_up)  # noqa: E731
        row["unfused_us"] = time_us(full, flush, args.reps, graph=False)
        row["unfused_graph_us"] = time_us(full, flush, args.reps, graph=True)
        row["linear_us"] = time_us(gemm, flush, args.reps, graph=False)
        row["linear_graph_us"] = time_us(gemm, flush, args.reps, graph=True)
        cells = ""
        for p in paths if rj else ():
            call = lambda p=p: rj.ffn_gate_up(  # noqa: E731
                x, gate_up, intermediate=inter, norm_weight=norm_w, eps=EPS, path=p)
            row[f"ropejit_{p}_graph_us"] = time_us(call, flush, args.reps, graph=True)
            cells += f" {row[f'ropejit_{p}_graph_us']:.1f} |"
        ffn_rows.append(row)
        print(f"| {m} | {row['unfused_us']:.1f} | {row['unfused_graph_us']:.1f} | "
              f"{row['linear_us']:.1f} | {row['linear_graph_us']:.1f} | {row['floor_us']:.1f} |"
              + cells)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows, "ffn_rows": ffn_rows}, f, indent=1)


if __name__ == "__main__":
    main()
