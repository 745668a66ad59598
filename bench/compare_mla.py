"""Same-run timing of one MLA preprocessing step (ropejit.mla.prepare, one launch) against the
same step as separate torch passes, against torch.compile of those passes, and against a device
copy of the bytes the step moves.

The step, per token: RMSNorm of kv_c [512] times its weight, RoPE (DeepSeek's pairs, position
ids into a float32 table) of k_pe [64] and q_pe [heads, 64], the latent cache row
[kv_c' | k_pe'] written at the token's slot of a paged cache (pages of 64 rows), in bf16 or as
e4m3 of value / scale; then either the decode query [q_nope (absorbed, 512) | q_pe'] assembled
into q_out (bf16 or e4m3), or, for prefill, q_pe rotated in place. DeepSeek-V3 at TP 8: 16 heads
per rank.

  ropejit        ropejit.mla.prepare(...): one launch
  torch          the step as torch ops (rms_norm, gathers, the rotation, cat, casts,
                 index_copy_ into the cache): each pass a kernel of its own
  torch.compile  the same function through torch.compile (inductor fuses what it can)
  copy           a device-to-device copy of half the bytes the step reads and writes (so the
                 copy reads and writes as many bytes as the step)

Every implementation is captured in a CUDA graph and replayed: decode sizes (1-256 tokens) as
compare_peers.py times them (warm L2, 20 calls per graph, per call), prefill sizes (4096 tokens
and up) one replay after a 256 MiB L2 flush. Before timing, each implementation's cache rows and
query are compared with a float64 computation of the step (relative L2; e4m3 dequantized).

    python3 bench/compare_mla.py --lib build-gpu/libropejit.so --out $OUT/mla.json
"""

import argparse
import json
import os
import statistics
import sys
import traceback

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_peers import first_line, graph_us_per_call, import_ropejit  # noqa: E402

HEADS, RANK, ROPE, PAGE = 16, 512, 64, 64
ROWS = 65536  # the position table; positions spread over it
EPS = 1e-6
CACHE_SCALE, Q_SCALE = 0.05, 0.04  # e4m3 code = value / scale (vLLM's convention)
DECODE = (1, 16, 64, 256)
PREFILL = (4096, 16384, 32768)
FLUSH_BYTES = 256 << 20
E4M3 = torch.float8_e4m3fn
# Relative L2 against float64: bf16 outputs round once (~2e-3); e4m3 has 3 mantissa bits.
TOLERANCE = {"bf16": 1e-2, "e4m3": 6e-2}


class Step:
    def __init__(self, tokens, fp8, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.tokens, self.fp8 = tokens, fp8
        self.decode = tokens < 4096
        dt = torch.bfloat16
        self.kv_c = torch.randn(tokens, RANK, generator=g).to(dt).cuda()
        self.k_pe = torch.randn(tokens, ROPE, generator=g).to(dt).cuda()
        self.w = (1 + 0.5 * torch.rand(RANK, generator=g)).to(dt).cuda()
        self.q = torch.randn(tokens, HEADS, 128 + ROPE, generator=g).to(dt).cuda()
        self.q_pe = self.q[..., 128:]  # a view, as DeepSeek's q splits into nope and pe
        self.q0 = self.q.clone()
        self.q_nope = torch.randn(tokens, HEADS, RANK, generator=g).to(dt).cuda() \
            if self.decode else None
        self.q_out = torch.empty(tokens, HEADS, RANK + ROPE, dtype=E4M3 if fp8 else dt,
                                 device="cuda") if self.decode else None
        inv = 10000.0 ** (-torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)
        ang = torch.arange(ROWS, dtype=torch.float64)[:, None] * inv
        self.cos64, self.sin64 = ang.cos(), ang.sin()
        self.cos, self.sin = self.cos64.float().cuda(), self.sin64.float().cuda()
        self.positions = torch.randint(0, ROWS, (tokens,), generator=g).cuda()
        cache_rows = max(2 * tokens, 4096)
        self.cache = torch.zeros(cache_rows // PAGE, PAGE, RANK + ROPE,
                                 dtype=E4M3 if fp8 else dt, device="cuda")
        self.slots = torch.randperm(cache_rows, generator=g)[:tokens].cuda()
        self.cache_scale = torch.tensor([CACHE_SCALE], device="cuda")
        self.q_scale = torch.tensor([Q_SCALE], device="cuda")
        self.skipped = torch.zeros(1, dtype=torch.int32, device="cuda")

    def bytes_moved(self):
        t, el = self.tokens, 1 if self.fp8 else 2
        read = t * (RANK + ROPE) * 2 + t * HEADS * ROPE * 2 + t * 8 + t * ROPE * 4  # + ids, rows
        written = t * (RANK + ROPE) * el
        if self.decode:
            read += t * HEADS * RANK * 2
            written += t * HEADS * (RANK + ROPE) * el
        else:
            written += t * HEADS * ROPE * 2  # q_pe in place
        return read + written

    def reset(self):
        self.q.copy_(self.q0)
        self.cache.zero_()
        if self.q_out is not None:
            self.q_out.zero_()

    def reference(self):
        """float64: the cache rows (at the slots) and the query (q_out or the rotated q_pe)."""
        pos = self.positions.cpu()
        c, s = self.cos64[pos], self.sin64[pos]
        x = self.kv_c.cpu().double()
        normed = x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * self.w.cpu().double()
        row = torch.cat((normed, rotate(self.k_pe.cpu().double(), c, s)), -1)
        q_rot = rotate(self.q0[..., 128:].cpu().double(), c[:, None], s[:, None])
        if self.decode:
            return row, torch.cat((self.q_nope.cpu().double(), q_rot), -1)
        return row, q_rot

    def outputs(self):
        rows = self.cache.view(-1, RANK + ROPE)[self.slots].cpu().double()
        if self.fp8:
            rows = rows * CACHE_SCALE
        if not self.decode:
            return rows, self.q[..., 128:].cpu().double()
        q = self.q_out.cpu().double()
        return rows, q * Q_SCALE if self.fp8 else q


def rotate(x, c, s):
    """DeepSeek's pairs (x[2i], x[2i+1]) by angle i; any float dtype."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)


def ropejit_step(rj, x):
    from ropejit import mla

    def step():
        mla.prepare(x.positions, x.cos, x.sin, kv_c=x.kv_c, k_pe=x.k_pe, cache=x.cache,
                    slots=x.slots, norm_weight=x.w, eps=EPS, q_pe=x.q_pe,
                    q_nope=x.q_nope, q_out=x.q_out,
                    cache_scale=x.cache_scale if x.fp8 else None,
                    q_scale=x.q_scale if x.fp8 and x.decode else None, skipped=x.skipped,
                    style="gptj")
    return step


def torch_function(x):
    """The step as plain torch ops on x's tensors (the same function torch.compile gets)."""
    def step(positions, cos, sin, kv_c, k_pe, w, cache, slots, q_pe, q_nope, q_out):
        c, s = cos[positions], sin[positions]
        normed = F.rms_norm(kv_c.float(), (RANK,), w.float(), EPS)
        row = torch.cat((normed, rotate(k_pe.float(), c, s)), -1)
        row = (row / CACHE_SCALE).to(E4M3) if x.fp8 else row.to(kv_c.dtype)
        if x.fp8:  # torch has no index_copy_ for float8: the same bytes as uint8
            cache.view(torch.uint8).view(-1, RANK + ROPE).index_copy_(0, slots,
                                                                      row.view(torch.uint8))
        else:
            cache.view(-1, RANK + ROPE).index_copy_(0, slots, row)
        q_rot = rotate(q_pe.float(), c[:, None], s[:, None])
        if q_out is None:
            q_pe.copy_(q_rot)
            return
        q = torch.cat((q_nope.float(), q_rot), -1)
        q_out.copy_((q / Q_SCALE).to(E4M3) if x.fp8 else q)
    return step


def bind(fn, x):
    return lambda: fn(x.positions, x.cos, x.sin, x.kv_c, x.k_pe, x.w, x.cache, x.slots, x.q_pe,
                      x.q_nope, x.q_out)


def flushed_graph_us(fn, flush, reps):
    """One call captured in a graph, replayed after an L2 flush; median µs."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    samples = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def rel_l2(got, want):
    return ((got - want).norm() / want.norm()).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=None, help="libropejit.so (default: the package's)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--tokens", default=",".join(map(str, DECODE + PREFILL)))
    ap.add_argument("--stores", default="bf16,e4m3", help="cache and query store: bf16, e4m3")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    a = ap.parse_args()
    rj = import_ropejit(a.lib)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = []
    names = ["ropejit", "torch", "torch.compile", "copy"]
    for store in a.stores.split(","):
        for tokens in map(int, a.tokens.split(",")):
            x = Step(tokens, store == "e4m3")
            impls = {"ropejit": ropejit_step(rj, x), "torch": bind(torch_function(x), x)}
            if not a.no_compile:
                torch._dynamo.reset()
                impls["torch.compile"] = bind(torch.compile(torch_function(x), dynamic=False), x)
            half = x.bytes_moved() // 2
            src = torch.empty(half, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            impls["copy"] = lambda: dst.copy_(src)
            row = {"tokens": tokens, "store": store, "bytes_moved": x.bytes_moved(),
                   "timing": "graph replay, warm L2" if x.decode else "graph, L2 flushed",
                   "impls": {}}
            want = x.reference()
            for name, fn in impls.items():
                entry = {}
                try:
                    if name != "copy":
                        x.reset()
                        fn()
                        torch.cuda.synchronize()
                        errs = [rel_l2(g, w) for g, w in zip(x.outputs(), want)]
                        entry["rel_l2"] = max(errs)
                        entry["ok"] = entry["rel_l2"] < TOLERANCE[store]
                    entry["us"] = (graph_us_per_call(fn, a.reps) if x.decode
                                   else flushed_graph_us(fn, flush, a.reps))
                except Exception as e:  # a failing implementation is reported, the run goes on
                    entry["error"] = first_line(e)
                    traceback.print_exc()
                row["impls"][name] = entry
            rows.append(row)
            cells = []
            for name in names:
                e = row["impls"].get(name, {})
                cells.append(f"{e['us']:.2f}" if "us" in e else "-")
            base = row["impls"]["ropejit"].get("us")
            extra = ""
            if base and "us" in row["impls"].get("torch", {}):
                extra += f" | {row['impls']['torch']['us'] / base:.2f}x"
            if base and "us" in row["impls"]["copy"]:
                extra += f" | {100 * row['impls']['copy']['us'] / base:.1f}%"
            bad = [n for n, e in row["impls"].items() if e.get("ok") is False or "error" in e]
            print(f"| {tokens} | {store} | {x.bytes_moved() / 1e6:.2f} MB | " + " | ".join(cells)
                  + extra + (f" | WRONG/FAILED: {bad}" if bad else "") + " |", flush=True)
            impls.clear()  # frees the step's tensors before the next size
    print("columns: tokens | store | bytes | " + " | ".join(names)
          + " (µs) | torch / ropejit | copy / ropejit")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "heads": HEADS, "kv_rank": RANK, "rope_dim": ROPE, "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
