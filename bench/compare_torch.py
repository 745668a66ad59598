"""Same-run comparison on one GPU: ropejit (through its Python package, ropejit.apply: in
place, neox, fp32 half-width cos/sin table built in float64, int64 position ids) against HF-style
torch eager RoPE, the same function under torch.compile, and a device-to-device copy of the same
bytes. Checks ropejit against a float64 reference first, then times everything with CUDA events,
prints a markdown table and writes the numbers as JSON.

    python3 bench/compare_torch.py --out $OUT/compare.json          # the installed package
    python3 bench/compare_torch.py --lib build/libropejit.so        # python/ropejit over a build
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
from dataclasses import dataclass

import torch

BASE = 10000.0
# Larger than any current GPU's L2 (H100 50 MiB, H200 60 MiB, B200 126 MiB), so writing it
# evicts q, k and the table and every repetition reads from HBM, as a model's layer would.
FLUSH_BYTES = 256 << 20
# Decode positions are spread over a context this long (batched decode of many sequences).
DECODE_CONTEXT = 8192
# Relative L2 error against float64 that one rounding to the output dtype stays well under.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3}
ROPEJIT_DTYPE = {torch.bfloat16: "bf16", torch.float16: "f16"}


def import_ropejit(lib):
    """The installed package, or with `lib` the source tree's python/ropejit over that
    libropejit.so (a build tree without `pip install`)."""
    if lib is not None:
        os.environ["ROPEJIT_LIB"] = os.path.abspath(lib)
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "python"))
    import ropejit
    return ropejit


@dataclass
class Case:
    name: str
    dtype: torch.dtype
    batch: int
    seq: int
    q_heads: int
    k_heads: int
    head_dim: int = 128
    decode: bool = False

    @property
    def tokens(self):
        return self.batch * self.seq

    @property
    def qk_bytes(self):
        return self.tokens * (self.q_heads + self.k_heads) * self.head_dim * self.dtype.itemsize


CASES = [
    *(Case(f"decode_t{t}", torch.bfloat16, 1, t, 32, 8, decode=True) for t in (1, 16, 64, 256)),
    Case("prefill_t4096", torch.bfloat16, 1, 4096, 32, 8),
    Case("prefill_t32768", torch.bfloat16, 1, 32768, 32, 8),
    Case("fp16_4x2048_h64", torch.float16, 4, 2048, 64, 64),
]


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_rope(q, k, cos_full, sin_full, position_ids):
    """transformers' apply_rotary_pos_emb on bshd tensors, with the gather of full-width
    cos/sin rows by position id that its rotary module does; returns new tensors."""
    cos = cos_full[position_ids].unsqueeze(2)  # [batch, seq, 1, D]: broadcast over heads
    sin = sin_full[position_ids].unsqueeze(2)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def float64_tables(rows, rotary, device):
    """cos and sin of p * base^(-2i/R), [rows, R/2], in float64."""
    inv_freq = BASE ** (-torch.arange(0, rotary, 2, dtype=torch.float64, device=device) / rotary)
    angles = torch.arange(rows, dtype=torch.float64, device=device)[:, None] * inv_freq
    return angles.cos(), angles.sin()


def reference(x, cos64, sin64, ids):
    """The float64 neox rotation of x [batch, seq, heads, D] at positions ids [batch*seq]."""
    b, s = x.shape[:2]
    cos, sin = cos64[ids].view(b, s, 1, -1), sin64[ids].view(b, s, 1, -1)
    x = x.double()
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def rel_l2(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def max_abs_diff(a_pair, b_pair):
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(a_pair, b_pair))


def time_us(fn, flush, warmup, reps):
    """Median device time of fn in µs. The flush runs before each start event, outside the
    timed region; being a long kernel, it also gives the host time to enqueue fn, so small
    cases measure device time rather than Python dispatch (unless dispatch outlasts it)."""
    for _ in range(warmup):
        fn()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1e3 for start, end in events)


def time_copy(nbytes, flush, warmup, reps):
    """Median µs of a device-to-device copy of nbytes (2 * nbytes moved), timed as time_us."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return time_us(lambda: dst.copy_(src), flush, warmup, reps)


def first_line(error):
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"


def run_case(case, ropejit, flush, warmup, reps):
    dev = torch.device("cuda")
    table_rows = max(DECODE_CONTEXT, case.seq)
    cos64, sin64 = float64_tables(table_rows, case.head_dim, dev)
    cos32, sin32 = cos64.float(), sin64.float()
    # HF keeps full-width tables (each frequency twice) and casts them to the model dtype.
    cos_full = torch.cat((cos64, cos64), dim=-1).to(case.dtype)
    sin_full = torch.cat((sin64, sin64), dim=-1).to(case.dtype)
    if case.decode:
        ids = torch.randint(0, table_rows, (case.tokens,), dtype=torch.int64, device=dev)
    else:
        ids = torch.arange(case.seq, dtype=torch.int64, device=dev).repeat(case.batch)
    ids2d = ids.view(case.batch, case.seq)
    q0 = torch.randn(case.batch, case.seq, case.q_heads, case.head_dim, dtype=case.dtype,
                     device=dev)
    k0 = torch.randn(case.batch, case.seq, case.k_heads, case.head_dim, dtype=case.dtype,
                     device=dev)
    spec = ropejit.Spec(dtype=ROPEJIT_DTYPE[case.dtype], head_dim=case.head_dim, style="neox",
                        layout="bshd", positions="ids", index_type="i64", freqs="table",
                        table_dtype="f32", table_width="half", in_place=True)

    def rope(q, k):  # in place, on torch's current stream
        ropejit.apply(q, k, cos=cos32, sin=sin32, position_ids=ids)

    row = {"case": case.name, "dtype": str(case.dtype).removeprefix("torch."), "batch": case.batch,
           "seq": case.seq, "q_heads": case.q_heads, "k_heads": case.k_heads,
           "head_dim": case.head_dim, "tokens": case.tokens, "bytes": 2 * case.qk_bytes,
           "key": ropejit.key(spec)}

    # Correctness, on copies: ropejit rotates in place and the originals feed eager/compile.
    q, k = q0.clone(), k0.clone()
    rope_error = None
    try:
        rope(q, k)
    except RuntimeError as e:  # ropejit.Error is one
        rope_error = first_line(e)
    ref = (reference(q0, cos64, sin64, ids), reference(k0, cos64, sin64, ids))
    eager_out = hf_rope(q0, k0, cos_full, sin_full, ids2d)
    row["eager_rel_l2"] = max(rel_l2(o, r) for o, r in zip(eager_out, ref))
    if rope_error is None:
        row["ropejit_rel_l2"] = max(rel_l2(o, r) for o, r in zip((q, k), ref))
        row["max_abs_diff_eager"] = max_abs_diff((q, k), eager_out)
        row["check_ok"] = row["ropejit_rel_l2"] < TOLERANCE[case.dtype]
    else:
        row["ropejit_error"] = rope_error
        row["check_ok"] = False

    # Static shapes and a fresh cache per case: one specialized graph per shape, and the
    # recompile limit never turns a later case into a dynamic-shape or eager fallback.
    torch._dynamo.reset()
    compiled = torch.compile(hf_rope, dynamic=False)
    compile_error = None
    try:
        compiled_out = compiled(q0, k0, cos_full, sin_full, ids2d)  # compiles
        if rope_error is None:
            row["max_abs_diff_compile"] = max_abs_diff((q, k), compiled_out)
        del compiled_out
    except Exception as e:  # inductor needs a C compiler and Triton; report, keep going
        compile_error = first_line(e)
        row["compile_error"] = compile_error
    del ref, eager_out

    row["copy_us"] = time_copy(case.qk_bytes, flush, warmup, reps)
    row["ropejit_us"] = None if rope_error else time_us(
        lambda: rope(q, k), flush, warmup, reps)
    row["eager_us"] = time_us(lambda: hf_rope(q0, k0, cos_full, sin_full, ids2d), flush, warmup,
                              reps)
    row["compile_us"] = None
    if compile_error is None:
        try:
            row["compile_us"] = time_us(lambda: compiled(q0, k0, cos_full, sin_full, ids2d),
                                        flush, warmup, reps)
        except Exception as e:
            row["compile_error"] = first_line(e)
    rope_us = row["ropejit_us"]
    # As bench/ropejit_bench's pct_copy: 100 means copy speed, the memory-bound floor.
    row["pct_copy"] = 100.0 * row["copy_us"] / rope_us if rope_us else None
    both = rope_us and row["compile_us"]
    row["speedup_vs_compile"] = row["compile_us"] / rope_us if both else None
    return row


def fmt_bytes(n):
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def fmt(value, spec, suffix=""):
    return "n/a" if value is None else format(value, spec) + suffix


def print_table(rows):
    print("| case | tokens | bytes | copy µs | ropejit µs | eager µs | compile µs "
          "| ropejit % of copy | speedup vs compile |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [r["case"], str(r["tokens"]), fmt_bytes(r["bytes"]),
                 *(fmt(r[f], ".1f") for f in ("copy_us", "ropejit_us", "eager_us", "compile_us")),
                 fmt(r["pct_copy"], ".0f", "%"), fmt(r["speedup_vs_compile"], ".2f", "x")]
        print("| " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", help="a build's libropejit.so, used with the source tree's "
                        "python/ropejit (default: the installed package)")
    parser.add_argument("--out", default="compare_torch.json", help="JSON output path")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("compare_torch: no CUDA device visible to torch; nothing to measure")

    ropejit = import_ropejit(args.lib)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "ropejit": ropejit.__version__,
            "warmup": args.warmup, "reps": args.reps, "flush_bytes": FLUSH_BYTES}
    print(f"# {meta['gpu']}, torch {meta['torch']} (CUDA {meta['cuda']}), "
          f"ropejit {meta['ropejit']}; median of {args.reps} after {args.warmup} warm-ups, "
          f"L2 flushed before each\n")

    rows = []
    for case in CASES:
        row = run_case(case, ropejit, flush, args.warmup, args.reps)
        rows.append(row)
        notes = [f"ropejit rel L2 {fmt(row.get('ropejit_rel_l2'), '.2e')} "
                 f"({'ok' if row['check_ok'] else 'FAIL'}, limit {TOLERANCE[case.dtype]:.0e})",
                 f"eager rel L2 {row['eager_rel_l2']:.2e}",
                 f"max |ropejit - eager| {fmt(row.get('max_abs_diff_eager'), '.3g')}",
                 f"max |ropejit - compile| {fmt(row.get('max_abs_diff_compile'), '.3g')}"]
        for error in ("ropejit_error", "compile_error"):
            if error in row:
                notes.append(f"{error}: {row[error]}")
        print(f"{case.name}: " + "; ".join(notes), flush=True)
    print()
    print_table(rows)

    with open(args.out, "w") as f:
        json.dump({"context": meta, "cases": rows}, f, indent=2)
    print(f"\nwrote {args.out}")
    if not all(r["check_ok"] for r in rows):
        sys.exit("compare_torch: ropejit failed the float64 check (see above)")


if __name__ == "__main__":
    main()
