"""The package's side of the trust boundary (issue 47), without torch or a GPU: every int bound
for a C field or argument is range-checked for its C type before ctypes stores it (ctypes keeps
the low bits of a larger one without a word), flags take only True and False, rotary_dim is
checked before inverse_frequencies allocates for it, malformed array-interface objects and
configs raise InvalidArgument naming what is wrong (a table of cases and a seeded fuzz), and
a ROPEJIT_LIB naming another library is an ImportError."""

import ctypes
import json
import os
import random
import re
import subprocess
import sys
import types

import numpy as np
import pytest
from conftest import FAKE_PTR, CudaArray, DLPackArray

import ropejit
import ropejit.fused
from ropejit import _capi, decode

MB = 1 << 20
HUGE = 2 ** 70  # what a truncating store turns into 0


@pytest.fixture
def c_calls(monkeypatch):
    """Replaces ropejit_apply itself, so that _call.launch (and its checks) runs to the C
    boundary: records (spec, args) and returns OK."""
    calls = []

    def apply(spec, args):
        calls.append((spec._obj, args._obj))
        return 0

    monkeypatch.setattr(_capi.lib, "ropejit_apply", apply)
    return calls


def refused(calls, words, fn, *args, **kwargs):
    with pytest.raises(ropejit.InvalidArgument) as e:
        fn(*args, **kwargs)
    assert calls == [], "a refused call reached the C API"
    for word in words:
        assert word in str(e.value), str(e.value)
    return e.value


# 1. Ints into ctypes fields: range-checked for the C type, flags only bools.

@pytest.mark.parametrize("fields, words", [
    (dict(head_dim=2 ** 32 + 128), ["spec.head_dim (4294967424)", "int32_t"]),
    (dict(rotary_dim=-2 ** 31 - 2), ["spec.rotary_dim (-2147483650)", "int32_t"]),
    (dict(head_dim=128.0), ["spec.head_dim (128.0) must be an int"]),
    (dict(head_dim=True), ["spec.head_dim (True) must be an int"]),
    (dict(in_place="no"), ["spec.in_place ('no') must be True or False"]),
    (dict(in_place=1), ["spec.in_place (1) must be True or False"]),
    (dict(in_place=None), ["spec.in_place (None) must be True or False"]),
    # numpy.bool_ is refused like any other stand-in: bool(x) converts it.
    (dict(in_place=np.True_), ["spec.in_place (", "must be True or False"]),
    (dict(layout=["bshd"]), ["spec.layout (['bshd']) must be one of"]),
])
def test_spec_fields_must_fit_their_c_types(fields, words):
    refused([], words, ropejit.key, **fields)


def test_numpy_ints_are_ints():
    assert ropejit.key(head_dim=np.int64(64), rotary_dim=np.int32(32)) == ropejit.key(
        head_dim=64, rotary_dim=32)
    assert ropejit.key(in_place=False).endswith("_oop")


def _q(**over):
    return CudaArray((1, 4, 2, 64), **over)


@pytest.mark.parametrize("call, words", [
    (lambda: ropejit.apply(_q(), position_offset=HUGE),
     ["position_offset (1180591620717411303424)", "int64_t"]),
    (lambda: ropejit.apply(_q(), position_offset=-2 ** 63 - 1), ["position_offset (", "int64_t"]),
    (lambda: ropejit.apply(_q(ptr=2 ** 64 + 16)),
     ["q's __cuda_array_interface__ data pointer (18446744073709551632)", "a pointer"]),
    (lambda: ropejit.apply(_q(ptr=-16)), ["data pointer (-16)"]),
    (lambda: ropejit.apply(_q(), stream=HUGE), ["stream (1180591620717411303424)", "a pointer"]),
    (lambda: ropejit.apply(_q(), stream=-1), ["stream (-1)"]),
    (lambda: ropejit.apply(_q(stream=HUGE)), ["q's __cuda_array_interface__ stream ("]),
    (lambda: ropejit.apply(_q(stream="default")), ["stream ('default') must be an int"]),
    (lambda: ropejit.apply(_q(), base=10 ** 400), ["base (1000000", "must be a finite number"]),
    (lambda: ropejit.apply(_q(), freqs="dynamic_ntk", seq_len=HUGE,
                           scaling=ropejit.Scaling(factor=2.0, original_max_positions=16)),
     ["seq_len (1180591620717411303424)", "int64_t"]),
    (lambda: ropejit.fused.qk_norm_rope(CudaArray((3, 4, 64)), position_offset=HUGE,
                                        layout="thd", position_ids=None,
                                        cu_seqlens=CudaArray((2,), "<i4", ptr=FAKE_PTR + MB)),
     ["position_offset (1180591620717411303424)"]),
])
def test_call_ints_must_fit_their_c_types(c_calls, call, words):
    refused(c_calls, words, call)


@pytest.mark.parametrize("backward", ["no", 1, np.True_])
def test_call_flags_take_only_bools(c_calls, backward):
    refused(c_calls, ["backward (", "must be True or False"], ropejit.apply, _q(),
            backward=backward)


def _fused_step(**over):
    """A valid fused call (bf16 thd q/k/v, FP8 q_out and paged cache), each argument
    overridable."""
    bf16 = dict(code=4, bits=16)
    args = dict(
        q=DLPackArray((3, 4, 64), **bf16),
        k=DLPackArray((3, 2, 64), ptr=FAKE_PTR + MB, **bf16),
        v=DLPackArray((3, 2, 64), ptr=FAKE_PTR + 2 * MB, **bf16),
        layout="thd", cu_seqlens=CudaArray((4,), "<i4", ptr=FAKE_PTR + 3 * MB),
        position_ids=CudaArray((3,), "<i8", ptr=FAKE_PTR + 4 * MB),
        q_out=DLPackArray((3, 4, 64), code=10, bits=8, ptr=FAKE_PTR + 5 * MB),
        out_scale=0.5, write_k=False,
        k_cache=DLPackArray((5, 16, 2, 64), code=10, bits=8, ptr=FAKE_PTR + 6 * MB),
        v_cache=DLPackArray((5, 16, 2, 64), code=10, bits=8, ptr=FAKE_PTR + 7 * MB),
        slot_mapping=CudaArray((3,), "<i8", ptr=FAKE_PTR + 8 * MB), k_scale=0.25, v_scale=2.0)
    args.update(over)
    return args


@pytest.mark.parametrize("over, words", [
    (dict(norm="rms", q_norm_weight=DLPackArray((64,), ptr=FAKE_PTR + 9 * MB),
          k_norm_weight=DLPackArray((64,), ptr=FAKE_PTR + 10 * MB), norm_eps=10 ** 400),
     ["norm_eps (1000000", "too large for a double"]),
    (dict(out_scale=1e39), ["out_scale (1e+39) does not fit a float"]),
    (dict(k_scale=-1e39), ["k_scale (-1e+39) does not fit a float"]),
    (dict(k_cache=DLPackArray((5, 16, 2, 64), code=10, bits=8, ptr=2 ** 64 - 4096)),
     ["k_cache (shape [5, 16, 2, 64]", "address space"]),
])
def test_fused_values_must_fit_their_c_types(c_calls, over, words):
    ropejit.fused.qk_norm_rope(**_fused_step())  # the step is valid as it stands
    c_calls.clear()
    refused(c_calls, words, ropejit.fused.qk_norm_rope, **_fused_step(**over))


@pytest.mark.parametrize("fn, kwargs, words", [
    (decode.qkv_projection_key, dict(head_dim=2 ** 32 + 128), ["head_dim (4294967424)"]),
    (decode.qkv_projection_key, dict(rotary_dim=2 ** 40), ["rotary_dim (1099511627776)"]),
    (decode.qkv_projection_key, dict(dtype="f64"), ["dtype ('f64') must be one of"]),
    (decode.qkv_projection_key, dict(norm=["rms"]), ["norm (['rms']) must be one of"]),
    (decode.ffn_key, dict(act="relu"), ["act ('relu') must be one of"]),
    (decode.ffn_key, dict(weights={}), ["weights ({}) must be one of"]),
])
def test_decode_keys_check_their_fields(fn, kwargs, words):
    refused([], words, fn, **kwargs)


@pytest.mark.parametrize("arch", ["sm_90\0garbage", "sm_\ud800", 90])
def test_precompile_arch_must_be_plain_text(arch):
    # C reads a string only up to its NUL: "sm_90\0garbage" would compile sm_90.
    refused([], ["arch (", "must be a string such as 'sm_90'"], ropejit.precompile, arch=arch)


@pytest.mark.parametrize("ctype, good, bad", [
    (ctypes.c_int32, [-2 ** 31, 2 ** 31 - 1], [-2 ** 31 - 1, 2 ** 31]),
    (ctypes.c_int64, [-2 ** 63, 2 ** 63 - 1], [-2 ** 63 - 1, 2 ** 63]),
    (ctypes.c_void_p, [0, 2 ** 64 - 1], [-1, 2 ** 64]),
    (ctypes.c_size_t, [0, 2 ** 64 - 1], [-1, 2 ** 64]),
])
def test_the_checking_helper_at_each_types_limits(ctype, good, bad):
    from ropejit import _cvalues
    for value in good:
        assert _cvalues.integer("n", value, ctype) == value
    for value in bad:
        with pytest.raises(ropejit.InvalidArgument, match=rf"n \({value}\) does not fit"):
            _cvalues.integer("n", value, ctype)
    with pytest.raises(ropejit.InvalidArgument, match=r"p \(None\) must be an int"):
        _cvalues.integer("p", None, ctypes.c_void_p)
    assert _cvalues.real("s", 3.4e38, ctypes.c_float) == 3.4e38
    with pytest.raises(ropejit.InvalidArgument, match=r"s \(3.5e\+38\) does not fit a float"):
        _cvalues.real("s", 3.5e38, ctypes.c_float)
    # A message echoes a clipped value, even one str() refuses to write out.
    with pytest.raises(ropejit.InvalidArgument, match=r"n \(<an int of 33220 bits>\)"):
        _cvalues.integer("n", 10 ** 10000)


# 2. inverse_frequencies checks rotary_dim before it allocates rotary_dim / 2 doubles.

def test_inverse_frequencies_checks_rotary_dim_before_allocating():
    # In a process limited to 2 GiB of address space: an unchecked 2^32 + 128 would allocate
    # 16 GiB (MemoryError here) instead of being refused.
    code = ("import resource; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "import ropejit\n"
            "try:\n"
            "    ropejit.inverse_frequencies('computed', 2**32 + 128)\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("InvalidArgument ropejit: rotary_dim (4294967424) must be an even "
                               "int in [2, 512]"), r.stdout


@pytest.mark.parametrize("rotary_dim", [514, 1024, 7, 0, -2, "8", True, 2 ** 32 + 128])
def test_rotary_dim_of_the_frequency_functions(rotary_dim):
    if not isinstance(rotary_dim, int) or rotary_dim < 2 ** 32:
        with pytest.raises(ropejit.InvalidArgument, match=r"rotary_dim \(.*\) must be an even "
                                                          r"int in \[2, 512\]"):
            ropejit.inverse_frequencies("computed", rotary_dim)
    with pytest.raises(ropejit.InvalidArgument, match=r"must be an even int in \[2, 512\]"):
        ropejit.attention_factor("yarn", rotary_dim, ropejit.Scaling(factor=4.0,
                                                                     original_max_positions=64))


def test_the_largest_rotary_dim_seq_len_and_base():
    assert len(ropejit.inverse_frequencies("computed", 512)) == 256
    with pytest.raises(ropejit.InvalidArgument, match=r"base \(1000.*too large for a double"):
        ropejit.inverse_frequencies("computed", 8, 10 ** 400)
    with pytest.raises(ropejit.InvalidArgument, match=r"seq_len \(1180591620717411303424\)"):
        ropejit.inverse_frequencies("dynamic_ntk", 8, seq_len=HUGE,
                                    scaling=ropejit.Scaling(factor=2.0, original_max_positions=16))


# 3. Malformed array-interface objects and configs: InvalidArgument naming what is wrong.

class Interface:
    """An object exposing `cai` as its __cuda_array_interface__."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


class Recursing:
    @property
    def __cuda_array_interface__(self):
        return self.__cuda_array_interface__


def _cai(**over):
    cai = {"shape": (1, 4, 2, 64), "typestr": "<f2", "data": (FAKE_PTR, False), "version": 3}
    for key, value in over.items():
        if value is _cai:
            cai.pop(key)
        else:
            cai[key] = value
    return cai


def _self_referencing():
    shape = [1, 4, 2]
    shape.append(shape)
    cai = _cai()
    cai["shape"] = cai
    obj = Interface(None)
    obj.__cuda_array_interface__ = obj
    deep = [64]
    for _ in range(100000):
        deep = [deep]
    return [("a shape holding itself", Interface(_cai(shape=shape)), "shape"),
            ("an interface holding itself", Interface(cai), "shape"),
            ("an interface that is the object", obj, "must be a dict"),
            ("a property that recurses", Recursing(), "cannot be read: RecursionError"),
            ("a shape nested 100000 deep", Interface(_cai(shape=deep)), "shape")]


MALFORMED_INTERFACES = [
    ("not a dict", Interface(42), "__cuda_array_interface__ (42) must be a dict"),
    ("a list of pairs", Interface([("shape", (1,))]), "must be a dict"),
    ("no shape", Interface(_cai(shape=_cai)), "has no 'shape'"),
    ("no typestr", Interface(_cai(typestr=_cai)), "has no 'typestr'"),
    ("no data", Interface(_cai(data=_cai)), "has no 'data'"),
    ("typestr an int", Interface(_cai(typestr=3)), "typestr (3) must be a numpy type string"),
    ("typestr bytes", Interface(_cai(typestr=b"<f2")), "typestr (b'<f2')"),
    ("typestr of size 0", Interface(_cai(typestr="<f0")), "typestr ('<f0')"),
    ("typestr of a unicode digit", Interface(_cai(typestr="<f\u00b2")), "typestr ("),
    ("typestr without a byte order", Interface(_cai(typestr="f2")), "typestr ('f2')"),
    ("typestr of a huge size", Interface(_cai(typestr="<f" + "9" * 5000)), "typestr ("),
    ("shape a string", Interface(_cai(shape="1,4,2,64")), "shape ('1,4,2,64') must be a tuple"),
    ("shape an int", Interface(_cai(shape=64)), "shape (64) must be a tuple"),
    ("shape negative", Interface(_cai(shape=(1, -4, 2, 64))), "holds -4: each must be >= 0"),
    ("shape of floats", Interface(_cai(shape=(1, 4.0, 2, 64))), "it holds 4.0"),
    ("shape of bools", Interface(_cai(shape=(1, 4, 2, True))), "it holds True"),
    ("shape past int64", Interface(_cai(shape=(2 ** 63, 1, 1, 64))), "fit int64"),
    ("shape of 65 dimensions", Interface(_cai(shape=(1,) * 65)), "more than 64"),
    ("shape spanning past int64", Interface(_cai(shape=(2 ** 40, 2 ** 40, 2, 64))),
     "past int64 offsets"),
    ("strides a string", Interface(_cai(strides="abc")), "strides ('abc') must be a tuple"),
    ("strides of another length", Interface(_cai(strides=(256, 2))), "one entry per dimension"),
    ("strides of floats", Interface(_cai(strides=(1024, 256, 128, 2.5))), "it holds 2.5"),
    ("strides past int64", Interface(_cai(strides=(2 ** 63, 256, 128, 2))), "fit int64"),
    ("data an int", Interface(_cai(data=5)), "data (5) must be a tuple"),
    ("data of one item", Interface(_cai(data=(FAKE_PTR,))), "must be a tuple (pointer"),
    ("data a string pointer", Interface(_cai(data=("0x10", False))), "data pointer ('0x10')"),
    ("data None", Interface(_cai(data=(None, False))), "must be an int"),
    ("data past 2^64", Interface(_cai(data=(2 ** 64 + 16, False))), "data pointer ("),
    ("data reaching past 2^64", Interface(_cai(data=(2 ** 64 - 64, False))), "address space"),
    ("version a string", Interface(_cai(version="3")), "version ('3') must be an int"),
    ("stream a string", Interface(_cai(stream="default")), "stream ('default')"),
    ("stream a float", Interface(_cai(stream=1.5)), "stream (1.5)"),
]


@pytest.mark.parametrize("label, obj, words", MALFORMED_INTERFACES + _self_referencing(),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_malformed_cuda_array_interfaces(c_calls, label, obj, words):
    e = refused(c_calls, [words], ropejit.apply, obj)
    assert str(e).startswith("ropejit: q"), str(e)  # the argument is named
    refused(c_calls, [words], ropejit.apply, _q(), cos=obj, sin=_q())


def _dlpack(**over):
    a = DLPackArray((1, 4, 2, 64))
    for field, value in over.items():
        setattr(a._managed.tensor, field, value)
    return a


class DLPackDevice(DLPackArray):
    def __init__(self, device):
        super().__init__((1, 4, 2, 64))
        self.device = device


class NotACapsule(DLPackArray):
    def __dlpack__(self, stream=None):
        return 42


@pytest.mark.parametrize("obj, words", [
    (DLPackDevice("cuda"), "__dlpack_device__() ('cuda') must be a tuple"),
    (DLPackDevice((2,)), "__dlpack_device__() ((2,))"),
    (DLPackDevice((2, "0")), "__dlpack_device__() ((2, '0'))"),
    (NotACapsule((1, 4, 2, 64)), "__dlpack__() (42) must be an unconsumed"),
    (_dlpack(ndim=-1), "ndim (-1) must be in [0, 64]"),
    (_dlpack(ndim=100000), "ndim (100000)"),
    (_dlpack(byte_offset=2 ** 64 - 1), "DLPack data pointer + byte_offset ("),
    (DLPackArray((1, -4, 2, 64)), "DLPack shape"),
    (DLPackArray((2 ** 40, 2 ** 40, 2, 64)), "past int64 offsets"),
])
def test_malformed_dlpack_objects(c_calls, obj, words):
    refused(c_calls, [words], ropejit.apply, obj)


_INTERFACE_KEYS = ["shape", "typestr", "data", "strides", "version", "stream", "mask", "junk"]


def _junk_values():
    self_list = []
    self_list.append(self_list)
    return [None, 0, -1, 1, 3, 2 ** 31, 2 ** 63, 2 ** 64 + 16, HUGE, -HUGE, 10 ** 5000, 1.5,
            float("nan"), True, "", "x", "<f2", "<f0", "<i8", "|b1", "<f\u00b2", b"<f2", [], (),
            {}, (1, 4, 2, 64), [1, 4, 2, 64], (0, 4, 2, 64), (1, -4, 2, 64), (2 ** 62, 2, 1, 1),
            (1,) * 70, ("a",), (1.0, 4, 2, 64), (FAKE_PTR,), (FAKE_PTR, False), (2 ** 64, False),
            (-1, False), [FAKE_PTR, True], (None, False), ("p", False), (2048, 512, 256, 2),
            (0, 0, 0, 2), (-2, 2, 2, 2), (2 ** 63, 1, 1, 1), self_list, object(), {"a": 1}]


def test_fuzzed_interfaces_raise_only_invalid_argument(c_calls):
    """Random malformed __cuda_array_interface__ dicts (a fixed seed): each call succeeds (a
    dict that happens to be valid) or raises InvalidArgument, never another exception."""
    rng = random.Random(47)
    values = _junk_values()
    good = _cai(stream=None)
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(3000):
        if rng.random() < 0.5:  # a valid dict with a few keys spoilt or dropped
            cai = dict(good)
            for _ in range(rng.randint(1, 3)):
                key = rng.choice(_INTERFACE_KEYS)
                if rng.random() < 0.15:
                    cai.pop(key, None)
                else:
                    cai[key] = rng.choice(values)
        else:
            cai = {key: rng.choice(values)
                   for key in rng.sample(_INTERFACE_KEYS, rng.randint(0, len(_INTERFACE_KEYS)))}
        obj = Interface(cai if rng.random() > 0.05 else rng.choice(values))
        where = rng.random()
        try:
            if where < 0.6:
                ropejit.apply(obj)
            elif where < 0.8:
                ropejit.apply(_q(), cos=obj, sin=CudaArray((16, 32), "<f4", ptr=FAKE_PTR + MB))
            else:
                ropejit.fused.qk_norm_rope(CudaArray((3, 4, 64)), obj, layout="thd",
                                           position_ids=CudaArray((3,), "<i8",
                                                                  ptr=FAKE_PTR + 2 * MB))
            outcomes["ok"] += 1
        except ropejit.InvalidArgument:
            outcomes["refused"] += 1
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0, outcomes


class ToDict:
    def __init__(self, value):
        self.value = value

    def to_dict(self):
        return self.value


class BadPath(os.PathLike):
    def __fspath__(self):
        return 3


def _malformed_configs():
    deep = {}
    for _ in range(5000):
        deep = {"rope_scaling": deep}
    circular = {"hidden_size": 256}
    circular["self"] = circular
    ns = types.SimpleNamespace(hidden_size=256)
    ns.nested = ns
    return [
        # Python's JSON encoder refuses it (3.11), or writes it and the C reader refuses the text
        # as nested deeper than 64 (3.12): either way a refusal that says so.
        ("a dict nested 5000 deep", lambda: ropejit.model_from_hf_config(deep), "nested"),
        ("a dict holding itself", lambda: ropejit.model_from_hf_config(circular),
         "Circular reference"),
        ("a namespace holding itself", lambda: ropejit.model_from_hf_config(ns),
         "Circular reference"),
        ("a tuple key", lambda: ropejit.model_from_hf_config({(1, 2): 3}),
         "keys must be str"),
        ("an int of 5000 digits", lambda: ropejit.model_from_hf_config({"hidden_size": 10 ** 5000}),
         "JSON cannot hold"),
        ("to_dict giving a list", lambda: ropejit.model_from_hf_config(ToDict([1, 2])),
         "config.to_dict() ([1, 2]) must return a dict"),
        ("a list", lambda: ropejit.model_from_hf_config([1, 2]), "must be a path"),
        ("bytes", lambda: ropejit.model_from_hf_config(b"config.json"), "must be a path"),
        ("a path of an int", lambda: ropejit.model_from_hf_config(BadPath()), "is no path"),
        ("a path with NUL", lambda: ropejit.model_from_hf_config("a\0b"), "NUL byte"),
        ("a dtype list", lambda: ropejit.model_from_hf_config({}, dtype=["bf16"]),
         "dtype (['bf16']) must be one of"),
        ("a text dtype dict", lambda: ropejit.model_from_hf_config_text("{}", dtype={}),
         "dtype ({}) must be one of"),
        ("text with a lone surrogate", lambda: ropejit.model_from_hf_config_text("\ud800"),
         "not valid Unicode"),
        ("text of an int", lambda: ropejit.model_from_hf_config_text(42), "must be str or bytes"),
        ("text nested 100000 deep", lambda: ropejit.model_from_hf_config_text("[" * 100000),
         "nested 100000 levels"),
        ("objects nested 100000 deep",
         lambda: ropejit.model_from_hf_config_text('{"a":' * 100000), "nested"),
        ("text of ill-formed UTF-8",
         lambda: ropejit.model_from_hf_config_text(b'{"model_type": "\xff"}'), "UTF-8"),
        ("a JSON list", lambda: ropejit.model_from_hf_config_text("[1, 2]"),
         "expected a JSON object"),
        ("heads a string",
         lambda: ropejit.model_from_hf_config({"hidden_size": 256, "num_attention_heads": "4"}),
         "num_attention_heads"),
        ("rope_scaling a list", lambda: ropejit.model_from_hf_config(
            {"hidden_size": 256, "num_attention_heads": 4, "rope_scaling": [1]}),
         "rope_scaling"),
        ("rope_theta NaN", lambda: ropejit.model_from_hf_config(
            {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": float("nan")}),
         "rope_theta (NaN)"),
    ]


@pytest.mark.parametrize("label, call, words", _malformed_configs(),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_malformed_configs(label, call, words):
    refused([], [words], call)


_CONFIG_KEYS = ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rope_theta", "rope_scaling", "rope_parameters", "rope_type", "type", "factor",
                "partial_rotary_factor", "rotary_dim", "max_position_embeddings",
                "original_max_position_embeddings", "short_factor", "long_factor",
                "mrope_section", "qk_rope_head_dim", "qk_nope_head_dim", "model_type",
                "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "mscale",
                "attention_factor", "rope_local_base_freq", "use_qk_norm"]


def _config_value(rng, depth):
    pick = rng.random()
    if depth < 3 and pick < 0.15:
        return {rng.choice(_CONFIG_KEYS): _config_value(rng, depth + 1)
                for _ in range(rng.randint(0, 4))}
    if depth < 3 and pick < 0.25:
        return [_config_value(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    return rng.choice([None, True, False, 0, -1, 1, 2, 4, 64, 128, 256, 1e4, 0.5, -0.5, 1e308,
                       2 ** 31, 2 ** 53 + 1, 2 ** 70, float("nan"), float("inf"), "", "x",
                       "linear", "yarn", "llama3", "dynamic", "longrope", "default", "qwen2_vl",
                       "gemma3", "deepseek_v3", "\ud800", "1e400"])


def test_fuzzed_configs_raise_only_invalid_argument():
    """Random configs (a fixed seed) built from the keys the reader looks at, as dicts and as
    text (some of it cut short): each is read or refused with InvalidArgument."""
    rng = random.Random(47)
    outcomes = {"read": 0, "refused": 0}
    base = {"hidden_size": 256, "num_attention_heads": 4}
    for i in range(1500):
        config = dict(base) if rng.random() < 0.7 else {}
        for _ in range(rng.randint(1, 6)):
            config[rng.choice(_CONFIG_KEYS)] = _config_value(rng, 0)
        try:
            if i % 2:
                ropejit.model_from_hf_config(config)
            else:
                text = json.dumps(config)
                if rng.random() < 0.2:
                    text = text[:rng.randint(0, len(text))]
                ropejit.model_from_hf_config_text(text)
            outcomes["read"] += 1
        except ropejit.InvalidArgument:
            outcomes["refused"] += 1
    assert outcomes["read"] > 0 and outcomes["refused"] > 0, outcomes


# 4. ROPEJIT_LIB naming another library.

def _system_library():
    """A shared library of this process that is not ropejit (libm or libc)."""
    try:
        maps = open("/proc/self/maps").read().split("\n")
    except OSError:
        return None
    for line in maps:
        path = line.split()[-1] if line.split() else ""
        if re.search(r"/lib(m|c)\.so(\.\d+)*$", path) and os.path.isfile(path):
            return path
    return None


def test_ropejit_lib_naming_another_library_is_an_import_error():
    other = _system_library()
    if other is None:
        pytest.skip("no libm or libc path found in /proc/self/maps")
    env = dict(os.environ, ROPEJIT_LIB=other)
    r = subprocess.run([sys.executable, "-c", "import ropejit"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    last = r.stderr.strip().split("\n")[-1]
    assert last.startswith("ImportError: ropejit: "), r.stderr
    assert other in last and "has no symbol ropejit_" in last, last
    assert "AttributeError" not in r.stderr, r.stderr


def test_longrope_factor_arrays_of_the_wrong_length_are_refused_before_c_reads_them():
    # 63 values where rotary_dim 128 reads 64: the library once read one double past Python's
    # array. Python names the lengths; the C API, given the same arrays, names factor_count.
    short = ropejit.Scaling(original_max_positions=4096, short_factor=[1.0] * 63,
                            long_factor=[2.0] * 63)
    for call in (lambda: ropejit.inverse_frequencies("longrope", 128, scaling=short, seq_len=1),
                 lambda: ropejit.attention_factor("longrope", 128, scaling=short)):
        with pytest.raises(ropejit.InvalidArgument,
                           match=r"hold 63 values each, but longrope with rotary_dim 128 reads "
                                 r"rotary_dim / 2 \(64\)"):
            call()
    from ropejit import _model
    table = _capi.new(_capi.ropejit_table_spec)
    table.freqs = _capi.FREQS["longrope"]
    table.scaling = _model.c_scaling(short)
    out = ctypes.c_double()
    status = _capi.lib.ropejit_attention_factor(ctypes.byref(table), 128, ctypes.byref(out))
    assert status == 1
    assert "scaling.factor_count (63) must be rotary_dim / 2 (64)" in \
        _capi.lib.ropejit_last_error().decode()
