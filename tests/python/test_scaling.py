"""Frequency scaling and Hugging Face configs without torch or a GPU: ropejit's C config reader
through the binding (every shipped config of tests/data/hf, as a path, a dict and text; its
frequencies against what transformers computes, tests/data/hf_golden.json), the reader's errors,
ropejit.Scaling, inverse_frequencies / attention_factor, and the call layer filling the scaling
and mRoPE fields of ropejit_args (checked by the library's own checks, and by the host emulator
over numpy arrays standing in for device memory)."""

import ctypes
import json
import math
import os
import subprocess
import sys
import types

import emulator
import numpy as np
import pytest
from conftest import FAKE_PTR, ROOT, CudaArray, no_driver

import ropejit
from ropejit import _call, _capi
from ropejit._tensors import View

HF = ROOT / "tests" / "data" / "hf"
CONFIGS = sorted(p.name for p in HF.glob("*.json"))
GOLDEN = {m["file"]: m for m in json.loads((ROOT / "tests" / "data" / "hf_golden.json")
                                           .read_text())["models"]}
LONG = dict(short_factor=[1.0, 1.5, 2.0, 2.5], long_factor=[3.0, 5.0, 7.0, 11.0])
SCALINGS = {  # a Scaling each variant accepts, for rotary_dim 8 (4 pairs)
    "linear": ropejit.Scaling(factor=4.0),
    "dynamic_ntk": ropejit.Scaling(factor=2.0, original_max_positions=16),
    "llama3": ropejit.Scaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_positions=64),
    "yarn": ropejit.Scaling(factor=4.0, original_max_positions=64, beta_fast=32.0, beta_slow=1.0),
    "longrope": ropejit.Scaling(factor=4.0, original_max_positions=16, **LONG),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_agree_with_transformers(name):
    model = ropejit.model_from_hf_config(HF / name)
    # The same reader through each way in: a str path, a dict, JSON text.
    raw = json.loads((HF / name).read_text())
    assert ropejit.model_from_hf_config(str(HF / name)) == model
    assert ropejit.model_from_hf_config(raw) == model
    assert ropejit.model_from_hf_config_text((HF / name).read_text()) == model
    golden = GOLDEN[name]
    # (DeepSeek MLA: the key's head is the rotary slice, and one k head is shared.)
    assert (model.q_heads, model.spec.head_dim) == (golden["num_attention_heads"],
                                                    golden["head_dim"])
    assert model.kv_heads == (1 if model.rotary_offset else golden["num_key_value_heads"])
    assert model.max_positions == golden["max_position_embeddings"]
    for layer in golden["layers"]:
        sliding = layer["layer"] == "sliding_attention"
        freqs = "computed" if sliding else model.freqs
        base = model.local_base if sliding else model.base
        assert base == layer["rope_theta"]
        for case in layer["cases"]:
            seq_len = case["seq_len"] or 0  # transformers' None: no longer than trained
            inv = ropejit.inverse_frequencies(freqs, model.rotary_dim, base,
                                              None if sliding else model.scaling, seq_len)
            np.testing.assert_allclose(inv, case["inv_freq"], rtol=1e-12, atol=0)
            factor = ropejit.attention_factor(freqs, model.rotary_dim,
                                              None if sliding else model.scaling, seq_len)
            assert factor == pytest.approx(case["attention_factor"], rel=1e-12)


def test_model_fields_and_specs():
    llama = ropejit.model_from_hf_config(HF / "llama3.1-8b.json", dtype="f16")
    assert (llama.freqs, llama.base, llama.head_dim, llama.rotary_dim) == (
        "llama3", 500000.0, 128, 128)
    assert llama.scaling == ropejit.Scaling(factor=8.0, low_freq_factor=1.0,
                                            high_freq_factor=4.0, original_max_positions=8192)
    assert ropejit.key(llama.spec) == (
        "rope_bshd_f16_d128_r128_neox_pos-ids-i64_comp-llama3_qk_fwd_ip")
    assert not llama.needs_seq_len

    qwen2_vl = ropejit.model_from_hf_config(HF / "qwen2-vl-7b.json")
    assert qwen2_vl.mrope_section == (16, 24, 24) and not qwen2_vl.mrope_interleaved
    assert (qwen2_vl.freqs, qwen2_vl.spec.positions) == ("computed", "mrope")
    qwen3_vl = ropejit.model_from_hf_config(HF / "qwen3-vl-8b.json")
    assert qwen3_vl.mrope_interleaved and qwen3_vl.norm == "rms"

    deepseek = ropejit.model_from_hf_config(HF / "deepseek-v2-lite.json")
    assert (deepseek.rotary_offset, deepseek.rotary_dim, deepseek.spec.head_dim) == (128, 64, 64)
    assert (deepseek.style, deepseek.freqs, deepseek.kv_heads) == ("gptj", "yarn", 1)
    assert (deepseek.scaling.mscale, deepseek.scaling.mscale_all_dim) == (0.707, 0.707)
    assert deepseek.softmax_scale_multiplier == pytest.approx(
        (0.1 * 0.707 * math.log(40) + 1) ** 2, rel=1e-15)
    assert deepseek.kv_lora_rank == 512  # MLA: the latent row is 512 + 64 wide
    assert qwen3_vl.kv_lora_rank == 0

    gemma = ropejit.model_from_hf_config(HF / "gemma3-4b.json")
    assert (gemma.freqs, gemma.local_base, gemma.norm) == ("linear", 10000.0, "rms_one_plus")
    assert ropejit.model_from_hf_config(HF / "olmo2-7b.json").norm == "rms_all_heads"
    assert ropejit.model_from_hf_config(HF / "gptj-6b.json").style == "gptj"

    phi = ropejit.model_from_hf_config(HF / "phi-3-mini-128k.json")
    assert phi.freqs == "longrope" and phi.needs_seq_len
    assert len(phi.scaling.short_factor) == len(phi.scaling.long_factor) == 48
    # The factor arrays were copied out of the C reader's thread-local memory: reading another
    # longrope config does not change them.
    before = phi.scaling
    other = json.loads((HF / "phi-3-mini-128k.json").read_text())
    other["rope_scaling"]["short_factor"] = [7.0] * 48
    assert ropejit.model_from_hf_config(other).scaling.short_factor == (7.0,) * 48
    assert phi.scaling == before and phi.scaling.short_factor[0] == 1.0


def test_precompile_a_model_read_from_its_config(tmp_path):
    # In a subprocess: the library reads ROPEJIT_CACHE_DIR once per process.
    code = ("import ropejit, sys\n"
            "for path in sys.argv[1:]:\n"
            "    ropejit.precompile(ropejit.model_from_hf_config(path).spec, arch='sm_90')\n")
    env = dict(os.environ, ROPEJIT_CACHE_DIR=str(tmp_path / "cache"), ROPEJIT_QUIET="1")
    r = subprocess.run([sys.executable, "-c", code, str(HF / "llama3.1-8b.json"),
                        str(HF / "qwen2-vl-7b.json")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    entries = [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    assert len(entries) >= 4, entries  # prefill's and decode's kernels of each key


def test_configs_from_objects():
    class PretrainedConfigLike:  # transformers' configs serialize themselves with to_dict()
        def to_dict(self):
            return {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 1e6,
                    "max_position_embeddings": 64, "dtype": np.float16,
                    "rope_parameters": {"rope_type": "yarn", "factor": 2.0,
                                        "original_max_position_embeddings": 32}}

    m = ropejit.model_from_hf_config(PretrainedConfigLike())
    assert (m.head_dim, m.freqs, m.base, m.scaling.factor) == (64, "yarn", 1e6, 2.0)
    ns = types.SimpleNamespace(hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.5,
                               max_position_embeddings=64, rope_scaling=None)
    m = ropejit.model_from_hf_config(ns)
    assert (m.head_dim, m.rotary_dim, m.freqs) == (64, 32, "computed")


BASE = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 4096}


@pytest.mark.parametrize("extra, words", [
    ({"rope_scaling": {"rope_type": "proportional"}},
     ['rope_scaling.rope_type ("proportional") is not a rope_type ropejit knows']),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 1024}},
     ["rope_scaling.low_freq_factor is missing", "llama3 needs it"]),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0] * 3,
                          "long_factor": [1.0] * 32, "original_max_position_embeddings": 1024}},
     ["rope_parameters.short_factor", "rotary_dim / 2 (32)"]),
    ({"rope_scaling": {"type": "mrope", "mrope_section": [8, 8, 8]}},
     ["rope_scaling.mrope_section", "must sum to rotary_dim / 2 (32)"]),
    ({"rope_theta": 1}, ["rope_theta (1) must be > 1"]),
    ({"rope_scaling": {"rope_type": "yarn", "factor": -2.0}}, ["rope_scaling.factor (-2.0)"]),
])
def test_bad_configs_raise_the_readers_message(extra, words):
    with pytest.raises(ropejit.InvalidArgument) as e:
        ropejit.model_from_hf_config(dict(BASE, **extra))
    assert e.value.code == ropejit.ErrorCode.invalid_argument
    assert str(e.value).startswith("ropejit: config.json: ")
    for word in words:
        assert word in str(e.value), str(e.value)


def test_bad_config_inputs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # short paths: the library clips long ones in messages
    with pytest.raises(ropejit.InvalidArgument, match=r"config file 'nowhere.json' does not "
                                                      r"exist"):
        ropejit.model_from_hf_config("nowhere.json")
    (tmp_path / "broken.json").write_text('{"num_attention_heads": ')
    with pytest.raises(ropejit.InvalidArgument, match=r"^ropejit: broken.json: invalid JSON"):
        ropejit.model_from_hf_config(tmp_path.joinpath("broken.json").relative_to(tmp_path))
    with pytest.raises(ropejit.InvalidArgument, match=r"config.json: expected a JSON object"):
        ropejit.model_from_hf_config_text("[1, 2]")
    with pytest.raises(ropejit.InvalidArgument, match=r"config \(builtins.int\) must be a path"):
        ropejit.model_from_hf_config(42)
    # The reader names the field and the value (json.dumps's own refusal names neither).
    with pytest.raises(ropejit.InvalidArgument, match=r"rope_theta \(NaN\) is not a number"):
        ropejit.model_from_hf_config(dict(BASE, rope_theta=float("nan")))
    with pytest.raises(ropejit.InvalidArgument, match=r"rope_scaling.factor \(-Infinity\)"):
        ropejit.model_from_hf_config(dict(BASE, rope_scaling={"rope_type": "linear",
                                                              "factor": -float("inf")}))
    with pytest.raises(ropejit.InvalidArgument, match=r"dtype \('f64'\) must be one of"):
        ropejit.model_from_hf_config(dict(BASE), dtype="f64")


def test_scaling_values():
    s = ropejit.Scaling()
    c = _capi.DEFAULT_ARGS.scaling  # the library's defaults
    assert (s.factor, s.high_freq_factor, s.beta_fast, s.truncate) == (
        c.factor, c.high_freq_factor, c.beta_fast, bool(c.truncate))
    long = ropejit.Scaling(factor=2, original_max_positions=16, **LONG)
    assert long.short_factor == (1.0, 1.5, 2.0, 2.5) and long.factor == 2.0
    assert ropejit.Scaling.from_list(long.to_list()) == long
    assert ropejit.Scaling.from_list(s.to_list()) == s
    for kwargs, match in [(dict(factor="8"), r"scaling.factor \('8'\) must be a number"),
                          (dict(original_max_positions=8.5),
                           r"scaling.original_max_positions \(8.5\) must be an int"),
                          (dict(truncate=1), r"scaling.truncate \(1\) must be True or False"),
                          (dict(short_factor=[1.0]), r"short_factor and scaling.long_factor go "
                                                     r"together.*got 1 and none"),
                          (dict(short_factor=[1.0], long_factor=["x"]),
                           r"scaling.long_factor\[0\] \('x'\) must be a number")]:
        with pytest.raises(ropejit.InvalidArgument, match=match):
            ropejit.Scaling(**kwargs)


def test_inverse_frequencies_and_attention_factor():
    plain = ropejit.inverse_frequencies("computed", 8, 10000.0)
    np.testing.assert_allclose(plain, 10000.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-15)
    linear = ropejit.inverse_frequencies("linear", 8, 10000.0, SCALINGS["linear"])
    np.testing.assert_allclose(linear, np.array(plain) / 4, rtol=1e-15)
    assert ropejit.attention_factor("yarn", 8, SCALINGS["yarn"]) == pytest.approx(
        0.1 * math.log(4) + 1, rel=1e-15)
    # longrope switches to the long factors beyond original_max_positions (16).
    short = ropejit.inverse_frequencies("longrope", 8, 10000.0, SCALINGS["longrope"], seq_len=16)
    long = ropejit.inverse_frequencies("longrope", 8, 10000.0, SCALINGS["longrope"], seq_len=17)
    np.testing.assert_allclose(short, np.array(plain) / LONG["short_factor"], rtol=1e-15)
    np.testing.assert_allclose(long, np.array(plain) / LONG["long_factor"], rtol=1e-15)
    # dynamic NTK keeps the model's frequencies up to the trained length, then rescales the base.
    assert ropejit.inverse_frequencies("dynamic_ntk", 8, 1e4, SCALINGS["dynamic_ntk"], 16) == plain
    assert ropejit.inverse_frequencies("dynamic_ntk", 8, 1e4, SCALINGS["dynamic_ntk"], 40)[1] < (
        plain[1])
    with pytest.raises(ropejit.InvalidArgument, match=r"original_max_positions \(0\) must be > 0 "
                                                      r"for llama3"):
        ropejit.inverse_frequencies("llama3", 8, 5e5, ropejit.Scaling(factor=8.0))
    with pytest.raises(ropejit.InvalidArgument, match=r"freqs \('table'\) must be one of"):
        ropejit.inverse_frequencies("table", 8)
    with pytest.raises(ropejit.InvalidArgument, match=r"seq_len \(-1\) must be an int >= 0"):
        ropejit.attention_factor("longrope", 8, SCALINGS["longrope"], seq_len=-1)
    with pytest.raises(ropejit.InvalidArgument, match=r"scaling \(\{'factor': 2\}\) must be a "
                                                      r"ropejit.Scaling"):
        ropejit.attention_factor("linear", 8, {"factor": 2})


# The call layer: ropejit.apply with stand-in device arrays (fake pointers). Bad arguments are
# refused in Python or by the library's checks, which run before it needs a driver.

def q_k(shape=(1, 4, 2, 8)):
    return CudaArray(shape, "<f2"), CudaArray(shape, "<f2", ptr=FAKE_PTR + (1 << 20))


IDS3 = CudaArray((3, 4), "<i8", ptr=FAKE_PTR + (2 << 20))


@pytest.mark.parametrize("kwargs, match", [
    (dict(freqs="llama3", base=5e5, scaling=ropejit.Scaling(factor=8.0)),
     r"args.scaling.original_max_positions \(0\) must be > 0 for llama3"),
    (dict(freqs="longrope", scaling=ropejit.Scaling(original_max_positions=16, short_factor=[1.0],
                                                    long_factor=[1.0])),
     r"scaling.short_factor and scaling.long_factor hold 1 values each, but longrope with "
     r"rotary_dim 8 reads rotary_dim / 2 \(4\)"),
    (dict(freqs="yarn", scaling=ropejit.Scaling(factor=4.0, original_max_positions=64,
                                                beta_fast=0.5)),
     r"args.scaling.beta_fast \(0.5\) must be >= beta_slow \(1\) for yarn"),
    (dict(position_ids=IDS3, mrope_section=(1, 1, 3)),
     r"mrope_section \(\[1, 1, 3\]\) must sum to rotary_dim / 2 \(4\)"),
    (dict(position_ids=IDS3, mrope_section=(1, 2)), r"mrope_section \(\(1, 2\)\) must be 3 ints"),
    (dict(position_ids=IDS3, mrope_section=(2, 2, -0.5)), r"must be 3 ints >= 0"),
    (dict(mrope_section=(2, 1, 1)), r"mrope_section needs position_ids with three rows"),
    (dict(position_ids=CudaArray((4,), "<i8", ptr=FAKE_PTR + (2 << 20)),
          mrope_section=(2, 1, 1)), r"position_ids must be contiguous with 12 elements"),
    (dict(mrope_interleaved=True), r"mrope_interleaved is set but mrope_section is not"),
    (dict(scaling=ropejit.Scaling(factor=2.0)), r"scaling is given but freqs is 'computed'"),
    (dict(freqs="linear", scaling={"factor": 2.0}), r"scaling \(\{'factor': 2.0\}\) must be a "
                                                    r"ropejit.Scaling"),
    (dict(freqs="llama5"), r"freqs \('llama5'\) must be one of"),
    (dict(freqs="table"), r"freqs 'table' needs cos and sin"),
    (dict(freqs="yarn", cos=CudaArray((8, 4), "<f4", ptr=FAKE_PTR + (3 << 20)),
          sin=CudaArray((8, 4), "<f4", ptr=FAKE_PTR + (4 << 20))),
     r"cos/sin are given but freqs is 'yarn'"),
    (dict(freqs="dynamic_ntk", scaling=SCALINGS["dynamic_ntk"],
          position_ids=CudaArray((4,), "<i8", ptr=FAKE_PTR + (2 << 20))),
     r"freqs 'dynamic_ntk' picks its frequencies by the sequence length: pass seq_len"),
    (dict(freqs="longrope", scaling=SCALINGS["longrope"], seq_len=-3),
     r"seq_len \(-3\) must be an int >= 0"),
])
def test_bad_scaling_and_mrope_calls(kwargs, match):
    q, k = q_k()
    with pytest.raises(ropejit.InvalidArgument, match=match) as e:
        ropejit.apply(q, k, **kwargs)
    assert e.value.code == ropejit.ErrorCode.invalid_argument


@pytest.mark.parametrize("freqs", sorted(SCALINGS))
def test_without_a_driver_a_valid_scaled_call_fails_with_no_driver(freqs):
    if not no_driver():
        pytest.skip("a CUDA driver is present: this test would launch on fake pointers")
    q, k = q_k()
    with pytest.raises(ropejit.NoDriverError):
        ropejit.apply(q, k, freqs=freqs, scaling=SCALINGS[freqs], position_ids=IDS3,
                      mrope_section=(2, 1, 1), mrope_interleaved=True, seq_len=40)


def host_view(name, a):
    """A numpy array as the call layer sees a device tensor (the emulator reads it)."""
    dtype = {np.dtype(np.float32): "f32", np.dtype(np.int64): "i64"}[a.dtype]
    return View(name, a.ctypes.data, a.shape, [s // a.itemsize for s in a.strides], dtype,
                ("cuda", 0))


def reference(x, positions, freqs, rotary_dim, base, scaling, seq_len, rows):
    """float64 neox rotation of x [tokens, heads, D] with per-pair positions (rows picks each
    pair's position row of positions [3, tokens]), from the library's frequencies."""
    inv = np.array(ropejit.inverse_frequencies(freqs, rotary_dim, base, scaling, seq_len))
    factor = ropejit.attention_factor(freqs, rotary_dim, scaling, seq_len)
    angles = positions[rows].T * inv  # [tokens, R/2]
    cos, sin = (np.cos(angles) * factor)[:, None], (np.sin(angles) * factor)[:, None]
    h = rotary_dim // 2
    x1, x2 = x[..., :h].astype(np.float64), x[..., h:rotary_dim].astype(np.float64)
    out = x.astype(np.float64)
    out[..., :h], out[..., h:rotary_dim] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return out


@pytest.mark.parametrize("freqs", ["computed"] + sorted(SCALINGS))
@pytest.mark.parametrize("mrope", [None, (1, 2, 1), "interleaved"])
def test_the_call_fills_scaling_and_mrope(freqs, mrope):
    # thd [tokens, heads, D] with D 10 > rotary_dim 8 (partial rotary), in place.
    rng = np.random.default_rng(7)
    tokens, heads, d, r = 5, 2, 10, 8
    x = rng.standard_normal((tokens, heads, d)).astype(np.float32)
    positions = rng.integers(0, 40, (3, tokens)).astype(np.int64)
    scaling = SCALINGS.get(freqs)
    seq_len = 30 if freqs in ("dynamic_ntk", "longrope") else None
    kwargs = dict(layout="thd", rotary_dim=r, base=500.0, freqs=freqs, scaling=scaling,
                  seq_len=seq_len)
    if mrope is None:
        ids, rows = positions[0].copy(), [0] * (r // 2)
    else:
        interleaved = mrope == "interleaved"
        section = (1, 2, 1) if interleaved else mrope
        ids = positions
        kwargs.update(mrope_section=section, mrope_interleaved=interleaved)
        # rows written out: sections in order; interleaved T H W T (height's section is 2 long,
        # width's 1: pair 3 is temporal again)
        rows = [0, 1, 2, 0] if interleaved else [0, 1, 1, 2]
    want = reference(x, positions if mrope else positions[:1], freqs, r, 500.0, scaling,
                     seq_len or 0, rows if mrope else [0] * (r // 2))
    spec, args = _call.plan(host_view("q", x), position_ids=host_view("position_ids", ids),
                            **kwargs)
    assert spec.freqs == _capi.FREQS[freqs]
    assert spec.positions == _capi.POSITIONS["ids" if mrope is None else "mrope"]
    if mrope is not None:
        assert list(args.mrope_section) == list(kwargs["mrope_section"])
    emulator.emulate(spec, args)
    np.testing.assert_allclose(x, want, rtol=2e-6, atol=2e-6)


def test_offset_positions_default_seq_len():
    # With offset positions on a dense layout, dynamic_ntk / longrope read the last position + 1.
    q = np.zeros((2, 6, 1, 8), np.float32)
    spec, args = _call.plan(host_view("q", q), freqs="longrope", scaling=SCALINGS["longrope"],
                            position_offset=11)
    assert args.scaling.seq_len == 17
    assert ctypes.cast(args.scaling.long_factor, ctypes.c_void_p).value
    assert args.scaling.long_factor[3] == 11.0 and args.scaling.original_max_positions == 16
    spec, args = _call.plan(host_view("q", q), freqs="longrope", scaling=SCALINGS["longrope"],
                            position_offset=11, seq_len=4)
    assert args.scaling.seq_len == 4
