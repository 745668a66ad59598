"""GPU only (skipped, visibly, without CUDA): torch.compile running the ops (inductor, the
backward too, scaled frequencies and mRoPE through RotaryEmbedding, and CUDA graphs through
mode='reduce-overhead'), CUDA graph capture and replay,
launches on torch's current stream (several streams), another device than the current one,
a key's first use during a capture refused, and DLPack / __cuda_array_interface__ producers
other than torch (CuPy and JAX when installed)."""

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import references as ref  # noqa: E402
from conftest import ROOT, requires_cuda  # noqa: E402
import ropejit  # noqa: E402
from ropejit import ops  # noqa: E402
from ropejit.dropin import flash_attn, hf, vllm  # noqa: E402
from ropejit.nn import RotaryEmbedding  # noqa: E402

pytestmark = [requires_cuda, pytest.mark.gpu]


def tables(rows, rotary_dim, device="cuda"):
    inv = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    return angles.cos().float().to(device), angles.sin().float().to(device)


def expected(x, cos, sin, ids):
    """float64 neox rotation of x [b, s, h, d] at ids [b*s] (tables on any device)."""
    b, s = x.shape[:2]
    c = cos.cpu()[ids.cpu()].view(b, s, 1, -1)
    si = sin.cpu()[ids.cpu()].view(b, s, 1, -1)
    return ref.rotate(x.cpu(), c, si, False)


def hf_inputs(dtype=torch.bfloat16, batch=2, seq=16):
    q = torch.randn(batch, 8, seq, 128, device="cuda", dtype=dtype)
    k = torch.randn(batch, 2, seq, 128, device="cuda", dtype=dtype)
    cos, sin = tables(seq, 128)
    cos_full = torch.cat((cos, cos), -1)[None].to(dtype)
    sin_full = torch.cat((sin, sin), -1)[None].to(dtype)
    return q, k, cos_full, sin_full


def test_repeated_apply_takes_the_fast_plan_with_its_own_tensors():
    """ropejit.apply repeated with torch tensors of the same shapes (_call.fast_plan): each call
    reads and writes its own tensors; out of place, so the inputs stay as they were."""
    from ropejit import _call
    cos, sin = tables(64, 128)
    _call._PLANS.clear()
    _call._TORCH_PLANS.clear()
    outs = []
    for _ in range(3):
        q = torch.randn(2, 5, 8, 128, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 5, 2, 128, device="cuda", dtype=torch.bfloat16)
        ids = torch.randint(0, 64, (10,), device="cuda")
        q_in, k_in = q.clone(), k.clone()
        q2, k2 = torch.empty_like(q), torch.empty_like(k)
        ropejit.apply(q, k, cos=cos, sin=sin, position_ids=ids, q_out=q2, k_out=k2)
        torch.cuda.synchronize()
        assert torch.equal(q, q_in) and torch.equal(k, k_in)
        for got, x in ((q2, q), (k2, k)):
            ref.assert_close(got, expected(x, cos, sin, ids))
        outs.append((q2, q2.clone()))
        assert len(_call._TORCH_PLANS) == 1
    for got, kept in outs:  # later calls did not write earlier outputs
        assert torch.equal(got, kept)


@pytest.mark.long
def test_torch_compile_fullgraph_runs_the_op():
    def f(q, k, cos, sin):
        q2, k2 = hf.apply_rotary_pos_emb(q, k, cos, sin)
        return q2 * 2, k2 + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    for seq in (16, 33):  # a second shape: recompiled (maybe dynamic), still one graph
        q, k, cos, sin = hf_inputs(seq=seq)
        want = f(q, k, cos, sin)
        got = compiled(q, k, cos, sin)
        torch.cuda.synchronize()
        for g, w in zip(got, want):
            assert torch.equal(g, w)


@pytest.mark.long
def test_torch_compile_backward():
    def loss(q, k, cos, sin, w):
        q2, k2 = hf.apply_rotary_pos_emb(q, k, cos, sin)
        return (q2 * w).sum() + (k2 * k2).sum()

    torch._dynamo.reset()
    q, k, cos, sin = hf_inputs(dtype=torch.float32)
    w = torch.randn_like(q)
    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True)):
        qq, kk = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
        fn(qq, kk, cos, sin, w).backward()
        grads.append((qq.grad, kk.grad))
    torch.cuda.synchronize()
    for eager, compiled in zip(*grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.long
def test_torch_compile_reduce_overhead_in_place():
    # vLLM's op mutates its inputs; inductor's CUDA graphs replay it.
    def step(positions, query, key, cache):
        vllm.rotary_embedding(positions, query, key, 128, cache, True)
        return query * 1, key * 1

    torch._dynamo.reset()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    cos, sin = tables(4096, 128)
    cache = torch.cat((cos, sin), -1).to(torch.bfloat16)
    for _ in range(4):
        positions = torch.randint(0, 4096, (64,), device="cuda")
        query = torch.randn(64, 32 * 128, device="cuda", dtype=torch.bfloat16)
        key = torch.randn(64, 8 * 128, device="cuda", dtype=torch.bfloat16)
        q_eager, k_eager = query.clone(), key.clone()
        vllm.rotary_embedding(positions, q_eager, k_eager, 128, cache, True)
        q_got, k_got = compiled(positions, query, key, cache)
        torch.cuda.synchronize()
        assert torch.equal(q_got, q_eager) and torch.equal(k_got, k_eager)


@pytest.mark.long
def test_torch_compile_scaled_and_mrope_rotary_embeddings():
    # Scaling parameters and mRoPE sections travel as constant lists through the op's schema:
    # one graph, the same values as eager, and the backward through the same frequencies.
    hf_data = ROOT / "tests" / "data" / "hf"
    llama = RotaryEmbedding.from_config(hf_data / "llama3.1-8b.json")
    vl = RotaryEmbedding.from_config(hf_data / "qwen3-vl-8b.json")

    def f(q, k, ids, ids3):
        q2, k2 = llama.apply(q, k, ids)
        cos, sin = vl(q, ids3)
        q3, _ = vl.apply(q, None, ids3)
        return q2 * 2, k2 + 1, cos, sin, q3

    torch._dynamo.reset()
    q = torch.randn(2, 32, 16, 128, device="cuda", requires_grad=True)
    k = torch.randn(2, 8, 16, 128, device="cuda")
    ids = torch.randint(0, 100000, (2, 16), device="cuda")
    ids3 = torch.randint(0, 4096, (3, 2, 16), device="cuda")
    want = f(q, k, ids, ids3)
    got = torch.compile(f, fullgraph=True)(q, k, ids, ids3)
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    (grad_eager,) = torch.autograd.grad(want[0].sum(), q)
    (grad_compiled,) = torch.autograd.grad(got[0].sum(), q)
    assert torch.equal(grad_compiled, grad_eager)


def test_cuda_graph_capture_and_replay():
    q = torch.randn(1, 64, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 64, 8, 128, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 64, 4, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = tables(8192, 128)
    ids = torch.randint(0, 8192, (64,), device="cuda")
    kwargs = dict(cos=cos, sin=sin, position_ids=ids)
    ops.rope(q, k, **kwargs)  # first use outside the capture: compiles and loads
    flash_attn.apply_rotary_emb(x, cos, sin, inplace=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q_out, k_out = ops.rope(q, k, **kwargs)
        flash_attn.apply_rotary_emb(x, cos, sin, inplace=True)
    for _ in range(3):
        q.copy_(torch.randn_like(q))
        k.copy_(torch.randn_like(k))
        ids.copy_(torch.randint(0, 8192, (64,), device="cuda"))
        x0 = torch.randn_like(x)
        x.copy_(x0)
        graph.replay()
        torch.cuda.synchronize()
        want_q, want_k = ops.rope(q, k, **kwargs)
        want_x = flash_attn.apply_rotary_emb(x0, cos, sin)
        torch.cuda.synchronize()
        assert torch.equal(q_out, want_q) and torch.equal(k_out, want_k)
        assert torch.equal(x, want_x)
        ref.assert_close(q_out, expected(q, cos, sin, ids))


@pytest.mark.parametrize("captured", [False, True])
def test_back_to_back_launches_see_each_others_writes(captured):
    """A chain of calls on one stream, each reading what the one before it wrote (out of place
    into NaN-poisoned buffers), back to back, eagerly and inside a CUDA graph. On sm_90 every
    launch is a programmatic dependent launch that each kernel releases at its entry, so a
    kernel that read before its producer had finished would rotate NaNs. A spin kernel first
    holds the stream, so that the eager calls' launches queue up behind it and run back to back
    (each call's host time is far longer than its kernel)."""
    cos, sin = tables(64, 128)
    n = 12
    q = torch.randn(1, 512, 8, 128, device="cuda")
    k = torch.randn(1, 512, 2, 128, device="cuda")
    ids = torch.randint(0, 64, (512,), device="cuda")
    qs = [q] + [torch.empty_like(q) for _ in range(n)]
    ks = [k] + [torch.empty_like(k) for _ in range(n)]

    def poison():
        for t in qs[1:] + ks[1:]:
            t.fill_(float("nan"))

    def chain():
        for i in range(n):
            ropejit.apply(qs[i], ks[i], cos=cos, sin=sin, position_ids=ids, q_out=qs[i + 1],
                          k_out=ks[i + 1])
    chain()  # compiles and plans first (outside the capture): the checked run only launches
    torch.cuda.synchronize()
    if captured:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain()
        poison()
        torch.cuda._sleep(1_000_000)
        graph.replay()
    else:
        poison()
        torch.cuda._sleep(50_000_000)  # ~25 ms: longer than the twelve calls' host time
        chain()
    torch.cuda.synchronize()
    for got, x in ((qs[-1], q), (ks[-1], k)):
        want = x.double()
        for _ in range(n):
            want = expected(want, cos, sin, ids)
        torch.testing.assert_close(got.double().cpu(), want, rtol=1e-5, atol=1e-5)


def test_first_use_during_a_capture_is_refused():
    q = torch.randn(1, 8, 4, 48, device="cuda", dtype=torch.float16)  # a key no test uses
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ropejit.Error, match="captur"):
        with torch.cuda.graph(graph):
            ops.rope_(q, base=777.0)


def test_launches_on_the_current_stream():
    # The copy into q is queued behind a ~50 ms sleep on a side stream; a launch on any other
    # stream would rotate q before the copy lands, and the copy would then overwrite it.
    cos, sin = tables(256, 128)
    streams = [torch.cuda.Stream() for _ in range(2)]
    sources = [torch.randn(2, 32, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in streams]
    targets = [torch.zeros_like(s) for s in sources]
    ops.rope_(targets[0], cos=cos, sin=sin)  # compile outside the timed part
    torch.cuda.synchronize()
    for stream, src, dst in zip(streams, sources, targets):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(50_000_000)
            dst.copy_(src)
            ops.rope_(dst, cos=cos, sin=sin)
    torch.cuda.synchronize()
    ids = torch.arange(32).repeat(2)
    for src, dst in zip(sources, targets):
        ref.assert_close(dst, expected(src, cos, sin, ids))


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs two GPUs")
def test_tensors_on_another_device_than_the_current_one():
    cos, sin = tables(64, 64, device="cuda:1")
    q = torch.randn(1, 8, 2, 64, device="cuda:1")
    with torch.cuda.device(0):
        out, _ = ops.rope(q, cos=cos, sin=sin)
    torch.cuda.synchronize(1)
    ref.assert_close(out, expected(q, cos, sin, torch.arange(8)))
    with pytest.raises(ropejit.InvalidArgument, match=r"cos is on cuda:0 but q is on cuda:1"):
        ops.rope(q, cos=cos.to("cuda:0"), sin=sin.to("cuda:0"))


class DLPackOnly:
    """Exposes only DLPack, as a JAX array does."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


class CudaArrayOnly:
    """Exposes only __cuda_array_interface__, as Numba and CuPy do (no bf16 there)."""

    def __init__(self, t):
        self.__cuda_array_interface__ = t.__cuda_array_interface__


@pytest.mark.parametrize("wrap, dtype", [(DLPackOnly, torch.bfloat16),
                                         (CudaArrayOnly, torch.float16)])
def test_other_producers(wrap, dtype):
    q = torch.randn(2, 16, 4, 64, device="cuda", dtype=dtype)
    k = torch.randn(2, 16, 1, 64, device="cuda", dtype=dtype)
    q0, k0 = q.clone(), k.clone()
    cos, sin = tables(32, 64)
    ids = torch.randint(0, 32, (32,), device="cuda", dtype=torch.int32)
    torch.cuda.synchronize()
    ropejit.apply(wrap(q), wrap(k), cos=wrap(cos), sin=wrap(sin), position_ids=wrap(ids))
    torch.cuda.synchronize()  # the legacy default stream (or the producer's)
    ref.assert_close(q, expected(q0, cos, sin, ids))
    ref.assert_close(k, expected(k0, cos, sin, ids))


def test_cupy_if_installed():
    cupy = pytest.importorskip("cupy")
    q = cupy.random.standard_normal((1, 8, 2, 64), dtype=cupy.float32)
    q0 = torch.as_tensor(q, device="cuda").clone()
    ropejit.apply(q, base=10000.0)
    cupy.cuda.runtime.deviceSynchronize()
    inv = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    angles = torch.arange(8, dtype=torch.float64)[:, None] * inv
    ref.assert_close(torch.as_tensor(q, device="cuda"),
                     ref.rotate(q0.cpu(), angles.cos()[None, :, None], angles.sin()[None, :, None],
                                False))


def test_jax_if_installed():
    # JAX would otherwise take most of the GPU's memory from the torch tests.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX sees no GPU")
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 8, 2, 64), dtype=jax.numpy.bfloat16)
    out = torch.empty(1, 8, 2, 64, device="cuda", dtype=torch.bfloat16)
    # JAX arrays are immutable: read from JAX (DLPack, bf16), write into a torch output.
    ropejit.apply(x, q_out=out, base=10000.0)
    torch.cuda.synchronize()
    x0 = torch.from_dlpack(x).cpu()
    inv = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    angles = torch.arange(8, dtype=torch.float64)[:, None] * inv
    ref.assert_close(out, ref.rotate(x0, angles.cos()[None, :, None], angles.sin()[None, :, None],
                                     False))


def _fused_projection_want(x, w64, nw, norm, ids, qh, kvh, d, style, tables):
    """float64 RMSNorm -> projection (weight rows w64, already decoded) -> RoPE as the fused
    kernel computes it: x * w rounded to bf16 once, rstd on the sums; cos/sin from `tables` (the
    fp32 values the kernel reads) or computed with base 10000."""
    tokens = x.shape[0]
    x64 = x.double()
    if norm == "none":
        a = x64
    else:
        wf = (1 + nw.float()) if norm == "rms_one_plus" else nw.float()
        a = (x.float() * wf).bfloat16().double()
    y = a @ w64.t()
    if norm != "none":
        y = y / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + float(torch.tensor(1e-6).float()))
    y = y.view(tokens, qh + 2 * kvh, d)
    if tables is None:
        inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cuda") / d)
        ang = ids.double()[:, None] * inv
        c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]
    else:
        c, s = tables[0].double()[ids][:, None, :], tables[1].double()[ids][:, None, :]
    rot = y[:, :qh + kvh]
    if style == "neox":
        lo, hi = rot[..., :d // 2], rot[..., d // 2:]
        rot = torch.cat((lo * c - hi * s, hi * c + lo * s), dim=-1)
    else:
        ev, od = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack((ev * c - od * s, od * c + ev * s), dim=-1).flatten(-2)
    return torch.cat((rot, y[:, qh + kvh:]), dim=1)


@pytest.mark.parametrize("tokens,norm,style,table", [
    (1, "rms", "neox", True), (5, "rms_one_plus", "gptj", False), (16, "none", "neox", True),
    (37, "rms", "gptj", True)])
def test_qkv_projection_against_float64(tokens, norm, style, table):
    """ropejit.decode.qkv_projection against RMSNorm -> projection -> RoPE in float64, with the
    activation rounded once as the kernel rounds it (x * w to bf16), tolerance a few bf16 ulps."""
    from ropejit import decode
    torch.manual_seed(tokens)
    hidden, qh, kvh, d = 512, 4, 2, 64
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w = ((torch.rand((qh + 2 * kvh) * d, hidden, device="cuda") * 2 - 1) * (3 / hidden) ** 0.5)
    w = w.bfloat16()
    nw = torch.rand(hidden, device="cuda") + (-0.5 if norm == "rms_one_plus" else 0.5)
    nw = nw.bfloat16()
    ids = torch.randint(0, 4096, (tokens,), device="cuda")
    cos, sin = tables(4096, d)
    q, k, v = decode.qkv_projection(x, w, q_heads=qh, kv_heads=kvh, head_dim=d,
                                    norm_weight=None if norm == "none" else nw, eps=1e-6,
                                    norm=norm, position_ids=ids,
                                    cos=cos if table else None, sin=sin if table else None,
                                    style=style, path="fused")
    want = _fused_projection_want(x, w.double(), nw, norm, ids, qh, kvh, d, style,
                                  (cos, sin) if table else None)
    got = torch.cat((q, k, v), dim=1).double()
    err = (got - want).abs()
    assert torch.all(err <= 2 ** -7 * want.abs() + 1e-3), float((err - 2 ** -7 * want.abs()).max())
    assert q.shape == (tokens, qh, d) and v.shape == (tokens, kvh, d)


@pytest.mark.parametrize("tokens,norm,style", [(1, "rms", "neox"), (9, "none", "gptj"),
                                                (33, "rms_one_plus", "neox")])
def test_qkv_projection_e4m3_weights_against_float64(tokens, norm, style):
    """float8_e4m3fn weights with a float32 scale per row: float64 of (a @ codes.T) * scale * rstd,
    then RoPE, as the kernel computes it (codes widened exactly, the scale on the fp32 sums)."""
    from ropejit import decode
    torch.manual_seed(100 + tokens)
    hidden, qh, kvh, d = 512, 4, 2, 64
    rows = (qh + 2 * kvh) * d
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w8 = (torch.randn(rows, hidden, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = (torch.rand(rows, device="cuda") + 0.5) * (1 / hidden) ** 0.5 / 64
    nw = (torch.rand(hidden, device="cuda") + (-0.5 if norm == "rms_one_plus" else 0.5)).bfloat16()
    ids = torch.randint(0, 4096, (tokens,), device="cuda")
    q, k, v = decode.qkv_projection(x, w8, q_heads=qh, kv_heads=kvh, head_dim=d,
                                    norm_weight=None if norm == "none" else nw, norm=norm,
                                    position_ids=ids, style=style, weight_scale=scale,
                                    path="fused")
    want = _fused_projection_want(x, w8.double() * scale.double()[:, None], nw, norm, ids, qh,
                                  kvh, d, style, None)
    got = torch.cat((q, k, v), dim=1).double()
    err = (got - want).abs()
    assert torch.all(err <= 2 ** -7 * want.abs() + 1e-3), float((err - 2 ** -7 * want.abs()).max())
    # The scale goes with e4m3 weights only, and they need it.
    with pytest.raises(ropejit.InvalidArgument, match="give weight_scale"):
        decode.qkv_projection(x, w8, q_heads=qh, kv_heads=kvh, head_dim=d, norm="none")
    with pytest.raises(ropejit.InvalidArgument, match="weight_scale must be a contiguous float32"):
        decode.qkv_projection(x, w8, q_heads=qh, kv_heads=kvh, head_dim=d, norm="none",
                              weight_scale=scale.half())
    with pytest.raises(ropejit.InvalidArgument, match="weight_scale is for float8_e4m3fn"):
        decode.qkv_projection(x, w8.bfloat16(), q_heads=qh, kv_heads=kvh, head_dim=d,
                              norm="none", weight_scale=scale)


def _decode_pages(tokens, pages, page_size, bad=-1):
    """FlashInfer's page table for a decode step, each token the newest of its own sequence of
    one or two pages (from a shuffled pool of `pages`); sequence `bad` gets a last-page length of
    0 (not written). Returns the addressing arguments and each token's (page, row) or None."""
    perm = torch.randperm(pages).tolist()
    indptr, indices, last, dest = [0], [], [], []
    for t in range(tokens):
        indices += perm[2 * t:2 * t + 1 + t % 2]
        indptr.append(len(indices))
        last.append(1 + (7 * t) % page_size)
        dest.append((indices[-1], last[-1] - 1))
    if 0 <= bad < tokens:
        last[bad] = 0
        dest[bad] = None
    addressing = dict(kv_indptr=torch.tensor(indptr, dtype=torch.int32, device="cuda"),
                      kv_indices=torch.tensor(indices, dtype=torch.int32, device="cuda"),
                      kv_last_page_len=torch.tensor(last, dtype=torch.int32, device="cuda"))
    return addressing, dest


@pytest.mark.parametrize("tokens,fp8,write_kv,mode", [
    (1, False, True, "slots"), (9, True, True, "slots"), (33, False, False, "slots"),
    (64, True, False, "slots"), (5, False, True, "paged"), (40, True, False, "paged"),
    (3, True, True, "contiguous"), (17, False, False, "contiguous")])
def test_qkv_projection_appends_to_a_kv_cache(tokens, fp8, write_kv, mode):
    """k and v into a [pages, page_size, kv_heads, head_dim] cache (vLLM's slot_mapping,
    FlashInfer's paged indices with each token the newest of its sequence, or a contiguous cache
    by sequence length): the same bits as the k/v outputs (the same fp32 values rounded once;
    FP8: within one e4m3 step of the scaled output), other rows untouched, a row outside the
    cache counted in skipped."""
    from ropejit import decode
    torch.manual_seed(300 + tokens)
    hidden, qh, kvh, d, page_size = 512, 4, 2, 64, 16
    pages = max(8, 2 * tokens + 2) if mode != "contiguous" else tokens + 1
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w = ((torch.rand((qh + 2 * kvh) * d, hidden, device="cuda") * 2 - 1) * (3 / hidden) ** 0.5)
    w = w.bfloat16()
    nw = (torch.rand(hidden, device="cuda") + 0.5).bfloat16()
    ids = torch.randint(0, 4096, (tokens,), device="cuda")
    dest = []  # (page, row) per token, None where nothing is written
    bad = 2 if tokens > 2 else -1
    if mode == "slots":
        slots = torch.randperm(pages * page_size, device="cuda")[:tokens].clone()
        if tokens > 2:
            slots[1] = -1                   # padding: not written, not counted
            slots[bad] = pages * page_size + 5
        dest = [None if not 0 <= int(v) < pages * page_size else divmod(int(v), page_size)
                for v in slots]
        addressing = dict(slot_mapping=slots)
    elif mode == "paged":
        addressing, dest = _decode_pages(tokens, pages, page_size, bad)
    else:
        held = [(5 * t) % page_size for t in range(tokens)]
        dest = [(t, held[t]) for t in range(tokens)]
        if tokens > 2:
            held[bad] = page_size  # full: not written, counted
            dest[bad] = None
        addressing = dict(cache_seqlens=torch.tensor(held, dtype=torch.int32, device="cuda"))
    cache_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    k_cache = torch.full((pages, page_size, kvh, d), -3.0, device="cuda").to(cache_dtype)
    v_cache = k_cache.clone()
    skipped = torch.zeros(1, dtype=torch.int32, device="cuda")
    k_scale, v_scale = (4.0, 8.0) if fp8 else (1.0, 1.0)
    # The fused path both times (from 33 tokens the automatic choice with k and v written is the
    # unfused one, whose roundings differ; test_qkv_projection_chunk_into_a_cache covers it).
    kw = dict(q_heads=qh, kv_heads=kvh, head_dim=d, norm_weight=nw, position_ids=ids,
              k_cache=k_cache, v_cache=v_cache, k_scale=k_scale, v_scale=v_scale, path="fused",
              **addressing)
    q, k, v = decode.qkv_projection(x, w, skipped=skipped, write_kv=True, **kw)
    q2, k2, v2 = decode.qkv_projection(x, w, write_kv=write_kv, **kw)
    torch.cuda.synchronize()
    assert torch.equal(q, q2)
    assert (k2 is None and v2 is None) == (not write_kv)
    assert int(skipped.item()) == (1 if tokens > 2 else 0)
    written = torch.zeros(pages, page_size, dtype=torch.bool, device="cuda")
    for t in range(tokens):
        if dest[t] is None:
            continue
        page, row = dest[t]
        written[page, row] = True
        for got, want, scale in ((k_cache[page, row], k[t], k_scale),
                                 (v_cache[page, row], v[t], v_scale)):
            if fp8:
                ref = want.float() * scale
                err = (got.float() - ref).abs()
                assert torch.all(err <= ref.abs() * 2 ** -3 + 2 ** -9), float(err.max())
            else:
                assert torch.equal(got, want)
    assert torch.all(k_cache[~written].float() == -3.0)
    assert torch.all(v_cache[~written].float() == -3.0)


@pytest.mark.parametrize("tokens,sequences,path", [(3, 3, "fused"), (40, 2, "unfused"),
                                                    (6, 2, "fused")])
def test_qkv_projection_appends_to_an_hnd_cache(tokens, sequences, path):
    """kv_layout="HND" ([pages, kv_heads, page_size, head_dim], transformers' StaticCache per
    batch row): the same bits at the same rows as the NHD cache of the same call, transposed,
    on both paths and with a chunk's cu_seqlens; other rows untouched; a layout that is not one
    of the two, or a cache that does not match it, is refused naming it."""
    from ropejit import decode
    torch.manual_seed(700 + tokens)
    hidden, qh, kvh, d, page_size = 512, 4, 2, 64, 64
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w = ((torch.rand((qh + 2 * kvh) * d, hidden, device="cuda") * 2 - 1) * (3 / hidden) ** 0.5)
    w = w.bfloat16()
    nw = (torch.rand(hidden, device="cuda") + 0.5).bfloat16()
    ids = torch.randint(0, 4096, (tokens,), device="cuda")
    held = torch.tensor([(9 * b) % 7 for b in range(sequences)], dtype=torch.int32,
                        device="cuda")
    kw = dict(q_heads=qh, kv_heads=kvh, head_dim=d, norm_weight=nw, position_ids=ids,
              cache_seqlens=held, path=path)
    if sequences != tokens:
        kw["cu_seqlens"] = torch.tensor([0, tokens // 2, tokens], dtype=torch.int32,
                                        device="cuda")
    nhd = [torch.full((sequences, page_size, kvh, d), -3.0, device="cuda").bfloat16()
           for _ in range(2)]
    hnd = [torch.full((sequences, kvh, page_size, d), -3.0, device="cuda").bfloat16()
           for _ in range(2)]
    q, k, v = decode.qkv_projection(x, w, k_cache=nhd[0], v_cache=nhd[1], **kw)
    q2, k2, v2 = decode.qkv_projection(x, w, k_cache=hnd[0], v_cache=hnd[1], kv_layout="HND",
                                       **kw)
    torch.cuda.synchronize()
    assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, v2)
    assert bool((nhd[0] != -3.0).any())
    for a, b in zip(nhd, hnd):
        assert torch.equal(a, b.transpose(1, 2))
    with pytest.raises(ropejit.InvalidArgument, match=r"kv_layout \('BHSD'\) must be one of"):
        decode.qkv_projection(x, w, k_cache=hnd[0], v_cache=hnd[1], kv_layout="BHSD", **kw)
    wide = torch.zeros(sequences, page_size, kvh, d, device="cuda").bfloat16()
    with pytest.raises(ropejit.InvalidArgument, match=r"k_cache must be HND \[pages, kv_heads"):
        decode.qkv_projection(x, w, k_cache=wide, v_cache=wide, kv_layout="HND", **kw)


@pytest.mark.parametrize("tokens,mode", [(1, "slots"), (40, "slots"), (5, "paged"),
                                         (64, "paged")])
def test_qkv_projection_dynamic_fp8_cache(tokens, mode):
    """A float8_e4m3fn cache with a scale per cached row and head (k_cache_scales,
    v_cache_scales): the unfused path at every token count; each scale is the head's amax / 448
    (of the fp32 values the returned bf16 k and v round), each code times its scale gives the
    value back within half an e4m3 step; rows and scales not addressed stay untouched; the
    fused path is refused."""
    from ropejit import decode
    torch.manual_seed(900 + tokens)
    hidden, qh, kvh, d, page_size = 512, 4, 2, 64, 16
    pages = 2 * tokens + 2
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w = ((torch.rand((qh + 2 * kvh) * d, hidden, device="cuda") * 2 - 1) * (3 / hidden) ** 0.5)
    w = w.bfloat16()
    nw = (torch.rand(hidden, device="cuda") + 0.5).bfloat16()
    ids = torch.randint(0, 4096, (tokens,), device="cuda")
    if mode == "slots":
        slots = torch.randperm(pages * page_size, device="cuda")[:tokens].clone()
        dest = [divmod(int(v), page_size) for v in slots]
        addressing = dict(slot_mapping=slots)
    else:
        addressing, dest = _decode_pages(tokens, pages, page_size)
    e4m3 = torch.float8_e4m3fn
    k_cache = torch.zeros(pages, page_size, kvh, d, dtype=torch.uint8, device="cuda").view(e4m3)
    v_cache = torch.zeros_like(k_cache.view(torch.uint8)).view(e4m3)
    k_scales = torch.full((pages, page_size, kvh), -1.0, device="cuda")
    v_scales = k_scales.clone()
    kw = dict(q_heads=qh, kv_heads=kvh, head_dim=d, norm_weight=nw, position_ids=ids,
              k_cache=k_cache, v_cache=v_cache, k_cache_scales=k_scales,
              v_cache_scales=v_scales, **addressing)
    with pytest.raises(ropejit.InvalidArgument, match="args.path is fused"):
        decode.qkv_projection(x, w, path="fused", **kw)
    q, k, v = decode.qkv_projection(x, w, **kw)
    torch.cuda.synchronize()
    written = torch.zeros(pages, page_size, dtype=torch.bool, device="cuda")
    for t, (page, row) in enumerate(dest):
        written[page, row] = True
        for cache, scales, want in ((k_cache, k_scales, k[t]), (v_cache, v_scales, v[t])):
            want = want.float()  # [kvh, d], the bf16 rounding of the kernel's fp32 values
            amax = want.abs().amax(-1).clamp_min(2 ** -9)
            s = scales[page, row]
            assert torch.all((s * 448 - amax).abs() <= amax * 2 ** -7), (t, s * 448, amax)
            # Half an e4m3 step (2^-4 relative; subnormal codes: half of 2^-9 code units, times
            # the scale), and the bf16 rounding of the value returned in k / v.
            got = cache[page, row].float() * s[:, None]
            err = (got - want).abs()
            assert torch.all(err <= want.abs() * (2 ** -4 + 2 ** -7) + s[:, None] * 2 ** -9), \
                float(err.max())
    assert torch.all(k_cache.view(torch.uint8)[~written] == 0)
    assert torch.all(v_cache.view(torch.uint8)[~written] == 0)
    assert torch.all(k_scales[~written] == -1.0) and torch.all(v_scales[~written] == -1.0)


@pytest.mark.parametrize("mode", ["paged", "contiguous"])
@pytest.mark.parametrize("path", ["fused", "unfused", "auto"])
def test_qkv_projection_chunk_into_a_cache(mode, path):
    """A prefill chunk: cu_seqlens groups 70 tokens into sequences (one empty); each sequence's
    tokens take its last positions after the append (paged: across its pages, last_page_len
    counting them) or the rows after seq_lens (contiguous). The cache rows hold the call's own
    k and v (bf16: the same bits), every other row untouched, on each path."""
    from ropejit import decode
    torch.manual_seed(400)
    hidden, qh, kvh, d, page_size = 512, 4, 2, 64, 16
    counts = [30, 0, 25, 15]
    tokens = sum(counts)
    cu = [0]
    for n in counts:
        cu.append(cu[-1] + n)
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w = ((torch.rand((qh + 2 * kvh) * d, hidden, device="cuda") * 2 - 1) * (3 / hidden) ** 0.5)
    w = w.bfloat16()
    nw = (torch.rand(hidden, device="cuda") + 0.5).bfloat16()
    ids = torch.randint(0, 4096, (tokens,), device="cuda")
    dest = []
    if mode == "paged":
        pages = 40
        perm = torch.randperm(pages).tolist()
        indptr, indices, last = [0], [], []
        for b, n in enumerate(counts):
            held = 7 + 9 * b                 # before the append
            after = held + n
            npages = -(-after // page_size)
            mine = perm[:npages]
            perm = perm[npages:]
            indices += mine
            indptr.append(len(indices))
            last.append(after - (npages - 1) * page_size)
            dest += [(mine[p // page_size], p % page_size) for p in range(held, after)]
        addressing = dict(kv_indptr=torch.tensor(indptr, dtype=torch.int32, device="cuda"),
                          kv_indices=torch.tensor(indices, dtype=torch.int32, device="cuda"),
                          kv_last_page_len=torch.tensor(last, dtype=torch.int32, device="cuda"))
    else:
        pages, page_size = len(counts), 64
        held = [3, 60, 11, 0]
        for b, n in enumerate(counts):
            dest += [(b, held[b] + i) for i in range(n)]
        addressing = dict(cache_seqlens=torch.tensor(held, dtype=torch.int32, device="cuda"))
    k_cache = torch.full((pages, page_size, kvh, d), -3.0, device="cuda").bfloat16()
    v_cache = k_cache.clone()
    skipped = torch.zeros(1, dtype=torch.int32, device="cuda")
    q, k, v = decode.qkv_projection(
        x, w, q_heads=qh, kv_heads=kvh, head_dim=d, norm_weight=nw, position_ids=ids,
        k_cache=k_cache, v_cache=v_cache, skipped=skipped, path=path,
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device="cuda"), **addressing)
    torch.cuda.synchronize()
    assert int(skipped.item()) == 0
    written = torch.zeros(pages, page_size, dtype=torch.bool, device="cuda")
    for t, (page, row) in enumerate(dest):
        written[page, row] = True
        assert torch.equal(k_cache[page, row], k[t]), (t, page, row)
        assert torch.equal(v_cache[page, row], v[t]), (t, page, row)
    assert torch.all(k_cache[~written].float() == -3.0)
    assert torch.all(v_cache[~written].float() == -3.0)
    if mode == "paged" and path == "fused":
        with pytest.raises(ropejit.InvalidArgument, match="cu_seqlens places a chunk's tokens"):
            decode.qkv_projection(
                x, w, q_heads=qh, kv_heads=kvh, head_dim=d, norm_weight=nw, position_ids=ids,
                k_cache=k_cache, v_cache=v_cache, slot_mapping=ids,
                cu_seqlens=torch.tensor(cu, dtype=torch.int32, device="cuda"))
        with pytest.raises(ropejit.InvalidArgument, match="kv_indptr must be a contiguous 1-d "
                                                          "torch.int32 tensor of 6 entries"):
            decode.qkv_projection(
                x, w, q_heads=qh, kv_heads=kvh, head_dim=d, norm_weight=nw, position_ids=ids,
                k_cache=k_cache, v_cache=v_cache, **addressing,
                cu_seqlens=torch.tensor(cu + [tokens], dtype=torch.int32, device="cuda"))


@pytest.mark.parametrize("tokens,act,merged", [(1, "silu", True), (12, "gelu_tanh", False),
                                               (64, "silu", False)])
def test_ffn_gate_up_e4m3_weights_against_float64(tokens, act, merged):
    """The FFN's gate/up with float8_e4m3fn weights and a float32 scale per row (merged with
    weight_scale, or separate with gate_scale / up_scale); the fused path (both paths:
    test_ffn_gate_up_paths_against_float64)."""
    from ropejit import decode
    torch.manual_seed(200 + tokens)
    hidden, inter = 1024, 256
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w8 = (torch.randn(2 * inter, hidden, device="cuda") * 64).clamp(-448, 448)
    w8 = w8.to(torch.float8_e4m3fn)
    scale = (torch.rand(2 * inter, device="cuda") + 0.5) * 3 * (1 / hidden) ** 0.5 / 64
    nw = (torch.rand(hidden, device="cuda") + 0.5).bfloat16()
    if merged:
        kw = dict(weight=w8, weight_scale=scale)
    else:
        kw = dict(gate_weight=w8[:inter].clone(), up_weight=w8[inter:].clone(),
                  gate_scale=scale[:inter].clone(), up_scale=scale[inter:].clone())
    got = decode.ffn_gate_up(x, norm_weight=nw, eps=1e-6, act=act, path="fused", **kw).double()
    x64 = x.double()
    rstd = 1 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + float(torch.tensor(1e-6).float()))
    a = (x.float() * nw.float()).bfloat16().double()
    gu = (a @ w8.double().t()) * scale.double() * rstd
    g, u = gu[:, :inter], gu[:, inter:]
    if act == "silu":
        s = g / (1 + torch.exp(-g))
    else:
        s = 0.5 * g * (1 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
    want, mag = s * u, (s.abs() + g.abs()) * u.abs() + s.abs() * u.abs()
    err = (got - want).abs()
    assert torch.all(err <= 2 ** -7 * mag + 2 ** -8 * want.abs() + 1e-4), float(err.max())
    with pytest.raises(ropejit.InvalidArgument, match="give gate_scale"):
        decode.ffn_gate_up(x, gate_weight=w8[:inter], up_weight=w8[inter:], norm_weight=nw)
    with pytest.raises(ropejit.InvalidArgument, match="weight_scale goes with the merged weight"):
        decode.ffn_gate_up(x, gate_weight=w8[:inter], up_weight=w8[inter:], norm_weight=nw,
                           weight_scale=scale)
    with pytest.raises(ropejit.InvalidArgument, match="all be float8_e4m3fn or all be"):
        decode.ffn_gate_up(x, gate_weight=w8[:inter], up_weight=w8[inter:].bfloat16(),
                           gate_scale=scale[:inter], norm_weight=nw)


def _weights(rows, hidden, kind, size):
    """Weights for the path tests: bf16 uniform in +-size, or float8_e4m3fn codes with a float32
    scale per row of about the same size. Returns (weight, scale or None, the float64 weight the
    fused kernel multiplies by (codes times scale, exact), the float64 weight the unfused path's
    GEMM reads (dequantized as torch does: fp32 product, then bf16))."""
    if kind == "bf16":
        w = ((torch.rand(rows, hidden, device="cuda") * 2 - 1) * size).bfloat16()
        return w, None, w.double(), w.double()
    w8 = (torch.randn(rows, hidden, device="cuda") * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    scale = (torch.rand(rows, device="cuda") + 0.5) * size / 64
    return (w8, scale, w8.double() * scale.double()[:, None],
            (w8.float() * scale[:, None]).bfloat16().double())


@pytest.mark.parametrize("tokens,path,act,merged,weights", [
    (1, "fused", "silu", True, "bf16"), (64, "unfused", "silu", False, "bf16"),
    (40, "auto", "gelu_tanh", True, "bf16"), (7, "auto", "silu", False, "bf16"),
    (3, "unfused", "gelu_tanh", True, "bf16"), (64, "unfused", "silu", True, "e4m3"),
    (3, "unfused", "gelu_tanh", False, "e4m3"), (100, "auto", "silu", True, "e4m3")])
def test_ffn_gate_up_paths_against_float64(tokens, path, act, merged, weights):
    """ropejit.decode.ffn_gate_up against float64 RMSNorm -> gate/up -> act(g) * u with each
    path's roundings (fused: x * w rounded, rstd on the sums; unfused: the normalized activation
    and both products rounded to bf16, as torch's sequence; e4m3 weights: the fused kernel
    scales each row's sum, the unfused path dequantizes the weight to bf16 first)."""
    from ropejit import decode
    torch.manual_seed(tokens)
    hidden, inter = 1024, 256
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w, scale, w64, w_unfused = _weights(2 * inter, hidden, weights, 3 * (3 / hidden) ** 0.5)
    nw = (torch.rand(hidden, device="cuda") + 0.5).bfloat16()
    if merged:
        kw = dict(weight=w) if scale is None else dict(weight=w, weight_scale=scale)
    else:
        kw = dict(gate_weight=w[:inter].clone(), up_weight=w[inter:].clone())
        if scale is not None:
            kw.update(gate_scale=scale[:inter].clone(), up_scale=scale[inter:].clone())
    got = decode.ffn_gate_up(x, norm_weight=nw, eps=1e-6, act=act, path=path, **kw).double()
    assert got.shape == (tokens, inter)
    x64 = x.double()
    rstd = 1 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + float(torch.tensor(1e-6).float()))

    def glu(gu, flip=None):
        # act(g) * u and the size of its inputs; flip: how far g and u may move beyond that
        g, u = gu[:, :inter], gu[:, inter:]
        if act == "silu":
            a = g / (1 + torch.exp(-g))
        else:
            a = 0.5 * g * (1 + torch.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3)))
        mag = (a.abs() + g.abs()) * u.abs() + a.abs() * u.abs()
        if flip is not None:  # |act'| <= 1.2 for both activations; mag is scaled by 2^-7 below
            fg, fu = flip[:, :inter], flip[:, inter:]
            mag = mag + 2 ** 7 * (1.2 * fg * (u.abs() + fu) + a.abs() * fu)
        return a * u, mag

    fused = glu(((x.float() * nw.float()).bfloat16().double() @ w64.t()) * rstd)
    v = x64 * rstd * nw.double()
    a = v.bfloat16().double()
    # The RMSNorm key computes in fp32: where float64 lies within fp32's error of a bf16 tie,
    # the activation may round to the other neighbour, moving g and u by that gap times |W|.
    gap = (v * (1 + 2 ** -20)).bfloat16().double() - (v * (1 - 2 ** -20)).bfloat16().double()
    unfused = glu((a @ w_unfused.t()).bfloat16().double(), gap.abs() @ w_unfused.abs().t())

    def worst(ref):  # the largest error over its tolerance (at most 1 to match)
        want, mag = ref
        return float(((got - want).abs() / (2 ** -7 * mag + 2 ** -8 * want.abs() + 1e-4)).max())

    matched = {"fused": worst(fused), "unfused": worst(unfused)}
    if path == "auto":
        assert min(matched.values()) <= 1, matched
    else:
        assert matched[path] <= 1, matched


@pytest.mark.parametrize("tokens,path,weights", [
    (64, "unfused", "bf16"), (64, "auto", "bf16"), (64, "fused", "bf16"), (200, "auto", "bf16"),
    (3, "unfused", "bf16"), (64, "unfused", "e4m3"), (3, "unfused", "e4m3"),
    (200, "auto", "e4m3")])
def test_qkv_projection_paths_against_float64(tokens, path, weights):
    """Every path of ropejit.decode.qkv_projection against float64 RMSNorm -> projection -> RoPE
    computed with that path's roundings: the fused kernel rounds x * w and applies rstd to the
    sums; the unfused path (RMSNorm key -> cuBLASLt -> RoPE key) rounds the normalized activation
    and the projection to bf16, as torch's sequence does. "auto" must match one of the two.
    e4m3 weights: the fused kernel scales each row's sum, the unfused path dequantizes the
    weight to bf16 first (fp32 product of code and scale, rounded), as torch would."""
    from ropejit import decode
    torch.manual_seed(tokens)
    hidden, qh, kvh, d = 1024, 8, 2, 128
    x = (torch.rand(tokens, hidden, device="cuda") * 4 - 2).bfloat16()
    w, scale, w64, w_unfused = _weights((qh + 2 * kvh) * d, hidden, weights, (3 / hidden) ** 0.5)
    nw = (torch.rand(hidden, device="cuda") + 0.5).bfloat16()
    ids = torch.randint(0, 4096, (tokens,), device="cuda")
    q, k, v = decode.qkv_projection(x, w, q_heads=qh, kv_heads=kvh, head_dim=d, norm_weight=nw,
                                    eps=1e-6, position_ids=ids, base=500000.0, path=path,
                                    weight_scale=scale)
    got = torch.cat((q, k, v), dim=1).double()
    x64 = x.double()
    rstd = 1 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + float(torch.tensor(1e-6).float()))
    inv = 500000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64, device="cuda") / d)
    ang = ids.double()[:, None] * inv
    c, s = ang.cos()[:, None, :], ang.sin()[:, None, :]

    def finish(y):  # RoPE on q and k of [tokens, columns]; the value and its inputs' size
        y = y.view(tokens, qh + 2 * kvh, d)
        lo, hi = y[:, :qh + kvh, :d // 2], y[:, :qh + kvh, d // 2:]
        rot = torch.cat((lo * c - hi * s, hi * c + lo * s), dim=-1)
        mag = torch.cat((lo.abs() * c.abs() + hi.abs() * s.abs(),
                         hi.abs() * c.abs() + lo.abs() * s.abs()), dim=-1)
        return torch.cat((rot, y[:, qh + kvh:]), dim=1), torch.cat((mag, y[:, qh + kvh:].abs()), 1)

    fused = finish(((x.float() * nw.float()).bfloat16().double() @ w64.t()) * rstd)
    a = (x64 * rstd * nw.double()).bfloat16().double()  # the RMSNorm key's output
    unfused = finish((a @ w_unfused.t()).bfloat16().double())

    def close(ref):
        # Within one bf16 ulp of the rotation's inputs (the unfused path's rounded projection may
        # round the other way where float64 sits near a tie) and a rounding of the output.
        want, mag = ref
        rms = want.pow(2).mean(dim=(1, 2), keepdim=True).sqrt()
        tol = 2 ** -7 * mag + 2 ** -8 * want.abs() + 2 ** -10 * rms
        return bool(torch.all((got - want).abs() <= tol))

    matched = {"fused": close(fused), "unfused": close(unfused)}
    if path == "auto":
        assert matched["fused"] or matched["unfused"], matched
    else:
        assert matched[path], matched
