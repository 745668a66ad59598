"""ropejit.fused.qk_norm_rope's argument checks and the structs it fills, with stand-in tensors
(fake device pointers behind __cuda_array_interface__ or DLPack): every bad input is refused
with a message naming the argument before anything reaches the C API; good input fills the spec
(its key) and the cache descriptor field by field. The kernels themselves: tests/python/
test_gpu.py (against float64) and the C++ GPU suite."""

import ctypes

import pytest
from conftest import FAKE_PTR, CudaArray, DLPackArray

import ropejit
import ropejit.fused
from ropejit import _call, _capi

MB = 1 << 20
T, HQ, HK, D = 3, 4, 2, 64  # three decode tokens of three sequences


def key_of(spec):
    buf = ctypes.create_string_buffer(_capi.KEY_BUFFER)
    _capi.check(_capi.lib.ropejit_key(ctypes.byref(spec), buf, len(buf)))
    return buf.value.decode()


def at(n):
    return FAKE_PTR + n * MB


def step(**over):
    """A valid Qwen3-style decode step's arguments (bf16 q/k/v views of a packed QKV tensor,
    FP8 paged cache), each overridable."""
    token = (HQ + 2 * HK) * D
    bf16 = dict(code=4, bits=16)
    args = dict(
        q=DLPackArray((T, HQ, D), strides=(token, D, 1), **bf16),
        k=DLPackArray((T, HK, D), strides=(token, D, 1), ptr=FAKE_PTR + HQ * D * 2, **bf16),
        v=DLPackArray((T, HK, D), strides=(token, D, 1), ptr=FAKE_PTR + (HQ + HK) * D * 2,
                      **bf16),
        layout="thd", cu_seqlens=CudaArray((4,), "<i4", ptr=at(1)),
        position_ids=CudaArray((T,), "<i8", ptr=at(2)),
        cos=CudaArray((64, D // 2), "<f4", ptr=at(3)), sin=CudaArray((64, D // 2), "<f4",
                                                                       ptr=at(4)),
        norm="rms", q_norm_weight=DLPackArray((D,), ptr=at(5), **bf16),
        k_norm_weight=DLPackArray((D,), ptr=at(6), **bf16), norm_eps=1e-6,
        q_out=DLPackArray((T, HQ, D), code=10, bits=8, ptr=at(7)), out_scale=0.5,
        write_k=False,
        k_cache=DLPackArray((5, 16, HK, D), code=10, bits=8, ptr=at(8)),
        v_cache=DLPackArray((5, 16, HK, D), code=10, bits=8, ptr=at(9)),
        kv_indptr=CudaArray((4,), "<i4", ptr=at(10)), kv_indices=CudaArray((5,), "<i4",
                                                                          ptr=at(11)),
        kv_last_page_len=CudaArray((3,), "<i4", ptr=at(12)), k_scale=0.25, v_scale=2.0,
        skipped=CudaArray((1,), "<i4", ptr=at(13)))
    args.update(over)
    return args


def refused(launches, match, **args):
    with pytest.raises(ropejit.InvalidArgument, match=match) as e:
        ropejit.fused.qk_norm_rope(**args)
    assert launches == [], "a refused call reached the launch"
    assert e.value.code == ropejit.ErrorCode.invalid_argument
    return e.value


def test_a_qwen3_fp8_paged_step_fills_the_structs(launches):
    a = step()
    q_written, k_written = ropejit.fused.qk_norm_rope(**a, stream=0x99)
    assert q_written is a["q_out"] and k_written is None
    (spec, args, stream), = launches
    assert stream == 0x99
    assert key_of(spec) == (
        "rope_thd_bf16_d64_r64_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3-cpaged-e4m3_fwd_oop")
    assert (args.batch, args.seq_len) == (3, T)
    assert (args.q.heads, args.q.stride_seq, args.q.stride_head) == (HQ, (HQ + 2 * HK) * D, D)
    assert (args.v.data, args.v.heads) == (FAKE_PTR + (HQ + HK) * D * 2, HK)
    assert (args.q_out.data, args.q_out.stride_seq) == (at(7), HQ * D)
    assert args.k_out.data is None
    assert (args.q_norm_weight, args.k_norm_weight, args.norm_eps) == (at(5), at(6), 1e-6)
    assert args.out_quant_scale == 0.5
    c = args.cache
    assert (c.k, c.v, c.pages, c.page_size) == (at(8), at(9), 5, 16)
    assert (c.stride_page, c.stride_slot, c.stride_head) == (16 * HK * D, HK * D, D)
    assert (c.indptr, c.indices, c.num_indices, c.last_page_len) == (at(10), at(11), 5, at(12))
    assert (c.k_quant_scale, c.v_quant_scale, c.skipped) == (0.25, 2.0, at(13))
    # The shared spec of the plain path is not modified (the fused one is a copy).
    ropejit.apply(a["q"], a["k"], cos=a["cos"], sin=a["sin"], position_ids=a["position_ids"],
                  cu_seqlens=a["cu_seqlens"], layout="thd")
    plain = "rope_thd_bf16_d64_r64_neox_pos-ids-i64_tab-f32-half_qk_fwd_ip"
    assert key_of(launches[1][0]) == plain


def test_hnd_slots_contiguous_and_in_place(launches):
    hnd = DLPackArray((5, HK, 16, D), code=4, bits=16, ptr=at(8))
    ropejit.fused.qk_norm_rope(**step(q_out=None, out_scale=1.0, write_k=True, kv_layout="HND",
                                      k_cache=hnd, v_cache=DLPackArray((5, HK, 16, D), code=4,
                                                                       bits=16, ptr=at(9))))
    spec, args, _ = launches[-1]
    assert key_of(spec) == (
        "rope_thd_bf16_d64_r64_neox_pos-ids-i64_tab-f32-half_qk-nrms-cpaged_fwd_ip")
    assert (args.cache.stride_page, args.cache.stride_slot, args.cache.stride_head) == (
        HK * 16 * D, D, 16 * D)
    ropejit.fused.qk_norm_rope(**step(kv_indptr=None, kv_indices=None, kv_last_page_len=None,
                                      slot_mapping=CudaArray((T,), "<i8", ptr=at(14)),
                                      norm="rms_one_plus"))
    spec, args, _ = launches[-1]
    assert "_q-nrms1p-oe4m3-cslots-e4m3_" in key_of(spec)
    assert args.cache.slot_mapping == at(14)
    ropejit.fused.qk_norm_rope(**step(kv_indptr=None, kv_indices=None, kv_last_page_len=None,
                                      cache_seqlens=CudaArray((3,), "<i4", ptr=at(15)),
                                      norm=None, q_norm_weight=None, k_norm_weight=None))
    spec, args, _ = launches[-1]
    assert "_q-oe4m3-ccont-e4m3_" in key_of(spec)
    assert args.cache.seq_lens == at(15)
    # No cache: QK-norm and RoPE in place (the diffusion / video transformer case, bshd).
    q = DLPackArray((2, 5, HQ, D), code=4, bits=16)
    k = DLPackArray((2, 5, HQ, D), code=4, bits=16, ptr=at(20))
    w = DLPackArray((D,), code=4, bits=16, ptr=at(21))
    assert ropejit.fused.qk_norm_rope(q, k, layout="bshd", base=10000.0, norm="rms",
                                      q_norm_weight=w, k_norm_weight=w) == (q, k)
    assert key_of(launches[-1][0]) == "rope_bshd_bf16_d64_r64_neox_pos-offset_comp_qk-nrms_fwd_ip"


def test_norm_arguments(launches):
    refused(launches, r"norm \('layer'\) must be one of 'rms', 'rms_one_plus', 'rms_all_heads'",
            **step(norm="layer"))
    refused(launches, r"norm 'rms' needs k_norm_weight", **step(k_norm_weight=None))
    refused(launches, r"q_norm_weight is given but norm is None", **step(norm=None))
    refused(launches, r"q_norm_weight must be contiguous with 64 elements \(head_dim\), got "
            r"shape \[32\]", **step(q_norm_weight=DLPackArray((32,), ptr=at(5))))
    refused(launches, r"q_norm_weight must be contiguous with 256 elements \(heads \* head_dim\), "
            r"got shape \[64\]", **step(norm="rms_all_heads"))
    refused(launches, r"k_norm_weight must be contiguous with 128 elements", **step(
        norm="rms_all_heads", q_norm_weight=DLPackArray((HQ * D,), ptr=at(5))))
    refused(launches, r"q_norm_weight.dtype \(f16\) must equal q.dtype \(bf16\)",
            **step(q_norm_weight=DLPackArray((D,), code=2, bits=16, ptr=at(5))))
    refused(launches, r"norm_eps \(-1.0\) must be a finite number >= 0", **step(norm_eps=-1.0))


def test_output_arguments(launches):
    refused(launches, r"q_out.dtype \(f16\) must be q's \(bf16\) or float8_e4m3fn",
            **step(q_out=DLPackArray((T, HQ, D), code=2, bits=16, ptr=at(7))))
    refused(launches, r"q_out has shape \[3, 2, 64\], q has \[3, 4, 64\]",
            **step(q_out=DLPackArray((T, 2, D), code=10, bits=8, ptr=at(7))))
    refused(launches, r"k_out is missing: out of place needs an output for k",
            **step(write_k=True))
    refused(launches, r"k_out is given but k is not written",
            **step(k_out=DLPackArray((T, HK, D), code=10, bits=8, ptr=at(16))))
    refused(launches, r"k_out.dtype \(bf16\) must equal q_out.dtype \(e4m3\)",
            **step(write_k=True, k_out=DLPackArray((T, HK, D), code=4, bits=16, ptr=at(16))))
    refused(launches, r"write_k \(1\) must be True or False", **step(write_k=1))
    refused(launches, r"out_scale \('2'\) must be a number", **step(out_scale="2"))


def test_cache_arguments(launches):
    refused(launches, r"write_k=False writes k only into the KV cache, but k_cache is not given",
            **step(k_cache=None, v_cache=None, kv_indptr=None, kv_indices=None,
                   kv_last_page_len=None, skipped=None))
    refused(launches, r"given without k_cache", **step(k_cache=None))
    refused(launches, r"k_cache needs one addressing.*got paged and slots",
            **step(slot_mapping=CudaArray((T,), "<i8", ptr=at(14))))
    refused(launches, r"k_cache needs one addressing", **step(
        kv_indptr=None, kv_indices=None, kv_last_page_len=None))
    refused(launches, r"a paged cache needs kv_indptr, kv_indices and kv_last_page_len; "
            r"kv_indices is missing", **step(kv_indices=None))
    refused(launches, r"kv_indptr must be a contiguous 1-d tensor of 4 elements \(batch \+ 1 "
            r"page offsets\), got shape \[3\]", **step(kv_indptr=CudaArray((3,), "<i4",
                                                                             ptr=at(10))))
    refused(launches, r"kv_indices.dtype \(i64\) must be i32",
            **step(kv_indices=CudaArray((5,), "<i8", ptr=at(11))))
    refused(launches, r"slot_mapping.dtype \(i32\) must be i64", **step(
        kv_indptr=None, kv_indices=None, kv_last_page_len=None,
        slot_mapping=CudaArray((T,), "<i4", ptr=at(14))))
    refused(launches, r"kv_layout \('NDH'\) must be one of 'NHD', 'HND'", **step(kv_layout="NDH"))
    refused(launches, r"k_cache has shape \[5, 16, 4, 64\] \(NHD\): 4 heads of 64, k has 2 of 64",
            **step(k_cache=DLPackArray((5, 16, 4, D), code=10, bits=8, ptr=at(8))))
    refused(launches, r"k_cache must be 4-d", **step(
        k_cache=DLPackArray((5, 16 * HK * D), code=10, bits=8, ptr=at(8))))
    refused(launches, r"k_cache.dtype \(f16\) must be q's \(bf16\) or float8_e4m3fn",
            **step(k_cache=DLPackArray((5, 16, HK, D), code=2, bits=16, ptr=at(8))))
    refused(launches, r"v_cache \(bf16 \[5, 16, 2, 64\].*must match k_cache \(e4m3",
            **step(v_cache=DLPackArray((5, 16, HK, D), code=4, bits=16, ptr=at(9))))
    refused(launches, r"v is given without v_cache", **step(v_cache=None))
    refused(launches, r"v_cache is given without v", **step(v=None))
    refused(launches, r"skipped must be a contiguous 1-d tensor of 1 elements",
            **step(skipped=CudaArray((2,), "<i4", ptr=at(13))))
    refused(launches, r"k_scale \(None\) must be a number", **step(k_scale=None))
    refused(launches, r"v is given without k", **step(k=None, write_k=True, q_out=None,
                                                      k_cache=None, v_cache=None,
                                                      kv_indptr=None, kv_indices=None,
                                                      kv_last_page_len=None, skipped=None,
                                                      k_norm_weight=None))


def dynamic_step(**over):
    """The decode step with dynamic FP8 scales for q_out and the cache."""
    args = step(out_scale=1.0, k_scale=1.0, v_scale=1.0,
                q_out_scale=CudaArray((T, HQ), "<f4", ptr=at(17)),
                k_cache_scales=CudaArray((5, 16, HK), "<f4", ptr=at(18)),
                v_cache_scales=CudaArray((5, 16, HK), "<f4", ptr=at(19)))
    args.update(over)
    return args


def test_dynamic_fp8_scales_fill_the_structs(launches):
    ropejit.fused.qk_norm_rope(**dynamic_step())
    spec, args, _ = launches[-1]
    assert key_of(spec) == (
        "rope_thd_bf16_d64_r64_neox_pos-ids-i64_tab-f32-half_q-nrms-oe4m3dyn-cpaged-e4m3dyn_fwd_"
        "oop")
    s = args.q_out_scale
    assert (s.data, s.heads, s.stride_seq, s.stride_head) == (at(17), HQ, HQ, 1)
    assert args.k_out_scale.data is None
    c = args.cache
    assert (c.k_scales, c.v_scales) == (at(18), at(19))
    assert (c.scale_stride_page, c.scale_stride_slot, c.scale_stride_head) == (16 * HK, HK, 1)
    # HND scales, and k written out with its own scales (views of one [tokens, q + k] tensor).
    hnd = DLPackArray((5, HK, 16, D), code=10, bits=8, ptr=at(8))
    ropejit.fused.qk_norm_rope(**dynamic_step(
        write_k=True, k_out=DLPackArray((T, HK, D), code=10, bits=8, ptr=at(16)),
        q_out_scale=CudaArray((T, HQ), "<f4", ptr=at(17), strides=(4 * (HQ + HK), 4)),
        k_out_scale=CudaArray((T, HK), "<f4", ptr=at(17) + 4 * HQ, strides=(4 * (HQ + HK), 4)),
        kv_layout="HND", k_cache=hnd, v_cache=DLPackArray((5, HK, 16, D), code=10, bits=8,
                                                          ptr=at(9)),
        k_cache_scales=CudaArray((5, HK, 16), "<f4", ptr=at(18)),
        v_cache_scales=CudaArray((5, HK, 16), "<f4", ptr=at(19))))
    spec, args, _ = launches[-1]
    assert "_qk-nrms-oe4m3dyn-cpaged-e4m3dyn_" in key_of(spec)
    assert (args.q_out_scale.stride_seq, args.k_out_scale.data) == (HQ + HK, at(17) + 4 * HQ)
    c = args.cache
    assert (c.scale_stride_page, c.scale_stride_slot, c.scale_stride_head) == (16 * HK, 1, 16)


def test_dynamic_fp8_arguments(launches):
    refused(launches, r"out_scale \(0.5\) and q_out_scale are both given",
            **dynamic_step(out_scale=0.5))
    refused(launches, r"k_scale \(0.25\) and k_cache_scales are both given",
            **dynamic_step(k_scale=0.25))
    refused(launches, r"q_out_scale has shape \[3, 2\]; it must be q_out's without head_dim "
            r"\[3, 4\]", **dynamic_step(q_out_scale=CudaArray((T, 2), "<f4", ptr=at(17))))
    refused(launches, r"q_out_scale.dtype \(f16\) must be float32",
            **dynamic_step(q_out_scale=CudaArray((T, HQ), "<f2", ptr=at(17))))
    refused(launches, r"q_out_scale is given but q_out.dtype is bf16", **dynamic_step(
        q_out=DLPackArray((T, HQ, D), code=4, bits=16, ptr=at(7))))
    refused(launches, r"k_out_scale is missing", **dynamic_step(
        write_k=True, k_out=DLPackArray((T, HK, D), code=10, bits=8, ptr=at(16))))
    refused(launches, r"k_out_scale is given but k is not written out",
            **dynamic_step(k_out_scale=CudaArray((T, HK), "<f4", ptr=at(16))))
    refused(launches, r"k_out_scale is given without q_out_scale",
            **step(k_out_scale=CudaArray((T, HK), "<f4", ptr=at(16))))
    refused(launches, r"without q_out: scales go with FP8 outputs",
            **dynamic_step(q_out=None, write_k=True))
    refused(launches, r"k_cache_scales has shape \[5, 16, 4\]; it must be k_cache's without "
            r"head_dim \[5, 16, 2\] \(NHD\)",
            **dynamic_step(k_cache_scales=CudaArray((5, 16, 4), "<f4", ptr=at(18))))
    refused(launches, r"v_cache_scales is missing", **dynamic_step(v_cache_scales=None))
    refused(launches, r"v_cache_scales is given without k_cache_scales",
            **dynamic_step(k_cache_scales=None))
    refused(launches, r"v_cache_scales \(strides \[32, 1, 16\]\) must match k_cache_scales",
            **dynamic_step(v_cache_scales=CudaArray((5, 16, HK), "<f4", ptr=at(19),
                                                    strides=(128, 4, 64))))
    refused(launches, r"k_cache_scales is given but k_cache.dtype is bf16", **dynamic_step(
        k_cache=DLPackArray((5, 16, HK, D), code=4, bits=16, ptr=at(8)),
        v_cache=DLPackArray((5, 16, HK, D), code=4, bits=16, ptr=at(9))))
    refused(launches, r"k_cache_scales / v_cache_scales are given without k_cache",
            **dynamic_step(q_out_scale=None, out_scale=1.0, k_cache=None, v_cache=None, v=None,
                           kv_indptr=None, kv_indices=None, kv_last_page_len=None,
                           skipped=None, write_k=True,
                           k_out=DLPackArray((T, HK, D), code=10, bits=8, ptr=at(16))))


def test_repeated_shapes_reuse_the_plan_with_each_calls_addresses(launches):
    plans = _call._PLANS
    plans.clear()
    ropejit.fused.qk_norm_rope(**step())
    assert len(plans) == 1
    # The same shapes at other addresses: a hit, with every address the call's own.
    token = (HQ + 2 * HK) * D
    moved = step(q=DLPackArray((T, HQ, D), strides=(token, D, 1), ptr=at(40), code=4, bits=16),
                 k=DLPackArray((T, HK, D), strides=(token, D, 1), ptr=at(40) + HQ * D * 2,
                               code=4, bits=16),
                 v=DLPackArray((T, HK, D), strides=(token, D, 1), ptr=at(40) + (HQ + HK) * D * 2,
                               code=4, bits=16),
                 q_out=DLPackArray((T, HQ, D), code=10, bits=8, ptr=at(41)),
                 k_cache=DLPackArray((5, 16, HK, D), code=10, bits=8, ptr=at(42)),
                 kv_indices=CudaArray((5,), "<i4", ptr=at(43)),
                 skipped=CudaArray((1,), "<i4", ptr=at(44)))
    ropejit.fused.qk_norm_rope(**moved)
    assert len(plans) == 1
    spec, args, _ = launches[-1]
    assert (args.q.data, args.k.data, args.q_out.data) == (at(40), at(40) + HQ * D * 2, at(41))
    assert (args.cache.k, args.cache.indices, args.cache.skipped) == (at(42), at(43), at(44))
    # Byte for byte what planning it afresh gives.
    plans.clear()
    ropejit.fused.qk_norm_rope(**moved)
    fresh_spec, fresh_args, _ = launches[-1]
    assert bytes(args) == bytes(fresh_args) and key_of(spec) == key_of(fresh_spec)
    # Another shape, or an argument of another type with an equal value, is planned again
    # (and refused where plan() refuses it).
    ropejit.fused.qk_norm_rope(**step(out_scale=0.5))
    ropejit.fused.qk_norm_rope(**step(out_scale=1))
    assert len(plans) == 2
    k_out = DLPackArray((T, HK, D), code=10, bits=8, ptr=at(16))
    ropejit.fused.qk_norm_rope(**step(write_k=True, k_out=k_out))
    before = len(launches)
    with pytest.raises(ropejit.InvalidArgument, match=r"write_k \(1\) must be True or False"):
        ropejit.fused.qk_norm_rope(**step(write_k=1, k_out=k_out))
    assert len(launches) == before


def test_the_library_checks_what_python_cannot(launches, monkeypatch):
    # Overlapping cache pages and q (the C API's overlap check), reached through the real
    # ropejit_apply: refused with the C message, before any launch (no driver needed).
    monkeypatch.undo()
    with pytest.raises(ropejit.InvalidArgument, match=r"args\.(cache|q)"):
        ropejit.fused.qk_norm_rope(**step(k_cache=DLPackArray((5, 16, HK, D), code=10, bits=8),
                                          v_cache=DLPackArray((5, 16, HK, D), code=10, bits=8)))
