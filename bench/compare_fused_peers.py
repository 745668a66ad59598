"""Same-run comparison of the fused serving step with FlashInfer's fused function on one GPU:
RoPE on q and k, q out as FP8 e4m3, k and v appended to an FP8 paged KV cache (NHD pages of 16
tokens), Llama-3-8B's attention shapes (32 q / 8 kv heads, head_dim 128, neox, bf16 in), one
launch each:

  ropejit     ropejit.fused.qk_norm_rope(q, k, v, ..., q_out=e4m3, write_k=False,
              k_cache=/v_cache=e4m3, kv_indptr/kv_indices/kv_last_page_len)
  FlashInfer  flashinfer.rope_quantize_fp8_append_paged_kv_cache (0.5.x), which takes per-token
              batch indices and positions (flashinfer.get_batch_indices_positions) besides the
              page table. Timed twice: with its default enable_pdl=False and with
              enable_pdl=True (programmatic dependent launch, as ropejit launches on sm_90;
              the same kernel, so only the first is in the error and bytes columns, the
              second's error goes to the JSON).

Both read the same q, k, v (separate contiguous tensors), the same float32 cos/sin cache
(FlashInfer's [positions, cos half | sin half]; ropejit gets its two halves as strided tables)
and position ids, and write the same cache layout. Every size is timed under CUDA-graph replay
(compare_peers.py's method: device time, the host's Python work and graph launch hidden), decode
sizes with one token per sequence, prefill sizes with sequences of 1024 tokens; the host time of
one eager call (Python and launch, no synchronization) is reported next to it. Before timing, each result is checked
against a float64 reference (q and the cache rows dequantized: within one e4m3 step), and the
two libraries' FP8 bytes are compared with each other. FlashInfer runs inside a try: if it
cannot import or fails, it is reported and ropejit still runs.

    python3 bench/compare_fused_peers.py --lib build-gpu/libropejit.so --out $OUT/fused_peers.json
"""

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_peers import first_line, graph_us_per_call, import_ropejit  # noqa: E402

Q_HEADS, K_HEADS, HEAD_DIM, PAGE = 32, 8, 128, 16
ROWS = 8192
SCALE_Q, SCALE_K, SCALE_V = 2.0, 4.0, 4.0  # stored = value * scale (FlashInfer: quant_scale_*)
DECODE = (1, 16, 64, 256)
PREFILL = (4096, 16384)


class Step:
    """One step's inputs and outputs: `tokens` over sequences of `per_seq` tokens, each sequence
    holding `held` tokens of history before the step (pages from a shuffled pool)."""

    def __init__(self, tokens, per_seq, seed=0):
        g = torch.Generator().manual_seed(seed)
        seqs = tokens // per_seq
        self.tokens = tokens
        self.q = torch.randn(tokens, Q_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16).cuda()
        self.k = torch.randn(tokens, K_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16).cuda()
        self.v = torch.randn(tokens, K_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16).cuda()
        inv = 10000.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
        ang = torch.arange(ROWS, dtype=torch.float64)[:, None] * inv
        self.cos64, self.sin64 = ang.cos(), ang.sin()
        self.cos_sin = torch.cat((self.cos64, self.sin64), 1).float().cuda()
        held = torch.randint(0, 1024, (seqs,), generator=g)
        lengths = held + per_seq  # after the append
        pages = (lengths + PAGE - 1) // PAGE
        self.indptr = torch.zeros(seqs + 1, dtype=torch.int32)
        self.indptr[1:] = torch.cumsum(pages, 0)
        self.n_pages = int(self.indptr[-1])
        self.indices = torch.randperm(self.n_pages, generator=g).to(torch.int32)
        self.last = ((lengths - 1) % PAGE + 1).to(torch.int32)
        self.cu = torch.arange(seqs + 1, dtype=torch.int32) * per_seq
        seq_of = torch.arange(tokens) // per_seq
        self.pos_in_seq = (held[seq_of] + torch.arange(tokens) % per_seq)
        self.ids = self.pos_in_seq.clone()  # positions are the index in the sequence
        for name in ("indptr", "indices", "last", "cu", "ids"):
            setattr(self, name, getattr(self, name).cuda())
        # FlashInfer's fused function reads pos_ids as int32 whatever their dtype (int64 ids
        # give wrong angles from the second token on), so it gets int32 ids; ropejit takes both.
        self.ids32 = self.ids.to(torch.int32)
        self.batch_indices = seq_of.to(torch.int32).cuda()
        self.positions = self.pos_in_seq.to(torch.int32).cuda()
        self.seq_of, self.held = seq_of, held
        self.outputs()

    def outputs(self):
        e4m3 = torch.float8_e4m3fn
        self.q_out = torch.empty(self.tokens, Q_HEADS, HEAD_DIM, dtype=e4m3, device="cuda")
        shape = (self.n_pages, PAGE, K_HEADS, HEAD_DIM)
        self.k_cache = torch.zeros(shape, dtype=torch.uint8, device="cuda").view(e4m3)
        self.v_cache = torch.zeros(shape, dtype=torch.uint8, device="cuda").view(e4m3)

    def cache_rows(self, cache):
        """[tokens, kv_heads, head_dim] of the rows this step appended (e4m3, on the host)."""
        idx = self.indices.cpu()
        pos = self.pos_in_seq
        starts = self.indptr.cpu()[self.seq_of]
        page = idx[(starts + pos // PAGE).long()].long()
        return cache.view(torch.uint8).cpu()[page, pos % PAGE].view(torch.float8_e4m3fn)

    def reference(self):
        def rope(x):
            c = self.cos64[self.ids.cpu()][:, None]
            s = self.sin64[self.ids.cpu()][:, None]
            h = HEAD_DIM // 2
            lo, hi = x[..., :h], x[..., h:]
            return torch.cat((lo * c - hi * s, hi * c + lo * s), -1)
        return rope(self.q.cpu().double()), rope(self.k.cpu().double()), self.v.cpu().double()


def ropejit_step(rj, x):
    def run():
        rj.fused.qk_norm_rope(
            x.q, x.k, x.v, layout="thd", cu_seqlens=x.cu, position_ids=x.ids,
            cos=x.cos_sin[:, :HEAD_DIM // 2], sin=x.cos_sin[:, HEAD_DIM // 2:],
            q_out=x.q_out, out_scale=SCALE_Q, write_k=False, k_cache=x.k_cache,
            v_cache=x.v_cache, kv_layout="NHD", kv_indptr=x.indptr, kv_indices=x.indices,
            kv_last_page_len=x.last, k_scale=SCALE_K, v_scale=SCALE_V)
    return run


def flashinfer_step(x, pdl=False):
    from flashinfer.rope import rope_quantize_fp8_append_paged_kv_cache

    def run():
        rope_quantize_fp8_append_paged_kv_cache(
            x.q, x.k, None, None, x.v, x.cos_sin, x.ids32, (x.k_cache, x.v_cache), x.indices,
            x.indptr, x.batch_indices, x.positions, is_neox=True,
            quantize_dtype=torch.float8_e4m3fn, quant_scale_q=SCALE_Q, quant_scale_kv=SCALE_K,
            page_size=PAGE, kv_layout="NHD", q_rope_out=x.q_out, enable_pdl=pdl)
    return run


def host_us(fn, calls=200):
    """Host time of one eager call (argument handling and launch), median of batches."""
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(times)


def error_of(x):
    """Largest error of the FP8 outputs in units of one e4m3 step of the reference, and the
    bytes (q_out, then the appended cache rows) for comparing the libraries."""
    want_q, want_k, want_v = x.reference()
    worst = 0.0
    for got, want, scale in ((x.q_out.cpu(), want_q, SCALE_Q),
                             (x.cache_rows(x.k_cache), want_k, SCALE_K),
                             (x.cache_rows(x.v_cache), want_v, SCALE_V)):
        w = want * scale
        step = torch.clamp(2.0 ** (torch.floor(torch.log2(w.abs().clamp_min(2.0 ** -6))) - 3),
                           min=2.0 ** -9)
        err = ((got.double() - w).abs() / step).nan_to_num(nan=float("inf"))  # NaN: unwritten
        worst = max(worst, err.max().item())
    data = [x.q_out.cpu().view(torch.uint8), x.cache_rows(x.k_cache).view(torch.uint8),
            x.cache_rows(x.v_cache).view(torch.uint8)]
    return worst, data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=None, help="libropejit.so (default: the installed package)")
    ap.add_argument("--out", default=None, help="JSON results")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--tokens", type=int, nargs="+", default=list(DECODE + PREFILL),
                    help=f"token counts (decode: up to {DECODE[-1]}, one per sequence; "
                    "prefill: sequences of 1024)")
    a = ap.parse_args()
    rj = import_ropejit(a.lib)
    import ropejit.fused  # noqa: F401
    rows = []
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    try:
        import flashinfer
        print(f"FlashInfer {flashinfer.__version__}")
    except Exception as e:  # reported, ropejit still runs
        print(f"FlashInfer: not importable ({first_line(e)})")
    print(f"ROPEJIT_PDL={os.environ.get('ROPEJIT_PDL', '(default)')}; FlashInfer timed with its "
          "default enable_pdl=False and with enable_pdl=True")
    print("| case | tokens | ropejit µs | FlashInfer µs | FlashInfer PDL µs | FlashInfer / ropejit "
          "| max error (e4m3 steps) ropejit / FlashInfer | FP8 bytes equal | host µs per eager "
          "call ropejit / FlashInfer |")
    print("|---|---|---|---|---|---|---|---|---|")
    # The first graph measured in a process ran 0.15-0.2 µs per call faster than every later one
    # at decode sizes (H100, 2026-11-25: ropejit 2.47 µs at 16 tokens when first, 2.60 after any
    # other size), so the first size is measured once, for nothing, by both libraries.
    first = Step(a.tokens[0], 1 if a.tokens[0] <= DECODE[-1] else 1024, seed=a.tokens[0])
    warm = []
    for make in (lambda: ropejit_step(rj, first), lambda: flashinfer_step(first)):
        try:
            warm.append(f"{graph_us_per_call(make(), 10):.2f}")
        except Exception:  # reported with the table below
            warm.append("—")
    print(f"(warm-up at {a.tokens[0]} tokens, not in the table: ropejit {warm[0]} µs, "
          f"FlashInfer {warm[1]} µs)")
    del first
    for tokens in a.tokens:
        decode = tokens <= DECODE[-1]
        x = Step(tokens, 1 if decode else 1024, seed=tokens)
        row = {"tokens": tokens, "timing": "graph replay"}
        results = {}
        for name, make in (("ropejit", lambda: ropejit_step(rj, x)),
                           ("FlashInfer", lambda: flashinfer_step(x)),
                           ("FlashInfer PDL", lambda: flashinfer_step(x, pdl=True))):
            try:
                fn = make()
                x.outputs()
                fn()
                torch.cuda.synchronize()
                err, data = error_of(x)
                us = graph_us_per_call(fn, a.reps)
                results[name] = {"us": us, "max_error_e4m3_steps": err,
                                 "host_us": host_us(fn)}
                results[name]["_data"] = data
            except Exception as e:
                results[name] = {"error": first_line(e)}
                traceback.print_exc(limit=2, file=sys.stderr)
        same = None
        if "_data" in results.get("ropejit", {}) and "_data" in results.get("FlashInfer", {}):
            pairs = zip(results["ropejit"]["_data"], results["FlashInfer"]["_data"])
            total = sum(r.numel() for r in results["ropejit"]["_data"])
            same = sum(int((r == f).sum()) for r, f in pairs) / total
        for r in results.values():
            r.pop("_data", None)
        row["impls"], row["fp8_bytes_equal"] = results, same

        def cell(name, key, fmt):
            r = results.get(name, {})
            return fmt.format(r[key]) if key in r else r.get("error", "—")[:40]

        ratio = (results["FlashInfer"]["us"] / results["ropejit"]["us"]
                 if "us" in results.get("FlashInfer", {}) and "us" in results.get("ropejit", {})
                 else None)
        print(f"| {'decode' if decode else 'prefill'} | {tokens} | "
              f"{cell('ropejit', 'us', '{:.2f}')} | {cell('FlashInfer', 'us', '{:.2f}')} | "
              f"{cell('FlashInfer PDL', 'us', '{:.2f}')} | "
              f"{'—' if ratio is None else f'{ratio:.2f}'} | "
              f"{cell('ropejit', 'max_error_e4m3_steps', '{:.2f}')} / "
              f"{cell('FlashInfer', 'max_error_e4m3_steps', '{:.2f}')} | "
              f"{'—' if same is None else f'{same:.4f}'} | "
              f"{cell('ropejit', 'host_us', '{:.1f}')} / {cell('FlashInfer', 'host_us', '{:.1f}')} |",
              flush=True)
        rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
