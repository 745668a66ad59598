"""Same-run timing of ropejit's MLA drop-ins at the peers' own interfaces, each against the same
step as separate torch passes (the unfused sequence: RoPE, concat, quantize and cache write each
a kernel) and a device copy of the bytes the step moves. DeepSeek-V3 at TP 8: 16 heads,
kv_lora_rank 512, rope 64, interleaved pairs, decode sizes, CUDA-graph replay (warm L2, per
call, as compare_peers.py times them).

  flashinfer.mla_rope_quantize_fp8            q and k: rope + e4m3 of value * scale, 4 outputs
  flashinfer.rope_quantize_fp8_append_paged   the same, the key into a paged (ckv, kpe) cache
                                              through FlashInfer's page table (pages of 64)
  vllm.concat_and_cache_mla_rope_fused        q_pe, k_pe rotated in place, [kv_c | k_pe] rows
                                              into a bf16 cache at slot_mapping

Before timing, ropejit's outputs are compared with the torch passes' (relative L2; e4m3
dequantized). The peers' own kernels do not install on the GPU host; their published figures
are not used here.

    python3 bench/compare_mla_dropins.py --lib build-gpu/libropejit.so --out $OUT/dropins.json
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_peers import first_line, graph_us_per_call, import_ropejit  # noqa: E402

HEADS, RANK, ROPE, PAGE, ROWS = 16, 512, 64, 64, 65536
E4M3 = torch.float8_e4m3fn
SQ, SKV = 8.0, 12.0  # FlashInfer's scales multiply
TOLERANCE = 6e-2  # relative L2 of e4m3 (3 mantissa bits); bf16 rows are far below it


def rotate(x, c, s):
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)


class Step:
    def __init__(self, tokens, seed=0):
        g = torch.Generator().manual_seed(seed + tokens)
        dt, dev = torch.bfloat16, "cuda"
        self.tokens = tokens
        self.q_rope = torch.randn(tokens, HEADS, ROPE, generator=g).to(dt).to(dev)
        self.q_nope = torch.randn(tokens, HEADS, RANK, generator=g).to(dt).to(dev)
        self.latent = torch.randn(tokens, RANK + ROPE, generator=g).to(dt).to(dev)
        self.k_nope, self.k_rope = self.latent.split([RANK, ROPE], dim=-1)
        inv = 10000.0 ** (-torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)
        ang = torch.arange(ROWS, dtype=torch.float64)[:, None] * inv
        self.cos_sin = torch.cat((ang.cos(), ang.sin()), -1).float().to(dev)
        self.pos = torch.randint(0, ROWS, (tokens,), generator=g).to(dev)
        # One request a token, each with its own pages: its position's page and a random row.
        self.page_pos = torch.randint(0, 4 * PAGE, (tokens,), generator=g, dtype=torch.int32)
        pages = 4 * tokens + 4
        self.kv_indices = torch.randperm(pages, generator=g)[:4 * tokens].int().to(dev)
        self.kv_indptr = (torch.arange(tokens + 1, dtype=torch.int32) * 4).to(dev)
        self.batch_indices = torch.arange(tokens, dtype=torch.int32).to(dev)
        self.page_pos = self.page_pos.to(dev)
        self.ckv = torch.zeros(pages, PAGE, RANK, dtype=E4M3, device=dev)
        self.kpe = torch.zeros(pages, PAGE, ROPE, dtype=E4M3, device=dev)
        self.outs = (torch.empty(tokens, HEADS, ROPE, dtype=E4M3, device=dev),
                     torch.empty(tokens, ROPE, dtype=E4M3, device=dev),
                     torch.empty(tokens, HEADS, RANK, dtype=E4M3, device=dev),
                     torch.empty(tokens, RANK, dtype=E4M3, device=dev))
        self.cache = torch.zeros(max(2 * tokens, 1024) // PAGE, PAGE, RANK + ROPE, dtype=dt,
                                 device=dev)
        self.slots = torch.randperm(self.cache.shape[0] * PAGE, generator=g)[:tokens].to(dev)
        self.q_pe0, self.latent0 = self.q_rope.clone(), self.latent.clone()

    def reset(self):
        self.q_rope.copy_(self.q_pe0)
        self.latent.copy_(self.latent0)


def quantize_torch(x):
    half = ROPE // 2
    c, s = x.cos_sin[x.pos, :half], x.cos_sin[x.pos, half:]

    def step():
        x.outs[0].copy_((rotate(x.q_rope.float(), c[:, None], s[:, None]) * SQ).to(E4M3))
        x.outs[1].copy_((rotate(x.k_rope.float(), c, s) * SKV).to(E4M3))
        x.outs[2].copy_((x.q_nope.float() * SQ).to(E4M3))
        x.outs[3].copy_((x.k_nope.float() * SKV).to(E4M3))
    return step


def quantize_ropejit(fi, x):
    def step():
        fi.mla_rope_quantize_fp8(x.q_rope, x.k_rope, x.q_nope, x.k_nope, x.cos_sin, x.pos,
                                 is_neox=False, quant_scale_q=SQ, quant_scale_kv=SKV,
                                 q_rope_out=x.outs[0], k_rope_out=x.outs[1],
                                 q_nope_out=x.outs[2], k_nope_out=x.outs[3])
    return step


def paged_torch(x):
    half = ROPE // 2

    def step():
        c, s = x.cos_sin[x.pos, :half], x.cos_sin[x.pos, half:]
        x.outs[0].copy_((rotate(x.q_rope.float(), c[:, None], s[:, None]) * SQ).to(E4M3))
        x.outs[2].copy_((x.q_nope.float() * SQ).to(E4M3))
        entry = x.kv_indptr[x.batch_indices.long()] + x.page_pos // PAGE
        slot = x.kv_indices[entry.long()].long() * PAGE + (x.page_pos % PAGE).long()
        k = (rotate(x.k_rope.float(), c, s) * SKV).to(E4M3)
        x.kpe.view(torch.uint8).view(-1, ROPE).index_copy_(0, slot, k.view(torch.uint8))
        n = (x.k_nope.float() * SKV).to(E4M3)
        x.ckv.view(torch.uint8).view(-1, RANK).index_copy_(0, slot, n.view(torch.uint8))
    return step


def paged_ropejit(fi, x):
    def step():
        fi.rope_quantize_fp8_append_paged_kv_cache(
            x.q_rope, x.k_rope, x.q_nope, x.k_nope, None, x.cos_sin, x.pos, (x.ckv, x.kpe),
            x.kv_indices, x.kv_indptr, x.batch_indices, x.page_pos, is_neox=False,
            quant_scale_q=SQ, quant_scale_kv=SKV, page_size=PAGE, q_rope_out=x.outs[0],
            q_nope_out=x.outs[2])
    return step


def vllm_torch(x):
    half = ROPE // 2

    def step():
        c, s = x.cos_sin[x.pos, :half], x.cos_sin[x.pos, half:]
        x.q_rope.copy_(rotate(x.q_rope.float(), c[:, None], s[:, None]))
        x.k_rope.copy_(rotate(x.k_rope.float(), c, s))
        x.cache.view(-1, RANK + ROPE).index_copy_(0, x.slots, torch.cat((x.k_nope, x.k_rope),
                                                                          -1))
    return step


def vllm_ropejit(vl, x):
    def step():
        vl.concat_and_cache_mla_rope_fused(x.pos, x.q_rope, x.k_rope, x.k_nope, x.cos_sin,
                                           False, x.slots, x.cache, "auto", None)
    return step


CASES = {
    # name: (ropejit step, torch step, outputs to compare, bytes read, bytes written)
    "flashinfer.mla_rope_quantize_fp8": (
        quantize_ropejit, quantize_torch, lambda x: x.outs,
        lambda t: t * (HEADS + 1) * (RANK + ROPE) * 2 + t * (ROPE * 4 + 8),
        lambda t: t * (HEADS + 1) * (RANK + ROPE)),
    "flashinfer.rope_quantize_fp8_append_paged_kv_cache": (
        paged_ropejit, paged_torch,
        lambda x: (x.outs[0], x.outs[2], x.ckv, x.kpe),
        lambda t: t * (HEADS + 1) * (RANK + ROPE) * 2 + t * (ROPE * 4 + 8 + 16),
        lambda t: t * (HEADS + 1) * (RANK + ROPE)),
    "vllm.concat_and_cache_mla_rope_fused": (
        vllm_ropejit, vllm_torch, lambda x: (x.q_rope, x.latent, x.cache),
        lambda t: t * (HEADS * ROPE + RANK + ROPE) * 2 + t * (ROPE * 4 + 16),
        lambda t: t * (HEADS * ROPE + ROPE + RANK + ROPE) * 2),
}


def snapshot(tensors):
    return [t.view(torch.uint8).clone() if t.dtype == E4M3 else t.clone() for t in tensors]


def rel_l2(a, b):
    a = a.view(E4M3).double() if a.dtype == torch.uint8 else a.double()
    b = b.view(E4M3).double() if b.dtype == torch.uint8 else b.double()
    a, b = torch.nan_to_num(a), torch.nan_to_num(b)
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=None, help="libropejit.so (default: the package's)")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--tokens", default="1,16,64,256")
    ap.add_argument("--reps", type=int, default=50)
    a = ap.parse_args()
    import_ropejit(a.lib)
    from ropejit.dropin import flashinfer, vllm
    mods = {"flashinfer": flashinfer, "vllm": vllm}
    rows = []
    for name, (ours, theirs, outputs, read, written) in CASES.items():
        for tokens in map(int, a.tokens.split(",")):
            x = Step(tokens)
            mod = mods[name.split(".")[0]]
            impls = {"ropejit": ours(mod, x), "torch": theirs(x)}
            moved = read(tokens) + written(tokens)
            src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            impls["copy"] = lambda: dst.copy_(src)
            row = {"interface": name, "tokens": tokens, "bytes_moved": moved, "impls": {}}
            results = {}
            for impl, fn in impls.items():
                entry = {}
                try:
                    if impl != "copy":
                        x.reset()
                        fn()
                        torch.cuda.synchronize()
                        results[impl] = snapshot(outputs(x))
                    entry["us"] = graph_us_per_call(fn, a.reps)
                except Exception as e:  # reported, the run goes on
                    entry["error"] = first_line(e)
                row["impls"][impl] = entry
            if "ropejit" in results and "torch" in results:
                err = max(rel_l2(g, w) for g, w in zip(results["ropejit"], results["torch"]))
                row["impls"]["ropejit"]["rel_l2_vs_torch"] = err
                row["impls"]["ropejit"]["ok"] = err < TOLERANCE
            rows.append(row)
            us = {k: v.get("us") for k, v in row["impls"].items()}
            ratio = f"{us['torch'] / us['ropejit']:.2f}x" if us["ropejit"] and us["torch"] else "-"
            share = f"{100 * us['copy'] / us['ropejit']:.1f}%" if us["ropejit"] else "-"
            bad = [k for k, v in row["impls"].items() if v.get("ok") is False or "error" in v]
            cells = " | ".join(f"{us[k]:.2f}" if us.get(k) else "-" for k in impls)
            print(f"| {name} | {tokens} | {moved / 1e6:.2f} MB | {cells} | {ratio} | {share}"
                  + (f" | WRONG/FAILED: {bad} {row['impls']}" if bad else "") + " |", flush=True)
    print("columns: interface | tokens | bytes | ropejit | torch | copy (µs) | torch / ropejit "
          "| copy / ropejit")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
