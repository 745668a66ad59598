"""Same-run comparison of the fused Qwen3-style step with the unfused sequence it replaces, each
pass of that sequence taken from the fastest implementation available on the host (#14's
"against the unfused sequence, each pass at its best"):

  fused     ropejit.fused.qk_norm_rope: per-head RMSNorm of q and k, RoPE, q in place (or q out
            as FP8 e4m3), k and v appended to a paged cache (bf16, or e4m3 with static scales);
            one launch.
  unfused   the same step as separate passes, in one CUDA graph:
              norm     q, then k, per head (FlashInfer's rmsnorm on [tokens, heads, 128], or
                       torch's F.rms_norm), into scratch tensors;
              rope     in place on the normalized q and k (ropejit's plain RoPE key, or
                       FlashInfer's apply_rope_with_cos_sin_cache_inplace);
              quantize (--fp8) q, k and v to e4m3 with their static scales (torch: multiply,
                       clamp to +-448, convert; eager, or one torch.compile kernel per tensor;
                       no library on the host has a standalone pass);
              append   k and v into the paged cache (FlashInfer's append_paged_kv_cache, given the
                       per-token batch indices and positions it wants, or torch's indexed copy
                       through precomputed page and row indices).
            Every candidate of a pass is timed alone (graph replay); the sequence is built from
            the fastest of each and timed as one graph.

Shapes: compare_fused_peers.py's step (32 q / 8 kv heads of 128, as Qwen3-8B's attention; neox,
bf16, an f32 cos/sin table, NHD pages of 16 tokens); decode sizes with one token per sequence,
prefill sizes with sequences of 1024. Before timing, the fused step's and the sequence's outputs
(q and the appended cache rows) are compared with a float64 reference (within MAX_ERROR_ULPS ulps
of the output format at the magnitude of the head's values; a row past it is marked WRONG and
gets no ratio). Device time under CUDA-graph replay (compare_peers.py's
method). A candidate that cannot import or fails is reported and left out.

    python3 bench/compare_unfused.py --lib build-gpu/libropejit.so [--fp8] --out $OUT/unfused.json
"""

import argparse
import json
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_fused_peers import HEAD_DIM, K_HEADS, PAGE  # noqa: E402
from compare_fused_peers import Step as FusedStep  # noqa: E402
from compare_peers import first_line, graph_us_per_call, import_ropejit  # noqa: E402

EPS = 1e-6
SCALE_Q, SCALE_K, SCALE_V = 2.0, 4.0, 4.0  # stored = value * scale
DECODE = (1, 16, 64, 256)
PREFILL = (4096,)
E4M3 = torch.float8_e4m3fn
# Two roundings of the output format (the unfused sequence rounds the normalized head, then the
# rotated one) and the propagated error: anything past 4 ulps of the head's magnitude is wrong.
MAX_ERROR_ULPS = 4.0


class Step(FusedStep):
    """compare_fused_peers.py's step (its shapes, page table, positions and cos/sin table) with
    the norm's weights, each token's cache page and row, and this comparison's outputs."""

    def __init__(self, tokens, per_seq, fp8, seed=0):
        self.fp8 = fp8
        super().__init__(tokens, per_seq, seed)
        g = torch.Generator().manual_seed(seed + 1)
        self.q0, self.k0 = self.q.clone(), self.k.clone()
        self.qw = (torch.rand(HEAD_DIM, generator=g) + 0.5).to(torch.bfloat16).cuda()
        self.kw = (torch.rand(HEAD_DIM, generator=g) + 0.5).to(torch.bfloat16).cuda()
        starts = self.indptr.cpu()[self.seq_of]
        self.page_of = self.indices.cpu()[(starts + self.pos_in_seq // PAGE).long()].long().cuda()
        self.row_of = (self.pos_in_seq % PAGE).cuda()
        self.reset()

    def outputs(self):
        """The base's constructor asks for its outputs; reset() makes this comparison's."""

    def reset(self):
        """Fresh q and k (the steps work in place), empty caches and scratch."""
        self.q = self.q0.clone()
        self.k = self.k0.clone()
        self.qn = torch.empty_like(self.q)
        self.kn = torch.empty_like(self.k)
        cache_dtype = E4M3 if self.fp8 else torch.bfloat16
        shape = (self.n_pages, PAGE, K_HEADS, HEAD_DIM)
        self.k_cache, self.v_cache = (
            torch.zeros(shape, dtype=torch.uint8 if self.fp8 else torch.bfloat16,
                        device="cuda").view(cache_dtype) for _ in range(2))
        self.q8 = torch.empty(self.q.shape, dtype=torch.uint8, device="cuda").view(E4M3)
        self.k8 = torch.empty(self.k.shape, dtype=torch.uint8, device="cuda").view(E4M3)
        self.v8 = torch.empty(self.v.shape, dtype=torch.uint8, device="cuda").view(E4M3)

    def reference(self):
        """float64 q, k (normalized per head, rotated) and v."""
        def norm_rope(x, w):
            x = x.cpu().double()
            x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS) * w.cpu().double()
            c = self.cos64[self.ids.cpu()][:, None]
            s = self.sin64[self.ids.cpu()][:, None]
            h = HEAD_DIM // 2
            lo, hi = x[..., :h], x[..., h:]
            return torch.cat((lo * c - hi * s, hi * c + lo * s), -1)
        return norm_rope(self.q0, self.qw), norm_rope(self.k0, self.kw), self.v.cpu().double()


def fused_step(rj, x):
    def run():
        extra = (dict(q_out=x.q8, out_scale=SCALE_Q, k_scale=SCALE_K, v_scale=SCALE_V)
                 if x.fp8 else {})
        rj.fused.qk_norm_rope(
            x.q, x.k, x.v, layout="thd", cu_seqlens=x.cu, position_ids=x.ids,
            cos=x.cos_sin[:, :HEAD_DIM // 2], sin=x.cos_sin[:, HEAD_DIM // 2:], norm="rms",
            q_norm_weight=x.qw, k_norm_weight=x.kw, norm_eps=EPS, write_k=False,
            k_cache=x.k_cache, v_cache=x.v_cache, kv_layout="NHD", kv_indptr=x.indptr,
            kv_indices=x.indices, kv_last_page_len=x.last, **extra)
    return run


# The candidates of each unfused pass: name -> maker(rj, x) -> callable. Each works on x.qn and
# x.kn (the normalized q and k), so that the passes compose in any choice.
def norm_flashinfer(rj, x):
    from flashinfer.norm import rmsnorm

    def run():
        rmsnorm(x.q, x.qw, EPS, out=x.qn)
        rmsnorm(x.k, x.kw, EPS, out=x.kn)
    return run


def norm_torch(rj, x):
    import torch.nn.functional as F

    def run():
        x.qn.copy_(F.rms_norm(x.q, (HEAD_DIM,), x.qw, EPS))
        x.kn.copy_(F.rms_norm(x.k, (HEAD_DIM,), x.kw, EPS))
    return run


def rope_ropejit(rj, x):
    def run():
        rj.apply(x.qn, x.kn, cos=x.cos_sin[:, :HEAD_DIM // 2], sin=x.cos_sin[:, HEAD_DIM // 2:],
                 layout="thd", cu_seqlens=x.cu, position_ids=x.ids)
    return run


def rope_flashinfer(rj, x):
    from flashinfer.rope import apply_rope_with_cos_sin_cache_inplace

    def run():
        apply_rope_with_cos_sin_cache_inplace(x.positions, x.qn.view(x.tokens, -1),
                                              x.kn.view(x.tokens, -1), HEAD_DIM, x.cos_sin, True)
    return run


def _quantize(src, dst, scale):
    dst.copy_((src.float() * scale).clamp_(-448.0, 448.0))


def quantize_torch(rj, x):
    def run():
        for src, dst, scale in ((x.qn, x.q8, SCALE_Q), (x.kn, x.k8, SCALE_K),
                                (x.v, x.v8, SCALE_V)):
            _quantize(src, dst, scale)
    return run


def quantize_compiled(rj, x):
    # One generated kernel per tensor instead of eager torch's four (compiled on the warm-up
    # calls, outside the graph capture). Each shape is its own graph (two per token count):
    # dynamo's default limit of 8 per function would make the largest sizes run eagerly.
    import torch._dynamo
    for name in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 64)
    quantize = torch.compile(_quantize, dynamic=False)

    def run():
        for src, dst, scale in ((x.qn, x.q8, SCALE_Q), (x.kn, x.k8, SCALE_K),
                                (x.v, x.v8, SCALE_V)):
            quantize(src, dst, scale)
    return run


def append_flashinfer(rj, x):
    from flashinfer.page import append_paged_kv_cache

    def run():
        k, v = (x.k8, x.v8) if x.fp8 else (x.kn, x.v)
        append_paged_kv_cache(k, v, x.batch_indices, x.positions, (x.k_cache, x.v_cache),
                              x.indices, x.indptr, x.last, "NHD")
    return run


def append_torch(rj, x):
    # Through byte views: indexed copies of float8 tensors are not implemented everywhere.
    as_bytes = torch.uint8 if x.fp8 else torch.int16

    def run():
        k, v = (x.k8, x.v8) if x.fp8 else (x.kn, x.v)
        x.k_cache.view(as_bytes)[x.page_of, x.row_of] = k.view(as_bytes)
        x.v_cache.view(as_bytes)[x.page_of, x.row_of] = v.view(as_bytes)
    return run


def passes(fp8):
    out = [("norm", {"FlashInfer rmsnorm": norm_flashinfer, "torch F.rms_norm": norm_torch}),
           ("rope", {"ropejit": rope_ropejit, "FlashInfer": rope_flashinfer})]
    if fp8:
        out.append(("quantize", {"torch eager": quantize_torch,
                                 "torch.compile": quantize_compiled}))
    out.append(("append", {"FlashInfer append_paged_kv_cache": append_flashinfer,
                           "torch indexed copy": append_torch}))
    return out


def error_of(x, q_got):
    """Largest error of q and the appended cache rows, in units of the output format's ulp at
    the head's magnitude (bf16: 2^-7 relative steps; e4m3: 2^-3)."""
    want_q, want_k, want_v = x.reference()
    rows = (x.page_of.cpu(), x.row_of.cpu())

    def appended(cache):  # through a byte view: CPU indexing of float8 tensors may be missing
        if not x.fp8:
            return cache.cpu()[rows]
        return cache.view(torch.uint8).cpu()[rows].view(E4M3)
    got = [(q_got, want_q, SCALE_Q if x.fp8 else 1.0),
           (appended(x.k_cache), want_k, SCALE_K if x.fp8 else 1.0),
           (appended(x.v_cache), want_v, SCALE_V if x.fp8 else 1.0)]
    mantissa = 3 if x.fp8 else 7
    worst = 0.0
    for have, want, scale in got:
        w = want * scale
        head = w.abs().amax(-1, keepdim=True).clamp_min(1e-30)
        ulp = 2.0 ** (torch.floor(torch.log2(head)) - mantissa)
        err = ((have.double() - w).abs() / ulp).nan_to_num(nan=float("inf"))
        worst = max(worst, err.max().item())
    return worst


def checked_us(make, x, reps, q_of):
    """Runs once on fresh buffers, checks against float64, then times under graph replay."""
    x.reset()
    fn = make()
    fn()
    torch.cuda.synchronize()
    err = error_of(x, q_of().cpu())
    return graph_us_per_call(fn, reps), err


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=None, help="libropejit.so (default: the installed package)")
    ap.add_argument("--out", default=None, help="JSON results")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--fp8", action="store_true",
                    help="q out and the cache in e4m3 with static scales (else bf16, q in place)")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(DECODE + PREFILL))
    a = ap.parse_args()
    for t in a.tokens:
        if t < 1 or (t > DECODE[-1] and t % 1024):
            ap.error(f"--tokens {t}: decode sizes up to {DECODE[-1]}, prefill sizes in whole "
                     "sequences of 1024")
    rj = import_ropejit(a.lib)
    import ropejit.fused  # noqa: F401
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    try:
        import flashinfer
        print(f"FlashInfer {flashinfer.__version__}")
    except Exception as e:
        print(f"FlashInfer: not importable ({first_line(e)})")
    step_name = "FP8 q and cache" if a.fp8 else "bf16, q in place"
    print(f"Qwen3-style step ({step_name}); graph replay, µs per call")
    print("| tokens | fused µs | unfused sequence µs | sequence / fused | passes (fastest of each, µs "
          "alone) | max error fused / sequence (ulps) |")
    print("|---|---|---|---|---|---|")
    rows = []
    for tokens in a.tokens:
        decode = tokens <= DECODE[-1]
        x = Step(tokens, 1 if decode else 1024, a.fp8, seed=tokens)
        q_result = (lambda: x.q8.float() if x.fp8 else x.q)
        row = {"tokens": tokens, "fp8": a.fp8, "passes": {}}
        try:
            row["fused_us"], row["fused_error_ulps"] = checked_us(
                lambda: fused_step(rj, x), x, a.reps, q_result)
        except Exception as e:
            row["fused_error"] = first_line(e)
            traceback.print_exc(limit=2, file=sys.stderr)
        chosen = []
        for name, candidates in passes(a.fp8):
            timed = {}
            for impl, make in candidates.items():
                try:
                    x.reset()
                    fn = make(rj, x)
                    timed[impl] = graph_us_per_call(fn, a.reps)
                except Exception as e:
                    timed[impl] = first_line(e)
                    traceback.print_exc(limit=2, file=sys.stderr)
            row["passes"][name] = timed
            usable = {k: v for k, v in timed.items() if isinstance(v, float)}
            if not usable:
                chosen = None
                break
            best = min(usable, key=usable.get)
            chosen.append((name, best, candidates[best]))
        if chosen:
            def sequence():
                fns = [make(rj, x) for _, _, make in chosen]

                def run():
                    for fn in fns:
                        fn()
                return run
            q_seq = (lambda: x.q8.float() if x.fp8 else x.qn)
            try:
                row["unfused_us"], row["unfused_error_ulps"] = checked_us(
                    sequence, x, a.reps, q_seq)
                row["chosen"] = {name: impl for name, impl, _ in chosen}
            except Exception as e:
                row["unfused_error"] = first_line(e)
                traceback.print_exc(limit=2, file=sys.stderr)
        # Both results within MAX_ERROR_ULPS of float64, or the row is marked and has no ratio.
        wrong = [name for name in ("fused", "unfused")
                 if row.get(f"{name}_error_ulps", 0.0) > MAX_ERROR_ULPS]
        row["wrong"] = wrong
        ratio = (row["unfused_us"] / row["fused_us"]
                 if "unfused_us" in row and "fused_us" in row and not wrong else None)
        parts = ", ".join(f"{name}: {impl} {row['passes'][name][impl]:.2f}"
                          for name, impl, _ in (chosen or []))
        print(f"| {tokens} | {row.get('fused_us', float('nan')):.2f} | "
              f"{row.get('unfused_us', float('nan')):.2f} | "
              f"{'—' if ratio is None else f'{ratio:.2f}'} | {parts} | "
              f"{row.get('fused_error_ulps', float('nan')):.1f} / "
              f"{row.get('unfused_error_ulps', float('nan')):.1f}"
              f"{' WRONG: ' + ', '.join(wrong) if wrong else ''} |", flush=True)
        rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "fp8": a.fp8, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
