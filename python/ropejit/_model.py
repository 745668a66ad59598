"""Frequency scaling and models described by a Hugging Face config.json, over the C API: the
scaling parameters (ropejit_scaling), a model's RoPE as ropejit's own config reader gives it
(ropejit_spec_from_hf_config: ropejit_model and its spec), and each variant's inverse frequencies
and attention factor as the library computes them (ropejit_inverse_frequencies,
ropejit_attention_factor). Nothing here re-implements a variant: every number comes from C."""

import ctypes
import dataclasses
import functools
import json
import numbers
import os
import types
from collections.abc import Mapping

from ropejit import _capi
from ropejit._cvalues import choice, integer, real, shown
from ropejit._library import Spec
from ropejit.errors import InvalidArgument

# Variants whose frequencies depend on the sequence length (scaling.seq_len).
NEEDS_SEQ_LEN = ("dynamic_ntk", "longrope")
# The frequency variants a call computes in the kernel (every Freqs value but tab).
COMPUTED_FREQS = tuple(name for name in _capi.FREQS if name != "table")

_C_DEFAULTS = _capi.DEFAULT_ARGS.scaling  # the library's RopeScaling defaults
_NUMBERS = ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale",
            "mscale_all_dim", "attention_factor")


def _name(table, value, what):
    for name, v in table.items():
        if v == value:
            return name
    raise InvalidArgument(f"ropejit: {what} ({value}) is not a value this package knows: the "
                          f"library is newer than the package")


@dataclasses.dataclass(frozen=True)
class Scaling:
    """Frequency scaling parameters (ropejit_scaling; Hugging Face's rope_scaling /
    rope_parameters), read by the scaled frequency variants: linear (factor), dynamic_ntk
    (factor, original_max_positions), llama3 (factor, low_freq_factor, high_freq_factor,
    original_max_positions), yarn (factor, beta_fast, beta_slow, original_max_positions, mscale,
    mscale_all_dim, attention_factor, truncate), longrope (short_factor and long_factor:
    rotary_dim / 2 divisors each, original_max_positions, factor, attention_factor). Defaults are
    the library's; the library checks the values a variant reads, naming the field. The sequence
    length that dynamic_ntk and longrope read is a call argument (seq_len), not a field here."""

    factor: float = _C_DEFAULTS.factor
    low_freq_factor: float = _C_DEFAULTS.low_freq_factor
    high_freq_factor: float = _C_DEFAULTS.high_freq_factor
    original_max_positions: int = _C_DEFAULTS.original_max_positions
    beta_fast: float = _C_DEFAULTS.beta_fast
    beta_slow: float = _C_DEFAULTS.beta_slow
    mscale: float = _C_DEFAULTS.mscale
    mscale_all_dim: float = _C_DEFAULTS.mscale_all_dim
    attention_factor: float = _C_DEFAULTS.attention_factor
    truncate: bool = bool(_C_DEFAULTS.truncate)
    short_factor: tuple = None
    long_factor: tuple = None

    def __post_init__(self):
        def fail(field, value, rule):
            raise InvalidArgument(f"ropejit: scaling.{field} ({value!r}) {rule}")

        for field in _NUMBERS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                fail(field, value, "must be a number")
            object.__setattr__(self, field, float(value))
        n = self.original_max_positions
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 0 <= n < 2 ** 53:
            fail("original_max_positions", n, "must be an int in [0, 2^53)")
        object.__setattr__(self, "original_max_positions", int(n))
        if not isinstance(self.truncate, bool):
            fail("truncate", self.truncate, "must be True or False")
        for field in ("short_factor", "long_factor"):
            value = getattr(self, field)
            if value is None:
                continue
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
                fail(field, value, "must be a sequence of numbers (rotary_dim / 2 of them)")
            values = tuple(value)
            for i, v in enumerate(values):
                if isinstance(v, bool) or not isinstance(v, numbers.Real):
                    fail(f"{field}[{i}]", v, "must be a number")
            object.__setattr__(self, field, tuple(float(v) for v in values))
        if (self.short_factor is None) != (self.long_factor is None) or (
                self.short_factor is not None
                and len(self.short_factor) != len(self.long_factor)):
            raise InvalidArgument(
                f"ropejit: scaling.short_factor and scaling.long_factor go together, with "
                f"rotary_dim / 2 values each; got {_count(self.short_factor)} and "
                f"{_count(self.long_factor)}")
        # Kept once: a call passes it on (a plain attribute, which torch.compile reads as a
        # constant).
        flat = tuple(float(getattr(self, f)) for f in _PARAMS)
        object.__setattr__(self, "_flat", flat + (self.short_factor or ()) +
                           (self.long_factor or ()))

    def to_list(self):
        """The flat float list the torch ops carry (their schema has no struct type): the ten
        parameters, then short_factor and long_factor."""
        return list(self._flat)

    @staticmethod
    def from_list(values):
        return _unflat(tuple(values))


def _count(factors):
    return "none" if factors is None else f"{len(factors)}"


_PARAMS = _NUMBERS[:3] + ("original_max_positions",) + _NUMBERS[3:] + ("truncate",)


@functools.lru_cache(maxsize=64)
def _unflat(values):
    if len(values) < len(_PARAMS) or (len(values) - len(_PARAMS)) % 2:
        raise InvalidArgument(f"ropejit: a flat scaling list has {len(_PARAMS)} parameters and "
                              f"two factor arrays of one length; got {len(values)} values")
    fields = dict(zip(_PARAMS, values))
    fields["original_max_positions"] = int(fields["original_max_positions"])
    fields["truncate"] = bool(fields["truncate"])
    rest = values[len(_PARAMS):]
    if rest:
        half = len(rest) // 2
        fields["short_factor"], fields["long_factor"] = rest[:half], rest[half:]
    return Scaling(**fields)


def c_scaling(scaling):
    """A ropejit_scaling for `scaling` (None: the defaults), seq_len 0. Its factor pointers point
    at arrays the struct keeps alive (ctypes holds them in the struct's _objects, and in those of
    any struct it is assigned into)."""
    s = _capi.ropejit_scaling.from_buffer_copy(_C_DEFAULTS)
    if scaling is None:
        return s
    for field in _PARAMS:
        setattr(s, field, getattr(scaling, field))
    if scaling.short_factor is not None:
        array = ctypes.c_double * len(scaling.short_factor)
        s.short_factor = array(*scaling.short_factor)
        s.long_factor = array(*scaling.long_factor)
        s.factor_count = len(scaling.short_factor)  # the library reads no more than this
    return s


def check_factors(freqs, rotary_dim, scaling):
    """longrope reads rotary_dim / 2 values of each factor array: say so here, by name, before
    the library is asked (which checks the count too)."""
    if freqs != "longrope" or scaling is None or scaling.short_factor is None:
        return
    if len(scaling.short_factor) != rotary_dim // 2:
        raise InvalidArgument(
            f"ropejit: scaling.short_factor and scaling.long_factor hold "
            f"{len(scaling.short_factor)} values each, but longrope with rotary_dim {rotary_dim} "
            f"reads rotary_dim / 2 ({rotary_dim // 2})")


def _from_c_scaling(c, pairs):
    """A Scaling from a ropejit_scaling, copying the factor arrays (rotary_dim / 2 each)."""
    fields = {f: getattr(c, f) for f in _PARAMS}
    fields["truncate"] = bool(fields["truncate"])
    if c.short_factor and c.long_factor:
        count = min(c.factor_count, pairs)
        fields["short_factor"] = tuple(c.short_factor[i] for i in range(count))
        fields["long_factor"] = tuple(c.long_factor[i] for i in range(count))
    return Scaling(**fields)


# The library's largest head_dim (kMaxHeadDim, jit/spec.cpp), so its largest rotary_dim.
MAX_ROTARY_DIM = 512


def _check_sizes(rotary_dim, seq_len):
    """rotary_dim in the library's range before rotary_dim / 2 doubles are allocated for it, and
    an int seq_len within its int64 field (the type checks follow in _check_variant)."""
    if (isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or rotary_dim % 2
            or not 2 <= rotary_dim <= MAX_ROTARY_DIM):
        raise InvalidArgument(f"ropejit: rotary_dim ({shown(rotary_dim)}) must be an even int in "
                              f"[2, {MAX_ROTARY_DIM}] (the library's largest head_dim)")
    if isinstance(seq_len, numbers.Integral) and not isinstance(seq_len, bool):
        integer("seq_len", seq_len, ctypes.c_int64)


def _check_variant(freqs, rotary_dim, scaling, seq_len):
    _check_sizes(rotary_dim, seq_len)
    if freqs not in COMPUTED_FREQS:
        raise InvalidArgument(f"ropejit: freqs ({freqs!r}) must be one of "
                              f"{', '.join(map(repr, COMPUTED_FREQS))}")
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int):
        raise InvalidArgument(f"ropejit: rotary_dim ({rotary_dim!r}) must be an int")
    if scaling is not None and not isinstance(scaling, Scaling):
        raise InvalidArgument(f"ropejit: scaling ({scaling!r}) must be a ropejit.Scaling or None")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise InvalidArgument(f"ropejit: seq_len ({seq_len!r}) must be an int >= 0")
    check_factors(freqs, rotary_dim, scaling)
    table = _capi.new(_capi.ropejit_table_spec)
    table.freqs = _capi.FREQS[freqs]
    table.scaling = c_scaling(scaling)
    table.scaling.seq_len = seq_len
    return table


def inverse_frequencies(freqs, rotary_dim, base=10000.0, scaling=None, seq_len=0):
    """The rotary_dim / 2 inverse frequencies (radians per position, float64) of a frequency
    variant ('computed', 'linear', 'dynamic_ntk', 'llama3', 'yarn', 'longrope'), as the kernels
    use them (ropejit_inverse_frequencies). seq_len: the sequence length dynamic_ntk and
    longrope switch on. Raises InvalidArgument naming a bad parameter."""
    if isinstance(base, int) and not isinstance(base, bool):
        real("base", base)  # an int beyond a double (the type check follows)
    c = _check_variant(freqs, rotary_dim, scaling, seq_len)
    if rotary_dim < 2:
        raise InvalidArgument(f"ropejit: rotary_dim ({rotary_dim}) must be even and >= 2")
    if isinstance(base, bool) or not isinstance(base, (int, float)):
        raise InvalidArgument(f"ropejit: base ({base!r}) must be a number")
    c.base = float(base)
    out = (ctypes.c_double * (rotary_dim // 2))()
    _capi.check(_capi.lib.ropejit_inverse_frequencies(ctypes.byref(c), rotary_dim, out,
                                                      len(out)))
    return list(out)


def attention_factor(freqs, rotary_dim, scaling=None, seq_len=0):
    """What the variant multiplies cos and sin by (yarn's and longrope's attention factor; 1
    for the others), as the kernels use it (ropejit_attention_factor)."""
    c = _check_variant(freqs, rotary_dim, scaling, seq_len)
    out = ctypes.c_double()
    _capi.check(_capi.lib.ropejit_attention_factor(ctypes.byref(c), rotary_dim,
                                                   ctypes.byref(out)))
    return out.value


@dataclasses.dataclass(frozen=True)
class ModelRope:
    """A model's RoPE as its Hugging Face config.json describes it, read by ropejit's C reader
    (ropejit::ModelRope; docs/scaling.md, "Models described by their config.json").

    spec: the plain-RoPE axes of the key its attention calls (computed frequencies of the
    model's variant, position ids, or mRoPE's three rows), in the dtype asked for; head_dim is
    the rotary slice's alone when rotary_offset > 0 (DeepSeek MLA). The reader's spec also
    names the QK-norm, which ropejit.Spec does not carry: it is `norm` here.

    freqs: 'computed' (rope_type default) or the scaled variant, with `scaling` its parameters.
    mrope_section: pairs per position row (temporal, height, width) for mRoPE models, else None.
    norm: the QK-norm the architecture applies before RoPE ('none', 'rms', 'rms_one_plus',
    'rms_all_heads'), with norm_eps; this package reports it and applies RoPE only. local_base:
    the base of Gemma 3's sliding-window layers (unscaled frequencies), 0 when every layer uses
    `base`. softmax_scale_multiplier: DeepSeek YaRN's factor for the attention's softmax scale
    (not RoPE's to apply). kv_lora_rank: MLA's compressed kv rank (DeepSeek, Kimi K2; the
    latent cache row is kv_lora_rank + rotary_dim wide), 0 for other attention."""

    spec: Spec
    head_dim: int
    rotary_dim: int
    rotary_offset: int
    q_heads: int
    kv_heads: int
    style: str
    freqs: str
    base: float
    scaling: Scaling
    mrope_section: tuple
    mrope_interleaved: bool
    norm: str
    max_positions: int
    norm_eps: float
    local_base: float
    softmax_scale_multiplier: float
    kv_lora_rank: int = 0

    @property
    def needs_seq_len(self):
        """Whether the frequencies depend on the sequence length (dynamic_ntk, longrope)."""
        return self.freqs in NEEDS_SEQ_LEN

    def inverse_frequencies(self, seq_len=0):
        return inverse_frequencies(self.freqs, self.rotary_dim, self.base, self.scaling, seq_len)

    def attention_factor(self, seq_len=0):
        return attention_factor(self.freqs, self.rotary_dim, self.scaling, seq_len)


def _spec_from_c(s):
    return Spec(layout=_name(_capi.LAYOUTS, s.layout, "spec.layout"),
                dtype=_name(_capi.DTYPES, s.dtype, "spec.dtype"), head_dim=s.head_dim,
                rotary_dim=s.rotary_dim, style=_name(_capi.STYLES, s.style, "spec.style"),
                positions=_name(_capi.POSITIONS, s.positions, "spec.positions"),
                index_type=_name(_capi.INDEX_TYPES, s.index_type, "spec.index_type"),
                freqs=_name(_capi.FREQS, s.freqs, "spec.freqs"),
                table_dtype=_name(_capi.DTYPES, s.table_dtype, "spec.table_dtype"),
                table_width=_name(_capi.TABLE_WIDTHS, s.table_width, "spec.table_width"),
                direction=_name(_capi.DIRECTIONS, s.direction, "spec.direction"),
                in_place=bool(s.in_place))


def _model_from_c(spec, m):
    # Copied at once: the factor arrays live in C memory of this thread until its next read.
    return ModelRope(
        spec=_spec_from_c(spec), head_dim=m.head_dim, rotary_dim=m.rotary_dim,
        rotary_offset=m.rotary_offset, q_heads=m.q_heads, kv_heads=m.kv_heads,
        style=_name(_capi.STYLES, m.style, "model.style"),
        freqs=_name(_capi.FREQS, m.freqs, "model.freqs"), base=m.base,
        scaling=_from_c_scaling(m.scaling, m.rotary_dim // 2),
        mrope_section=tuple(m.mrope_section) if m.mrope else None,
        mrope_interleaved=bool(m.mrope_interleaved),
        norm=_name(_capi.NORMS, m.norm, "model.norm"), max_positions=m.max_positions,
        norm_eps=m.norm_eps, local_base=m.local_base,
        softmax_scale_multiplier=m.softmax_scale_multiplier, kv_lora_rank=m.kv_lora_rank)


def _dtype_code(dtype):
    return choice("dtype", dtype, _capi.DTYPES)


def model_from_hf_config_text(text, dtype="bf16"):
    """The ModelRope of a config.json's text (str or bytes). Raises InvalidArgument with the C
    reader's message, which names the field and its value."""
    if isinstance(text, str):
        try:
            text = text.encode()
        except UnicodeEncodeError as e:  # a lone surrogate: no UTF-8 holds it
            raise InvalidArgument(f"ropejit: the config text is not valid Unicode: {e}") from None
    if not isinstance(text, bytes):
        raise InvalidArgument(f"ropejit: text ({type(text).__name__}) must be str or bytes "
                              f"holding config.json")
    if b"\0" in text:
        raise InvalidArgument("ropejit: the config text holds a NUL byte")
    spec, model = _capi.new(_capi.ropejit_spec), _capi.new(_capi.ropejit_model)
    _capi.check(_capi.lib.ropejit_spec_from_hf_config_text(text, _dtype_code(dtype),
                                                           ctypes.byref(spec),
                                                           ctypes.byref(model)))
    return _model_from_c(spec, model)


def config_text(config):
    """JSON text of a config given as a mapping, a transformers PretrainedConfig (its full
    to_dict(): to_json_string() leaves out values equal to the class's defaults, which the C
    reader would then not see) or any object with attributes (types.SimpleNamespace)."""
    if isinstance(config, Mapping):
        fields = dict(config)
    elif callable(getattr(config, "to_dict", None)):
        fields = config.to_dict()
        if not isinstance(fields, Mapping):
            raise InvalidArgument(f"ropejit: config.to_dict() ({shown(fields)}) must return a "
                                  f"dict")
    elif isinstance(config, types.SimpleNamespace):
        fields = vars(config)
    else:
        raise InvalidArgument(
            f"ropejit: config ({type(config).__module__}.{type(config).__qualname__}) must be a "
            f"path to config.json, a dict, or a transformers PretrainedConfig")
    # NaN and infinities are written as Python writes them: the C reader refuses each naming its
    # field and value, which json.dumps's own refusal does not.
    try:
        return json.dumps(fields, default=_json_default)
    except ValueError as e:  # a circular reference, an int too long to write out
        raise InvalidArgument(f"ropejit: the config has a value JSON cannot hold: {e}") from None
    except TypeError as e:  # a key that is no str, int, float, bool or None
        raise InvalidArgument(f"ropejit: the config cannot be written as JSON: {e}") from None
    except RecursionError:
        raise InvalidArgument("ropejit: the config is nested too deeply to be written as JSON") \
            from None


def _json_default(value):
    # Values transformers keeps unserialized (a torch.dtype, a nested config object).
    if callable(getattr(value, "to_dict", None)):
        return value.to_dict()
    if isinstance(value, types.SimpleNamespace):
        return vars(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def model_from_hf_config(config, dtype="bf16"):
    """The ModelRope of a Hugging Face config: a path to config.json (str or os.PathLike, read by
    the C library's bounded file reader), a dict, or a transformers PretrainedConfig (passed to
    the C reader as JSON text). `dtype` is the spec's activation dtype. Raises InvalidArgument
    with the reader's message, which names the field and its value."""
    if isinstance(config, (str, os.PathLike)):
        try:
            path = os.fsencode(config)
        except TypeError as e:  # a __fspath__ that returns neither str nor bytes
            raise InvalidArgument(f"ropejit: config ({shown(config)}) is no path: {e}") from None
        if b"\0" in path:
            raise InvalidArgument(f"ropejit: path ({shown(config)}) holds a NUL byte")
        spec, model = _capi.new(_capi.ropejit_spec), _capi.new(_capi.ropejit_model)
        _capi.check(_capi.lib.ropejit_spec_from_hf_config(path, _dtype_code(dtype),
                                                          ctypes.byref(spec),
                                                          ctypes.byref(model)))
        return _model_from_c(spec, model)
    return model_from_hf_config_text(config_text(config), dtype)
