"""GPU only (skipped, visibly, without CUDA): ropejit.fused.qk_norm_rope on torch tensors
against a float64 reference of the whole chain (per-head RMSNorm -> RoPE -> FP8 or bf16 store ->
KV-cache placement), with every cache byte the call does not address checked unchanged. The
exact (bit-level) checks of every fused variant are the C++ GPU suite's; these check the Python
binding end to end: the right key, pointers, strides and cache addressing."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from conftest import requires_cuda  # noqa: E402
import ropejit.fused  # noqa: E402

pytestmark = [requires_cuda, pytest.mark.gpu]

HQ, HK, D, PAGE, PAGES = 8, 2, 128, 4, 24
POISON = 0x5A


def tables(rows, d):
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return a.cos(), a.sin()


def rms(x, w, eps, one_plus=False):
    w = w.double() + (1.0 if one_plus else 0.0)
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def neox(x, c, s):
    h = x.shape[-1] // 2
    lo, hi = x[..., :h], x[..., h:]
    return torch.cat((lo * c - hi * s, hi * c + lo * s), -1)


def close_fp8(got, want, scale, what):
    """got: e4m3 tensor; want: float64 values before scaling. Within one e4m3 step of
    want * scale, and mostly the round-to-nearest-even neighbour itself."""
    w = want * scale
    g = got.double()
    err = (g.cpu() - w).abs()
    assert bool((err <= w.abs() * 2.0 ** -3 + 2.0 ** -9).all()), f"{what}: max error {err.max()}"
    rne = w.float().to(torch.float8_e4m3fn).view(torch.uint8)
    same = (rne == got.cpu().view(torch.uint8)).double().mean().item()
    assert same >= 0.99, f"{what}: only {same:.3f} of the values are the nearest e4m3"


def close_bf16(got, want, what):
    err = (got.double().cpu() - want).abs()
    assert bool((err <= want.abs() * 2.0 ** -7 + 1e-6).all()), f"{what}: max error {err.max()}"


def dynamic_scale(want):
    """float64 dequantization scale of each head (last dimension) under dynamic FP8."""
    return want.abs().amax(-1).clamp(min=2.0 ** -9) / 448.0


@pytest.mark.parametrize("mode", ["bf16", "fp8", "fp8dyn"])
@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
def test_paged_decode_step_against_float64(mode, kv_layout):
    fp8, dyn = mode != "bf16", mode == "fp8dyn"
    g = torch.Generator().manual_seed(7 + fp8 + dyn + 3 * (kv_layout == "HND"))
    seqs = 5
    held = torch.randint(0, 4 * PAGE, (seqs,), generator=g)  # tokens before this step
    qkv = torch.randn(seqs, HQ + 2 * HK, D, generator=g).to(torch.bfloat16)
    qn = (torch.rand(D, generator=g) + 0.5).to(torch.bfloat16)
    kn = (torch.rand(D, generator=g) + 0.5).to(torch.bfloat16)
    cos64, sin64 = tables(64, D)
    # The page table after the append: each sequence's pages drawn from a shuffled pool.
    pool = torch.randperm(PAGES, generator=g)
    counts = (held + 1 + PAGE - 1) // PAGE
    indptr = torch.zeros(seqs + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(counts, 0)
    indices = pool[:int(indptr[-1])].to(torch.int32)
    last = ((held + 1 - 1) % PAGE + 1).to(torch.int32)
    ids = held.to(torch.int64)  # the new token's position is its index in the sequence

    dev = "cuda"
    qkv_d = qkv.to(dev)
    q, k, v = qkv_d[:, :HQ], qkv_d[:, HQ:HQ + HK], qkv_d[:, HQ + HK:]
    cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    shape = (PAGES, PAGE, HK, D) if kv_layout == "NHD" else (PAGES, HK, PAGE, D)
    k_cache = torch.full(shape, POISON, dtype=torch.uint8, device=dev)
    v_cache = torch.full(shape, POISON, dtype=torch.uint8, device=dev)
    if not fp8:
        k_cache = torch.full(shape, POISON * 257, dtype=torch.int16, device=dev)
        v_cache = torch.full(shape, POISON * 257, dtype=torch.int16, device=dev)
    k_cache, v_cache = k_cache.view(cache_dtype), v_cache.view(cache_dtype)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    q_out = torch.empty(seqs, HQ, D, dtype=torch.float8_e4m3fn, device=dev) if fp8 else None
    skipped = torch.zeros(1, dtype=torch.int32, device=dev)
    out_scale, k_scale, v_scale = 4.0, 2.0, 8.0
    scales = {}
    if dyn:  # poisoned (NaN) scale tensors; the kernel computes each head's scale
        out_scale = k_scale = v_scale = 1.0
        nan = float("nan")
        scales = dict(q_out_scale=torch.full((seqs, HQ), nan, device=dev),
                      k_cache_scales=torch.full(shape[:3], nan, device=dev),
                      v_cache_scales=torch.full(shape[:3], nan, device=dev))

    ropejit.fused.qk_norm_rope(
        q, k, v, layout="thd", cu_seqlens=torch.arange(seqs + 1, dtype=torch.int32, device=dev),
        position_ids=ids.to(dev), cos=cos64.float().to(dev), sin=sin64.float().to(dev),
        norm="rms", q_norm_weight=qn.to(dev), k_norm_weight=kn.to(dev), norm_eps=1e-6,
        q_out=q_out, out_scale=out_scale, write_k=False, k_cache=k_cache, v_cache=v_cache,
        kv_layout=kv_layout, kv_indptr=indptr.to(dev), kv_indices=indices.to(dev),
        kv_last_page_len=last.to(dev), k_scale=k_scale, v_scale=v_scale, skipped=skipped,
        **scales)
    torch.cuda.synchronize()

    x = qkv.double()
    c, s = cos64[ids][:, None], sin64[ids][:, None]
    want_q = neox(rms(x[:, :HQ], qn, 1e-6), c, s)
    want_k = neox(rms(x[:, HQ:HQ + HK], kn, 1e-6), c, s)
    want_v = x[:, HQ + HK:]
    def check_scales(got, want, what):
        """The kernel's scales against float64's; returns the multipliers 448 / a as the kernel
        forms them (an fp32 division: where the exact product lies on an e4m3 tie, its rounded
        multiplier decides the side, and v's products are then exact in float64)."""
        ref = dynamic_scale(want)
        err = (got.double().cpu() - ref).abs()
        assert bool((err <= ref * 2.0 ** -17).all()), f"{what}: scale error {err.max()}"
        a = want.abs().amax(-1).clamp(min=2.0 ** -9).float()
        return (torch.tensor(448.0) / a).double()[..., None]

    if dyn:
        close_fp8(q_out, want_q, check_scales(scales["q_out_scale"], want_q, "q"), "q_out")
    elif fp8:
        close_fp8(q_out, want_q, out_scale, "q_out")
    else:
        close_bf16(q, want_q, "q (in place)")
    # The cache: the addressed rows hold the new k and v; every other byte is unchanged.
    written = torch.zeros(shape[:3], dtype=torch.bool)
    for i in range(seqs):
        page = int(indices[int(indptr[i]) + int(held[i]) // PAGE])
        slot = int(held[i]) % PAGE
        at = (page, slot) if kv_layout == "NHD" else (page, slice(None), slot)
        got_k, got_v = k_cache[at], v_cache[at]  # [HK, D]
        if dyn:
            for name, got, want in (("k", got_k, want_k[i]), ("v", got_v, want_v[i])):
                mul = check_scales(scales[f"{name}_cache_scales"][at], want,
                                   f"{name} scales of sequence {i}")
                close_fp8(got, want, mul, f"{name} of sequence {i}")
        elif fp8:
            close_fp8(got_k, want_k[i], k_scale, f"k of sequence {i}")
            close_fp8(got_v, want_v[i], v_scale, f"v of sequence {i}")
        else:
            close_bf16(got_k, want_k[i], f"k of sequence {i}")
            close_bf16(got_v, want_v[i], f"v of sequence {i}")
        written[at] = True
    untouched = ~written.to(dev)
    for name, now, then in (("k_cache", k_cache, before_k), ("v_cache", v_cache, before_v)):
        a = now.view(torch.uint8).view(*shape[:3], -1)[untouched]
        b = then.view(torch.uint8).view(*shape[:3], -1)[untouched]
        assert torch.equal(a, b), f"{name}: a byte the call does not address changed"
    for name in ("k_cache_scales", "v_cache_scales") if dyn else ():
        assert bool(scales[name][untouched].isnan().all()), f"{name}: an unaddressed scale changed"
    assert int(skipped) == 0
    # k and v are read only (write_k=False), and q too when it goes out as FP8.
    unchanged = slice(0, None) if fp8 else slice(HQ, None)
    assert torch.equal(qkv_d[:, unchanged].cpu(), qkv[:, unchanged])


def test_repeated_torch_calls_take_the_fast_plan_with_their_own_tensors():
    """A repeat of a planned call made of torch tensors is planned from torch's own attributes
    (_call.fast_plan): each call writes its own tensors, and other strides plan again."""
    from ropejit import _call
    g = torch.Generator().manual_seed(5)
    w = (torch.rand(D, generator=g) - 0.5).to(torch.bfloat16)
    cos64, sin64 = tables(64, D)
    cos, sin, wc = cos64.float().cuda(), sin64.float().cuda(), w.cuda()
    cu = torch.tensor([0, 5], dtype=torch.int32, device="cuda")
    _call._PLANS.clear()
    _call._TORCH_PLANS.clear()

    def call(x, ids):
        """Rotates x ([5, HQ + HK, D] on the GPU) in place; returns its float64 expectation."""
        want = neox(rms(x.cpu().double(), w, 1e-6), cos64[ids.cpu()][:, None],
                    sin64[ids.cpu()][:, None])
        ropejit.fused.qk_norm_rope(x[:, :HQ], x[:, HQ:], cos=cos, sin=sin, position_ids=ids,
                                   cu_seqlens=cu, norm="rms", q_norm_weight=wc,
                                   k_norm_weight=wc)
        torch.cuda.synchronize()
        return want

    def fresh():
        ids = torch.randint(0, 64, (5,), generator=g).cuda()
        return torch.randn(5, HQ + HK, D, generator=g).to(torch.bfloat16).cuda(), ids

    x1, ids1 = fresh()
    close_bf16(x1, call(x1, ids1), "first call (planned)")
    assert len(_call._TORCH_PLANS) == 1
    after1 = x1.clone()
    x2, ids2 = fresh()
    close_bf16(x2, call(x2, ids2), "repeated call (fast plan)")
    assert len(_call._TORCH_PLANS) == 1
    assert torch.equal(x1, after1), "the repeated call wrote the first call's tensor"
    # Heads 2 * D elements apart: other strides, planned again.
    wide = torch.zeros(5, HQ + HK, 2 * D, dtype=torch.bfloat16, device="cuda")
    x3 = wide[..., :D]
    x3.copy_(fresh()[0])
    ids3 = fresh()[1]
    close_bf16(x3, call(x3, ids3), "other strides (planned again)")
    assert len(_call._TORCH_PLANS) == 2
    assert bool((wide[..., D:] == 0).all()), "wrote between the heads"


def test_norm_and_rope_without_cache_bshd():
    """QK-RMSNorm (Gemma's 1 + w) and RoPE in place on bshd, computed frequencies, as a video
    or diffusion transformer applies them (no cache)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 6, 2 * HQ, 64, generator=g).to(torch.bfloat16)
    w = (torch.rand(64, generator=g) - 0.5).to(torch.bfloat16)
    qk = x.to("cuda")
    q, k = qk[:, :, :HQ], qk[:, :, HQ:]
    assert ropejit.fused.qk_norm_rope(q, k, layout="bshd", base=10000.0, position_offset=3,
                                      norm="rms_one_plus", q_norm_weight=w.cuda(),
                                      k_norm_weight=w.cuda(), norm_eps=1e-5) == (q, k)
    torch.cuda.synchronize()
    cos64, sin64 = tables(16, 64)
    c, s = cos64[3:9][None, :, None], sin64[3:9][None, :, None]
    want = neox(rms(x.double(), w, 1e-5, one_plus=True), c, s)
    close_bf16(qk, want, "q and k (in place)")
