"""What ropejit needs to know of a tensor (device pointer, shape, strides in elements, dtype,
device), read from a torch tensor directly, or from any object with __cuda_array_interface__
(CuPy, Numba, JAX) or DLPack (__dlpack__ / __dlpack_device__). No library is imported here:
torch is recognised by the type's module."""

import ctypes
import numbers
import sys
from collections.abc import Mapping

from ropejit._cvalues import integer, shown
from ropejit.errors import InvalidArgument


class View:
    """One tensor as ropejit sees it. `ptr` is 0 for tensors without storage (torch's fake
    tensors while tracing): everything is checked, nothing is launched. `device` is
    (type, index): index None when the protocol does not say (__cuda_array_interface__).
    `stream`: the producer's stream from __cuda_array_interface__ v3, else None."""

    __slots__ = ("name", "ptr", "shape", "strides", "dtype", "device", "stream")

    def __init__(self, name, ptr, shape, strides, dtype, device, stream=None):
        self.name, self.ptr, self.shape, self.strides = name, ptr, tuple(shape), tuple(strides)
        self.dtype, self.device, self.stream = dtype, device, stream

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return (f"View({self.name}: {self.dtype} {list(self.shape)} strides "
                f"{list(self.strides)} on {device_name(self.device)})")


def device_name(device):
    kind, index = device
    return kind if index is None or kind == "cpu" else f"{kind}:{index}"


def is_torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


_TORCH_DTYPES = None


def _torch_dtype(dtype):
    global _TORCH_DTYPES
    if _TORCH_DTYPES is None:
        import torch
        _TORCH_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
                         torch.int32: "i32", torch.int64: "i64"}
        if hasattr(torch, "float8_e4m3fn"):  # FP8 outputs and caches of the fused keys
            _TORCH_DTYPES[torch.float8_e4m3fn] = "e4m3"
    return _TORCH_DTYPES.get(dtype) or str(dtype).replace("torch.", "")


def from_torch(name, t, fake=False):
    """`fake`: the tensor has no storage (torch.compile's fake tensors): ptr 0."""
    device = t.device
    return View(name, 0 if fake else t.data_ptr(), t.shape, t.stride(), _torch_dtype(t.dtype),
                (device.type, device.index))


# __cuda_array_interface__ typestr (numpy's) by ropejit's names; bf16 has no typestr.
_TYPESTRS = {"<f4": "f32", "<f2": "f16", "<i4": "i32", "<i8": "i64"}
_ITEMSIZES = {"<f4": 4, "<f2": 2, "<i4": 4, "<i8": 8}
_MAX_NDIM = 64  # numpy's limit; DLPack and the interface set none
_INT64_MAX = (1 << 63) - 1
_ADDRESS_END = 1 << 64


def _bad(name, what, value, rule):
    raise InvalidArgument(f"ropejit: {name}'s {what} ({shown(value)}) {rule}")


def _cai_typestr(name, typestr):
    """(dtype name, item size) of a typestr: byte order, kind, size in bytes ('<f2')."""
    if typestr in _ITEMSIZES if type(typestr) is str else False:
        return _TYPESTRS[typestr], _ITEMSIZES[typestr]
    size = typestr[2:] if isinstance(typestr, str) else ""
    if (not isinstance(typestr, str) or len(typestr) > 8 or typestr[:1] not in "<>|="
            or not typestr[1:2].isalpha() or not (size.isascii() and size.isdigit())
            or int(size) == 0):
        _bad(name, "__cuda_array_interface__ typestr", typestr,
             "must be a numpy type string such as '<f2': byte order, kind, size in bytes")
    return _TYPESTRS.get(typestr, f"typestr {typestr!r}"), int(size)


def _sizes(name, what, values, nonnegative):
    """A tuple of ints that fit int64 (>= 0 for a shape), at most _MAX_NDIM of them."""
    if not isinstance(values, (tuple, list)):
        _bad(name, what, values, "must be a tuple of ints")
    if len(values) > _MAX_NDIM:
        _bad(name, what, values, f"has {len(values)} dimensions, more than {_MAX_NDIM}")
    low = 0 if nonnegative else -_INT64_MAX - 1
    for n in values:
        if type(n) is int and low <= n <= _INT64_MAX:
            continue  # the common case, without the ABC check below
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            _bad(name, what, values, f"must be a tuple of ints; it holds {shown(n)}")
        if not low <= n <= _INT64_MAX:
            _bad(name, what, values, f"holds {shown(n)}: each must be "
                 f"{'>= 0 and ' if nonnegative else ''}fit int64")
    return tuple(int(n) for n in values)


def _check_extent(name, ptr, shape, strides, itemsize):
    """Refuses a view whose bytes, from `ptr`, would pass int64 byte offsets or either end of
    the address space: the library computes offsets in int64 and would wrap."""
    low = high = 0  # element offsets of the first and last element from ptr
    for n, s in zip(shape, strides):
        if n == 0:
            return
        if s < 0:
            low += (n - 1) * s
        else:
            high += (n - 1) * s
    low, high = low * itemsize, (high + 1) * itemsize
    if high - low > _INT64_MAX or ptr + low < 0 or ptr + high > _ADDRESS_END:
        raise InvalidArgument(f"ropejit: {name} (shape {list(shape)}, strides {list(strides)} "
                              f"elements of {itemsize} bytes, at {ptr:#x}) spans bytes "
                              f"[{low}, {high}) from its pointer: past int64 offsets or the "
                              f"address space")


def _from_cuda_array_interface(name, cai):
    if type(cai) is not dict and not isinstance(cai, Mapping):
        _bad(name, "__cuda_array_interface__", cai, "must be a dict")
    for key in ("shape", "typestr", "data"):
        if key not in cai:
            _bad(name, "__cuda_array_interface__", cai, f"has no {key!r}")
    dtype, itemsize = _cai_typestr(name, cai["typestr"])
    if cai.get("mask") is not None:
        raise InvalidArgument(f"ropejit: {name} has a mask (__cuda_array_interface__): masked "
                              f"arrays are not supported")
    version = cai.get("version", 0)
    if type(version) is not int and (isinstance(version, bool)
                                     or not isinstance(version, numbers.Integral)):
        _bad(name, "__cuda_array_interface__ version", version, "must be an int")
    data = cai["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        _bad(name, "__cuda_array_interface__ data", data,
             "must be a tuple (pointer, read-only flag)")
    ptr = integer(f"{name}'s __cuda_array_interface__ data pointer", data[0], ctypes.c_void_p)
    shape = _sizes(name, "__cuda_array_interface__ shape", cai["shape"], True)
    strides = cai.get("strides")
    if strides is None:
        strides = _row_major(shape)
    else:
        strides = _sizes(name, "__cuda_array_interface__ strides", strides, False)
        if len(strides) != len(shape):
            _bad(name, "__cuda_array_interface__ strides", strides,
                 f"must have one entry per dimension of shape {list(shape)}")
        if any(s % itemsize for s in strides):
            raise InvalidArgument(f"ropejit: {name} has byte strides {tuple(strides)} that are "
                                  f"not multiples of its element size ({itemsize})")
        strides = tuple(s // itemsize for s in strides)
    _check_extent(name, ptr, shape, strides, itemsize)
    stream = None
    if version >= 3 and cai.get("stream") is not None:
        stream = integer(f"{name}'s __cuda_array_interface__ stream", cai["stream"],
                         ctypes.c_void_p)
    return View(name, ptr, shape, strides, dtype, ("cuda", None), stream)


def _row_major(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


# DLPack (dlpack.h): device types, and the structs of the unversioned "dltensor" capsule.
_DL_DEVICES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
               9: "vpi", 10: "rocm", 11: "rocm_host", 13: "cuda_managed", 14: "oneapi"}
_DL_CUDA = 2
_DL_DTYPES = {(2, 32): "f32", (2, 16): "f16", (4, 16): "bf16", (0, 32): "i32", (0, 64): "i64",
              (10, 8): "e4m3"}  # kDLFloat8_e4m3fn
_DL_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_stream(stream):
    """The consumer stream argument of __dlpack__: the producer makes its pending work on the
    tensor visible to it. DLPack spells the legacy default stream 1 (0 is ambiguous there)."""
    return 1 if not stream else stream


def _from_dlpack(name, obj, stream):
    device = obj.__dlpack_device__()
    if (not isinstance(device, tuple) or len(device) != 2 or any(
            isinstance(n, bool) or not isinstance(n, numbers.Integral) for n in device)):
        _bad(name, "__dlpack_device__()", device, "must be a tuple (device type, device id)")
    device_type, device_id = int(device[0]), int(device[1])
    kind = _DL_DEVICES.get(device_type, f"DLPack device type {device_type}")
    if device_type != _DL_CUDA:
        # No capsule is taken: a CPU tensor is refused by the caller's device check.
        return View(name, 0, (), (), "?", (kind, device_id))
    capsule = obj.__dlpack__(stream=_dlpack_stream(stream))
    # The capsule stays unconsumed: its destructor calls the producer's deleter when it goes,
    # and `obj` keeps the memory alive for the call.
    try:
        address = _capsule_pointer(capsule, b"dltensor")
    except (TypeError, ValueError):
        _bad(name, "__dlpack__()", capsule, "must be an unconsumed \"dltensor\" capsule")
    t = _DLTensor.from_address(address)
    if not 0 <= t.ndim <= _MAX_NDIM:
        _bad(name, "DLPack tensor's ndim", t.ndim, f"must be in [0, {_MAX_NDIM}]")
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    dtype = _DL_DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        dtype = f"{_DL_CODE_NAMES.get(code, f'code {code}')}{bits}" + (
            f"x{lanes}" if lanes != 1 else "")
    shape = _sizes(name, "DLPack shape", [t.shape[i] for i in range(t.ndim)], True)
    strides = (tuple(t.strides[i] for i in range(t.ndim)) if t.strides else _row_major(shape))
    ptr = integer(f"{name}'s DLPack data pointer + byte_offset", (t.data or 0) + t.byte_offset,
                  ctypes.c_void_p)
    _check_extent(name, ptr, shape, strides, max(1, bits * lanes // 8))
    return View(name, ptr, shape, strides, dtype, ("cuda", device_id))


def view(name, obj, stream=None, fake=False):
    """The View of `obj` (argument `name`), or InvalidArgument saying what it is and what
    ropejit takes. `stream` is the launch stream, passed to __dlpack__ as the consumer's."""
    if is_torch_tensor(obj):
        return from_torch(name, obj, fake)
    try:
        cai = getattr(obj, "__cuda_array_interface__", None)
    except Exception as e:  # a property that fails, one that recurses included
        raise InvalidArgument(f"ropejit: {name}.__cuda_array_interface__ cannot be read: "
                              f"{type(e).__name__}: {shown(str(e))}") from e
    if cai is not None:
        return _from_cuda_array_interface(name, cai)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(name, obj, stream)
    if hasattr(obj, "__array_interface__"):
        return View(name, 0, (), (), "?", ("cpu", None))
    raise InvalidArgument(f"ropejit: {name} ({type(obj).__module__}.{type(obj).__qualname__}) is "
                          f"not a tensor: pass a torch tensor, or an object with "
                          f"__cuda_array_interface__ or __dlpack__ (CuPy, JAX, Numba)")
