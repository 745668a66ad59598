"""Python values on their way into the C API: every int is checked against the range of the C
type that receives it (ctypes keeps the low bits of a larger one without a word), every flag must
be a real bool, every choice a name its table holds; a refusal is an InvalidArgument naming the
argument and the value passed."""

import ctypes
import math
import numbers

from ropejit.errors import InvalidArgument


def _limits(c_name, bits, signed):
    if signed:
        return c_name, -(1 << (bits - 1)), (1 << (bits - 1)) - 1, f"[-2^{bits - 1}, 2^{bits - 1})"
    return c_name, 0, (1 << bits) - 1, f"[0, 2^{bits})"


# (C name, lowest, highest, the range as a message writes it) of each ctypes integer type the
# structs and prototypes use. c_size_t is c_uint64 on LP64 hosts: one entry serves both.
_INTS = {
    ctypes.c_int32: _limits("int32_t", 32, True),
    ctypes.c_int64: _limits("int64_t", 64, True),
    ctypes.c_uint32: _limits("uint32_t", 32, False),
    ctypes.c_size_t: _limits("size_t", 8 * ctypes.sizeof(ctypes.c_size_t), False),
    ctypes.c_void_p: _limits("a pointer", 8 * ctypes.sizeof(ctypes.c_void_p), False),
}
_FLOAT_MAX = 3.4028234663852886e38  # FLT_MAX: a larger finite double becomes inf in a float

# int32_t fields of ropejit.h that hold 0 or 1 (the header's bools).
FLAGS = frozenset({"in_place", "truncate", "mrope_interleaved"})


def shown(value, limit=80):
    """repr(value) for a message, clipped: a message echoes what was passed, not 100 kB of it."""
    try:
        text = repr(value)
    except Exception:  # an int past str()'s digit limit, a repr that raises or recurses
        if isinstance(value, int):
            return f"<an int of {value.bit_length()} bits>"
        return f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def integer(name, value, ctype=ctypes.c_int64):
    """`value` as an int for a C field or argument of `ctype`; bools are refused (True is no
    size), numpy's ints are taken."""
    c_name, lo, hi, span = _INTS[ctype]
    if type(value) is int and lo <= value <= hi:
        return value  # the common case, without the ABC check below (a launch's hot path)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgument(f"ropejit: {name} ({shown(value)}) must be an int ({c_name})")
    v = int(value)
    if not lo <= v <= hi:
        raise InvalidArgument(f"ropejit: {name} ({shown(v)}) does not fit {c_name}: it must be in "
                              f"{span}")
    return v


def flag(name, value):
    """`value` for a C field (or an argument) that holds a bool. Only True and False are taken: a
    string such as "no" is truthy, and numpy.bool_ is refused like every other stand-in (bool(x)
    converts)."""
    if not isinstance(value, bool):
        raise InvalidArgument(f"ropejit: {name} ({shown(value)}) must be True or False")
    return value


def real(name, value, ctype=ctypes.c_double):
    """`value` as a float for a C double or float field: an int beyond a double, or a finite
    value beyond a float's range (which the store would turn into inf), is refused."""
    if type(value) is float:
        v = value  # the common case, without the ABC check below
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgument(f"ropejit: {name} ({shown(value)}) must be a number")
    else:
        try:
            v = float(value)
        except OverflowError:
            raise InvalidArgument(f"ropejit: {name} ({shown(value)}) is too large for a "
                                  f"double") from None
    if ctype is ctypes.c_float and math.isfinite(v) and abs(v) > _FLOAT_MAX:
        raise InvalidArgument(f"ropejit: {name} ({v!r}) does not fit a float (32-bit): its "
                              f"magnitude must be <= {_FLOAT_MAX!r}")
    return v


def choice(name, value, table):
    """table[value] for a name the table holds; InvalidArgument listing the names otherwise (an
    unhashable value included)."""
    try:
        return table[value]
    except (KeyError, TypeError):
        raise InvalidArgument(f"ropejit: {name} ({shown(value)}) must be one of "
                              f"{', '.join(map(repr, table))}") from None


_FIELD_TYPES = {}


def _field_types(cls):
    types = _FIELD_TYPES.get(cls)
    if types is None:
        types = _FIELD_TYPES[cls] = dict(cls._fields_)
    return types


def convert(name, field, value, ctype):
    """`value` checked for a field of ctypes type `ctype`; struct values pass as they are."""
    if field in FLAGS:
        return flag(name, value)
    if value is None and ctype is ctypes.c_void_p:
        return None  # NULL: an operand not given
    if ctype in _INTS:
        return integer(name, value, ctype)
    if ctype in (ctypes.c_double, ctypes.c_float):
        return real(name, value, ctype)
    if isinstance(ctype, type) and issubclass(ctype, ctypes.Array) and ctype._type_ in _INTS:
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or \
                len(value) != ctype._length_:
            raise InvalidArgument(f"ropejit: {name} ({shown(value)}) must be {ctype._length_} "
                                  f"ints")
        return ctype(*(integer(f"{name}[{i}]", v, ctype._type_) for i, v in enumerate(value)))
    return value


def fill(struct, prefix="", **fields):
    """Sets each field of a ctypes struct after checking its value against the field's C type;
    a message names the field as `prefix` + its name (the caller's argument name when the two
    agree, as for position_offset). Returns the struct."""
    types = _FIELD_TYPES.get(type(struct)) or _field_types(type(struct))
    for field, value in fields.items():
        ctype = types[field]
        limits = _INTS.get(ctype)
        # The common case inline (an int in range for an int field): planning fills every call
        # that is not remembered.
        if limits is None or type(value) is not int or not limits[1] <= value <= limits[2] \
                or field in FLAGS:
            value = convert(prefix + field, field, value, ctype)
        setattr(struct, field, value)
    return struct
