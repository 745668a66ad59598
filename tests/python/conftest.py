"""Shared fixtures of the Python tests: what this machine has (torch, a CUDA GPU), stand-in
tensors exposing __cuda_array_interface__ or DLPack, and the `backend` fixture that runs a
torch test on the GPU and, without one, on CPU tensors through the host emulator."""

import ctypes
import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def header_version():
    text = (ROOT / "include" / "ropejit" / "ropejit.hpp").read_text()
    return re.search(r'kVersion = "([^"]+)"', text).group(1)


def cuda_available():
    if not HAVE_TORCH:
        return False
    import torch
    return torch.cuda.is_available()


def no_driver():
    """True when ropejit itself sees no driver (then C calls fail with no_driver)."""
    import ropejit
    try:
        return ropejit.info().driver.startswith("none")
    except FileNotFoundError:
        # The library alone (ROPEJIT_LIB over a build tree) has no `ropejit` command to ask; the
        # library finds the driver the same way: libcuda.so.1 loads and cuInit succeeds.
        import ctypes
        try:
            return ctypes.CDLL("libcuda.so.1").cuInit(0) != 0
        except OSError:
            return True


def pytest_configure(config):
    # pytest-xdist's workers share the cores (and, under tools/dev.sh, ctest's processes): each
    # takes its share of torch's CPU threads, or the emulated cases' CPU ops oversubscribe them.
    import os
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if HAVE_TORCH and workers > 1:
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


def pytest_collection_modifyitems(config, items):
    # The cases marked `long` run first: pytest-xdist hands out the first quarter of the cases
    # one at a time, round robin, so each worker starts on one of them instead of a worker
    # meeting several at the end of the run while the others wait.
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


requires_cuda = pytest.mark.skipif(not cuda_available(),
                                   reason="no CUDA GPU visible to torch (GPU test)")

# Pointers that are never dereferenced: arguments are checked before any launch, and without a
# driver the C API stops at no_driver before touching them.
FAKE_PTR = 0x7F0000000000


@pytest.fixture
def launches(monkeypatch):
    """Replaces the launch: records (spec, args, stream) instead of calling the C API."""
    from ropejit import _call
    calls = []
    monkeypatch.setattr(_call, "launch", lambda spec, args, stream: calls.append(
        (spec, args, stream)))
    return calls


class CudaArray:
    """A stand-in device array exposing __cuda_array_interface__ (v3) with a fake pointer."""

    def __init__(self, shape, typestr="<f2", strides=None, ptr=FAKE_PTR, stream=None, version=3):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "strides": strides,
                                         "version": version, "stream": stream}


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8),
                ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("tensor", _DLTensor), ("ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPackArray:
    """A stand-in exposing DLPack: __dlpack_device__ and __dlpack__ returning a real
    "dltensor" capsule (no deleter) over a fake pointer. code/bits: 2/16 f16, 4/16 bf16,
    2/32 f32, 0/64 int64. Records the stream __dlpack__ was asked for."""

    def __init__(self, shape, code=4, bits=16, strides=None, ptr=FAKE_PTR, device=(2, 0),
                 byte_offset=0):
        self.device = device
        n = len(shape)
        self._shape = (ctypes.c_int64 * n)(*shape)
        self._strides = None if strides is None else (ctypes.c_int64 * n)(*strides)
        self._managed = _DLManaged(_DLTensor(ptr, device[0], device[1], n, code, bits, 1,
                                             self._shape, self._strides, byte_offset))
        self.requested_streams = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        self.requested_streams.append(stream)
        return _capsule_new(ctypes.addressof(self._managed), b"dltensor", None)


class Backend:
    """Where a torch test's tensors live: 'cuda' (the real kernels) or 'emulated' (CPU tensors,
    launches replaced by emulator.emulate, which records each launch in `launches`)."""

    def __init__(self, name):
        self.name = name
        self.device = "cuda" if name == "cuda" else "cpu"
        self.launches = []

    def sync(self):
        if self.name == "cuda":
            import torch
            torch.cuda.synchronize()


_C_CHECKS = []


def _c_checks_calls():
    """Whether emulated calls also go through the real ropejit_apply: only without a driver,
    where it stops at no_driver; with one it would launch on host pointers."""
    if not _C_CHECKS:
        _C_CHECKS.append(no_driver())
    return _C_CHECKS[0]


def _emulate(monkeypatch, backend):
    import emulator

    import ropejit
    from ropejit import _apply, _call, _capi, _tensors

    real_view = _tensors.from_torch

    def from_torch(name, t, fake=False):
        v = real_view(name, t, fake)
        if v.device[0] == "cpu":
            v.device = ("cuda", 0)
        return v

    def launch(spec, args, stream):
        backend.launches.append((spec, args))
        if _c_checks_calls():
            # The C API checks the whole call (strides, overlaps, positions against the table)
            # before it needs the driver: no_driver means it accepted what the binding built.
            try:
                _capi.check(_capi.lib.ropejit_apply(ctypes.byref(spec), ctypes.byref(args)))
            except ropejit.NoDriverError:
                pass
        emulator.emulate(spec, args)

    monkeypatch.setattr(_tensors, "from_torch", from_torch)
    monkeypatch.setattr(_call, "launch", launch)
    monkeypatch.setattr(_apply, "torch_stream", lambda q: 0)
    monkeypatch.setattr(_apply, "torch_device_guard", lambda q: None)


@pytest.fixture(params=["emulated", "cuda"])
def backend(request, monkeypatch):
    if not HAVE_TORCH:
        pytest.skip("PyTorch is not installed")
    b = Backend(request.param)
    if b.name == "cuda":
        if not cuda_available():
            pytest.skip("no CUDA GPU visible to torch (GPU test)")
    else:
        _emulate(monkeypatch, b)
    return b
