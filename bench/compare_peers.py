"""Same-run comparison with the peers' RoPE kernels on one GPU: ropejit (its Python package)
against Liger-Kernel's Triton kernel and FlashInfer's CUDA kernels, next to copies of the same
bytes, on Llama-3-8B's attention shapes (32 q / 8 kv heads, head_dim 128, neox, bf16).

Two ways of handing over the angles, because the peers take different ones:
  rows  HF's rotary module gathers cos/sin once per forward pass into per-token rows that every
        layer reuses; the kernel reads row t for token t. Liger takes these (full-width, in the
        model dtype, as HF gives them); ropejit takes half-width f32 rows with positions
        `offset` 0 (row = token), and again HF's own bf16 rows, the tensors Liger gets.
  ids   vLLM/SGLang keep a [max_positions] cos/sin cache and hand each layer int64 position
        ids; the kernel gathers. FlashInfer's cos_sin_cache kernel and its pos_ids kernel (which
        computes cos/sin itself) take these; ropejit takes ids into a half-width f32 table.
Decode sizes are timed under CUDA-graph replay of 20 calls with warm L2 (per call, as a server
replays a layer stack; device time only, the host's graph launch hidden behind a spin kernel); prefill sizes per call with the L2 flushed before each. Every result is
checked against float64 first; every peer runs inside its own try, so a missing or failing peer
is reported and the run goes on.

    python3 bench/compare_peers.py --lib build-gpu/libropejit.so --out $OUT/peers.json
    python3 bench/compare_peers.py --profile decode_t1   # a few eager calls each, for ncu
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import time_us  # noqa: E402  (bench/ is not a package)

BASE = 10000.0
Q_HEADS, K_HEADS, HEAD_DIM = 32, 8, 128
DTYPE = torch.bfloat16
TABLE_ROWS = 8192  # the ids mode's cache; decode positions are spread over it
FLUSH_BYTES = 256 << 20  # larger than any current L2 (H100 50 MiB, H200 60 MiB)
GRAPH_CALLS = 20
REPLAYS_PER_SAMPLE = 5
SPIN_CYCLES = 200_000  # ~100 µs at 2 GHz: longer than the host takes to enqueue the replays
# Relative L2 error against float64: one bf16 rounding of the output is ~2e-3; a kernel that
# computes in bf16 (Liger on HF's bf16 rows) stays under 1e-2.
TOLERANCE = 1e-2

DECODE_TOKENS = (1, 16, 64, 256)
PREFILL_TOKENS = (4096, 32768)


def import_ropejit(lib):
    if lib is not None:
        os.environ["ROPEJIT_LIB"] = os.path.abspath(lib)
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
    import ropejit
    return ropejit


def first_line(error):
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


class Inputs:
    """One case's tensors: q/k originals, positions, and every form of the angles."""

    def __init__(self, tokens, decode, seed=0):
        dev = torch.device("cuda")
        gen = torch.Generator(device=dev).manual_seed(seed + tokens)
        self.tokens = tokens
        self.q0 = torch.randn(tokens, Q_HEADS, HEAD_DIM, dtype=DTYPE, device=dev, generator=gen)
        self.k0 = torch.randn(tokens, K_HEADS, HEAD_DIM, dtype=DTYPE, device=dev, generator=gen)
        rows = max(TABLE_ROWS, tokens)
        if decode:
            self.ids = torch.randint(0, rows, (tokens,), dtype=torch.int64, device=dev,
                                     generator=gen)
        else:
            self.ids = torch.arange(tokens, dtype=torch.int64, device=dev)
        inv_freq = BASE ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64, device=dev)
                            / HEAD_DIM)
        angles = torch.arange(rows, dtype=torch.float64, device=dev)[:, None] * inv_freq
        self.cos64, self.sin64 = angles.cos(), angles.sin()  # [rows, D/2]
        self.cos32, self.sin32 = self.cos64.float(), self.sin64.float()
        self.cos_sin_cache = torch.cat((self.cos32, self.sin32), dim=-1).contiguous()
        # Per-token rows, as HF's rotary module hands them to every layer.
        self.row_cos32 = self.cos32[self.ids].contiguous()
        self.row_sin32 = self.sin32[self.ids].contiguous()
        full = lambda t: torch.cat((t, t), dim=-1)[self.ids].to(DTYPE)[None]  # [1, T, D]
        self.row_cos_hf, self.row_sin_hf = full(self.cos64), full(self.sin64)
        self.ids32 = self.ids.to(torch.int32)

    def reference(self):
        cos, sin = self.cos64[self.ids][:, None], self.sin64[self.ids][:, None]
        out = []
        for x in (self.q0, self.k0):
            x = x.double()
            x1, x2 = x[..., :HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
            out.append(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
        return out

    @property
    def qk_bytes(self):
        return (self.q0.numel() + self.k0.numel()) * self.q0.element_size()


def implementations(ropejit):
    """name -> (mode, factory); factory(inputs) returns fn(q, k) rotating [T, H, D] in place.
    A factory that raises (peer not installed, API changed) marks that peer unavailable."""

    def ropejit_ids(x):
        def fn(q, k):
            ropejit.apply(q[None], k[None], cos=x.cos32, sin=x.sin32, position_ids=x.ids)
        return fn

    def ropejit_rows(x):
        def fn(q, k):
            ropejit.apply(q[None], k[None], cos=x.row_cos32, sin=x.row_sin32)
        return fn

    def ropejit_hf_rows(x):
        def fn(q, k):  # the very tensors Liger gets: full-width bf16 rows, [T, D]
            ropejit.apply(q[None], k[None], cos=x.row_cos_hf[0], sin=x.row_sin_hf[0])
        return fn

    def liger_rows(x):
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        def fn(q, k):
            # Liger wants [batch, heads, seq, D]; the transposed view of a contiguous
            # [batch, seq, heads, D] tensor is what it turns back into contiguous memory, so
            # it rotates our buffers in place.
            liger_rotary_pos_emb(q[None].transpose(1, 2), k[None].transpose(1, 2),
                                 x.row_cos_hf, x.row_sin_hf)
        return fn

    def flashinfer_cache(x):
        import flashinfer

        def fn(q, k):
            flashinfer.apply_rope_with_cos_sin_cache_inplace(
                x.ids, q.view(x.tokens, -1), k.view(x.tokens, -1), HEAD_DIM, x.cos_sin_cache,
                is_neox=True)
        return fn

    def flashinfer_pos_ids(x):
        import flashinfer

        def fn(q, k):
            flashinfer.apply_rope_pos_ids_inplace(q, k, x.ids32, rope_theta=BASE)
        return fn

    return {
        "ropejit (rows)": ("rows", ropejit_rows),
        "ropejit (HF bf16 rows)": ("rows", ropejit_hf_rows),
        "Liger (rows)": ("rows", liger_rows),
        "ropejit (ids)": ("ids", ropejit_ids),
        "FlashInfer cache (ids)": ("ids", flashinfer_cache),
        "FlashInfer computed (ids)": ("ids", flashinfer_pos_ids),
    }


def check(fn, x):
    q, k = x.q0.clone(), x.k0.clone()
    fn(q, k)
    torch.cuda.synchronize()
    ref = x.reference()
    rel = max(((o.double() - r).norm() / r.norm()).item() for o, r in zip((q, k), ref))
    max_abs = max((o.double() - r).abs().max().item() for o, r in zip((q, k), ref))
    return rel, max_abs


def graph_us_per_call(fn, reps):
    """Median over samples of REPLAYS_PER_SAMPLE replays of one graph holding GRAPH_CALLS
    calls, per call (warm L2). A spin kernel before each sample's start event keeps the GPU
    busy while the host enqueues the replays, so the events time the device alone, not the
    host's graph launch (several µs, which would add ~0.3 µs to every call)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()  # compiles, autotunes (Triton), warms allocators outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    for _ in range(5):
        graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        for _ in range(REPLAYS_PER_SAMPLE):
            graph.replay()
        end.record()
        end.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 / (GRAPH_CALLS * REPLAYS_PER_SAMPLE)
                             for start, end in events)


def flushed_us(fn, flush, reps):
    """Median µs of one call with the L2 flushed before it, as compare_torch.py times."""
    return time_us(fn, flush, 3, reps)


def run_case(name, tokens, decode, impls, flush, reps):
    x = Inputs(tokens, decode)
    row = {"case": name, "tokens": tokens, "bytes_moved": 2 * x.qk_bytes,
           "timing": "graph replay, warm L2" if decode else "per call, L2 flushed", "impls": {}}
    q_dst, k_dst = torch.empty_like(x.q0), torch.empty_like(x.k0)
    if decode:
        def copies():
            q_dst.copy_(x.q0)
            k_dst.copy_(x.k0)
        row["copy_us"] = graph_us_per_call(copies, reps)
        row["copy_kind"] = "two copies (q, k)"
    else:
        src = torch.empty(x.qk_bytes, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        row["copy_us"] = flushed_us(lambda: dst.copy_(src), flush, reps)
        row["copy_kind"] = "one copy of q+k"
    for impl_name, (mode, factory) in impls.items():
        entry = {"mode": mode}
        try:
            fn = factory(x)
            entry["rel_l2"], entry["max_abs"] = check(fn, x)
            entry["check_ok"] = entry["rel_l2"] < TOLERANCE
            q, k = x.q0.clone(), x.k0.clone()
            call = lambda: fn(q, k)
            entry["us"] = graph_us_per_call(call, reps) if decode else flushed_us(call, flush, reps)
        except Exception as e:  # a peer missing or broken: say so, keep going
            entry["error"] = first_line(e)
            if os.environ.get("COMPARE_PEERS_TRACE"):
                traceback.print_exc()
        row["impls"][impl_name] = entry
        line = (f"{entry['us']:.2f} µs, rel L2 {entry['rel_l2']:.2e}"
                f"{'' if entry['check_ok'] else ' FAIL'}" if "us" in entry else entry["error"])
        print(f"{name} {impl_name}: {line}", flush=True)
    return row


def print_table(rows, impl_names):
    print("| case | timing | copy µs | " + " | ".join(f"{n} µs" for n in impl_names) + " |")
    print("|---|---|---|" + "---|" * len(impl_names))
    for r in rows:
        cells = [r["case"], r["timing"], f"{r['copy_us']:.2f}"]
        for n in impl_names:
            e = r["impls"][n]
            cells.append(f"{e['us']:.2f}" + ("" if e["check_ok"] else " (wrong)") if "us" in e
                         else "n/a")
        print("| " + " | ".join(cells) + " |")
    print("\nrel L2 error against float64 (max of q and k):")
    print("| case | " + " | ".join(impl_names) + " |")
    print("|---|" + "---|" * len(impl_names))
    for r in rows:
        cells = [f"{r['impls'][n]['rel_l2']:.2e}" if "rel_l2" in r["impls"][n] else "n/a"
                 for n in impl_names]
        print(f"| {r['case']} | " + " | ".join(cells) + " |")


def profile(tokens, factories, decode=True):
    """A few eager calls of each implementation for ncu; no timing. `factories`: name ->
    factory(inputs) as in implementations()."""
    x = Inputs(tokens, decode)
    for name, factory in factories.items():
        try:
            fn = factory(x)
            q, k = x.q0.clone(), x.k0.clone()
            for _ in range(5):
                fn(q, k)
            torch.cuda.synchronize()
            print(f"profiled {name}")
        except Exception as e:
            print(f"{name}: {first_line(e)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", help="a build's libropejit.so, used with the source tree's "
                        "python/ropejit (default: the installed package)")
    parser.add_argument("--out", default="compare_peers.json", help="JSON output path")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--profile", metavar="CASE", help="e.g. decode_t1: eager calls only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("compare_peers: no CUDA device visible to torch; nothing to measure")
    ropejit = import_ropejit(args.lib)
    impls = implementations(ropejit)
    if args.profile:
        profile(int(args.profile.rsplit("_t", 1)[1]),
                {name: factory for name, (_, factory) in impls.items()},
                args.profile.startswith("decode"))
        return

    versions = {"ropejit": ropejit.__version__}
    for module in ("liger_kernel", "flashinfer", "triton"):
        try:
            from importlib.metadata import version
            versions[module] = version(module.replace("_", "-") if module != "flashinfer"
                                       else "flashinfer-python")
        except Exception as e:
            versions[module] = first_line(e)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "versions": versions, "reps": args.reps,
            "graph_calls": GRAPH_CALLS, "shape": f"{Q_HEADS}q/{K_HEADS}kv heads, d{HEAD_DIM}, bf16"}
    print(f"# {meta['gpu']}, torch {meta['torch']}, {versions}; {meta['shape']}; "
          f"median of {args.reps}\n", flush=True)

    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    rows = [run_case(f"decode_t{t}", t, True, impls, flush, args.reps) for t in DECODE_TOKENS]
    rows += [run_case(f"prefill_t{t}", t, False, impls, flush, args.reps)
             for t in PREFILL_TOKENS]
    print()
    print_table(rows, list(impls))
    with open(args.out, "w") as f:
        json.dump({"context": meta, "cases": rows}, f, indent=2)
    print(f"\nwrote {args.out}")
    bad = [(r["case"], n) for r in rows for n, e in r["impls"].items()
           if n.startswith("ropejit") and not e.get("check_ok")]
    if bad:
        sys.exit(f"compare_peers: ropejit failed the float64 check or did not run: {bad}")


if __name__ == "__main__":
    main()
