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
    with torch.no_grad():  # a model's Parameters, outside autograd: plain tensors
        ops.rope_(torch.nn.Parameter(q.clone()), torch.nn.Parameter(k.clone()), **kwargs)
    with pytest.raises(AssertionError, match="dispatcher"):
        ops.rope(q.float().requires_grad_(True), **dict(kwargs, cos=kwargs["cos"].float(),
                                                        sin=kwargs["sin"].float()))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(), pytest.raises(AssertionError, match="dispatcher"):
        ops.rope_(torch.empty(1, 4, 2, 64, device="cuda"), base=10000.0)


def test_a_repeated_call_reuses_its_plan_with_the_new_addresses(backend, monkeypatch):
    """The second call of a shape (every decode step) plans nothing and rotates its own
    tensors, exactly."""
    from ropejit import _call
    q, q4, k, k4, kwargs, expected = case_inputs(CASES[0], backend.device)
    ops.rope(q, k, **kwargs)
    planned = []
    real = _call.plan
    monkeypatch.setattr(_call, "plan", lambda *a, **kw: planned.append(1) or real(*a, **kw))
    for _ in range(2):
        q2, k2 = torch.randn_like(q), torch.randn_like(k)
        layout = kwargs["layout"]
        want = expected(as_bshd(q2, layout).clone())
        out_q, out_k = ops.rope(q2, k2, **kwargs)
        ops.rope_(q2, k2, **kwargs)
        backend.sync()
        ref.assert_close(as_bshd(out_q, layout), want)
        ref.assert_close(as_bshd(q2, layout), want)
    assert len(planned) <= 1  # rope_'s first call plans once


def test_cpu_tensors_are_refused_before_launch():
    q = torch.zeros(1, 4, 2, 64)
    with pytest.raises(ropejit.InvalidArgument, match=r"q is on cpu"):
        ops.rope(q, base=10000.0)
    with pytest.raises(ropejit.InvalidArgument, match=r"q is on cpu"):
        ropejit.apply(q, base=10000.0)


# Frequencies computed in the kernel with a scaling variant's parameters, and mRoPE's three
# position rows: against the library's float64 frequencies (references.scaled_cos_sin).
SCALINGS = {
    "linear": ropejit.Scaling(factor=4.0),
    "dynamic_ntk": ropejit.Scaling(factor=2.0, original_max_positions=32),
    "llama3": ropejit.Scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_positions=64),
    "yarn": ropejit.Scaling(factor=4.0, original_max_positions=64, mscale=1.0,
                            mscale_all_dim=0.5),
    "longrope": ropejit.Scaling(factor=8.0, original_max_positions=32,
                                short_factor=[1.0 + 0.1 * i for i in range(16)],
                                long_factor=[1.0 + 0.7 * i for i in range(16)]),
}


@pytest.mark.parametrize("freqs", sorted(SCALINGS))
@pytest.mark.parametrize("layout, dtype", [("bshd", "bf16"), ("bhsd", "f32")])
def test_scaled_frequencies(backend, freqs, layout, dtype):
    batch, seq, r = 2, 5, 32
    q, q4 = dense(layout, batch, seq, 3, 48, DTYPES[dtype], backend.device)  # partial rotary
    k, k4 = dense(layout, batch, seq, 1, 48, DTYPES[dtype], backend.device)
    pos = torch.randint(0, 100, (batch, seq))
    seq_len = 77 if freqs in ("dynamic_ntk", "longrope") else None
    kwargs = dict(layout=layout, rotary_dim=r, base=5e4, freqs=freqs, scaling=SCALINGS[freqs],
                  seq_len=seq_len, position_ids=pos.reshape(-1).to(backend.device))
    c, s = ref.scaled_cos_sin(freqs, r, 5e4, SCALINGS[freqs], seq_len or 0, pos)
    want_q = ref.rotate(q4.cpu(), c[:, :, None], s[:, :, None], False)
    want_k = ref.rotate(k4.cpu(), c[:, :, None], s[:, :, None], False)
    q_out, k_out = ops.rope(q, k, **kwargs)
    backend.sync()
    ref.assert_close(as_bshd(q_out, layout), want_q)
    ref.assert_close(as_bshd(k_out, layout), want_k)
    ops.rope_(q, k, **kwargs)
    backend.sync()
    ref.assert_close(q4, want_q)


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_positions(backend, interleaved):
    # bshd [2, 4, heads, 32]: 16 pairs in sections (4, 6, 6) of the [3, batch * seq] rows.
    batch, seq, r = 2, 4, 32
    q, q4 = dense("bshd", batch, seq, 2, r, torch.float32, backend.device)
    rows3 = torch.randint(0, 50, (3, batch * seq))
    section = (4, 6, 6)
    if interleaved:  # T H W T H W ..., height's and width's 6 pairs each, then temporal
        rows = [i % 3 if i < 18 else 0 for i in range(16)]
    else:
        rows = [0] * 4 + [1] * 6 + [2] * 6
    per_pair = rows3[rows].T.reshape(batch, seq, 16)  # each pair's position
    c, s = ref.scaled_cos_sin("yarn", r, 1e4, SCALINGS["yarn"], 0, per_pair)
    c, s = c.diagonal(dim1=-2, dim2=-1), s.diagonal(dim1=-2, dim2=-1)  # pair i at its position
    out, _ = ops.rope(q, position_ids=rows3.to(backend.device), mrope_section=section,
                      mrope_interleaved=interleaved, freqs="yarn", scaling=SCALINGS["yarn"],
                      base=1e4)
    backend.sync()
    ref.assert_close(out, ref.rotate(q4.cpu(), c[:, :, None], s[:, :, None], False))


def test_gradient_of_a_scaled_variant(backend):
    # yarn's attention factor scales cos and sin: the gradient is that factor times the
    # conjugate rotation, which the backward direction of the same key computes.
    q = torch.randn(1, 6, 2, 32).to(backend.device).requires_grad_(True)
    kwargs = dict(freqs="yarn", scaling=SCALINGS["yarn"], base=1e4, position_offset=3)
    out, _ = ops.rope(q, **kwargs)
    g = torch.randn_like(out)
    out.backward(g)
    backend.sync()
    c, s = ref.scaled_cos_sin("yarn", 32, 1e4, SCALINGS["yarn"], 0, torch.arange(6) + 3)
    assert ropejit.attention_factor("yarn", 32, SCALINGS["yarn"]) != 1.0
    ref.assert_close(q.grad, ref.rotate(g.cpu(), c[None, :, None], -s[None, :, None], False))


def test_tracing_checks_the_scaling_parameters():
    # Under fake tensors (torch.compile's tracing) nothing reaches ropejit_apply: the library's
    # own checks of the variant's parameters run at trace time all the same.
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        q = torch.empty(1, 4, 2, 64, device="cuda")
        out, _ = ops.rope(q, freqs="llama3", scaling=SCALINGS["llama3"], base=5e5)
        assert out.shape == q.shape
        with pytest.raises(ropejit.InvalidArgument, match=r"original_max_positions \(0\) must be "
                                                          r"> 0 for llama3"):
            ops.rope(q, freqs="llama3", scaling=ropejit.Scaling(factor=8.0), base=5e5)
        with pytest.raises(ropejit.InvalidArgument, match=r"pass seq_len"):
            ops.rope(q, freqs="longrope", scaling=SCALINGS["longrope"],
                     position_ids=torch.zeros(4, dtype=torch.long, device="cuda"))
