"""What ropejit needs to know of a tensor (device pointer, shape, strides in elements, dtype,
device), read from a torch tensor directly, or from any object with __cuda_array_interface__
(CuPy, Numba, JAX) or DLPack (__dlpack__ / __dlpack_device__). No library is imported here:
torch is recognised by the type's module."""

import ctypes
import sys

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


def _from_cuda_array_interface(name, cai):
    typestr = cai["typestr"]
    dtype = _TYPESTRS.get(typestr, f"typestr {typestr!r}")
    if cai.get("mask") is not None:
        raise InvalidArgument(f"ropejit: {name} has a mask (__cuda_array_interface__): masked "
                              f"arrays are not supported")
    shape = tuple(int(n) for n in cai["shape"])
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 1
    strides = cai.get("strides")
    if strides is None:
        strides = _row_major(shape)
    else:
        if any(s % itemsize for s in strides):
            raise InvalidArgument(f"ropejit: {name} has byte strides {tuple(strides)} that are "
                                  f"not multiples of its element size ({itemsize})")
        strides = tuple(s // itemsize for s in strides)
    stream = cai.get("stream") if cai.get("version", 0) >= 3 else None
    return View(name, int(cai["data"][0]), shape, strides, dtype, ("cuda", None), stream)


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
    device_type, device_id = obj.__dlpack_device__()
    kind = _DL_DEVICES.get(int(device_type), f"DLPack device type {int(device_type)}")
    if int(device_type) != _DL_CUDA:
        # No capsule is taken: a CPU tensor is refused by the caller's device check.
        return View(name, 0, (), (), "?", (kind, int(device_id)))
    capsule = obj.__dlpack__(stream=_dlpack_stream(stream))
    # The capsule stays unconsumed: its destructor calls the producer's deleter when it goes,
    # and `obj` keeps the memory alive for the call.
    t = _DLTensor.from_address(_capsule_pointer(capsule, b"dltensor"))
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    dtype = _DL_DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        dtype = f"{_DL_CODE_NAMES.get(code, f'code {code}')}{bits}" + (
            f"x{lanes}" if lanes != 1 else "")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = (tuple(t.strides[i] for i in range(t.ndim)) if t.strides else _row_major(shape))
    ptr = (t.data or 0) + t.byte_offset
    return View(name, ptr, shape, strides, dtype, ("cuda", int(device_id)))


def view(name, obj, stream=None, fake=False):
    """The View of `obj` (argument `name`), or InvalidArgument saying what it is and what
    ropejit takes. `stream` is the launch stream, passed to __dlpack__ as the consumer's."""
    if is_torch_tensor(obj):
        return from_torch(name, obj, fake)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return _from_cuda_array_interface(name, cai)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        return _from_dlpack(name, obj, stream)
    if hasattr(obj, "__array_interface__"):
        return View(name, 0, (), (), "?", ("cpu", None))
    raise InvalidArgument(f"ropejit: {name} ({type(obj).__module__}.{type(obj).__qualname__}) is "
                          f"not a tensor: pass a torch tensor, or an object with "
                          f"__cuda_array_interface__ or __dlpack__ (CuPy, JAX, Numba)")
