"""ropejit.mla on the GPU and, through a float64 host emulation of the kernel (emulator.py), on
the CPU: the binding's fields (pointers, strides, stores, scales), the cache rows, the query in
place or assembled, padding and skipped slots, against a float64 formula written here."""

import ctypes

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import references as ref  # noqa: E402

import ropejit  # noqa: E402
from ropejit import mla  # noqa: E402


@pytest.fixture(params=["cuda", "emulated"])
def device(request, monkeypatch):
    if request.param == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("no CUDA GPU visible to torch (GPU test)")
        return "cuda"
    import emulator
    from conftest import _c_checks_calls
    from ropejit import _capi

    def launch(spec, args, dev):
        if _c_checks_calls():  # without a driver the C checks end at no_driver; with one they
            try:               # would launch on host pointers
                _capi.check(_capi.lib.ropejit_mla_prepare(ctypes.byref(spec), ctypes.byref(args)))
            except ropejit.NoDriverError:
                pass
        emulator.emulate_mla(spec, args)

    monkeypatch.setattr(mla, "_require_cuda", False)
    monkeypatch.setattr(mla, "_launch", launch)
    return "cpu"


def _rotate(x, cos, sin, gptj):
    """x [..., P] float64 by cos/sin [..., P/2]."""
    if gptj:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("style", ["gptj", "neox"])
@pytest.mark.parametrize("query", ["in_place", "assemble", "assemble_fp8"])
def test_prepare_matches_float64(device, dtype, style, query):
    torch.manual_seed(5)
    T, H, R, P, rows = 6, 3, 64, 16, 40
    kv_c = torch.randn(T, R).to(dtype).to(device)
    k_pe = torch.randn(T, 1, P).to(dtype).to(device)
    w = (1 + 0.5 * torch.rand(R)).to(dtype).to(device)
    positions = torch.tensor([3, 39, 0, 17, 40, 8], dtype=torch.int64, device=device)  # 40: off
    slots = torch.tensor([5, -1, 2, 30, 7, 0], dtype=torch.int64, device=device)  # 30: outside
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(P // 2, dtype=torch.float64) / (P // 2))
    cos, sin = angles.cos().float().to(device), angles.sin().float().to(device)
    fp8 = query == "assemble_fp8"
    cache = torch.full((2, 4, R + P), float("nan"), dtype=dtype, device=device)  # 8 slots
    q = torch.randn(T, H, 32 + P).to(dtype).to(device)  # q_pe is a view: nope 32, rope 16
    q_pe = q[..., 32:]
    q0 = q.clone()
    q_nope = torch.randn(T, H, R).to(dtype).to(device)
    out_dtype = torch.float8_e4m3fn if fp8 else dtype
    q_out = None if query == "in_place" else \
        torch.zeros(T, H, R + P, device=device).to(out_dtype)
    q_scale = torch.tensor([0.05], device=device) if fp8 else None
    skipped = torch.zeros(1, dtype=torch.int32, device=device)
    if device == "cuda":
        # A first call of these shapes on other tensors: the call checked below repeats its
        # plan with its own addresses.
        from ropejit import decode
        planned = len(decode._PLANNED)
        mla.prepare(positions.clone(), cos.clone(), sin.clone(), kv_c=kv_c.clone(),
                    k_pe=k_pe.clone(), cache=cache.clone(), slots=slots.clone(),
                    norm_weight=w.clone(), q_pe=q.clone()[..., 32:],
                    q_nope=None if q_out is None else q_nope.clone(),
                    q_out=None if q_out is None else q_out.clone(),
                    q_scale=None if q_scale is None else q_scale.clone(),
                    skipped=skipped.clone(), style=style)
        assert len(decode._PLANNED) in (planned + 1, 1)  # kept (or the cache was full)
        planned = len(decode._PLANNED)
    mla.prepare(positions, cos, sin, kv_c=kv_c, k_pe=k_pe, cache=cache, slots=slots,
                norm_weight=w, q_pe=q_pe, q_nope=None if q_out is None else q_nope, q_out=q_out,
                q_scale=q_scale, skipped=skipped, style=style)
    if device == "cuda":
        assert len(decode._PLANNED) == planned  # the plan was repeated, not made again
        torch.cuda.synchronize()
    gptj = style == "gptj"
    pos = positions.cpu()
    c64, s64 = cos.cpu().double()[pos.clamp(max=rows - 1)], sin.cpu().double()[pos.clamp(max=rows - 1)]
    off = pos >= rows
    x = kv_c.cpu().double()
    normed = x / torch.sqrt((x * x).mean(-1, keepdim=True) + np.float32(1e-6)) * w.cpu().double()
    k_rot = _rotate(k_pe.cpu().double()[:, 0], c64, s64, gptj)
    k_rot[off] = float("nan")
    rows_out = cache.cpu().view(-1, R + P)
    written = set()
    for t in range(T):
        slot = int(slots[t])
        if 0 <= slot < 8:
            written.add(slot)
            ref.assert_close(rows_out[slot, :R], normed[t], dtype)
            if off[t]:
                assert torch.isnan(rows_out[slot, R:].double()).all()
            else:
                ref.assert_close(rows_out[slot, R:], k_rot[t], dtype)
    for slot in set(range(8)) - written:
        assert torch.isnan(rows_out[slot].double()).all()  # untouched
    assert int(skipped.cpu()) == 1
    q_rot = _rotate(q0.cpu().double()[..., 32:], c64[:, None], s64[:, None], gptj)
    q_rot[off] = float("nan")
    if q_out is None:
        got = q.cpu()
        assert torch.equal(got[..., :32], q0.cpu()[..., :32])  # the nope part untouched
        for t in range(T):
            if off[t]:
                assert torch.isnan(got[t, :, 32:].double()).all()
            else:
                ref.assert_close(got[t, :, 32:], q_rot[t], dtype)
        return
    assert torch.equal(q.cpu(), q0.cpu())  # q_pe read, not written
    got = q_out.cpu().double()
    want = torch.cat((q_nope.cpu().double(), q_rot), dim=-1)
    if fp8:
        got = got * 0.05
        for t in range(T):
            if not off[t]:  # e4m3: 3 mantissa bits, one rounding
                torch.testing.assert_close(got[t], want[t], rtol=2.0 ** -4, atol=0.05 * 2.0 ** -9)
        return
    for t in range(T):
        if off[t]:
            assert torch.isnan(got[t, :, R:]).all()
            ref.assert_close(got[t, :, :R], want[t, :, :R], dtype)
        else:
            ref.assert_close(got[t], want[t], dtype)


def test_prepare_argument_errors(device):
    pos = torch.zeros(2, dtype=torch.int64, device=device)
    cos = torch.zeros(8, 8, device=device)
    q_pe = torch.zeros(2, 4, 16, dtype=torch.bfloat16, device=device)
    with pytest.raises(ropejit.InvalidArgument, match="needs kv_c"):
        mla.prepare(pos, cos, cos)
    with pytest.raises(ropejit.InvalidArgument, match=r"q_pe must be \[tokens = 2, heads, "
                                                      r"rope_dim = 16\]"):
        mla.prepare(pos, cos, cos, q_pe=torch.zeros(2, 4, 8, dtype=torch.bfloat16, device=device))
    with pytest.raises(ropejit.InvalidArgument, match="cache is given but kv_c is not"):
        mla.prepare(pos, cos, cos, q_pe=q_pe, cache=torch.zeros(4, 80, dtype=torch.bfloat16))
    with pytest.raises(ropejit.InvalidArgument, match="q_out is given but q_nope is not"):
        mla.prepare(pos, cos, cos, q_pe=q_pe, q_out=torch.zeros(2, 4, 80, dtype=torch.bfloat16))
    with pytest.raises(ropejit.InvalidArgument, match="style"):
        mla.prepare(pos, cos, cos, q_pe=q_pe, style="halves")


def test_key_and_the_op_traces_without_graph_breaks(device):
    assert mla.key() == "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_csame_qip"
    assert mla.key(query="assemble", q_store="e4m3", cache_store="e4m3") == \
        "mla_bf16_r512_p64_gptj_ids-i64_tab-f32_nrms_ce4m3_qasm-e4m3"

    def step(positions, cos, sin, kv_c, k_pe, cache, slots, w, q_pe):
        torch.ops.ropejit.mla_prepare(positions, cos, sin, kv_c, k_pe, cache, slots, w, 1e-6,
                                      q_pe, None, None, None, None, None, "gptj")
        return cache, q_pe

    from torch._subclasses.fake_tensor import FakeTensorMode
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    dev = "cuda" if device == "cuda" else "cpu"
    with FakeTensorMode(allow_non_fake_inputs=True):
        args = (torch.zeros(4, dtype=torch.int64, device=dev), torch.zeros(16, 8, device=dev),
                torch.zeros(16, 8, device=dev), torch.zeros(4, 64, dtype=torch.bfloat16, device=dev),
                torch.zeros(4, 16, dtype=torch.bfloat16, device=dev),
                torch.zeros(8, 80, dtype=torch.bfloat16, device=dev),
                torch.zeros(4, dtype=torch.int64, device=dev),
                torch.zeros(64, dtype=torch.bfloat16, device=dev),
                torch.zeros(4, 2, 16, dtype=torch.bfloat16, device=dev))
        torch.compile(step, fullgraph=True, backend=backend)(*args)
    assert len(graphs) == 1
    assert any("mla_prepare" in str(n.target) for n in graphs[0].graph.nodes)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_vllm_concat_and_cache_mla(device, kv_cache_dtype):
    """vLLM's MLA cache write through the drop-in: [kv_c | k_pe] at each slot, the bits vLLM's
    kernel writes (a copy, or e4m3 of value / scale), padding (-1) and the rows of no token
    untouched, kv_c longer than slot_mapping (a padded CUDA graph batch)."""
    from ropejit.dropin import vllm
    torch.manual_seed(7)
    L, P, tokens = 512, 64, 5
    kv_c = torch.randn(tokens + 2, L).to(torch.bfloat16).to(device)
    k_pe = torch.randn(tokens + 2, P).to(torch.bfloat16).to(device)
    slot_mapping = torch.tensor([3, -1, 0, 9, 4], dtype=torch.int64, device=device)
    fp8 = kv_cache_dtype == "fp8"
    kv_cache = (torch.full((3, 4, L + P), 0x5a, dtype=torch.uint8, device=device) if fp8
                else torch.full((3, 4, L + P), -7.0, dtype=torch.bfloat16, device=device))
    before = kv_cache.clone()
    scale = torch.tensor([0.07], device=device)
    vllm.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    if device == "cuda":
        torch.cuda.synchronize()
    first = kv_cache.clone()
    # Again, on the identity inputs the first call kept: the same bytes.
    vllm.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(kv_cache.cpu(), first.cpu())
    rows, old = kv_cache.view(-1, L + P).cpu(), before.view(-1, L + P).cpu()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        want = torch.cat((kv_c[t], k_pe[t])).cpu()
        if fp8:
            want = (want.float() / 0.07).clamp(-448, 448).to(torch.float8_e4m3fn)
            want = want.view(torch.uint8)
        assert torch.equal(rows[slot], want), slot
    untouched = sorted(set(range(12)) - {s for s in slot_mapping.tolist() if s >= 0})
    assert torch.equal(rows[untouched], old[untouched])


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("is_neox", [False, True])
def test_vllm_concat_and_cache_mla_rope_fused(device, kv_cache_dtype, is_neox):
    """vLLM's fused MLA RoPE + cache write through the drop-in: q_pe and k_pe rotated in place
    (float64 reference, one rounding), each row [kv_c | rope(k_pe)] at its slot (dtype or e4m3
    of value / scale), padding (-1) and other rows untouched, positions longer than
    slot_mapping (a padded batch: those tokens rotated, no row written)."""
    from ropejit.dropin import vllm
    torch.manual_seed(11)
    L, P, H, tokens = 64, 16, 3, 6
    dt = torch.bfloat16
    kv_c = torch.randn(tokens, L).to(dt).to(device)
    k_pe = torch.randn(tokens, 1, P).to(dt).to(device)
    q = torch.randn(tokens, H, 8 + P).to(dt).to(device)
    q_pe = q[..., 8:]
    k0, q0 = k_pe.clone().cpu().double(), q.clone().cpu()
    positions = torch.tensor([5, 0, 33, 7, 12, 2], dtype=torch.int64, device=device)
    slot_mapping = torch.tensor([3, -1, 0, 9, 4], dtype=torch.int64, device=device)  # 5 of 6
    angles = torch.arange(40, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(P // 2, dtype=torch.float64) / (P // 2))
    cos_sin = torch.cat((angles.cos(), angles.sin()), -1).float().to(device)
    fp8 = kv_cache_dtype == "fp8"
    kv_cache = (torch.full((3, 4, L + P), 0x5a, dtype=torch.uint8, device=device) if fp8
                else torch.full((3, 4, L + P), -7.0, dtype=dt, device=device))
    before = kv_cache.clone().cpu()
    scale = torch.tensor([0.07], device=device)
    vllm.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin, is_neox,
                                         slot_mapping, kv_cache, kv_cache_dtype, scale)
    if device == "cuda":
        torch.cuda.synchronize()
    pos = positions.cpu()
    c, s = angles.cos()[pos], angles.sin()[pos]
    gptj = not is_neox
    k_rot = _rotate(k0[:, 0], c, s, gptj)
    q_rot = _rotate(q0[..., 8:].double(), c[:, None], s[:, None], gptj)
    ref.assert_close(k_pe[:, 0].cpu(), k_rot, dt)
    ref.assert_close(q.cpu()[..., 8:], q_rot, dt)
    assert torch.equal(q.cpu()[..., :8], q0[..., :8])
    rows, old = kv_cache.view(-1, L + P).cpu(), before.view(-1, L + P)
    written = set()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        written.add(slot)
        want = torch.cat((kv_c[t].cpu().double(), k_rot[t]))
        if fp8:
            got = rows[slot].view(torch.float8_e4m3fn).double() * 0.07
            torch.testing.assert_close(got, want, rtol=2.0 ** -4, atol=0.07 * 2.0 ** -9)
            assert torch.equal(rows[slot, :L].view(torch.float8_e4m3fn),
                               (kv_c[t].cpu().float() / 0.07).to(torch.float8_e4m3fn))
        else:
            assert torch.equal(rows[slot, :L], kv_c[t].cpu())  # copied exactly
            ref.assert_close(rows[slot, L:], want[L:], dt)
            assert torch.equal(rows[slot, L:], k_pe[t, 0].cpu())  # the same rounding
    untouched = sorted(set(range(12)) - written)
    assert torch.equal(rows[untouched], old[untouched])
    with pytest.raises(ropejit.InvalidArgument, match="kv_cache_dtype"):
        vllm.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin, is_neox,
                                             slot_mapping, kv_cache, "fp8_ds_mla", scale)


def test_tables_from_an_mla_config():
    """mla.tables: the model's YaRN frequencies and attention factor at every position, in
    float64 then rounded once; DeepSeek-V2-Lite's mscale equal to its mscale_all_dim gives a
    factor of 1; errors name the argument."""
    import pathlib
    config = pathlib.Path(__file__).resolve().parents[1] / "data" / "hf" / "deepseek-v2-lite.json"
    model = ropejit.model_from_hf_config(config)
    cos, sin = mla.tables(model, 5000)
    assert cos.shape == (5000, 32) and cos.dtype == torch.float32
    inv = torch.tensor(model.inverse_frequencies(), dtype=torch.float64)
    assert model.attention_factor() == 1.0
    angles = torch.arange(5000, dtype=torch.float64)[:, None] * inv
    assert torch.equal(cos, angles.cos().float()) and torch.equal(sin, angles.sin().float())
    c16, _ = mla.tables(str(config), 8, dtype=torch.bfloat16)
    assert torch.equal(c16, angles[:8].cos().to(torch.bfloat16))
    assert mla.tables(model)[0].shape[0] == model.max_positions
    with pytest.raises(ropejit.InvalidArgument, match=r"rows \(0\)"):
        mla.tables(model, 0)
    with pytest.raises(ropejit.InvalidArgument, match="dtype"):
        mla.tables(model, 4, dtype=torch.float64)
    with pytest.raises(ropejit.InvalidArgument, match="not an MLA model"):
        mla.tables({"num_attention_heads": 4, "head_dim": 64}, 4)



def test_vllm_rope_fused_on_one_projection_output(device):
    """vLLM splits kv_c and k_pe from one projection's output: k_pe's columns rotated in place
    beside kv_c's, which are read for the cache rows, in one call; q_pe in place too."""
    from ropejit.dropin import vllm
    torch.manual_seed(17)
    L, P, H, T = 64, 16, 2, 4
    dt = torch.float16
    latent = torch.randn(T, L + P).to(dt).to(device)
    kv_c, k_pe = latent.split([L, P], dim=-1)
    q_pe = torch.randn(T, H, P).to(dt).to(device)
    k0, q0, c0 = k_pe.cpu().double(), q_pe.cpu().double(), kv_c.cpu().clone()
    positions = torch.tensor([1, 30, 7, 0], dtype=torch.int64, device=device)
    slot_mapping = torch.tensor([2, 0, -1, 5], dtype=torch.int64, device=device)
    angles = torch.arange(32, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(P // 2, dtype=torch.float64) / (P // 2))
    cos_sin = torch.cat((angles.cos(), angles.sin()), -1).float().to(device)
    kv_cache = torch.full((2, 4, L + P), -3.0, dtype=dt, device=device)
    vllm.concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin, False,
                                         slot_mapping, kv_cache, "auto", None)
    if device == "cuda":
        torch.cuda.synchronize()
    pos = positions.cpu()
    c, s = angles.cos()[pos], angles.sin()[pos]
    k_rot = _rotate(k0, c, s, True)
    ref.assert_close(k_pe.cpu(), k_rot, dt)
    ref.assert_close(q_pe.cpu(), _rotate(q0, c[:, None], s[:, None], True), dt)
    assert torch.equal(kv_c.cpu(), c0)  # the read columns untouched
    rows = kv_cache.view(-1, L + P).cpu()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            assert torch.equal(rows[slot, :L], c0[t])
            assert torch.equal(rows[slot, L:], k_pe[t].cpu())


def _flashinfer_inputs(device, T, H, R, P, is_neox):
    torch.manual_seed(19)
    dt = torch.bfloat16
    q_rope, k_rope = torch.randn(T, H, P).to(dt).to(device), torch.randn(T, P).to(dt).to(device)
    q_nope, k_nope = torch.randn(T, H, R).to(dt).to(device), torch.randn(T, R).to(dt).to(device)
    angles = torch.arange(48, dtype=torch.float64)[:, None] * 10000.0 ** (
        -torch.arange(P // 2, dtype=torch.float64) / (P // 2))
    cos_sin = torch.cat((angles.cos(), angles.sin()), -1).float().to(device)
    pos_ids = torch.randint(0, 48, (T,), dtype=torch.int32).to(device)
    c, s = angles.cos()[pos_ids.cpu().long()], angles.sin()[pos_ids.cpu().long()]
    gptj = not is_neox
    want_q = _rotate(q_rope.cpu().double(), c[:, None], s[:, None], gptj)
    want_k = _rotate(k_rope.cpu().double(), c, s, gptj)
    return (q_rope, k_rope, q_nope, k_nope, cos_sin, pos_ids), (want_q, want_k)


def _assert_codes(got, want, scale):
    """e4m3 codes of want * scale: one rounding of a value computed in fp32 (3 mantissa bits)."""
    torch.testing.assert_close(got.cpu().double() / scale, want, rtol=2.0 ** -4,
                               atol=2.0 ** -9 / scale)


def _codes(x, scale):
    """FlashInfer's e4m3 of a value given in the activation dtype: x * scale in fp32, rounded."""
    return (x.cpu().float() * scale).to(torch.float8_e4m3fn).view(torch.uint8)


@pytest.mark.parametrize("is_neox", [False, True])
@pytest.mark.parametrize("outputs", ["allocated", "one_buffer"])
def test_flashinfer_mla_rope_quantize_fp8(device, is_neox, outputs):
    """FlashInfer's mla_rope_quantize_fp8 through the drop-in: every part as e4m3 codes of
    value * scale; the nope parts the exact bits of FlashInfer's fp32 product; outputs
    allocated, or given as the two column ranges of one buffer each (SGLang's use)."""
    from ropejit.dropin import flashinfer
    T, H, R, P = 5, 4, 64, 16
    inputs, (want_q, want_k) = _flashinfer_inputs(device, T, H, R, P, is_neox)
    q_rope, k_rope, q_nope, k_nope = inputs[:4]
    sq, skv = 20.0, 30.0
    outs = {}
    if outputs == "one_buffer":
        qbuf = torch.zeros(T, H, R + P, device=device).to(torch.float8_e4m3fn)
        kbuf = torch.zeros(T, R + P, device=device).to(torch.float8_e4m3fn)
        outs = dict(q_nope_out=qbuf[..., :R], q_rope_out=qbuf[..., R:], k_nope_out=kbuf[:, :R],
                    k_rope_out=kbuf[:, R:])
    q_rope_out, k_rope_out, q_nope_out, k_nope_out = flashinfer.mla_rope_quantize_fp8(
        *inputs, is_neox=is_neox, quant_scale_q=sq, quant_scale_kv=skv, **outs)
    if device == "cuda":
        torch.cuda.synchronize()
    for got, name in ((q_rope_out, "q_rope_out"), (q_nope_out, "q_nope_out")):
        assert got.dtype == torch.float8_e4m3fn
        if outputs == "one_buffer":
            assert got.data_ptr() == outs[name].data_ptr()
    _assert_codes(q_rope_out, want_q, sq)
    _assert_codes(k_rope_out, want_k, skv)
    assert torch.equal(q_nope_out.cpu().view(torch.uint8), _codes(q_nope, sq))
    assert torch.equal(k_nope_out.cpu().view(torch.uint8), _codes(k_nope, skv))
    same = flashinfer.rope_quantize_fp8(*inputs, is_neox=is_neox, quant_scale_q=sq,
                                        quant_scale_kv=skv)
    if device == "cuda":
        torch.cuda.synchronize()
    for a, b in zip(same, (q_rope_out, k_rope_out, q_nope_out, k_nope_out)):
        assert torch.equal(a.cpu().view(torch.uint8), b.cpu().view(torch.uint8))
    with pytest.raises(ropejit.InvalidArgument, match="MLA form"):
        flashinfer.rope_quantize_fp8(q_rope, k_rope.unsqueeze(1), q_nope, k_nope.unsqueeze(1),
                                     *inputs[4:])
    with pytest.raises(ropejit.InvalidArgument, match="quantize_dtype"):
        flashinfer.mla_rope_quantize_fp8(*inputs, quantize_dtype=torch.float8_e5m2)
    half = torch.zeros(T // 2, R, device=device).to(torch.float8_e4m3fn)
    with pytest.raises(ropejit.InvalidArgument, match=r"k_nope_out has shape \(2, 64\)"):
        flashinfer.mla_rope_quantize_fp8(*inputs, k_nope_out=half)
    strided = torch.zeros(T, 2 * R, device=device).to(torch.float8_e4m3fn)[:, ::2]
    with pytest.raises(ropejit.InvalidArgument, match="contiguous last dimension"):
        flashinfer.mla_rope_quantize_fp8(*inputs, k_nope_out=strided)


@pytest.mark.parametrize("page_size", [1, 4])
def test_flashinfer_append_paged_mla_cache(device, page_size):
    """FlashInfer's rope_quantize_fp8_append_paged_kv_cache (MLA form) through the drop-in:
    each token's [k_nope | rope(k_rope)] as e4m3 codes of value * scale at its page of the
    request's kv_indices; a padding token (batch index past the batch) and a token past its
    request's pages write nothing; every other cache byte untouched; the query returned."""
    from ropejit.dropin import flashinfer
    T, H, R, P = 6, 2, 32, 16
    inputs, (want_q, want_k) = _flashinfer_inputs(device, T, H, R, P, False)
    k_nope = inputs[3]
    # Request 0 appends positions 5..7, request 1 positions 0..1; then padding, and a token of
    # request 1 whose position lies past its pages.
    pages = 12 // page_size + 4
    batch_indices = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.int32)
    positions = torch.tensor([5, 6, 7, 0, 1, 8 + 8 * page_size], dtype=torch.int32)
    batch_indices[5] = 1
    need = [8 // page_size + (8 % page_size > 0), 2 // page_size + (2 % page_size > 0)]
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(3)).to(torch.int32)
    kv_indices = order[:sum(need)]
    kv_indptr = torch.tensor([0, need[0], need[0] + need[1]], dtype=torch.int32)
    padded = batch_indices.clone()
    padded[4] = 2  # token 4: padding
    ckv = torch.full((pages, page_size, R), 0x5a, dtype=torch.uint8, device=device)
    kpe = torch.full((pages, page_size, P), 0x5a, dtype=torch.uint8, device=device)
    sq, skv = 10.0, 25.0
    q_rope_out, q_nope_out = flashinfer.rope_quantize_fp8_append_paged_kv_cache(
        *inputs[:4], None, *inputs[4:],
        (ckv.view(torch.float8_e4m3fn), kpe.view(torch.float8_e4m3fn)), kv_indices.to(device),
        kv_indptr.to(device), padded.to(device), positions.to(device), is_neox=False,
        quant_scale_q=sq, quant_scale_kv=skv, page_size=page_size)
    if device == "cuda":
        torch.cuda.synchronize()
    _assert_codes(q_rope_out, want_q, sq)
    assert torch.equal(q_nope_out.cpu().view(torch.uint8), _codes(inputs[2], sq))
    ckv_rows, kpe_rows = ckv.view(-1, R).cpu(), kpe.view(-1, P).cpu()
    written = set()
    for t in (0, 1, 2, 3):
        b, p = int(padded[t]), int(positions[t])
        slot = int(kv_indices[int(kv_indptr[b]) + p // page_size]) * page_size + p % page_size
        written.add(slot)
        assert torch.equal(ckv_rows[slot], _codes(k_nope[t], skv)), t
        _assert_codes(kpe_rows[slot].view(torch.float8_e4m3fn), want_k[t], skv)
    others = sorted(set(range(pages * page_size)) - written)
    assert (ckv_rows[others] == 0x5a).all() and (kpe_rows[others] == 0x5a).all()


def test_vllm_cache_write_into_one_layer_of_a_cache_for_all_layers(device):
    """vLLM's cache for all layers, [blocks, layers, block_size, row], viewed per layer: blocks
    a stride of their own apart. Each slot's row lands in its block of this layer; the other
    layer and every other row untouched."""
    from ropejit.dropin import vllm
    torch.manual_seed(23)
    L, P, T = 64, 16, 5
    kv_c = torch.randn(T, L).to(torch.bfloat16).to(device)
    k_pe = torch.randn(T, P).to(torch.bfloat16).to(device)
    slot_mapping = torch.tensor([6, -1, 0, 11, 3], dtype=torch.int64, device=device)
    every = torch.full((3, 2, 4, L + P), -5.0, dtype=torch.bfloat16, device=device)
    before = every.clone().cpu()
    layer = every[:, 1]  # [blocks, block_size, row], blocks 2 * 4 rows apart
    vllm.concat_and_cache_mla(kv_c, k_pe, layer, slot_mapping, "auto", None)
    if device == "cuda":
        torch.cuda.synchronize()
    want = before.clone()
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            want[slot // 4, 1, slot % 4] = torch.cat((kv_c[t], k_pe[t])).cpu()
    assert torch.equal(every.cpu(), want)
