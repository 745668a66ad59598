"""ropejit.apply's argument checks, with stand-in tensors (fake device pointers behind
__cuda_array_interface__ or DLPack) and numpy arrays: every bad input is refused with a message
naming the argument and its value, before anything reaches the C API; good input fills the C
structs field by field."""

import numpy as np
import pytest
from conftest import FAKE_PTR, CudaArray, DLPackArray

import ropejit
from ropejit import _apply

MB = 1 << 20


def q_k(q_shape=(2, 5, 4, 64), k_heads=2, typestr="<f2"):
    q = CudaArray(q_shape, typestr)
    k_shape = list(q_shape)
    k_shape[2] = k_heads
    return q, CudaArray(k_shape, typestr, ptr=FAKE_PTR + MB)


def table(rows=16, width=32, typestr="<f4", offset=2 * MB):
    return CudaArray((rows, width), typestr, ptr=FAKE_PTR + offset)


def refused(launches, match, *args, **kwargs):
    with pytest.raises(ropejit.InvalidArgument, match=match) as e:
        ropejit.apply(*args, **kwargs)
    assert launches == [], "a refused call reached the launch"
    assert e.value.code == ropejit.ErrorCode.invalid_argument
    assert isinstance(e.value, ValueError)
    return e.value


def test_numpy_arrays_are_host_memory(launches):
    q = np.zeros((1, 4, 2, 64), np.float16)
    refused(launches, r"q is on cpu: ropejit needs CUDA device memory", q)
    q2, _ = q_k()
    refused(launches, r"k is on cpu", q2, np.zeros((2, 5, 2, 64), np.float16))


def test_non_tensors(launches):
    refused(launches, r"q \(builtins.list\) is not a tensor", [[1.0]])
    q, _ = q_k()
    refused(launches, r"cos \(builtins.str\) is not a tensor", q, cos="cos", sin="sin")


@pytest.mark.parametrize("typestr, named", [("<f8", "typestr '<f8'"), ("|b1", "typestr '|b1'"),
                                            ("<i8", "i64")])
def test_activation_dtypes(launches, typestr, named):
    q = CudaArray((1, 4, 2, 64), typestr)
    e = refused(launches, "q.dtype", q)
    assert named in str(e) and "f32 or f16 or bf16" in str(e)


def test_last_dimension_must_be_contiguous(launches):
    # f16: byte strides; the last one 4 bytes = every other element.
    q = CudaArray((1, 4, 2, 64), strides=(2048, 512, 256, 4))
    refused(launches, r"q needs a contiguous last dimension \(stride 1\), got strides "
            r"\[1024, 256, 128, 2\]", q)


def test_byte_strides_must_be_whole_elements(launches):
    q = CudaArray((1, 4, 2, 64), strides=(2048, 512, 257, 2))
    refused(launches, r"byte strides \(2048, 512, 257, 2\).*element size \(2\)", q)


def test_shapes_and_layouts(launches):
    q, k = q_k()
    refused(launches, r"layout \('bsdh'\) must be one of", q, layout="bsdh")
    refused(launches, r"style \('rope'\) must be one of", q, style="rope")
    refused(launches, r"q must be 3-d \[tokens, heads, head_dim\] for layout 'thd'", q,
            layout="thd")
    refused(launches, r"q must be 4-d \[seq, batch, heads, head_dim\]",
            CudaArray((5, 64)), layout="sbhd")
    bad_k = CudaArray((2, 6, 2, 64), ptr=FAKE_PTR + MB)
    refused(launches, r"k has shape \[2, 6, 2, 64\], q has \[2, 5, 4, 64\]", q, bad_k)
    refused(launches, r"k.dtype \(f32\) must equal q.dtype \(f16\)", q,
            CudaArray((2, 5, 2, 64), "<f4"))


@pytest.mark.parametrize("rotary_dim", [63, 0.5, 66, -2])
def test_rotary_dim(launches, rotary_dim):
    q, _ = q_k()
    refused(launches, rf"rotary_dim \({rotary_dim!r}\) must be even and in \[2, head_dim \(64\)\]",
            q, rotary_dim=rotary_dim)


def test_tables(launches):
    q, k = q_k()
    refused(launches, r"sin is missing", q, k, cos=table())
    refused(launches, r"cos is missing", q, k, sin=table())
    refused(launches, r"cos has 48 columns: a table row holds rotary_dim / 2 \(32, half width\) "
            r"or rotary_dim \(64, full width\)", q, k, cos=table(width=48),
            sin=table(width=48, offset=3 * MB))
    refused(launches, r"cos \(f32 \[16, 32\].*and sin \(f16 \[16, 32\].*must match", q, k,
            cos=table(), sin=table(typestr="<f2", offset=3 * MB))
    refused(launches, r"cos.dtype \(typestr '<f8'\) must be f32 or f16 or bf16", q, k,
            cos=table(typestr="<f8"), sin=table(typestr="<f8", offset=3 * MB))
    refused(launches, r"cos must be 2-d \[rows, width\]", q, k, cos=CudaArray((16, 1, 32), "<f4"),
            sin=CudaArray((16, 1, 32), "<f4"))
    refused(launches, r"base \(1.0\) must be a finite number > 1", q, k, base=1.0)
    refused(launches, r"base \(nan\)", q, k, base=float("nan"))


def test_positions(launches):
    q, k = q_k()
    ids = CudaArray((10,), "<i8", ptr=FAKE_PTR + 4 * MB)
    refused(launches, r"position_ids and seq_offsets are both given", q, position_ids=ids,
            seq_offsets=CudaArray((2,), "<i4"))
    refused(launches, r"position_ids must be contiguous with 10 elements \(one position per "
            r"token\), got shape \[9\]", q, position_ids=CudaArray((9,), "<i8"))
    refused(launches, r"position_ids.dtype \(f32\) must be i32 or i64", q,
            position_ids=CudaArray((10,), "<f4"))
    refused(launches, r"position_ids must be contiguous.*strides \[2\]", q,
            position_ids=CudaArray((10,), "<i8", strides=(16,)))
    refused(launches, r"seq_offsets must be contiguous with 2 elements \(one offset per "
            r"sequence\)", q, seq_offsets=CudaArray((3,), "<i4"))
    refused(launches, r"position_offset \('3'\) must be an int", q, position_offset="3")
    refused(launches, r"cu_seqlens is only for layout 'thd' \(layout is 'bshd'\)", q,
            cu_seqlens=CudaArray((3,), "<i4"))
    t = CudaArray((10, 4, 64))
    refused(launches, r"layout 'thd' needs cu_seqlens \(or position_ids\)", t, layout="thd")
    refused(launches, r"cu_seqlens.dtype \(i64\) must be i32", t, layout="thd",
            cu_seqlens=CudaArray((3,), "<i8"))


def test_outputs(launches):
    q, k = q_k()
    refused(launches, r"k_out is missing", q, k,
            q_out=CudaArray((2, 5, 4, 64), ptr=FAKE_PTR + 8 * MB))
    refused(launches, r"q_out has shape \[2, 5, 2, 64\], q has \[2, 5, 4, 64\]", q,
            q_out=CudaArray((2, 5, 2, 64)))
    refused(launches, r"k_out is given without k", q, q_out=CudaArray((2, 5, 4, 64)),
            k_out=CudaArray((2, 5, 2, 64)))


def test_dlpack_devices_and_dtypes(launches):
    refused(launches, r"q is on cuda_host", DLPackArray((1, 4, 2, 64), device=(3, 0)))
    refused(launches, r"q.dtype \(float64\) must be f32 or f16 or bf16",
            DLPackArray((1, 4, 2, 64), code=2, bits=64))
    q = DLPackArray((1, 4, 2, 64))
    k = DLPackArray((1, 4, 2, 64), device=(2, 1), ptr=FAKE_PTR + MB)
    refused(launches, r"k is on cuda:1 but q is on cuda:0: every tensor of a call must be on one "
            r"device", q, k)


def test_dlpack_call_fills_the_structs(launches):
    # bf16 (only DLPack can say so), sbhd strides given in elements, a byte offset.
    q = DLPackArray((5, 2, 4, 64), strides=(2 * 4 * 64, 4 * 64, 64, 1), byte_offset=256)
    ids = DLPackArray((10,), code=0, bits=32, ptr=FAKE_PTR + 4 * MB)
    cos = DLPackArray((32, 64), code=2, bits=32, ptr=FAKE_PTR + 2 * MB)
    sin = DLPackArray((32, 64), code=2, bits=32, ptr=FAKE_PTR + 3 * MB)
    ropejit.apply(q, cos=cos, sin=sin, position_ids=ids, layout="sbhd", stream=0x5000)
    (spec, a, stream), = launches
    assert ropejit.key(ropejit.Spec(layout="sbhd", dtype="bf16", head_dim=64, positions="ids",
                                    index_type="i32", table_width="full")) \
        == _key_of(spec)
    assert (a.batch, a.seq_len) == (2, 5)
    assert a.q.data == FAKE_PTR + 256
    assert (a.q.heads, a.q.stride_batch, a.q.stride_seq, a.q.stride_head) == (4, 256, 512, 64)
    assert a.k.data is None and a.position_ids == FAKE_PTR + 4 * MB
    assert (a.cos, a.sin, a.table_stride, a.table_rows) == (FAKE_PTR + 2 * MB, FAKE_PTR + 3 * MB,
                                                            64, 32)
    assert stream == 0x5000
    assert q.requested_streams == [0x5000] and ids.requested_streams == [0x5000]


def _key_of(spec):
    import ctypes
    from ropejit import _capi
    buf = ctypes.create_string_buffer(_capi.KEY_BUFFER)
    _capi.check(_capi.lib.ropejit_key(ctypes.byref(spec), buf, len(buf)))
    return buf.value.decode()


def test_cuda_array_interface_call_fills_the_structs(launches):
    # A packed QKV projection [tokens, (4 + 2 + 2) heads, 64] in f16: q and k are strided views.
    token = 8 * 64
    q = CudaArray((1, 7, 4, 64), strides=(7 * token * 2, token * 2, 128, 2), stream=0x77)
    k = CudaArray((1, 7, 2, 64), strides=(7 * token * 2, token * 2, 128, 2),
                  ptr=FAKE_PTR + 4 * 64 * 2)
    q_out, k_out = CudaArray((1, 7, 4, 64), ptr=FAKE_PTR + MB), CudaArray(
        (1, 7, 2, 64), ptr=FAKE_PTR + 2 * MB)
    cu = None
    result = ropejit.apply(q, k, base=500000.0, rotary_dim=32, style="gptj", position_offset=9,
                           backward=True, q_out=q_out, k_out=k_out)
    assert result == (q_out, k_out)
    (spec, a, stream), = launches
    assert _key_of(spec) == "rope_bshd_f16_d64_r32_gptj_pos-offset_comp_qk_bwd_oop"
    assert (a.q.stride_seq, a.q.stride_head, a.k.stride_seq, a.k.heads) == (token, 64, token, 2)
    assert (a.q_out.data, a.q_out.stride_seq, a.k_out.data) == (FAKE_PTR + MB, 4 * 64,
                                                                FAKE_PTR + 2 * MB)
    assert (a.base, a.position_offset, a.cu_seqlens) == (500000.0, 9, cu)
    assert stream == 0x77  # the producer's stream, from __cuda_array_interface__ v3


def test_thd_call(launches):
    t = CudaArray((10, 4, 64), "<f4")
    cu = CudaArray((4,), "<i4", ptr=FAKE_PTR + 5 * MB)
    offsets = CudaArray((3,), "<i8", ptr=FAKE_PTR + 6 * MB)
    ropejit.apply(t, layout="thd", cu_seqlens=cu, seq_offsets=offsets, cos=table(),
                  sin=table(offset=3 * MB))
    (spec, a, stream), = launches
    assert _key_of(spec) == "rope_thd_f32_d64_r64_neox_pos-seqoff-i64_tab-f32-half_qk_fwd_ip"
    assert (a.batch, a.seq_len, a.cu_seqlens, a.seq_offsets) == (3, 10, FAKE_PTR + 5 * MB,
                                                                 FAKE_PTR + 6 * MB)
    assert (a.q.stride_batch, a.q.stride_seq, a.q.stride_head) == (0, 256, 64)
    assert stream == 0  # no stream named anywhere: the legacy default stream


def test_stream_arguments(launches):
    class TorchLikeStream:
        cuda_stream = 0x1234

    class CupyLikeStream:
        ptr = 0x5678

    q, _ = q_k()
    ropejit.apply(q, stream=TorchLikeStream())
    ropejit.apply(q, stream=CupyLikeStream())
    assert [s for _, _, s in launches] == [0x1234, 0x5678]
    refused(launches[:0], r"stream \('default'\) must be a CUstream handle", q, stream="default")
    assert _apply.stream_handle(None) == 0


def fake_torch(monkeypatch):
    """Installs a stand-in `torch` module (dtypes, devices, the current raw stream, a Tensor
    class with data_ptr / shape / stride / dtype / device), so that ropejit's paths for torch
    tensors run here without torch; the real module (on GPU hosts) and ropejit's caches are put
    back after the test. Returns (module, tensor factory)."""
    import collections
    import sys
    import types
    from ropejit import _call, _tensors

    torch = types.ModuleType("torch")
    for name in ("float32", "float16", "bfloat16", "int32", "int64"):
        setattr(torch, name, f"torch.{name}")
    Device = collections.namedtuple("Device", "type index")

    class Tensor:
        def __init__(self, shape, dtype, ptr, strides=None):
            self.shape, self.dtype, self.ptr = tuple(shape), dtype, ptr
            self.strides = strides or tuple(
                int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape)))
            self.device = Device("cuda", 0)

        def data_ptr(self):
            return self.ptr

        def stride(self):
            return self.strides

    torch.Tensor = Tensor
    torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda index: 0xABC0 + index)
    torch.cuda = types.SimpleNamespace(current_device=lambda: 0)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(_tensors, "_TORCH_DTYPES", None)
    monkeypatch.setattr(_call, "_PLANS", {})
    monkeypatch.setattr(_call, "_TORCH_PLANS", {})
    return torch, Tensor


def test_torch_tensors_repeat_from_the_torch_keyed_plans(launches, monkeypatch):
    """A repeat of a planned call made only of torch tensors is planned from torch's own
    attributes (_call.fast_plan): the call's addresses, byte for byte what planning gives, the
    current stream; other strides, or a tensor of another kind, take the View path."""
    from ropejit import _call
    torch, T = fake_torch(monkeypatch)

    def call(at, q_strides=None, k=None):
        q = T((2, 5, 4, 64), torch.float16, FAKE_PTR + at * MB, q_strides)
        k = T((2, 5, 2, 64), torch.float16, FAKE_PTR + (at + 1) * MB) if k is None else k
        ropejit.apply(q, k, cos=T((16, 32), torch.float32, FAKE_PTR + (at + 2) * MB),
                      sin=T((16, 32), torch.float32, FAKE_PTR + (at + 3) * MB),
                      position_ids=T((2, 5), torch.int64, FAKE_PTR + (at + 4) * MB))
        return launches[-1]

    from ropejit import _tensors
    viewed = []
    view = _tensors.view
    monkeypatch.setattr(_tensors, "view", lambda name, *a, **kw: viewed.append(name) or view(
        name, *a, **kw))
    call(0)
    assert len(_call._TORCH_PLANS) == 1 and launches[-1][2] == 0xABC0 and "q" in viewed
    viewed.clear()
    spec, args, stream = call(10)  # a hit: no View is built
    assert viewed == [] and len(_call._TORCH_PLANS) == 1 and stream == 0xABC0
    assert (args.q.data, args.k.data, args.cos, args.sin, args.position_ids) == tuple(
        FAKE_PTR + (10 + i) * MB for i in range(5))
    _call._PLANS.clear()
    _call._TORCH_PLANS.clear()
    fresh_spec, fresh_args, _ = call(10)  # planned afresh through the Views
    assert bytes(fresh_args) == bytes(args) and bytes(fresh_spec) == bytes(spec)
    # Heads 128 elements apart: other strides, planned again.
    _, wide, _ = call(20, q_strides=(5 * 4 * 128, 4 * 128, 128, 1))
    assert len(_call._TORCH_PLANS) == 2 and wide.q.stride_head == 128
    # A k of another kind: the View path, nothing remembered under torch's attributes.
    _, mixed, _ = call(30, k=CudaArray((2, 5, 2, 64), "<f2", ptr=FAKE_PTR + 31 * MB))
    assert len(_call._TORCH_PLANS) == 2 and mixed.k.data == FAKE_PTR + 31 * MB


def test_repeated_shapes_reuse_the_plan_with_each_calls_addresses(launches):
    from ropejit import _call
    _call._PLANS.clear()
    ids = CudaArray((2, 5), "<i8", ptr=FAKE_PTR + 3 * MB)
    q, k = q_k()
    ropejit.apply(q, k, cos=table(), sin=table(offset=4 * MB), position_ids=ids)
    assert len(_call._PLANS) == 1
    # Other addresses, same shapes: a hit, with this call's addresses.
    q2 = CudaArray((2, 5, 4, 64), "<f2", ptr=FAKE_PTR + 10 * MB)
    k2 = CudaArray((2, 5, 2, 64), "<f2", ptr=FAKE_PTR + 11 * MB)
    ids2 = CudaArray((2, 5), "<i8", ptr=FAKE_PTR + 12 * MB)
    cos2, sin2 = table(offset=13 * MB), table(offset=14 * MB)
    ropejit.apply(q2, k2, cos=cos2, sin=sin2, position_ids=ids2)
    assert len(_call._PLANS) == 1
    spec, args, _ = launches[-1]
    assert (args.q.data, args.k.data, args.position_ids) == (
        FAKE_PTR + 10 * MB, FAKE_PTR + 11 * MB, FAKE_PTR + 12 * MB)
    assert (args.cos, args.sin) == (FAKE_PTR + 13 * MB, FAKE_PTR + 14 * MB)
    _call._PLANS.clear()
    ropejit.apply(q2, k2, cos=cos2, sin=sin2, position_ids=ids2)
    assert bytes(launches[-1][1]) == bytes(args) and launches[-1][0] is spec
    # An equal value of another type is planned again, and refused where planning refuses it.
    before = len(launches)
    with pytest.raises(ropejit.InvalidArgument, match="position_offset"):
        ropejit.apply(q2, k2, cos=cos2, sin=sin2, position_offset=1.0)
    ropejit.apply(q2, k2, cos=cos2, sin=sin2, position_offset=1)
    with pytest.raises(ropejit.InvalidArgument, match="position_offset"):
        ropejit.apply(q2, k2, cos=cos2, sin=sin2, position_offset=1.0)
    assert len(launches) == before + 1


def test_subpackages_load_on_first_use_and_torch_only_then():
    import subprocess
    import sys
    code = ("import sys, ropejit; assert 'torch' not in sys.modules; "
            "assert {'ops', 'nn', 'fused', 'decode', 'dropin'} <= set(dir(ropejit)); "
            "print(ropejit.decode.rms_norm_key('f16', 'rms_one_plus', True)); "
            "getattr(ropejit, 'no_such_thing')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "rmsnorm_f16_nrms1p_res" in r.stdout, r.stderr
    assert "module 'ropejit' has no attribute 'no_such_thing'" in r.stderr
