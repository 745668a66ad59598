"""ropejit.ops and ropejit.apply on torch tensors against the float64 rotation, over layouts,
dtypes, styles, tables, positions and partial rotary; outputs poisoned with NaN; autograd
against the analytic conjugate rotation. Each test runs on the GPU ('cuda') and, through the
host emulator of the C structs, on CPU tensors ('emulated'); both skip visibly without torch."""

import math

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import references as ref  # noqa: E402

import ropejit  # noqa: E402
from ropejit import ops  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def tables(rows, rotary_dim, dtype=torch.float32, device="cpu", base=10000.0, full=False,
           style="neox"):
    """float64-exact cos/sin [rows, R/2] rounded to dtype, and the ropejit table to pass (full
    width repeats each frequency as the style reads it)."""
    inv = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    if full:
        widen = ((lambda t: torch.cat((t, t), -1)) if style == "neox"
                 else (lambda t: t.repeat_interleave(2, -1)))
        passed = widen(cos), widen(sin)
    else:
        passed = cos, sin
    return cos.to(device), sin.to(device), passed[0].to(device), passed[1].to(device)


def dense(layout, batch, seq, heads, head_dim, dtype, device):
    """A tensor in `layout` and its [batch, seq, heads, head_dim] view."""
    order = {"bshd": (batch, seq, heads, head_dim), "sbhd": (seq, batch, heads, head_dim),
             "bhsd": (batch, heads, seq, head_dim)}[layout]
    t = torch.randn(order, dtype=torch.float32).to(dtype).to(device)
    return t, as_bshd(t, layout)


def as_bshd(t, layout):
    return {"bshd": t, "sbhd": t.transpose(0, 1), "bhsd": t.transpose(1, 2)}[layout]


CASES = [  # layout, dtype, head_dim, rotary_dim, style, table ("half", "full", None), positions
    ("bshd", "bf16", 64, 64, "neox", "half", "offset"),
    ("bshd", "f16", 64, 32, "gptj", "full", "ids"),
    ("sbhd", "f32", 80, 80, "neox", "full", "seq_offsets"),
    ("bhsd", "bf16", 96, 64, "gptj", "half", "offset"),
    ("bhsd", "f32", 64, 64, "neox", None, "ids"),
    ("bshd", "f16", 128, 96, "neox", None, "seq_offsets"),
]


def case_inputs(case, device, batch=2, seq=5, heads=3, k_heads=1):
    layout, dtype, d, r, style, table, positions = case
    q, q4 = dense(layout, batch, seq, heads, d, DTYPES[dtype], device)
    k, k4 = dense(layout, batch, seq, k_heads, d, DTYPES[dtype], device)
    rows = 64
    cos, sin, tcos, tsin = tables(rows, r, device=device, full=table == "full", style=style,
                                  dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    kwargs = dict(layout=layout, style=style, rotary_dim=r)
    if table:
        kwargs.update(cos=tcos, sin=tsin)
    else:
        kwargs.update(base=10000.0)
        cos, sin, _, _ = tables(rows, r)
    if positions == "ids":
        pos = torch.randint(0, rows, (batch, seq))
        kwargs["position_ids"] = pos.to(torch.int64).reshape(-1).to(device)
    elif positions == "seq_offsets":
        offsets = torch.tensor([3, 40])
        pos = torch.arange(seq)[None] + offsets[:, None]
        kwargs["seq_offsets"] = offsets.to(torch.int32).to(device)
    else:
        pos = torch.arange(seq)[None].expand(batch, seq) + 7
        kwargs["position_offset"] = 7

    def expected(x4, direction=1):
        c, s = cos.cpu()[pos][:, :, None], sin.cpu()[pos][:, :, None]
        return ref.rotate(x4.cpu(), c, direction * s.double(), style == "gptj")

    return q, q4, k, k4, kwargs, expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_out_of_place_and_in_place(backend, case):
    q, q4, k, k4, kwargs, expected = case_inputs(case, backend.device)
    want_q, want_k = expected(q4), expected(k4)
    q_out, k_out = ops.rope(q, k, **kwargs)
    backend.sync()
    ref.assert_close(as_bshd(q_out, kwargs["layout"]), want_q)
    ref.assert_close(as_bshd(k_out, kwargs["layout"]), want_k)
    assert q_out.shape == q.shape and q_out.stride() == q.stride()
    before = q.data_ptr()
    ops.rope_(q, k, **kwargs)
    backend.sync()
    assert q.data_ptr() == before
    ref.assert_close(q4, want_q)
    ref.assert_close(k4, want_k)


@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "-".join(map(str, c)))
def test_backward_direction_undoes_forward(backend, case):
    q, q4, k, k4, kwargs, expected = case_inputs(case, backend.device)
    q_out, _ = ops.rope(q, None, backward=True, **kwargs)
    backend.sync()
    ref.assert_close(as_bshd(q_out, kwargs["layout"]), expected(q4, direction=-1))


def test_apply_writes_every_output_element(backend):
    # Outputs poisoned with NaN: an element the call does not write (the partial rotary tail
    # out of place, say) stays NaN and fails the comparison.
    q, q4, k, k4, kwargs, expected = case_inputs(CASES[1], backend.device)
    q_out, k_out = torch.full_like(q, math.nan), torch.full_like(k, math.nan)
    result = ropejit.apply(q, k, q_out=q_out, k_out=k_out, **kwargs)
    backend.sync()
    assert result[0] is q_out and result[1] is k_out
    ref.assert_close(q_out, expected(q4))
    ref.assert_close(k_out, expected(k4))


def test_strided_views_of_a_packed_projection(backend):
    # q, k, v as slices of one [batch, seq, (4 + 2 + 2) * 64] projection: strided, no copies.
    qkv = torch.randn(2, 6, 8 * 64).to(torch.bfloat16).to(backend.device)
    q = qkv[..., : 4 * 64].unflatten(-1, (4, 64))
    k = qkv[..., 4 * 64: 6 * 64].unflatten(-1, (2, 64))
    v_before = qkv[..., 6 * 64:].clone()
    q0, k0 = q.clone(), k.clone()
    cos, sin, _, _ = tables(16, 64, device=backend.device)
    ops.rope_(q, k, cos=cos, sin=sin)
    backend.sync()
    pos = torch.arange(6)[None].expand(2, 6)
    c, s = cos.cpu()[pos][:, :, None], sin.cpu()[pos][:, :, None]
    ref.assert_close(q, ref.rotate(q0.cpu(), c, s, False))
    ref.assert_close(k, ref.rotate(k0.cpu(), c, s, False))
    assert torch.equal(qkv[..., 6 * 64:], v_before)


def test_thd_with_cu_seqlens(backend):
    lens = [3, 1, 5]
    cu = torch.tensor([0, 3, 4, 9], dtype=torch.int32)
    x = torch.randn(9, 2, 64).to(backend.device)
    cos, sin, _, _ = tables(32, 64, device=backend.device)
    out, _ = ops.rope(x, cos=cos, sin=sin, layout="thd", cu_seqlens=cu.to(backend.device),
                      position_offset=4)
    backend.sync()
    pos = torch.cat([torch.arange(n) + 4 for n in lens])
    ref.assert_close(out, ref.rotate(x.cpu(), cos.cpu()[pos][:, None], sin.cpu()[pos][:, None],
                                     False))


def test_one_launch_per_call(backend):
    if backend.name != "emulated":
        pytest.skip("counts launches through the emulator")
    q, q4, k, k4, kwargs, _ = case_inputs(CASES[0], backend.device)
    ops.rope(q, k, **kwargs)
    ops.rope_(q, k, **kwargs)
    assert len(backend.launches) == 2


@pytest.mark.parametrize("case", [CASES[0], CASES[2], CASES[3]], ids=lambda c: c[0])
def test_gradient_is_the_conjugate_rotation(backend, case):
    layout, dtype, d, r, style, table, positions = case
    case = (layout, "f32", d, r, style, table, positions)
    q, q4, k, k4, kwargs, expected = case_inputs(case, backend.device)
    q.requires_grad_(True)
    k.requires_grad_(True)
    q_out, k_out = ops.rope(q, k, **kwargs)
    gq, gk = torch.randn_like(q_out), torch.randn_like(k_out)
    torch.autograd.backward((q_out, k_out), (gq, gk))
    backend.sync()
    ref.assert_close(as_bshd(q.grad, layout), expected(as_bshd(gq, layout), direction=-1))
    ref.assert_close(as_bshd(k.grad, layout), expected(as_bshd(gk, layout), direction=-1))


def test_gradient_of_a_non_contiguous_upstream(backend):
    # sum() hands back an expanded (stride 0) gradient; a transpose hands back a permuted one.
    q, q4, _, _, kwargs, expected = case_inputs(CASES[4], backend.device)
    q = q.float().requires_grad_(True)
    out, _ = ops.rope(q, **kwargs)
    out.sum().backward()
    backend.sync()
    ones = torch.ones_like(q4, dtype=torch.float64)
    ref.assert_close(as_bshd(q.grad, kwargs["layout"]), expected(ones, direction=-1))


def test_in_place_under_autograd_is_exact(backend):
    q, q4, k, k4, kwargs, expected = case_inputs(("bshd", "f32", 64, 64, "neox", "half",
                                                  "offset"), backend.device)
    leaf = q.clone().requires_grad_(True)
    x = leaf * 1.0  # a non-leaf rotated in place, as inside a model
    ops.rope_(x, None, **kwargs)
    g = torch.randn_like(x)
    x.backward(g)
    backend.sync()
    ref.assert_close(leaf.grad, expected(g, direction=-1))


def test_eager_calls_skip_the_dispatcher_only_when_nothing_needs_it(backend, monkeypatch):
    if backend.name != "emulated":
        pytest.skip("replaces the registered ops")
    q, q4, k, k4, kwargs, expected = case_inputs(CASES[0], backend.device)

    def refuse(*args):
        raise AssertionError("the dispatcher was used")

    monkeypatch.setattr(ops, "_rope", refuse)
    monkeypatch.setattr(ops, "_rope_inplace", refuse)
    ops.rope(q, k, **kwargs)
    ops.rope_(q, k, **kwargs)
    with pytest.raises(AssertionError, match="dispatcher"):
        ops.rope(q.float().requires_grad_(True), **dict(kwargs, cos=kwargs["cos"].float(),
                                                        sin=kwargs["sin"].float()))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(), pytest.raises(AssertionError, match="dispatcher"):
        ops.rope_(torch.empty(1, 4, 2, 64, device="cuda"), base=10000.0)


def test_cpu_tensors_are_refused_before_launch():
    q = torch.zeros(1, 4, 2, 64)
    with pytest.raises(ropejit.InvalidArgument, match=r"q is on cpu"):
        ops.rope(q, base=10000.0)
    with pytest.raises(ropejit.InvalidArgument, match=r"q is on cpu"):
        ropejit.apply(q, base=10000.0)
