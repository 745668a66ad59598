"""ctypes mirror of include/ropejit/ropejit.h: every struct field for field (the fused-call
fields, which ropejit.fused fills), the enum values, the
prototypes, and the load of the bundled libropejit.so with its struct-size check."""

import ctypes
import os

from ropejit import errors

# Enum values of ropejit.h (equal to the C++ enums), by the names keys and the command use.
LAYOUTS = {"bshd": 0, "sbhd": 1, "bhsd": 2, "thd": 3}
DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
STYLES = {"neox": 0, "gptj": 1}
POSITIONS = {"offset": 0, "seq_offsets": 1, "ids": 2, "mrope": 3}
INDEX_TYPES = {"i32": 0, "i64": 1}
FREQS = {"table": 0, "computed": 1, "linear": 2, "dynamic_ntk": 3, "llama3": 4, "yarn": 5,
         "longrope": 6}
TABLE_WIDTHS = {"half": 0, "full": 1}
DIRECTIONS = {"forward": 0, "backward": 1}
NORMS = {"none": 0, "rms": 1, "rms_one_plus": 2, "rms_all_heads": 3}
KV_CACHES = {"none": 0, "contiguous": 1, "paged": 2, "slots": 3}  # ropejit::KvCache
STORES = {"same": 0, "e4m3": 1, "e4m3_dynamic": 2}  # ropejit::Store

_i32, _i64, _f32, _f64 = ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_double
_ptr = ctypes.c_void_p


# ropejit.h's ABI header: every top-level struct starts with it, filled by its _init_sized
# function with this side's sizeof, so the library reads only what this package's structs hold.
STRUCT_TAG = 0x314A5052


class ropejit_header(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("tag", ctypes.c_uint32)]


_HEADER = [("header", ropejit_header)]


class ropejit_spec(ctypes.Structure):
    _fields_ = _HEADER + [(name, _i32) for name in (
        "layout", "dtype", "head_dim", "rotary_dim", "style", "positions", "index_type", "freqs",
        "table_dtype", "table_width", "direction", "in_place", "fusion", "norm", "out_store",
        "cache", "cache_store")]


class ropejit_tensor(ctypes.Structure):
    _fields_ = [("data", _ptr), ("heads", _i64), ("stride_batch", _i64), ("stride_seq", _i64),
                ("stride_head", _i64)]


class ropejit_scaling(ctypes.Structure):
    _fields_ = [("factor", _f64), ("low_freq_factor", _f64), ("high_freq_factor", _f64),
                ("original_max_positions", _i64), ("beta_fast", _f64), ("beta_slow", _f64),
                ("mscale", _f64), ("mscale_all_dim", _f64), ("attention_factor", _f64),
                ("truncate", _i32), ("short_factor", ctypes.POINTER(_f64)),
                ("long_factor", ctypes.POINTER(_f64)), ("seq_len", _i64),
                ("factor_count", _i64)]


class ropejit_kv_cache(ctypes.Structure):
    _fields_ = [("k", _ptr), ("v", _ptr), ("pages", _i64), ("page_size", _i64),
                ("stride_page", _i64), ("stride_slot", _i64), ("stride_head", _i64),
                ("slot_mapping", _ptr), ("indptr", _ptr), ("indices", _ptr),
                ("num_indices", _i64), ("last_page_len", _ptr), ("seq_lens", _ptr),
                ("k_quant_scale", _f32), ("v_quant_scale", _f32), ("skipped", _ptr),
                ("k_scales", _ptr), ("v_scales", _ptr), ("scale_stride_page", _i64),
                ("scale_stride_slot", _i64), ("scale_stride_head", _i64)]


class ropejit_args(ctypes.Structure):
    _fields_ = _HEADER + [
        ("batch", _i64), ("seq_len", _i64),
        ("q", ropejit_tensor), ("k", ropejit_tensor),
        ("q_out", ropejit_tensor), ("k_out", ropejit_tensor),
        ("position_offset", _i64), ("seq_offsets", _ptr), ("position_ids", _ptr),
        ("cu_seqlens", _ptr), ("cos", _ptr), ("sin", _ptr),
        ("table_stride", _i64), ("table_rows", _i64), ("base", _f64), ("stream", _ptr),
        ("scaling", ropejit_scaling), ("mrope_section", _i32 * 3), ("mrope_interleaved", _i32),
        ("v", ropejit_tensor), ("q_norm_weight", _ptr), ("k_norm_weight", _ptr),
        ("norm_eps", _f64), ("out_quant_scale", _f32), ("cache", ropejit_kv_cache),
        ("q_out_scale", ropejit_tensor), ("k_out_scale", ropejit_tensor),
    ]


class ropejit_table_spec(ctypes.Structure):
    _fields_ = _HEADER + [("freqs", _i32), ("base", _f64), ("scaling", ropejit_scaling),
                          ("rows", _i64), ("row_stride", _i64)]


class ropejit_model(ctypes.Structure):
    _fields_ = _HEADER + [(name, _i32) for name in (
        "head_dim", "rotary_dim", "rotary_offset", "q_heads", "kv_heads", "style", "freqs")] + [
        ("base", _f64), ("scaling", ropejit_scaling), ("mrope", _i32),
        ("mrope_section", _i32 * 3), ("mrope_interleaved", _i32), ("norm", _i32),
        ("max_positions", _i64), ("norm_eps", _f64), ("local_base", _f64),
        ("softmax_scale_multiplier", _f64), ("kv_lora_rank", _i32)]


class ropejit_qkv_proj_spec(ctypes.Structure):
    _fields_ = _HEADER + [(name, _i32) for name in (
        "dtype", "head_dim", "rotary_dim", "style", "positions", "index_type", "freqs",
        "table_dtype", "table_width", "norm", "weights", "cache", "cache_store")]


class ropejit_qkv_proj_args(ctypes.Structure):
    _fields_ = _HEADER + [
        ("tokens", _i64), ("hidden", _i64), ("q_heads", _i64), ("kv_heads", _i64),
        ("x", _ptr), ("x_stride", _i64), ("norm_weight", _ptr), ("norm_eps", _f64),
        ("weight", _ptr), ("weight_stride", _i64),
        ("q", ropejit_tensor), ("k", ropejit_tensor), ("v", ropejit_tensor),
        ("position_offset", _i64), ("position_ids", _ptr), ("cos", _ptr), ("sin", _ptr),
        ("table_stride", _i64), ("table_rows", _i64), ("base", _f64), ("stream", _ptr),
        ("path", _i32), ("workspace", _ptr), ("workspace_bytes", ctypes.c_size_t),
        ("weight_scale", _ptr), ("cache", ropejit_kv_cache), ("cu_seqlens", _ptr),
        ("batch", _i64), ("bias", _ptr),
    ]


class ropejit_ffn_spec(ctypes.Structure):
    _fields_ = _HEADER + [("dtype", _i32), ("norm", _i32), ("act", _i32), ("weights", _i32)]


class ropejit_ffn_args(ctypes.Structure):
    _fields_ = _HEADER + [
        ("tokens", _i64), ("hidden", _i64), ("intermediate", _i64), ("x", _ptr),
        ("x_stride", _i64), ("norm_weight", _ptr), ("norm_eps", _f64), ("gate_weight", _ptr),
        ("up_weight", _ptr), ("weight_stride", _i64), ("out", _ptr), ("out_stride", _i64),
        ("path", _i32), ("workspace", _ptr), ("workspace_bytes", ctypes.c_size_t),
        ("stream", _ptr), ("gate_scale", _ptr), ("up_scale", _ptr),
    ]


class ropejit_rms_norm_spec(ctypes.Structure):
    _fields_ = _HEADER + [("dtype", _i32), ("norm", _i32), ("residual", _i32)]


class ropejit_rms_norm_args(ctypes.Structure):
    _fields_ = _HEADER + [
        ("rows", _i64), ("hidden", _i64), ("x", _ptr), ("x_stride", _i64), ("residual", _ptr),
        ("residual_stride", _i64), ("weight", _ptr), ("norm_eps", _f64), ("out", _ptr),
        ("out_stride", _i64), ("stream", _ptr),
    ]


class ropejit_mla_spec(ctypes.Structure):
    _fields_ = _HEADER + [
        ("dtype", _i32), ("kv_rank", _i32), ("rope_dim", _i32), ("style", _i32),
        ("index_type", _i32), ("table_dtype", _i32), ("norm", _i32), ("cache_store", _i32),
        ("query", _i32), ("q_store", _i32), ("scale_multiplies", _i32),
    ]


class ropejit_mla_args(ctypes.Structure):
    _fields_ = _HEADER + [
        ("tokens", _i64), ("heads", _i64), ("kv_c", _ptr), ("kv_c_stride", _i64), ("k_pe", _ptr),
        ("k_pe_stride", _i64), ("norm_weight", _ptr), ("norm_eps", _f64), ("cache", _ptr),
        ("cache_slots", _i64), ("cache_stride", _i64), ("slots", _ptr), ("cache_scale", _ptr),
        ("skipped", _ptr), ("q_pe", _ptr), ("q_pe_token_stride", _i64),
        ("q_pe_head_stride", _i64), ("q_nope", _ptr), ("q_nope_token_stride", _i64),
        ("q_nope_head_stride", _i64), ("q_out", _ptr), ("q_out_token_stride", _i64),
        ("q_out_head_stride", _i64), ("q_scale", _ptr), ("position_ids", _ptr), ("cos", _ptr),
        ("sin", _ptr), ("table_rows", _i64), ("table_stride", _i64), ("stream", _ptr),
        ("k_pe_out", _ptr), ("k_pe_out_stride", _i64), ("cache_pe", _ptr),
        ("cache_pe_stride", _i64), ("kv_indices", _ptr), ("kv_indptr", _ptr),
        ("batch_indices", _ptr), ("page_positions", _ptr), ("batch", _i64),
        ("num_indices", _i64), ("page_size", _i64), ("rows_by_token", _i32),
        ("q_out_pe", _ptr), ("q_out_pe_token_stride", _i64), ("q_out_pe_head_stride", _i64),
        ("cache_block_size", _i64), ("cache_block_stride", _i64),
        ("cache_pe_block_stride", _i64),
    ]


# ropejit::MlaQuery
MLA_QUERIES = {"in_place": 0, "assemble": 1}

# ropejit::Activation
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}

# ropejit::ProjPath
PROJ_PATHS = {"auto": 0, "fused": 1, "unfused": 2}

# ropejit::Weights: in the activation dtype, or FP8 e4m3 codes with a float32 scale per row
WEIGHTS = {"same": 0, "e4m3": 1}


# Canonical keys are about 70 characters; this leaves room for the fused axes.
KEY_BUFFER = 512

# Each top-level struct's _init_sized function (ropejit.h's _init macros, by name).
_INITS = {
    ropejit_spec: "ropejit_spec_init_sized",
    ropejit_args: "ropejit_args_init_sized",
    ropejit_table_spec: "ropejit_table_spec_init_sized",
    ropejit_model: "ropejit_model_init_sized",
    ropejit_qkv_proj_spec: "ropejit_qkv_proj_spec_init_sized",
    ropejit_qkv_proj_args: "ropejit_qkv_proj_args_init_sized",
    ropejit_ffn_spec: "ropejit_ffn_spec_init_sized",
    ropejit_ffn_args: "ropejit_ffn_args_init_sized",
    ropejit_rms_norm_spec: "ropejit_rms_norm_spec_init_sized",
    ropejit_rms_norm_args: "ropejit_rms_norm_args_init_sized",
    ropejit_mla_spec: "ropejit_mla_spec_init_sized",
    ropejit_mla_args: "ropejit_mla_args_init_sized",
}

_PROTOTYPES = {
    **{name: (ctypes.c_int, [ctypes.POINTER(cls), ctypes.c_size_t])
       for cls, name in _INITS.items()},
    "ropejit_apply": (ctypes.c_int, [ctypes.POINTER(ropejit_spec), ctypes.POINTER(ropejit_args)]),
    "ropejit_key": (ctypes.c_int, [ctypes.POINTER(ropejit_spec), ctypes.c_char_p, ctypes.c_size_t]),
    "ropejit_precompile": (ctypes.c_int, [ctypes.POINTER(ropejit_spec), ctypes.c_char_p]),
    "ropejit_inverse_frequencies": (ctypes.c_int, [ctypes.POINTER(ropejit_table_spec), _i32,
                                                   ctypes.POINTER(_f64), ctypes.c_size_t]),
    "ropejit_attention_factor": (ctypes.c_int, [ctypes.POINTER(ropejit_table_spec), _i32,
                                                ctypes.POINTER(_f64)]),
    "ropejit_spec_from_hf_config": (ctypes.c_int, [ctypes.c_char_p, _i32,
                                                   ctypes.POINTER(ropejit_spec),
                                                   ctypes.POINTER(ropejit_model)]),
    "ropejit_spec_from_hf_config_text": (ctypes.c_int, [ctypes.c_char_p, _i32,
                                                        ctypes.POINTER(ropejit_spec),
                                                        ctypes.POINTER(ropejit_model)]),
    "ropejit_qkv_projection": (ctypes.c_int, [ctypes.POINTER(ropejit_qkv_proj_spec),
                                              ctypes.POINTER(ropejit_qkv_proj_args)]),
    "ropejit_qkv_projection_workspace_bytes": (
        ctypes.c_int, [ctypes.POINTER(ropejit_qkv_proj_spec),
                       ctypes.POINTER(ropejit_qkv_proj_args), ctypes.POINTER(ctypes.c_size_t)]),
    "ropejit_qkv_projection_path": (
        ctypes.c_int, [ctypes.POINTER(ropejit_qkv_proj_spec),
                       ctypes.POINTER(ropejit_qkv_proj_args), ctypes.POINTER(_i32)]),
    "ropejit_ffn_gate_up": (ctypes.c_int, [ctypes.POINTER(ropejit_ffn_spec),
                                           ctypes.POINTER(ropejit_ffn_args)]),
    "ropejit_ffn_gate_up_workspace_bytes": (
        ctypes.c_int, [ctypes.POINTER(ropejit_ffn_spec), ctypes.POINTER(ropejit_ffn_args),
                       ctypes.POINTER(ctypes.c_size_t)]),
    "ropejit_ffn_gate_up_path": (
        ctypes.c_int, [ctypes.POINTER(ropejit_ffn_spec), ctypes.POINTER(ropejit_ffn_args),
                       ctypes.POINTER(_i32)]),
    "ropejit_ffn_key": (ctypes.c_int, [ctypes.POINTER(ropejit_ffn_spec), ctypes.c_char_p,
                                       ctypes.c_size_t]),
    "ropejit_ffn_precompile": (ctypes.c_int, [ctypes.POINTER(ropejit_ffn_spec), ctypes.c_char_p]),
    "ropejit_qkv_proj_key": (ctypes.c_int, [ctypes.POINTER(ropejit_qkv_proj_spec),
                                            ctypes.c_char_p, ctypes.c_size_t]),
    "ropejit_qkv_proj_precompile": (ctypes.c_int, [ctypes.POINTER(ropejit_qkv_proj_spec),
                                                   ctypes.c_char_p]),
    "ropejit_rms_norm": (ctypes.c_int, [ctypes.POINTER(ropejit_rms_norm_spec),
                                        ctypes.POINTER(ropejit_rms_norm_args)]),
    "ropejit_rms_norm_key": (ctypes.c_int, [ctypes.POINTER(ropejit_rms_norm_spec),
                                            ctypes.c_char_p, ctypes.c_size_t]),
    "ropejit_mla_prepare": (ctypes.c_int, [ctypes.POINTER(ropejit_mla_spec),
                                           ctypes.POINTER(ropejit_mla_args)]),
    "ropejit_mla_key": (ctypes.c_int, [ctypes.POINTER(ropejit_mla_spec), ctypes.c_char_p,
                                       ctypes.c_size_t]),
    "ropejit_last_error": (ctypes.c_char_p, []),
    "ropejit_version": (ctypes.c_char_p, []),
    "ropejit_cache_counts": (None, [ctypes.POINTER(ctypes.c_uint64)] * 4),
    "ropejit_struct_sizes": (None, [ctypes.POINTER(ctypes.c_size_t),
                                    ctypes.POINTER(ctypes.c_size_t)]),
    "ropejit_decode_struct_sizes": (None, [ctypes.POINTER(ctypes.c_size_t)] * 4),
}


def library_path():
    """$ROPEJIT_LIB (a build tree's libropejit.so, for development), else the one installed in
    this package."""
    path = os.environ.get("ROPEJIT_LIB") or os.path.join(os.path.dirname(__file__),
                                                         "libropejit.so")
    if not os.path.isfile(path):
        why = "is not a file" if os.path.exists(path) else "does not exist"
        raise ImportError(f"ropejit: {path} {why}: install the package with "
                          f"`pip install .` (which builds it), or point ROPEJIT_LIB at a "
                          f"libropejit.so built with -DROPEJIT_BUILD_SHARED=ON")
    return path


def check_struct_sizes(lib):
    """A library built from another header than these structs would read garbage: refuse it."""
    spec, args = ctypes.c_size_t(), ctypes.c_size_t()
    lib.ropejit_struct_sizes(ctypes.byref(spec), ctypes.byref(args))
    ours = (ctypes.sizeof(ropejit_spec), ctypes.sizeof(ropejit_args))
    if (spec.value, args.value) != ours:
        raise ImportError(
            f"ropejit: {lib._name} has sizeof(ropejit_spec) {spec.value} and sizeof(ropejit_args) "
            f"{args.value}, but this package's structs are {ours[0]} and {ours[1]}: the library "
            f"and the Python package come from different versions; reinstall with `pip install .`")
    decode = getattr(lib, "ropejit_decode_struct_sizes", None)
    if decode is None:
        return
    sizes = [ctypes.c_size_t() for _ in range(4)]
    decode(*[ctypes.byref(s) for s in sizes])
    ours = tuple(ctypes.sizeof(cls) for cls in (ropejit_qkv_proj_spec, ropejit_qkv_proj_args,
                                                 ropejit_ffn_spec, ropejit_ffn_args))
    if tuple(s.value for s in sizes) != ours:
        raise ImportError(
            f"ropejit: {lib._name}'s decode-block structs have sizes "
            f"{tuple(s.value for s in sizes)}, this package's {ours}: the library and the Python "
            f"package come from different versions; reinstall with `pip install .`")


def load(path=None):
    path = path or library_path()
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        hint = ("it needs NVRTC (libnvrtc) from the CUDA Toolkit it was built with: put the "
                "toolkit's lib folder on LD_LIBRARY_PATH" if "nvrtc" in str(e) else
                "reinstall with `pip install .`, or point ROPEJIT_LIB at a libropejit.so built "
                "on this machine")
        raise ImportError(f"ropejit: cannot load {path}: {e}; {hint}") from e
    for name, (restype, argtypes) in _PROTOTYPES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"ropejit: {path} has no symbol {name}: it is another library, or "
                              f"a libropejit.so older than this package; point ROPEJIT_LIB at a "
                              f"libropejit.so of this version, or reinstall with "
                              f"`pip install .`") from None
        fn.restype, fn.argtypes = restype, argtypes
    check_struct_sizes(lib)
    return lib


lib = load()


def check(status):
    """Raises the ropejit.Error subclass for a non-zero status, with the thread's last message
    (ctypes releases the GIL during the call, but the message is thread-local in C)."""
    if status != 0:
        raise errors.from_status(status, lib.ropejit_last_error().decode(errors="replace"))


def version():
    return lib.ropejit_version().decode()


def new(cls):
    """A struct of `cls` holding the library's defaults and its ABI header (its _init_sized)."""
    s = cls()
    check(getattr(lib, _INITS[cls])(ctypes.byref(s), ctypes.sizeof(s)))
    return s


def default_spec():
    return new(ropejit_spec)


# The library's defaults for every field (base 10000, scaling and norm defaults, quant scales 1);
# each call copies it and fills in what it uses.
DEFAULT_ARGS = new(ropejit_args)
