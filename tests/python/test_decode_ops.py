"""The decode block's torch ops (ropejit.ops.rms_norm, qkv_projection, ffn_gate_up, and the fused
family's qk_norm_rope): traced from fake tensors without a GPU (shapes and the argument
checks); on the GPU, torch.library.opcheck, the same bits as ropejit.decode's and
ropejit.fused's calls, torch.compile(fullgraph=True) of a decode layer's prologue and its
CUDA-graph replay, and the KV cache they write."""

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

from conftest import requires_cuda  # noqa: E402

import ropejit  # noqa: E402
from ropejit import decode, ops  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTER = 8, 2, 64, 512, 1024


def _inputs(device, tokens=3, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    cols = (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM
    return dict(
        x=randn(tokens, HIDDEN),
        residual=randn(tokens, HIDDEN),
        norm_weight=(1 + randn(HIDDEN, scale=0.1)),
        weight=randn(cols, HIDDEN, scale=HIDDEN ** -0.5),
        bias=randn(cols, scale=0.5),
        gate_up=randn(2 * INTER, HIDDEN, scale=HIDDEN ** -0.5),
        ids=torch.arange(5, 5 + tokens, dtype=torch.int64, device=device),
        k_cache=torch.zeros(4, 16, KV_HEADS, HEAD_DIM, dtype=dtype, device=device),
        v_cache=torch.zeros(4, 16, KV_HEADS, HEAD_DIM, dtype=dtype, device=device),
        slots=torch.arange(17, 17 + tokens, dtype=torch.int64, device=device),
    )


def _step(t, x, residual):
    """A decode layer's prologue and FFN front: residual add + RMSNorm, the QKV projection with
    RoPE and the cache append, RMSNorm, gate/up."""
    h = ops.rms_norm(x, t["norm_weight"], 1e-5, residual=residual)
    q, k, v = ops.qkv_projection(h, t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                                 head_dim=HEAD_DIM, norm="none", position_ids=t["ids"],
                                 base=500000.0, k_cache=t["k_cache"], v_cache=t["v_cache"],
                                 slot_mapping=t["slots"])
    g = ops.ffn_gate_up(h, t["gate_up"], norm_weight=t["norm_weight"], eps=1e-5)
    return q, k, v, g


def test_the_ops_trace_from_fake_tensors_without_a_gpu():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        t = _inputs("cuda")
        q, k, v, g = _step(t, t["x"], t["residual"].clone())
        assert q.shape == (3, Q_HEADS, HEAD_DIM) and k.shape == (3, KV_HEADS, HEAD_DIM)
        assert v.shape == (3, KV_HEADS, HEAD_DIM) and g.shape == (3, INTER)
        assert q.device.type == "cuda" and g.dtype == torch.bfloat16
        # The checks run at trace time: a wrong head count is named, as in an eager call.
        with pytest.raises(ropejit.InvalidArgument, match=r"weight.shape\[0\] \(768\) must be"):
            ops.qkv_projection(t["x"], t["weight"], q_heads=Q_HEADS, kv_heads=1,
                               head_dim=HEAD_DIM, norm_weight=t["norm_weight"])
        with pytest.raises(ropejit.InvalidArgument, match=r"residual has shape"):
            ops.rms_norm(t["x"], t["norm_weight"], residual=t["x"][:1])
        q, _, _ = ops.qkv_projection(t["x"], t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                                     head_dim=HEAD_DIM, norm_weight=t["norm_weight"],
                                     bias=t["bias"])
        assert q.shape == (3, Q_HEADS, HEAD_DIM)
        with pytest.raises(ropejit.InvalidArgument, match=r"bias must be a contiguous \[768\]"):
            ops.qkv_projection(t["x"], t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                               head_dim=HEAD_DIM, norm_weight=t["norm_weight"],
                               bias=t["bias"][:100])
        with pytest.raises(ropejit.InvalidArgument, match=r"path='unfused'"):
            ops.qkv_projection(t["x"], t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                               head_dim=HEAD_DIM, norm_weight=t["norm_weight"],
                               bias=t["bias"], path="unfused")


@requires_cuda
@pytest.mark.long
def test_opcheck():
    t = _inputs("cuda")
    tests = ("test_schema", "test_autograd_registration", "test_faketensor",
             "test_aot_dispatch_dynamic")
    from ropejit import _decode_ops as d
    torch.library.opcheck(d.rms_norm_op, (t["x"], t["norm_weight"], t["residual"].clone(), 1e-5,
                                          "rms"), test_utils=tests)
    torch.library.opcheck(d.rms_norm_plain_op, (t["x"], t["norm_weight"], 1e-5, "rms_one_plus"),
                          test_utils=tests)
    torch.library.opcheck(
        d.qkv_projection_op,
        (t["x"], t["weight"], t["norm_weight"], None, t["ids"], None, None, t["k_cache"],
         t["v_cache"], t["slots"], None, None, None, None, None, None, None, None, Q_HEADS,
         KV_HEADS, HEAD_DIM, 0, "rms", 1e-5, 0, 500000.0, "neox", "auto", 1.0, 1.0, True,
         "NHD", t["bias"]), test_utils=tests)
    torch.library.opcheck(
        d.qkv_projection_plain_op,
        (t["x"], t["weight"], t["norm_weight"], None, t["ids"], None, None, Q_HEADS, KV_HEADS,
         HEAD_DIM, 0, "rms", 1e-5, 0, 500000.0, "neox", "auto"), test_utils=tests)
    torch.library.opcheck(
        d.qkv_projection_plain_op,
        (t["x"], t["weight"], t["norm_weight"], None, t["ids"], None, None, Q_HEADS, KV_HEADS,
         HEAD_DIM, 0, "rms", 1e-5, 0, 500000.0, "neox", "auto", t["bias"]), test_utils=tests)
    half = INTER
    torch.library.opcheck(
        d.ffn_gate_up_op, (t["x"], t["gate_up"][:half], t["gate_up"][half:], t["norm_weight"],
                           None, None, 1e-5, "rms", "silu", "auto"), test_utils=tests)


@requires_cuda
def test_the_ops_give_the_bits_of_the_decode_calls():
    t = _inputs("cuda", tokens=5)
    residual = t["residual"].clone()
    ref_residual = t["residual"].clone()
    h = ops.rms_norm(t["x"], t["norm_weight"], 1e-5, residual=residual)
    h_ref = decode.rms_norm(t["x"], t["norm_weight"], 1e-5, residual=ref_residual)
    assert torch.equal(h, h_ref) and torch.equal(residual, ref_residual)
    # Against float64: x + residual rounded once, then the norm in fp32 rounded once.
    s = (t["x"].double() + t["residual"].double()).to(torch.bfloat16)
    assert torch.equal(residual, s)
    sd = s.double()
    want = sd / torch.sqrt(sd.pow(2).mean(-1, keepdim=True) + 1e-5) * t["norm_weight"].double()
    assert (h.double() - want).abs().max() <= 2 ** -7 * want.abs().max()

    kc, vc = t["k_cache"].clone(), t["v_cache"].clone()
    got = ops.qkv_projection(h, t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                             head_dim=HEAD_DIM, norm="none", position_ids=t["ids"],
                             k_cache=kc, v_cache=vc, slot_mapping=t["slots"])
    kr, vr = t["k_cache"].clone(), t["v_cache"].clone()
    want = decode.qkv_projection(h, t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                                 head_dim=HEAD_DIM, norm="none", position_ids=t["ids"],
                                 k_cache=kr, v_cache=vr, slot_mapping=t["slots"])
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)
    rows = kc.view(-1, KV_HEADS, HEAD_DIM)[t["slots"]]
    assert torch.equal(rows, got[1]) and torch.equal(vc.view(-1, KV_HEADS, HEAD_DIM)[t["slots"]],
                                                     got[2])
    assert torch.equal(ops.ffn_gate_up(h, t["gate_up"], norm_weight=t["norm_weight"]),
                       decode.ffn_gate_up(h, t["gate_up"], norm_weight=t["norm_weight"]))
    # Qwen2's biases: the op and the decode call agree, and v (not rotated) moves by the bias.
    plain = ops.qkv_projection(h, t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                               head_dim=HEAD_DIM, norm="none", position_ids=t["ids"])
    biased = ops.qkv_projection(h, t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                                head_dim=HEAD_DIM, norm="none", position_ids=t["ids"],
                                bias=t["bias"])
    want = decode.qkv_projection(h, t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                                 head_dim=HEAD_DIM, norm="none", position_ids=t["ids"],
                                 bias=t["bias"])
    for a, b in zip(biased, want):
        assert torch.equal(a, b)
    v_bias = t["bias"][(Q_HEADS + KV_HEADS) * HEAD_DIM:].view(KV_HEADS, HEAD_DIM).double()
    shift = biased[2].double() - plain[2].double()
    assert (shift - v_bias).abs().max() <= 2 ** -7 * (plain[2].abs().max() + v_bias.abs().max())


@requires_cuda
def test_a_compiled_step_matches_eager_and_replays_in_a_cuda_graph():
    t = _inputs("cuda", tokens=1)
    eager_cache = (t["k_cache"].clone(), t["v_cache"].clone())
    residual = t["residual"].clone()
    eager = _step(dict(t, k_cache=eager_cache[0], v_cache=eager_cache[1]), t["x"], residual)

    compiled = torch.compile(_step, fullgraph=True)
    c_res = t["residual"].clone()
    got = compiled(t, t["x"], c_res)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)
    assert torch.equal(c_res, residual)
    assert torch.equal(t["k_cache"], eager_cache[0]) and torch.equal(t["v_cache"], eager_cache[1])

    # Captured once (the keys are loaded), replayed with new inputs written into the same memory.
    x = t["x"].clone()
    g_res = t["residual"].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _step(t, x, g_res.clone())
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _step(t, x, g_res)
    fresh = _inputs("cuda", tokens=1, seed=1)
    x.copy_(fresh["x"])
    g_res.copy_(fresh["residual"])
    graph.replay()
    torch.cuda.synchronize()
    ref_res = fresh["residual"].clone()
    want = _step(dict(t, k_cache=t["k_cache"].clone(), v_cache=t["v_cache"].clone()),
                 fresh["x"], ref_res)
    for a, b in zip(out, want):
        assert torch.equal(a, b)
    assert torch.equal(g_res, ref_res)


@requires_cuda
def test_a_repeated_shape_replays_its_plan_with_the_new_addresses():
    first, second = _inputs("cuda", tokens=4, seed=2), _inputs("cuda", tokens=4, seed=3)

    def project(t, offset):
        kc, vc = t["k_cache"].clone(), t["v_cache"].clone()
        qkv = decode.qkv_projection(t["x"], t["weight"], q_heads=Q_HEADS, kv_heads=KV_HEADS,
                                    head_dim=HEAD_DIM, norm_weight=t["norm_weight"],
                                    position_offset=offset, k_cache=kc, v_cache=vc,
                                    slot_mapping=t["slots"])
        g = decode.ffn_gate_up(t["x"], t["gate_up"], norm_weight=t["norm_weight"])
        return qkv + (kc, vc, g)

    decode._PLANNED.clear()
    project(first, 3)  # planned
    assert len(decode._PLANNED) == 2
    replayed = project(second, 9)  # the plans, with second's addresses and offset
    decode._PLANNED.clear()
    fresh = project(second, 9)
    for a, b in zip(replayed, fresh):
        assert torch.equal(a, b)


def _qk_step(t, packed, k_cache, v_cache, seqlens):
    """Qwen3's attention prologue after the projection: QK-norm, RoPE and the append to an HND
    cache ([batch, kv_heads, max_len, head_dim], transformers' StaticCache) on views of the
    packed projection output."""
    q, k, v = (h.view(h.shape[0], 1, -1, HEAD_DIM)
               for h in packed.split([Q_HEADS, KV_HEADS, KV_HEADS], dim=1))
    return ops.qk_norm_rope(q, k, v, layout="bshd", position_ids=t["ids"], base=1e6,
                            norm="rms", q_norm_weight=t["qk_norm"], k_norm_weight=t["qk_norm"],
                            norm_eps=1e-6, k_cache=k_cache, v_cache=v_cache, kv_layout="HND",
                            cache_seqlens=seqlens)


@requires_cuda
def test_the_fused_op_gives_the_bits_of_the_fused_call_eager_and_compiled():
    """ropejit.ops.qk_norm_rope (in place on views of one packed tensor, the cache appended):
    eager, through the dispatcher (opcheck) and under torch.compile(fullgraph=True) with CUDA
    graphs, the bits of ropejit.fused.qk_norm_rope."""
    from ropejit import _fused_ops, fused
    t = _inputs("cuda", tokens=3)
    t["qk_norm"] = (1 + torch.randn(HEAD_DIM, device="cuda") * 0.1).bfloat16()
    packed = (torch.randn(3, Q_HEADS + 2 * KV_HEADS, HEAD_DIM, device="cuda")).bfloat16()
    seqlens = torch.tensor([0, 5, 15], dtype=torch.int32, device="cuda")

    def cache():
        return [torch.zeros(3, KV_HEADS, 16, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
                for _ in range(2)]

    want_packed, want_cache = packed.clone(), cache()
    q, k, v = (h.view(3, 1, -1, HEAD_DIM)
               for h in want_packed.split([Q_HEADS, KV_HEADS, KV_HEADS], dim=1))
    fused.qk_norm_rope(q, k, v, layout="bshd", position_ids=t["ids"], base=1e6, norm="rms",
                       q_norm_weight=t["qk_norm"], k_norm_weight=t["qk_norm"], norm_eps=1e-6,
                       k_cache=want_cache[0], v_cache=want_cache[1], kv_layout="HND",
                       cache_seqlens=seqlens)
    assert not torch.equal(want_packed, packed)
    assert torch.equal(want_cache[0][2, :, 15], want_packed[2, Q_HEADS:Q_HEADS + KV_HEADS])

    got_packed, got_cache = packed.clone(), cache()
    _qk_step(t, got_packed, *got_cache, seqlens)
    assert torch.equal(got_packed, want_packed)
    assert all(torch.equal(a, b) for a, b in zip(got_cache, want_cache))

    # Static buffers, as transformers' StaticCache marks its tensors, so the CUDA graph keeps
    # them as inputs it mutates.
    got_packed, got_cache = packed.clone(), cache()
    for buf in (got_packed, *got_cache):
        torch._dynamo.mark_static_address(buf)
    step = torch.compile(_qk_step, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # warm-up, recording, replay
        got_packed.copy_(packed)
        for c in got_cache:
            c.zero_()
        step(t, got_packed, *got_cache, seqlens)
        torch.cuda.synchronize()
        assert torch.equal(got_packed, want_packed)
        assert all(torch.equal(a, b) for a, b in zip(got_cache, want_cache))

    args = [None] * len(_fused_ops.TENSORS)
    named = dict(q=packed.clone()[:, None, :Q_HEADS], position_ids=t["ids"],
                 q_norm_weight=t["qk_norm"])
    for name, value in named.items():
        args[_fused_ops.TENSORS.index(name)] = value
    options = ["bshd", "neox", 0, 0, 1e6, None, [], None, None, False, "rms", 1e-6, 1.0, True,
               "NHD", 1.0, 1.0]
    torch.library.opcheck(_fused_ops.op, (*args, *options),
                          test_utils=("test_schema", "test_autograd_registration",
                                      "test_faketensor", "test_aot_dispatch_dynamic"))
