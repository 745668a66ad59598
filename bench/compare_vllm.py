"""Same-run comparison of ropejit's fused QK-norm + RoPE with vLLM's two fused kernels on one
GPU, Qwen3-8B's attention shapes (packed QKV projection output of 32 q / 8 k / 8 v heads,
head_dim 128, bf16, RMSNorm per head with eps 1e-6, neox, float32 cos/sin tables, int64
positions):

  in place   vLLM's fused_qk_norm_rope (csrc/fused_qknorm_rope_kernel.cu: QK-norm and RoPE
             on the q and k heads of the packed tensor, in place; vLLM launches it with
             programmatic dependent launch up to 16 tokens) against
             ropejit.fused.qk_norm_rope on the q and k views of the same tensor.
  cache      vLLM's fused_qknorm_rope_cache (csrc/fused_qknorm_rope_cache_kernel.cu: q out,
             k out rotated, v out, and k/v written to a paged cache of 16-token NHD blocks
             through a slot mapping; bf16 or FP8 e4m3 cache with per-tensor scales) against
             ropejit.fused.qk_norm_rope with q_out, k_out, slot_mapping and the same cache.
             vLLM's kernel also copies v to a v_out tensor (8% more bytes), which ropejit has
             no output for: the table gives each side's GB/s of its own bytes.

vLLM's kernels are built from a vLLM source tree by bench/peers/build_vllm.sh (nothing of vLLM
is in this repository) and loaded with torch.ops.load_library. Every size is timed under
CUDA-graph replay (compare_peers.py's method), decode sizes with one token per sequence,
prefill sizes with sequences of 1024 tokens. Before timing, each output is checked against a
float64 reference (norm, then RoPE by the same float32 tables): the largest error in units of
one bf16 step (one e4m3 step for an FP8 cache) at the reference value, or at 1 (2**-6 for
e4m3) for smaller values. vLLM rounds the normalized head to bf16 before RoPE, one rounding
more than ropejit; the fraction of output bytes equal between the two is listed too.

    bench/peers/build_vllm.sh VLLM_SRC .peers/vllm_peer.so
    python3 bench/compare_vllm.py --lib build-gpu/libropejit.so --peer .peers/vllm_peer.so \\
        --out $OUT/vllm.json
"""

import argparse
import json
import math
import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_peers import first_line, graph_us_per_call, import_ropejit  # noqa: E402

HQ, HKV, D, PAGE = 32, 8, 128, 16
EPS = 1e-6
ROWS = 8192
VLLM_SCALE_K, VLLM_SCALE_V = 0.25, 0.25  # vLLM stores value / scale; ropejit value * (1 / scale)
DECODE = (1, 16, 64, 256)
PREFILL = (4096, 16384)
E4M3 = torch.float8_e4m3fn


class Inputs:
    """One size's packed QKV tensor, norm weights, tables, positions and slots."""

    def __init__(self, tokens, seed):
        g = torch.Generator().manual_seed(seed)
        per_seq = 1 if tokens <= DECODE[-1] else 1024
        self.tokens = tokens
        self.qkv0 = (torch.randn(tokens, (HQ + 2 * HKV) * D, generator=g) * 2).to(
            torch.bfloat16).cuda()
        self.qw = (1 + 0.25 * torch.randn(D, generator=g)).to(torch.bfloat16).cuda()
        self.kw = (1 + 0.25 * torch.randn(D, generator=g)).to(torch.bfloat16).cuda()
        inv = 1e6 ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)  # Qwen3's base
        ang = torch.arange(ROWS, dtype=torch.float64)[:, None] * inv
        self.cos_sin = torch.cat((ang.cos(), ang.sin()), 1).float().cuda()
        # The reference rotates by the float32 tables both libraries read.
        self.cos64, self.sin64 = (t.double().cpu() for t in self.cos_sin.split(D // 2, 1))
        seqs = tokens // per_seq
        held = torch.randint(0, ROWS - per_seq, (seqs,), generator=g)
        self.ids = (held.repeat_interleave(per_seq) + torch.arange(tokens) % per_seq).cuda()
        # Slots: each sequence's tokens in its own shuffled 16-token blocks.
        blocks_per_seq = (per_seq + PAGE - 1) // PAGE + 1
        self.blocks = seqs * blocks_per_seq
        order = torch.randperm(self.blocks, generator=g).view(seqs, blocks_per_seq)
        start = torch.randint(0, PAGE, (seqs,), generator=g)
        within = start.repeat_interleave(per_seq) + torch.arange(tokens) % per_seq
        seq_of = torch.arange(tokens) // per_seq
        self.slots = (order[seq_of, within // PAGE] * PAGE + within % PAGE).cuda()
        self.qkv = self.qkv0.clone()

    def reset(self):
        self.qkv.copy_(self.qkv0)

    def views(self, qkv):
        t = self.tokens
        return (qkv[:, :HQ * D].view(t, HQ, D), qkv[:, HQ * D:(HQ + HKV) * D].view(t, HKV, D),
                qkv[:, (HQ + HKV) * D:].view(t, HKV, D))

    def reference(self):
        """float64 q, k after norm and RoPE, and v, [tokens, heads, D]."""
        q, k, v = (x.cpu().double() for x in self.views(self.qkv0))
        ids = self.ids.cpu()
        c, s = self.cos64[ids][:, None], self.sin64[ids][:, None]

        def norm_rope(x, w):
            x = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w.cpu().double()
            lo, hi = x[..., :D // 2], x[..., D // 2:]
            return torch.cat((lo * c - hi * s, hi * c + lo * s), -1)
        return norm_rope(q, self.qw), norm_rope(k, self.kw), v

    def cache_rows(self, cache):
        """The rows this step wrote, [tokens, kv heads, D], on the host."""
        slots = self.slots.cpu()
        return cache.view(torch.uint8).cpu().view(-1, HKV, D * cache.element_size())[slots]


def steps_of(x, fp8):
    """One bf16 step (or e4m3 step) at each reference value, or at `floor` for values below
    it. After RMSNorm a head's values are of order one, so a value near zero (where RoPE's sum
    cancels) is measured in the step at 1 (bf16) or 2**-6 (e4m3), not its own: a rounding of
    an order-one intermediate would otherwise read as thousands of steps."""
    floor = 2.0 ** -6 if fp8 else 1.0
    bits = 3 if fp8 else 7
    return 2.0 ** (torch.floor(torch.log2(x.abs().clamp_min(floor))) - bits)


def worst(got, want, fp8=False, scale=1.0):
    """Largest error in steps; infinite where a value is NaN (a poisoned output left unwritten,
    which Python's max() would otherwise pass over)."""
    w = want * scale
    err = ((got.double() - w).abs() / steps_of(w, fp8)).nan_to_num(nan=math.inf)
    return err.max().item()


class CacheOutputs:
    def __init__(self, x, fp8):
        """Fresh outputs, poisoned: NaN rows, cache bytes 0x7f (e4m3 NaN; bf16 3.4e38)."""
        t, dev = x.tokens, "cuda"
        nan = lambda n: torch.full((t, n * D), float("nan"), dtype=torch.bfloat16, device=dev)
        self.q, self.k, self.v = nan(HQ), nan(HKV), nan(HKV)
        shape = (x.blocks, PAGE, HKV, D * (1 if fp8 else 2))
        poisoned = lambda: torch.full(shape, 0x7f, dtype=torch.uint8, device=dev).view(
            E4M3 if fp8 else torch.bfloat16)
        self.k_cache, self.v_cache = poisoned(), poisoned()
        self.k_scale = torch.tensor([VLLM_SCALE_K], device=dev)
        self.v_scale = torch.tensor([VLLM_SCALE_V], device=dev)


def in_place_impls(rj):
    def ropejit_fn(x):
        q, k, _ = x.views(x.qkv)
        cos, sin = x.cos_sin[:, :D // 2], x.cos_sin[:, D // 2:]
        return lambda: rj.fused.qk_norm_rope(
            q, k, layout="thd", position_ids=x.ids, cos=cos, sin=sin, norm="rms",
            q_norm_weight=x.qw, k_norm_weight=x.kw, norm_eps=EPS)

    def vllm_fn(x):
        op = torch.ops.ropejit_vllm_peer.fused_qk_norm_rope
        return lambda: op(x.qkv, HQ, HKV, HKV, D, EPS, x.qw, x.kw, x.cos_sin, True, x.ids, -1)

    def check(x):
        want_q, want_k, want_v = x.reference()
        q, k, v = (t.cpu() for t in x.views(x.qkv))
        assert torch.equal(v, x.views(x.qkv0)[2].cpu()), "v heads changed"
        return max(worst(q, want_q), worst(k, want_k)), [q.view(torch.uint8), k.view(torch.uint8)]

    bytes_moved = lambda t: 2 * t * (HQ + HKV) * D * 2
    return {"ropejit": ropejit_fn, "vLLM": vllm_fn}, check, lambda name, t: bytes_moved(t)


def cache_impls(rj, fp8):
    outs = {}

    def ropejit_fn(x):
        o = outs[x.tokens]
        q, k, v = x.views(x.qkv)
        cos, sin = x.cos_sin[:, :D // 2], x.cos_sin[:, D // 2:]
        scales = dict(k_scale=1 / VLLM_SCALE_K, v_scale=1 / VLLM_SCALE_V) if fp8 else {}
        return lambda: rj.fused.qk_norm_rope(
            q, k, v, layout="thd", position_ids=x.ids, cos=cos, sin=sin, norm="rms",
            q_norm_weight=x.qw, k_norm_weight=x.kw, norm_eps=EPS,
            q_out=o.q.view(x.tokens, HQ, D), k_out=o.k.view(x.tokens, HKV, D),
            k_cache=o.k_cache, v_cache=o.v_cache, kv_layout="NHD", slot_mapping=x.slots,
            **scales)

    def vllm_fn(x):
        o = outs[x.tokens]
        op = torch.ops.ropejit_vllm_peer.fused_qknorm_rope_cache
        cos, sin = x.cos_sin[:, :D // 2], x.cos_sin[:, D // 2:]
        return lambda: op(o.q, o.k, o.v, x.qkv, x.qw, x.kw, cos, sin, x.ids, x.slots,
                          o.k_cache, o.v_cache, D, HQ, HKV, D // 2, EPS, 0.0,
                          "fp8" if fp8 else "auto", o.k_scale if fp8 else None,
                          o.v_scale if fp8 else None)

    def prepare(x):
        outs[x.tokens] = CacheOutputs(x, fp8)

    def check(x):
        o = outs[x.tokens]
        want_q, want_k, want_v = x.reference()
        t = x.tokens
        q, k = o.q.cpu().view(t, HQ, D), o.k.cpu().view(t, HKV, D)
        err = max(worst(q, want_q), worst(k, want_k))
        data = [q.view(torch.uint8), k.view(torch.uint8)]
        for cache, want, scale in ((o.k_cache, want_k, 1 / VLLM_SCALE_K),
                                   (o.v_cache, want_v, 1 / VLLM_SCALE_V)):
            rows = x.cache_rows(cache)
            got = rows.view(E4M3) if fp8 else rows.view(torch.bfloat16)
            err = max(err, worst(got, want, fp8, scale if fp8 else 1.0))
            data.append(rows)
        return err, data

    def bytes_moved(name, t):
        cache_elem = 1 if fp8 else 2
        read = t * (HQ + 2 * HKV) * D * 2
        write = t * (HQ + HKV) * D * 2 + 2 * t * HKV * D * cache_elem
        if name == "vLLM":
            write += t * HKV * D * 2  # v_out
        return read + write
    return {"ropejit": ropejit_fn, "vLLM": vllm_fn}, check, bytes_moved, prepare


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=None, help="libropejit.so (default: the installed package)")
    ap.add_argument("--peer", required=True, help="the library bench/peers/build_vllm.sh built")
    ap.add_argument("--out", default=None, help="JSON results")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--tokens", type=int, nargs="+", default=list(DECODE + PREFILL))
    ap.add_argument("--cases", nargs="+", default=["in_place", "cache_bf16", "cache_fp8"],
                    choices=["in_place", "cache_bf16", "cache_fp8"])
    a = ap.parse_args()
    for t in a.tokens:
        if t < 1 or (t > DECODE[-1] and t % 1024):
            ap.error(f"--tokens {t}: decode sizes are 1..{DECODE[-1]} (one token per sequence), "
                     "prefill sizes multiples of 1024 (sequences of 1024)")
    rj = import_ropejit(a.lib)
    import ropejit.fused  # noqa: F401
    torch.ops.load_library(os.path.abspath(a.peer))
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"ROPEJIT_PDL={os.environ.get('ROPEJIT_PDL', '(default)')}")
    rows = []
    for case in a.cases:
        if case == "in_place":
            impls, check, bytes_moved = in_place_impls(rj)
            prepare = lambda x: None
        else:
            impls, check, bytes_moved, prepare = cache_impls(rj, case == "cache_fp8")
        print(f"\n{case}\n| tokens | ropejit µs | vLLM µs | vLLM / ropejit | ropejit GB/s | "
              f"vLLM GB/s | max error (bf16 or e4m3 steps) ropejit / vLLM | bytes equal |")
        print("|---|---|---|---|---|---|---|---|")
        # Measured once for nothing first: the first graph of a process runs faster.
        warm = Inputs(a.tokens[0], seed=1)
        prepare(warm)
        for make in impls.values():
            try:
                graph_us_per_call(make(warm), 10)
            except Exception:
                pass
        for tokens in a.tokens:
            x = Inputs(tokens, seed=tokens)
            res, data = {}, {}
            for name, make in impls.items():
                try:
                    x.reset()
                    prepare(x)
                    fn = make(x)
                    fn()
                    torch.cuda.synchronize()
                    err, data[name] = check(x)
                    us = graph_us_per_call(fn, a.reps)
                    res[name] = {"us": us, "max_error_steps": err,
                                 "bytes": bytes_moved(name, tokens),
                                 "gb_s": bytes_moved(name, tokens) / us / 1e3}
                except Exception as e:
                    res[name] = {"error": first_line(e)}
                    traceback.print_exc(limit=3, file=sys.stderr)

            def cell(name, key, fmt):
                r = res.get(name, {})
                return fmt.format(r[key]) if key in r else r.get("error", "—")[:40]
            both = all("us" in res.get(n, {}) for n in ("ropejit", "vLLM"))
            ratio = f"{res['vLLM']['us'] / res['ropejit']['us']:.2f}" if both else "—"
            same = "—"
            if len(data) == 2:
                pairs = list(zip(data["ropejit"], data["vLLM"]))
                equal = sum(int((r == v).sum()) for r, v in pairs) / sum(r.numel() for r, _ in pairs)
                same = f"{equal:.4f}"
                res["bytes_equal"] = equal
            print(f"| {tokens} | {cell('ropejit', 'us', '{:.2f}')} | {cell('vLLM', 'us', '{:.2f}')}"
                  f" | {ratio} | {cell('ropejit', 'gb_s', '{:.0f}')} | {cell('vLLM', 'gb_s', '{:.0f}')}"
                  f" | {cell('ropejit', 'max_error_steps', '{:.2f}')} / "
                  f"{cell('vLLM', 'max_error_steps', '{:.2f}')} | {same} |", flush=True)
            rows.append({"case": case, "tokens": tokens, "impls": res})
            if a.out:  # after every row: a later failure keeps what was measured
                with open(a.out, "w") as f:
                    json.dump({"gpu": torch.cuda.get_device_name(),
                               "pdl": os.environ.get("ROPEJIT_PDL"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
