"""ctypes binding of ropejit's C API (include/ropejit/ropejit.h), and `Rope`, which applies
one spec to torch tensors. The module imports without torch: tensors are only read through
their own methods (data_ptr, stride, shape, dtype, new_empty), and torch itself is imported
only when a call has to look up the current stream."""

import ctypes
import os
import pathlib

# Enum values of ropejit.h (they equal the C++ enums), by the names keys and the CLI use.
LAYOUTS = {"bshd": 0, "sbhd": 1, "bhsd": 2, "thd": 3}
DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
STYLES = {"neox": 0, "gptj": 1}
POSITIONS = {"offset": 0, "seq_offsets": 1, "ids": 2}
INDEX_TYPES = {"i32": 0, "i64": 1}
FREQS = {"table": 0, "computed": 1}
TABLE_WIDTHS = {"half": 0, "full": 1}
FORWARD, BACKWARD = 0, 1

# torch dtype names (str(tensor.dtype) without "torch.") by the names above; matching on the
# name keeps torch out of the import.
_TORCH_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i32": "int32",
                "i64": "int64"}

# Axes (batch, seq, heads) of a 4-d tensor in each dense layout. thd is left out: it needs
# cu_seqlens, which Rope does not pass.
_AXES = {"bshd": (0, 1, 2), "sbhd": (1, 0, 2), "bhsd": (0, 2, 1)}

# Canonical keys are about 70 characters; this leaves room for new axes.
_KEY_BUFFER = 256


class ropejit_spec(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in (
        "layout", "dtype", "head_dim", "rotary_dim", "style", "positions", "index_type", "freqs",
        "table_dtype", "table_width", "direction", "in_place", "fusion")]


class ropejit_tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("heads", ctypes.c_int64),
        ("stride_batch", ctypes.c_int64),
        ("stride_seq", ctypes.c_int64),
        ("stride_head", ctypes.c_int64),
    ]


class ropejit_args(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int64),
        ("seq_len", ctypes.c_int64),
        ("q", ropejit_tensor),
        ("k", ropejit_tensor),
        ("q_out", ropejit_tensor),
        ("k_out", ropejit_tensor),
        ("position_offset", ctypes.c_int64),
        ("seq_offsets", ctypes.c_void_p),
        ("position_ids", ctypes.c_void_p),
        ("cu_seqlens", ctypes.POINTER(ctypes.c_int32)),
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("table_stride", ctypes.c_int64),
        ("table_rows", ctypes.c_int64),
        ("base", ctypes.c_double),
        ("stream", ctypes.c_void_p),
    ]


def find_library(path=None):
    """The path of libropejit.so: `path`, else $ROPEJIT_LIB, else the newest
    ../build*/libropejit.so next to this script (several build trees can coexist)."""
    if path is None:
        path = os.environ.get("ROPEJIT_LIB")
    if path is not None:
        if not os.path.isfile(path):
            raise OSError(f"libropejit.so not found at {path}")
        return os.path.abspath(path)
    root = pathlib.Path(__file__).resolve().parent.parent
    found = sorted(root.glob("build*/libropejit.so"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise OSError(f"libropejit.so not found: pass its path, set ROPEJIT_LIB, or build "
                      f"the ropejit_shared target under {root}/build*")
    return str(found[-1])


_loaded = {}


def load(path=None):
    """Loads libropejit.so (see find_library) once per path and declares its prototypes."""
    path = find_library(path)
    if path in _loaded:
        return _loaded[path]
    lib = ctypes.CDLL(path)
    status = ctypes.c_int  # a C enum is int-sized
    spec_p, args_p = ctypes.POINTER(ropejit_spec), ctypes.POINTER(ropejit_args)
    prototypes = {
        "ropejit_spec_init": (None, [spec_p]),
        "ropejit_args_init": (None, [args_p]),
        "ropejit_contiguous": (ropejit_tensor, [ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64,
                                                ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]),
        "ropejit_apply": (status, [spec_p, args_p]),
        "ropejit_key": (status, [spec_p, ctypes.c_char_p, ctypes.c_size_t]),
        "ropejit_precompile": (status, [spec_p, ctypes.c_char_p]),
        "ropejit_last_error": (ctypes.c_char_p, []),
        "ropejit_version": (ctypes.c_char_p, []),
    }
    for name, (restype, argtypes) in prototypes.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _loaded[path] = lib
    return lib


def version(lib=None):
    return load(lib).ropejit_version().decode()


def _pick(table, field, value):
    if value not in table:
        raise ValueError(f"{field} ({value!r}) must be one of {sorted(table)}")
    return table[value]


def _dtype_name(tensor):
    return str(tensor.dtype).removeprefix("torch.")


class Rope:
    """One ropejit spec, applied to torch tensors in one of the dense layouts (logical shape
    [batch, seq, heads, head_dim] permuted as the layout says; any strides with a contiguous
    last dimension). `lib`: a path of libropejit.so, a library from load(), or None to
    search (find_library)."""

    def __init__(self, dtype="bf16", head_dim=128, rotary_dim=0, style="neox", layout="bshd",
                 positions="offset", index_type="i64", freqs="table", table_dtype="f32",
                 table_width="half", in_place=True, backward=False, lib=None):
        self.lib = lib if isinstance(lib, ctypes.CDLL) else load(lib)
        _pick(_AXES, "layout", layout)
        if positions not in ("offset", "ids"):  # seq_offsets needs an argument apply() lacks
            raise ValueError(f"positions ({positions!r}) must be 'offset' or 'ids'")
        self.dtype, self.layout, self.positions = dtype, layout, positions
        self.index_type, self.freqs, self.table_dtype = index_type, freqs, table_dtype
        self.in_place = in_place
        s = ropejit_spec()
        # The library's defaults for the fields set nowhere below (fusion, future axes).
        self.lib.ropejit_spec_init(ctypes.byref(s))
        s.layout = LAYOUTS[layout]
        s.dtype = _pick(DTYPES, "dtype", dtype)
        s.head_dim = head_dim
        s.rotary_dim = rotary_dim
        s.style = _pick(STYLES, "style", style)
        s.positions = POSITIONS[positions]
        s.index_type = _pick(INDEX_TYPES, "index_type", index_type)
        s.freqs = _pick(FREQS, "freqs", freqs)
        s.table_dtype = _pick(DTYPES, "table_dtype", table_dtype)
        s.table_width = _pick(TABLE_WIDTHS, "table_width", table_width)
        s.direction = BACKWARD if backward else FORWARD
        s.in_place = 1 if in_place else 0
        self.spec = s
        rotary = rotary_dim or head_dim
        self.table_row_width = rotary // 2 if table_width == "half" else rotary

    def _check(self, status):
        if status != 0:
            raise RuntimeError(self.lib.ropejit_last_error().decode())

    def key(self):
        """The canonical kernel key, e.g. rope_bshd_bf16_d128_r128_neox_pos-ids-i64_..."""
        buf = ctypes.create_string_buffer(_KEY_BUFFER)
        self._check(self.lib.ropejit_key(ctypes.byref(self.spec), buf, len(buf)))
        return buf.value.decode()

    def precompile(self, arch):
        """Compiles the spec for `arch` ("sm_90") into the disk cache; needs no GPU."""
        self._check(self.lib.ropejit_precompile(ctypes.byref(self.spec), arch.encode()))

    def _operand(self, name, t, batch, seq):
        """A ropejit_tensor viewing `t`, after the checks the C API cannot make: it sees only
        a pointer and strides, not the tensor's dtype, device or extent."""
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-d ({self.layout}), got shape {tuple(t.shape)}")
        if not t.is_cuda:
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        if _dtype_name(t) != _TORCH_NAMES[self.dtype]:
            raise ValueError(f"{name}.dtype ({t.dtype}) does not match the spec's dtype "
                             f"({self.dtype})")
        if t.shape[3] != self.spec.head_dim or t.stride(3) != 1:
            raise ValueError(f"{name} needs a contiguous last dimension of head_dim "
                             f"({self.spec.head_dim}), got shape {tuple(t.shape)} "
                             f"strides {t.stride()}")
        b, s, h = _AXES[self.layout]
        if (t.shape[b], t.shape[s]) != (batch, seq):
            raise ValueError(f"{name} has batch {t.shape[b]} and seq {t.shape[s]}; "
                             f"q has {batch} and {seq}")
        return ropejit_tensor(t.data_ptr(), t.shape[h], t.stride(b), t.stride(s), t.stride(h))

    def _table(self, name, t):
        if t is None:
            raise ValueError(f"{name} is required with freqs='table'")
        if not t.is_cuda:
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        if t.dim() != 2 or t.shape[1] != self.table_row_width or t.stride(1) != 1:
            raise ValueError(f"{name} must be [rows, {self.table_row_width}] with contiguous rows, "
                             f"got shape {tuple(t.shape)} strides {t.stride()}")
        if _dtype_name(t) != _TORCH_NAMES[self.table_dtype]:
            raise ValueError(f"{name}.dtype ({t.dtype}) does not match table_dtype "
                             f"({self.table_dtype})")

    def apply(self, q, k=None, *, cos=None, sin=None, position_ids=None, position_offset=0,
              base=10000.0, q_out=None, k_out=None, stream=None):
        """Rotates q (and k) in one launch on `stream` (a torch.cuda.Stream or a raw
        CUstream handle; default: torch's current stream on q's device). Returns (q, k) in
        place, else (q_out, k_out), allocated contiguous in the layout when not given."""
        b_axis, s_axis, _ = _AXES[self.layout]
        batch, seq = q.shape[b_axis], q.shape[s_axis]
        a = ropejit_args()
        self.lib.ropejit_args_init(ctypes.byref(a))
        a.batch, a.seq_len = batch, seq
        a.q = self._operand("q", q, batch, seq)
        if k is not None:
            a.k = self._operand("k", k, batch, seq)
        if not self.in_place:
            q_out = q.new_empty(q.shape) if q_out is None else q_out
            a.q_out = self._operand("q_out", q_out, batch, seq)
            if k is not None:
                k_out = k.new_empty(k.shape) if k_out is None else k_out
                a.k_out = self._operand("k_out", k_out, batch, seq)
        if self.positions == "ids":
            ids = position_ids
            if ids is None or _dtype_name(ids) != _TORCH_NAMES[self.index_type]:
                want = _TORCH_NAMES[self.index_type]
                raise ValueError(f"position_ids must be a tensor of {want} with positions='ids'")
            if not ids.is_cuda or not ids.is_contiguous() or ids.numel() != batch * seq:
                raise ValueError(f"position_ids must be contiguous on a CUDA device with "
                                 f"batch*seq ({batch * seq}) elements, got shape "
                                 f"{tuple(ids.shape)} on {ids.device}")
            a.position_ids = ids.data_ptr()
        else:
            a.position_offset = position_offset
        if self.freqs == "table":
            self._table("cos", cos)
            self._table("sin", sin)
            if cos.shape != sin.shape or cos.stride() != sin.stride():
                raise ValueError(f"cos {tuple(cos.shape)}/{cos.stride()} and sin "
                                 f"{tuple(sin.shape)}/{sin.stride()} must match")
            a.cos, a.sin = cos.data_ptr(), sin.data_ptr()
            a.table_stride, a.table_rows = cos.stride(0), cos.shape[0]
        else:
            a.base = base
        if stream is None:
            import torch
            stream = torch.cuda.current_stream(q.device)
        a.stream = stream if isinstance(stream, int) else stream.cuda_stream
        self._check(self.lib.ropejit_apply(ctypes.byref(self.spec), ctypes.byref(a)))
        return (q, k) if self.in_place else (q_out, k_out)
