"""Each drop-in against its peer's semantics in float64 (tests/python/references.py), forward
and gradient, on the GPU and through the host emulator; their argument errors; and a
torch.compile(fullgraph=True) trace of each with fake CUDA tensors, which needs no GPU."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import references as ref  # noqa: E402

import ropejit  # noqa: E402
from ropejit.dropin import flash_attn, hf, liger, transformer_engine, vllm  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def hf_tables(batch, seq, rotary_dim, dtype, device, base=10000.0, per_batch=False):
    """cos/sin as a transformers rotary module returns them: [b or 1, seq, R], [f, f]."""
    inv = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    pos = (torch.randint(0, 4096, (batch, seq)) if per_batch
           else torch.arange(seq)[None].double())
    freqs = pos.double()[..., None] * inv
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("unsqueeze_dim, per_batch, rotary", [(1, False, 64), (2, True, 64),
                                                              (1, True, 32)])
def test_hf_apply_rotary_pos_emb(backend, dtype, unsqueeze_dim, per_batch, rotary):
    shape_q = (2, 4, 5, 64) if unsqueeze_dim == 1 else (2, 5, 4, 64)
    shape_k = (2, 1, 5, 64) if unsqueeze_dim == 1 else (2, 5, 1, 64)
    q = torch.randn(shape_q).to(dtype).to(backend.device)
    k = torch.randn(shape_k).to(dtype).to(backend.device)
    cos, sin = hf_tables(2, 5, rotary, dtype, backend.device, per_batch=per_batch)
    want_q, want_k = ref.hf(q.cpu(), k.cpu(), cos.cpu(), sin.cpu(), unsqueeze_dim)
    got_q, got_k = hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    backend.sync()
    ref.assert_close(got_q, want_q)
    ref.assert_close(got_k, want_k)
    got_q2, got_k2 = liger.liger_rotary_pos_emb(q, k, cos, sin, None, unsqueeze_dim)
    backend.sync()
    assert torch.equal(got_q2, got_q) and torch.equal(got_k2, got_k)


@pytest.mark.long
def test_hf_gradient_matches_autograd_of_the_reference(backend):
    q = torch.randn(2, 3, 5, 64, device=backend.device, requires_grad=True)
    k = torch.randn(2, 1, 5, 64, device=backend.device, requires_grad=True)
    cos, sin = hf_tables(2, 5, 64, torch.float32, backend.device, per_batch=True)
    q64 = q.detach().cpu().double().requires_grad_(True)
    k64 = k.detach().cpu().double().requires_grad_(True)
    want = ref.hf(q64, k64, cos.cpu(), sin.cpu())
    got = hf.apply_rotary_pos_emb(q, k, cos, sin)
    g = [torch.randn_like(t) for t in got]
    torch.autograd.backward(got, g)
    torch.autograd.backward(want, [t.cpu().double() for t in g])
    backend.sync()
    ref.assert_close(q.grad, q64.grad, torch.float32)
    ref.assert_close(k.grad, k64.grad, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("variant", ["int_offset", "tensor_offsets", "varlen", "partial"])
def test_flash_attn_apply_rotary_emb(backend, dtype, interleaved, variant):
    device = backend.device
    rotary = 32 if variant == "partial" else 64
    angles = torch.arange(40, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    cos, sin = angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)
    kwargs, ref_kwargs = {}, {}
    if variant == "varlen":
        x = torch.randn(9, 3, 64).to(dtype).to(device)
        cu = torch.tensor([0, 4, 9], dtype=torch.int32, device=device)
        offsets = torch.tensor([2, 30], dtype=torch.int32, device=device)
        kwargs = dict(cu_seqlens=cu, max_seqlen=5, seqlen_offsets=offsets)
        ref_kwargs = dict(cu_seqlens=cu.cpu(), seqlen_offsets=offsets.cpu())
    else:
        x = torch.randn(2, 5, 3, 64).to(dtype).to(device)
        if variant == "tensor_offsets":
            offsets = torch.tensor([0, 33], dtype=torch.int64, device=device)
            kwargs = ref_kwargs = dict(seqlen_offsets=offsets)
            ref_kwargs = dict(seqlen_offsets=offsets.cpu())
        elif variant != "partial":
            kwargs = ref_kwargs = dict(seqlen_offsets=11)
    want = ref.flash_attn(x.cpu(), cos.cpu(), sin.cpu(), interleaved, **ref_kwargs)
    got = flash_attn.apply_rotary_emb(x, cos, sin, interleaved, False, **kwargs)
    backend.sync()
    assert got.data_ptr() != x.data_ptr()
    ref.assert_close(got, want)
    same = flash_attn.apply_rotary_emb(x, cos, sin, interleaved, True, **kwargs)
    backend.sync()
    assert same is x
    ref.assert_close(x, want)


@pytest.mark.long
def test_liger_entry_points_agree_forward_and_backward(backend):
    """liger_rope and LigerRopeFunction.apply (which returns (q, k), as Liger 0.8's): the
    transformers semantics, forward and gradient, against float64."""
    q = torch.randn(2, 4, 5, 64, device=backend.device, requires_grad=True)
    k = torch.randn(2, 2, 5, 64, device=backend.device, requires_grad=True)
    cos, sin = hf_tables(2, 5, 64, torch.float32, backend.device, per_batch=True)
    q64 = q.detach().cpu().double().requires_grad_(True)
    k64 = k.detach().cpu().double().requires_grad_(True)
    want = ref.hf(q64, k64, cos.cpu(), sin.cpu())
    f_q, f_k = liger.liger_rope(q, k, cos, sin)
    c_q, c_k = liger.LigerRopeFunction.apply(q, k, cos, sin)
    g = [torch.randn_like(f_q), torch.randn_like(f_k)]
    grads_f = torch.autograd.grad((f_q, f_k), (q, k), g)
    grads_c = torch.autograd.grad((c_q, c_k), (q, k), g)
    torch.autograd.backward(want, [t.cpu().double() for t in g])
    backend.sync()
    assert torch.equal(f_q, c_q) and torch.equal(f_k, c_k)
    ref.assert_close(c_q, want[0].detach(), torch.float32)
    ref.assert_close(grads_c[0], q64.grad, torch.float32)
    ref.assert_close(grads_c[1], k64.grad, torch.float32)
    assert torch.equal(grads_f[0], grads_c[0]) and torch.equal(grads_f[1], grads_c[1])


def _liger_odd_reference(x, cos, sin, h=None):
    """Liger's kernel in float64: with h = head_dim // 2 (an odd head_dim) or rotary_dim / 2,
    element i < h pairs with i + h, rotated by cos/sin's first h columns; the rest of the head
    passes through."""
    h = x.shape[-1] // 2 if h is None else h
    c, s = cos[..., :h].double().unsqueeze(1), sin[..., :h].double().unsqueeze(1)
    x1, x2, last = x[..., :h], x[..., h:2 * h], x[..., 2 * h:]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s, last), dim=-1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim, per_batch", [(41, False), (41, True), (9, True), (1, False)])
def test_liger_odd_head_dim_as_liger_kernel(backend, dtype, head_dim, per_batch):
    """An odd head_dim (Liger's own test uses 41) through liger_rope and LigerRopeFunction:
    the first 2 * (head_dim // 2) elements rotated in halves by cos/sin's first head_dim // 2
    columns of transformers' head_dim + 1, the last passed through; forward and gradient
    against float64; the inputs untouched."""
    q = torch.randn(3, 5, 7, head_dim).to(dtype).to(backend.device).requires_grad_(True)
    k = torch.randn(3, 2, 7, head_dim).to(dtype).to(backend.device).requires_grad_(True)
    cos, sin = hf_tables(3, 7, head_dim, torch.float32, backend.device, per_batch=per_batch)
    assert cos.shape[-1] == head_dim + 1  # what transformers' rotary module gives
    q_before, k_before = q.detach().clone(), k.detach().clone()
    q64 = q.detach().cpu().double().requires_grad_(True)
    k64 = k.detach().cpu().double().requires_grad_(True)
    want = (_liger_odd_reference(q64, cos.cpu(), sin.cpu()),
            _liger_odd_reference(k64, cos.cpu(), sin.cpu()))
    f_q, f_k = liger.liger_rope(q, k, cos, sin)
    c_q, c_k = liger.LigerRopeFunction.apply(q, k, cos, sin)
    g = [torch.randn_like(f_q), torch.randn_like(f_k)]
    grads_f = torch.autograd.grad((f_q, f_k), (q, k), g)
    grads_c = torch.autograd.grad((c_q, c_k), (q, k), g)
    torch.autograd.backward(want, [t.cpu().double() for t in g])
    backend.sync()
    assert torch.equal(q.detach(), q_before) and torch.equal(k.detach(), k_before)
    for got in ((f_q, f_k), (c_q, c_k)):
        assert got[0].shape == q.shape and got[1].shape == k.shape
        ref.assert_close(got[0], want[0].detach(), dtype)
        ref.assert_close(got[1], want[1].detach(), dtype)
        assert torch.equal(got[0][..., -1], q.detach()[..., -1])  # passed through, exactly
    for grads in (grads_f, grads_c):
        ref.assert_close(grads[0], q64.grad, dtype)
        ref.assert_close(grads[1], k64.grad, dtype)
        assert torch.equal(grads[0][..., -1], g[0][..., -1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim, rotary_dim, transposed",
                         [(64, 64, True), (64, 32, False), (40, 24, False)])
def test_liger_rotary_dim_with_half_width_tables(backend, dtype, head_dim, rotary_dim,
                                                 transposed):
    """Liger's rotary_dim argument (its GPT-OSS path): cos/sin hold each frequency once
    (rotary_dim / 2 columns; GPT-OSS's are column-major), the first rotary_dim elements rotated
    in halves, the rest passed through; forward and gradient against float64, through both
    entry points."""
    half = rotary_dim // 2
    q = torch.randn(2, 4, 6, head_dim).to(dtype).to(backend.device).requires_grad_(True)
    k = torch.randn(2, 1, 6, head_dim).to(dtype).to(backend.device).requires_grad_(True)
    angles = torch.arange(6, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(half, dtype=torch.float64) / half)
    cos = angles.cos().float()[None].to(backend.device)
    sin = angles.sin().float()[None].to(backend.device)
    if transposed:
        cos, sin = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (cos, sin))
        assert cos.stride(-1) != 1
    q64 = q.detach().cpu().double().requires_grad_(True)
    k64 = k.detach().cpu().double().requires_grad_(True)
    want = (_liger_odd_reference(q64, cos.cpu(), sin.cpu(), half),
            _liger_odd_reference(k64, cos.cpu(), sin.cpu(), half))
    f_q, f_k = liger.liger_rotary_pos_emb(q, k, cos, sin, rotary_dim=rotary_dim)
    c_q, c_k = liger.LigerRopeFunction.apply(q, k, cos, sin, None, 1, rotary_dim)
    g = [torch.randn_like(f_q), torch.randn_like(f_k)]
    grads = [torch.autograd.grad((f_q, f_k), (q, k), g),
             torch.autograd.grad((c_q, c_k), (q, k), g)]
    torch.autograd.backward(want, [t.cpu().double() for t in g])
    backend.sync()
    for got in ((f_q, f_k), (c_q, c_k)):
        ref.assert_close(got[0], want[0].detach(), dtype)
        ref.assert_close(got[1], want[1].detach(), dtype)
        assert torch.equal(got[0][..., rotary_dim:], q.detach()[..., rotary_dim:])
    for grad in grads:
        ref.assert_close(grad[0], q64.grad, dtype)
        ref.assert_close(grad[1], k64.grad, dtype)


def test_liger_rotary_dim_errors():
    q = torch.randn(1, 2, 3, 64)
    cos = torch.ones(1, 3, 16)
    with pytest.raises(ropejit.InvalidArgument, match=r"rotary_dim \(33\) must be an even int"):
        liger.liger_rope(q, q, cos, cos, rotary_dim=33)
    with pytest.raises(ropejit.InvalidArgument, match="needs rotary_dim / 2 = 32"):
        liger.liger_rope(q, q, cos, cos, rotary_dim=64)


@pytest.mark.parametrize("head_dim, width", [(41, 19), (64, 30), (64, 66)])
def test_liger_rotary_dim_is_the_width_of_cos(backend, head_dim, width):
    """Liger's rule without rotary_dim: the rotated width is cos/sin's (at most head_dim), h its
    half, i pairing with i + h by cos/sin's first h columns."""
    q = torch.randn(1, 2, 3, head_dim).to(backend.device)
    k = torch.randn(1, 1, 3, head_dim).to(backend.device)
    angles = torch.rand(1, 3, width, dtype=torch.float64) * 6
    cos, sin = angles.cos().float().to(backend.device), angles.sin().float().to(backend.device)
    got = liger.liger_rope(q, k, cos, sin)
    backend.sync()
    for x, out in zip((q, k), got):
        want = _liger_odd_reference(x.cpu().double(), cos.cpu(), sin.cpu(),
                                    min(width, head_dim) // 2)
        ref.assert_close(out, want, torch.float32)


def _fa_tables(rotary, dtype, device, rows=40):
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, rotary, 2, dtype=torch.float64) / rotary)
    return angles.cos().to(dtype).to(device), angles.sin().to(dtype).to(device)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("offsets", ["int", "tensor"])
def test_flash_attn_under_autograd_in_place_too(backend, inplace, offsets):
    """apply_rotary_emb on a leaf that requires grad, in place as well (flash-attn's
    autograd.Function): the forward against float64, the gradient the rotation by -angle."""
    cos, sin = _fa_tables(64, torch.float32, backend.device)
    seqlen_offsets = 3 if offsets == "int" else torch.tensor([0, 21], device=backend.device)
    ref_offsets = seqlen_offsets if offsets == "int" else seqlen_offsets.cpu()
    x = torch.randn(2, 5, 3, 64, device=backend.device, requires_grad=True)
    x0 = x.detach().cpu().clone()
    out = flash_attn.apply_rotary_emb(x, cos, sin, False, inplace, seqlen_offsets)
    g = torch.randn_like(out)
    g0 = g.detach().cpu().clone()
    out.backward(g)
    backend.sync()
    ref.assert_close(out.detach(), ref.flash_attn(x0, cos.cpu(), sin.cpu(), False,
                                                   seqlen_offsets=ref_offsets))
    ref.assert_close(x.grad, ref.flash_attn(g0, cos.cpu(), -sin.cpu(), False,
                                            seqlen_offsets=ref_offsets))
    assert flash_attn.apply_rotary_emb_func is flash_attn.apply_rotary_emb


@pytest.mark.parametrize("packing", ["3", "gqa", "gqa_cos_k"])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.long)])
def test_flash_attn_qkv_and_kv_in_place(backend, packing, grad, compiled):
    """apply_rotary_emb_qkv_ ([b, s, 3, h, d], or [b, s, hq + 2 hk, d] with num_heads_q; k with
    its own tables) and apply_rotary_emb_kv_: q and k rotated in place, v untouched, gradients
    rotated back, eager and under torch.compile (as flash-attn's own test calls it);
    apply_rotary(conjugate=True) rotates by -angle."""
    device = backend.device
    cos, sin = _fa_tables(32, torch.float32, device)
    cos_k, sin_k = _fa_tables(32, torch.float32, device, rows=60)
    cos_k, sin_k = cos_k[20:], sin_k[20:]  # k's positions 20 further on
    kw = {}
    if packing == "3":
        qkv = torch.randn(2, 5, 3, 4, 64, device=device)
        q_of, k_of, v_of = (lambda t: t[:, :, 0]), (lambda t: t[:, :, 1]), (lambda t: t[:, :, 2])
    else:
        qkv = torch.randn(2, 5, 4 + 2 * 2, 64, device=device)
        kw["num_heads_q"] = 4
        q_of, k_of, v_of = (lambda t: t[:, :, :4]), (lambda t: t[:, :, 4:6]), \
            (lambda t: t[:, :, 6:])
        if packing == "gqa_cos_k":
            kw.update(cos_k=cos_k, sin_k=sin_k)
    k_tables = (cos_k, sin_k) if packing == "gqa_cos_k" else (cos, sin)
    x0 = qkv.detach().cpu().clone()
    if grad:
        leaf = qkv.clone().requires_grad_(True)
        qkv = leaf * 1.0  # a non-leaf, as a projection's output
    # Emulated: dynamo and AOT autograd trace the op (its fake implementation, the in-place
    # views) without inductor's C++ build of the CPU graph; on the GPU inductor compiles it.
    fn = flash_attn.apply_rotary_emb_qkv_
    if compiled:
        fn = torch.compile(fn, backend="inductor" if backend.name == "cuda" else "aot_eager")
    out = fn(qkv, cos, sin, seqlen_offsets=1, **kw)
    assert out is qkv or grad or compiled
    backend.sync()
    ref.assert_close(q_of(out.detach()), ref.flash_attn(q_of(x0), cos.cpu(), sin.cpu(),
                                                        seqlen_offsets=1))
    ref.assert_close(k_of(out.detach()), ref.flash_attn(k_of(x0), k_tables[0].cpu(),
                                                        k_tables[1].cpu(), seqlen_offsets=1))
    assert torch.equal(v_of(out.detach()).cpu(), v_of(x0))
    if grad:
        g = torch.randn_like(out)
        g0 = g.cpu().clone()
        out.backward(g)
        backend.sync()
        ref.assert_close(q_of(leaf.grad), ref.flash_attn(q_of(g0), cos.cpu(), -sin.cpu(),
                                                         seqlen_offsets=1))
        ref.assert_close(k_of(leaf.grad), ref.flash_attn(k_of(g0), k_tables[0].cpu(),
                                                         -k_tables[1].cpu(), seqlen_offsets=1))
        assert torch.equal(v_of(leaf.grad).cpu(), v_of(g0))

    kv = torch.randn(2, 5, 2, 3, 64, device=device)
    kv0 = kv.cpu().clone()
    assert flash_attn.apply_rotary_emb_kv_(kv, cos, sin, True, 2) is kv
    backend.sync()
    ref.assert_close(kv[:, :, 0], ref.flash_attn(kv0[:, :, 0], cos.cpu(), sin.cpu(), True,
                                                 seqlen_offsets=2))
    assert torch.equal(kv[:, :, 1].cpu(), kv0[:, :, 1])
    back = flash_attn.apply_rotary(kv[:, :, 0], cos, sin, 2, interleaved=True, conjugate=True)
    backend.sync()
    ref.assert_close(back, kv0[:, :, 0], torch.float32)
    with pytest.raises(ValueError, match=r"num_heads_q"):
        flash_attn.apply_rotary_emb_qkv_(torch.zeros(1, 2, 8, 64, device=device), cos, sin)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("shape", ["tokens", "batch_seq", "heads_split", "partial", "no_key"])
def test_vllm_rotary_embedding(backend, dtype, is_neox, shape):
    device = backend.device
    head_size, rot = 64, 32 if shape == "partial" else 64
    angles = torch.arange(100, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype).to(device)
    if shape == "batch_seq":
        positions = torch.randint(0, 100, (2, 3), device=device)
        query = torch.randn(2, 3, 4 * head_size).to(dtype).to(device)
        key = torch.randn(2, 3, 2 * head_size).to(dtype).to(device)
    else:
        positions = torch.randint(0, 100, (7,), device=device)
        # A slice of a packed projection: query's token stride is not 4 * head_size.
        qkv = torch.randn(7, 8 * head_size).to(dtype).to(device)
        query, key = qkv[:, : 4 * head_size], qkv[:, 4 * head_size: 6 * head_size]
        if shape == "heads_split":
            query, key = query.unflatten(-1, (4, head_size)), key.unflatten(-1, (2, head_size))
    if shape == "no_key":
        key = None
    want_q, want_k = vllm_ref = ref.vllm(positions.cpu(), query.cpu(),
                                         None if key is None else key.cpu(), head_size,
                                         cache.cpu(), is_neox)
    assert vllm_ref is not None
    result = vllm.rotary_embedding(positions, query, key, head_size, cache, is_neox)
    backend.sync()
    assert result is None
    ref.assert_close(query, want_q)
    if key is not None:
        ref.assert_close(key, want_k)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("offsets", [False, True])
def test_vllm_forward_cuda_as_models_call_it(backend, is_neox, offsets):
    """RotaryEmbedding.forward_cuda as a vLLM attention layer calls it: query and key are views
    of the packed QKV output, partial rotary (a scaled variant's cache: YaRN-like factors per
    frequency), int64 positions, optional offsets; rotated in place, the other columns
    (v, the unrotated tail of each head) untouched."""
    from types import SimpleNamespace
    device, head_size, rot, tokens = backend.device, 64, 48, 9
    scale = torch.linspace(1.0, 4.0, rot // 2, dtype=torch.float64)
    angles = torch.arange(200, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(0, rot, 2, dtype=torch.float64) / rot) / scale
    cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float().to(device)
    rope = SimpleNamespace(head_size=head_size, rotary_dim=rot, is_neox_style=is_neox,
                           cos_sin_cache=cache)
    qkv = torch.randn(tokens, (4 + 2 + 2) * head_size, dtype=torch.bfloat16).to(device)
    before = qkv.clone()
    q, k = qkv[:, :4 * head_size], qkv[:, 4 * head_size:6 * head_size]
    positions = torch.randint(0, 100, (tokens,), device=device)
    shift = torch.randint(0, 100, (tokens,), device=device) if offsets else None
    at = positions if shift is None else positions + shift
    want_q, want_k = ref.vllm(at.cpu(), q.cpu(), k.cpu(), head_size, cache.cpu(), is_neox)
    got_q, got_k = vllm.forward_cuda(rope, positions, q, k, shift)
    backend.sync()
    assert got_q is q and got_k is k
    ref.assert_close(q, want_q)
    ref.assert_close(k, want_k)
    assert torch.equal(qkv[:, 6 * head_size:], before[:, 6 * head_size:])  # v untouched
    with pytest.raises(ropejit.InvalidArgument, match="has no cos_sin_cache"):
        vllm.forward_cuda(SimpleNamespace(head_size=64, is_neox_style=True), positions, q, k)


def te_freqs(rows, rotary, interleaved, device):
    inv = 10000.0 ** (-torch.arange(0, rotary, 2, dtype=torch.float32) / rotary)
    freqs = torch.arange(rows, dtype=torch.float32)[:, None] * inv
    emb = (torch.stack((freqs, freqs), dim=-1).flatten(-2) if interleaved
           else torch.cat((freqs, freqs), dim=-1))
    return emb.reshape(rows, 1, 1, rotary).to(device)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd", "start_positions", "partial"])
def test_transformer_engine_apply_rotary_pos_emb(backend, dtype, interleaved, tensor_format):
    device = backend.device
    rotary = 32 if tensor_format == "partial" else 64
    freqs = te_freqs(50, rotary, interleaved, device)
    kwargs, ref_kwargs, fmt = {}, {}, tensor_format
    if tensor_format == "thd":
        t = torch.randn(9, 3, 64)
        cu = torch.tensor([0, 6, 9], dtype=torch.int32)
        kwargs, ref_kwargs = dict(cu_seqlens=cu.to(device)), dict(cu_seqlens=cu)
    elif tensor_format == "start_positions":
        fmt, t = "bshd", torch.randn(2, 5, 3, 64)
        start = torch.tensor([4, 20], dtype=torch.int32)
        kwargs, ref_kwargs = dict(start_positions=start.to(device)), dict(start_positions=start)
    else:
        fmt = "sbhd" if tensor_format == "partial" else tensor_format
        t = torch.randn(5, 2, 3, 64)
    t = t.to(dtype).to(device)
    want = ref.transformer_engine(t.cpu(), freqs.cpu(), fmt, interleaved, **ref_kwargs)
    got = transformer_engine.apply_rotary_pos_emb(t, freqs, fmt, interleaved=interleaved, **kwargs)
    if "start_positions" not in kwargs:  # the older positional signature: interleaved 4th
        old = transformer_engine.apply_rotary_pos_emb(t, freqs, fmt, interleaved, True, **kwargs)
        backend.sync()
        assert torch.equal(old, got)
    backend.sync()
    # ropejit's table is cos/sin of fp32 angles, as TE's: compare at the table's precision too.
    rtol, atol = ref.tolerance(dtype)
    torch.testing.assert_close(got.double().cpu(), want, rtol=rtol, atol=atol + 2e-6)


def _te_rank_freqs(freqs, seqlen, cp_size, cp_rank):
    """TE's _get_freqs_on_this_cp_rank: chunks r and 2 cp_size - 1 - r of the whole sequence."""
    seg, full = seqlen // 2, cp_size * seqlen
    return torch.cat([freqs[cp_rank * seg:(cp_rank + 1) * seg],
                      freqs[full - (cp_rank + 1) * seg:full - cp_rank * seg]])


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("cp_size, cp_rank", [(2, 0), (2, 1), (3, 1)])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("started", [False, True])
def test_transformer_engine_context_parallelism(backend, tensor_format, cp_size, cp_rank,
                                                interleaved, started):
    """cp_size > 1: each rank's tokens take the positions of its two chunks of the whole
    sequence (TE's load-balanced split; thd with the padded cu_seqlens of the whole sequences),
    offset by the sequence's start position where given (TE offsets the freqs), forward and
    gradient (the rotation by -angle at the same positions), against float64."""
    device = backend.device
    freqs = te_freqs(3 * 12, 64, interleaved, device)
    if tensor_format == "thd":
        local = [4, 6, 2]
        cu_whole = torch.tensor([0] + [cp_size * n for n in local], dtype=torch.int32).cumsum(0)
        t = torch.randn(sum(local), 3, 64, device=device, requires_grad=True)
        kwargs = dict(cu_seqlens=cu_whole.to(torch.int32).to(device))
        starts = [3, 0, 5]
    else:
        shape = (6, 2, 3, 64) if tensor_format == "sbhd" else (2, 6, 3, 64)
        t = torch.randn(*shape, device=device, requires_grad=True)
        kwargs = {}
        starts = [3, 5]
    if not started:
        starts = [0] * len(starts)
    start_positions = (torch.tensor(starts, dtype=torch.int32, device=device) if started
                       else None)
    out = transformer_engine.apply_rotary_pos_emb(t, freqs, tensor_format, start_positions,
                                                  interleaved, True, cp_size=cp_size,
                                                  cp_rank=cp_rank, **kwargs)
    g = torch.randn_like(out)
    out.backward(g)
    backend.sync()
    assert out.is_contiguous()

    def expected(x, sign):
        x, f = x.detach().cpu(), sign * freqs.cpu()
        if tensor_format != "thd":
            seqlen = x.shape[0] if tensor_format == "sbhd" else x.shape[1]
            dim = 1 if tensor_format == "sbhd" else 0
            return torch.cat([ref.transformer_engine(
                x.narrow(dim, b, 1), _te_rank_freqs(f[st:], seqlen, cp_size, cp_rank),
                tensor_format, interleaved) for b, st in enumerate(starts)], dim=dim)
        parts, start = [], 0
        for n, st in zip(local, starts):
            seq_cu = torch.tensor([0, n], dtype=torch.int32)
            parts.append(ref.transformer_engine(x[start:start + n],
                                                _te_rank_freqs(f[st:], n, cp_size, cp_rank),
                                                "thd", interleaved, cu_seqlens=seq_cu))
            start += n
        return torch.cat(parts)

    rtol, atol = ref.tolerance(torch.float32)
    torch.testing.assert_close(out.detach().double().cpu(), expected(t, 1), rtol=rtol,
                               atol=atol + 2e-6)
    torch.testing.assert_close(t.grad.double().cpu(), expected(g, -1), rtol=rtol,
                               atol=atol + 2e-6)


def test_transformer_engine_any_strides_and_a_contiguous_output(backend):
    """A t whose last dimension is not contiguous (TE's tests transpose heads and head_dim) is
    read as TE reads it; the output is contiguous, as TE's."""
    freqs = te_freqs(20, 64, False, backend.device)
    t = torch.randn(5, 2, 64, 3, device=backend.device).transpose(2, 3)
    assert t.stride(-1) != 1
    out = transformer_engine.apply_rotary_pos_emb(t, freqs, "sbhd")
    backend.sync()
    assert out.is_contiguous() and out.shape == t.shape
    want = ref.transformer_engine(t.cpu(), freqs.cpu(), "sbhd", False)
    rtol, atol = ref.tolerance(torch.float32)
    torch.testing.assert_close(out.double().cpu(), want, rtol=rtol, atol=atol + 2e-6)


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("case", ["plain", "interleaved", "start_positions", "partial",
                                  "cp", "own_k_freqs"])
def test_transformer_engine_fused_qkv(backend, tensor_format, case):
    """apply_fused_qkv_rotary_pos_emb on Megatron's grouped packed QKV (each group: 4 q heads,
    one k, one v), as TE's own test builds it: q, k and v against apply_rotary_pos_emb's float64
    semantics on the split heads, and the gradient (q and k rotated back, v passed through)."""
    device, d, groups, batch, seqlen = backend.device, 64, 3, 2, 6
    interleaved = case == "interleaved"
    rot = 32 if case == "partial" else d
    cp_size, cp_rank = (2, 1) if case == "cp" else (1, 0)
    freqs = te_freqs(cp_size * seqlen + 8, rot, interleaved, device)
    k_freqs = te_freqs(cp_size * seqlen + 8, rot, interleaved, device) * (
        0.5 if case == "own_k_freqs" else 1.0)
    if case != "own_k_freqs":
        k_freqs = freqs  # one launch for q and k
    shape = (seqlen, batch, groups, 6 * d) if tensor_format == "sbhd" else \
        (batch, seqlen, groups, 6 * d)
    qkv = torch.randn(*shape, device=device, requires_grad=True)
    start = (torch.tensor([3, 5], dtype=torch.int32, device=device)
             if case == "start_positions" else None)
    # TE's positional order, cu_seqlens (unused) included.
    q, k, v = transformer_engine.apply_fused_qkv_rotary_pos_emb(
        qkv, freqs, k_freqs, [4 * d, d, d], tensor_format, start, interleaved, None, cp_size,
        cp_rank)
    g = [torch.randn_like(t) for t in (q, k, v)]
    torch.autograd.backward((q, k, v), g)
    backend.sync()
    lead = shape[:2]
    assert q.shape == (*lead, 4 * groups, d) and k.shape == v.shape == (*lead, groups, d)
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()

    def rotated(x, f, sign=1):
        f = sign * f.cpu()
        if cp_size > 1:
            f = _te_rank_freqs(f, seqlen, cp_size, cp_rank)
        return ref.transformer_engine(x.detach().cpu(), f, tensor_format, interleaved,
                                      start_positions=None if start is None else start.cpu())

    x = qkv.detach()
    q_in, k_in, v_in = x[..., :4 * d].reshape(*lead, 4 * groups, d), x[..., 4 * d:5 * d], \
        x[..., 5 * d:]
    rtol, atol = ref.tolerance(torch.float32)
    close = dict(rtol=rtol, atol=atol + 2e-6)
    torch.testing.assert_close(q.detach().double().cpu(), rotated(q_in, freqs), **close)
    torch.testing.assert_close(k.detach().double().cpu(), rotated(k_in, k_freqs), **close)
    assert torch.equal(v.detach().cpu(), v_in.cpu())
    want = torch.cat((rotated(g[0], freqs, -1).reshape(*lead, groups, 4 * d),
                      rotated(g[1], k_freqs, -1), g[2].double().cpu()), dim=-1)
    torch.testing.assert_close(qkv.grad.double().cpu(), want, **close)


def test_transformer_engine_fused_qkv_argument_errors():
    qkv = torch.zeros(4, 1, 2, 6 * 8)
    f = torch.zeros(8, 1, 1, 8)
    with pytest.raises(ropejit.InvalidArgument, match="qkv_split_arg_list"):
        transformer_engine.apply_fused_qkv_rotary_pos_emb(qkv, f, f)
    with pytest.raises(ropejit.InvalidArgument, match="summing to its last dimension"):
        transformer_engine.apply_fused_qkv_rotary_pos_emb(qkv, f, f, qkv_split_arg_list=[32, 8, 4])
    with pytest.raises(ropejit.InvalidArgument, match="one head each"):
        transformer_engine.apply_fused_qkv_rotary_pos_emb(qkv, f, f,
                                                          qkv_split_arg_list=[30, 12, 6])
    with pytest.raises(ropejit.InvalidArgument, match="'sbhd' or 'bshd' for packed QKV"):
        transformer_engine.apply_fused_qkv_rotary_pos_emb(qkv, f, f, [32, 8, 8], "thd")
    with pytest.raises(ropejit.InvalidArgument, match=r"k_freqs must be \[rows, 1, 1"):
        transformer_engine.apply_fused_qkv_rotary_pos_emb(qkv, f, f[0],
                                                          qkv_split_arg_list=[32, 8, 8])


def test_dropin_argument_errors():
    q = torch.zeros(1, 2, 4, 64)
    cos = torch.zeros(1, 4, 64)
    with pytest.raises(ropejit.InvalidArgument, match=r"unsqueeze_dim \(3\) must be 1"):
        hf.apply_rotary_pos_emb(q, q, cos, cos, unsqueeze_dim=3)
    with pytest.raises(ropejit.InvalidArgument, match=r"cos has batch 3, q has 1"):
        hf.apply_rotary_pos_emb(q, q, torch.zeros(3, 4, 64), torch.zeros(3, 4, 64))
    with pytest.raises(ropejit.InvalidArgument, match=r"local sequence length \(1\) must be "
                                                      r"even"):
        transformer_engine.apply_rotary_pos_emb(q, torch.zeros(4, 1, 1, 64), cp_size=2)
    with pytest.raises(ropejit.InvalidArgument, match=r"cp_rank \(2\) must be an int in "
                                                      r"\[0, cp_size \(2\)\)"):
        transformer_engine.apply_rotary_pos_emb(q, torch.zeros(4, 1, 1, 64), cp_size=2,
                                                cp_rank=2)
    with pytest.raises(ropejit.InvalidArgument, match=r"freqs has 6 rows; start_positions \(up "
                                                      r"to 5\) with rank 1 of 2 need 8"):
        transformer_engine.apply_rotary_pos_emb(torch.zeros(2, 2, 4, 64),
                                                torch.zeros(6, 1, 1, 64), "sbhd",
                                                torch.tensor([0, 5], dtype=torch.int32),
                                                cp_size=2, cp_rank=1)
    with pytest.raises(ropejit.InvalidArgument, match=r"freqs has 3 rows; rank 0 of 2 with "
                                                      r"local sequence length 2 needs 4"):
        transformer_engine.apply_rotary_pos_emb(torch.zeros(2, 1, 4, 64),
                                                torch.zeros(3, 1, 1, 64), cp_size=2)
    with pytest.raises(ropejit.InvalidArgument, match=r"freqs must be \[rows, 1, 1, rotary_dim\]"):
        transformer_engine.apply_rotary_pos_emb(q, torch.zeros(4, 64))
    with pytest.raises(ropejit.InvalidArgument, match=r"tensor_format \('hsbd'\)"):
        transformer_engine.apply_rotary_pos_emb(q, torch.zeros(4, 1, 1, 64), "hsbd")
    positions = torch.zeros(4, dtype=torch.int64)
    with pytest.raises(ropejit.InvalidArgument, match=r"query.shape\[-1\] \(100\) is not a "
                                                      r"multiple of head_size \(64\)"):
        vllm.rotary_embedding(positions, torch.zeros(4, 100), None, 64, torch.zeros(8, 64), True)
    with pytest.raises(ropejit.InvalidArgument, match=r"query has shape \[5, 128\], positions "
                                                      r"\[4\]"):
        vllm.rotary_embedding(positions, torch.zeros(5, 128), None, 64, torch.zeros(8, 64), True)
    with pytest.raises(ropejit.InvalidArgument, match=r"q is on cpu"):
        flash_attn.apply_rotary_emb(q, torch.zeros(8, 32), torch.zeros(8, 32))


# torch.compile(fullgraph=True) traces with fake CUDA tensors on any machine: a graph break or a
# failing fake implementation shows here without a GPU; the GPU suite runs compiled graphs.
def _trace(fn, *make_args, dynamic=None):
    from torch._subclasses.fake_tensor import FakeTensorMode
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = [make() for make in make_args]
        torch.compile(fn, fullgraph=True, dynamic=dynamic, backend=backend)(*args)
    assert len(graphs) == 1
    calls = ("call_function", "call_method")
    return [str(n.target) for n in graphs[0].graph.nodes if n.op in calls]


def _cuda(*shape, dtype=torch.bfloat16):
    return lambda: torch.randn(*shape, dtype=dtype, device="cuda")


@pytest.mark.long
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("name", ["hf", "liger", "liger_odd", "flash_attn", "flash_attn_inplace",
                                  "vllm", "transformer_engine", "te_fused_qkv", "ops_rope_"])
def test_dropins_trace_without_graph_breaks(name, dynamic):
    ids = lambda: torch.zeros(8, dtype=torch.int64, device="cuda")  # noqa: E731
    cases = {
        "hf": (lambda q, k, c, s: hf.apply_rotary_pos_emb(q, k, c, s),
               [_cuda(2, 4, 8, 64), _cuda(2, 2, 8, 64), _cuda(1, 8, 64), _cuda(1, 8, 64)]),
        "liger": (lambda q, k, c, s: liger.liger_rotary_pos_emb(q, k, c, s),
                  [_cuda(2, 4, 8, 64), _cuda(2, 2, 8, 64), _cuda(2, 8, 64), _cuda(2, 8, 64)]),
        "liger_odd": (lambda q, k, c, s: liger.liger_rotary_pos_emb(q, k, c, s),
                      [_cuda(2, 4, 8, 41), _cuda(2, 2, 8, 41), _cuda(1, 8, 42), _cuda(1, 8, 42)]),
        "flash_attn": (lambda x, c, s: flash_attn.apply_rotary_emb(x, c, s, True),
                       [_cuda(2, 8, 4, 64), _cuda(16, 32), _cuda(16, 32)]),
        "flash_attn_inplace": (lambda x, c, s: flash_attn.apply_rotary_emb(x, c, s, False, True),
                               [_cuda(2, 8, 4, 64), _cuda(16, 32), _cuda(16, 32)]),
        "vllm": (lambda p, q, k, c: vllm.rotary_embedding(p, q, k, 64, c, True),
                 [ids, _cuda(8, 256), _cuda(8, 128), _cuda(32, 64)]),
        "transformer_engine": (lambda t, f: transformer_engine.apply_rotary_pos_emb(t, f),
                               [_cuda(8, 2, 4, 64), _cuda(16, 1, 1, 64, dtype=torch.float32)]),
        "te_fused_qkv": (lambda t, f: transformer_engine.apply_fused_qkv_rotary_pos_emb(
            t, f, f, qkv_split_arg_list=[256, 64, 64]),
            [_cuda(8, 2, 3, 384), _cuda(16, 1, 1, 64, dtype=torch.float32)]),
        "ops_rope_": (lambda q, k: ropejit.ops.rope_(q, k, base=500000.0),
                      [_cuda(2, 8, 4, 64), _cuda(2, 8, 1, 64)]),
    }
    fn, make_args = cases[name]
    ops = _trace(fn, *make_args, dynamic=dynamic)
    assert any("ropejit.rope" in op for op in ops), ops
    # Nothing but the op, views and table arithmetic: no host scalars lifted into the graph.
    assert "item" not in ops, ops


def test_trace_time_argument_errors():
    with pytest.raises(Exception, match=r"k.dtype \(f32\) must equal q.dtype \(bf16\)"):
        _trace(lambda q, k: ropejit.ops.rope(q, k), _cuda(2, 8, 4, 64),
               _cuda(2, 8, 4, 64, dtype=torch.float32))
