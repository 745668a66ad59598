"""ropejit.nn.RotaryEmbedding: built by ropejit's C config reader from Hugging Face configs (4.x
and 5.x shapes, every rope_type it knows, mRoPE), its errors, its cos/sin and its direct apply
path against transformers' own rotary modules run in float64 (default, linear, dynamic, llama3,
yarn, longrope, mRoPE, Gemma 3's per-layer-type bases), and patched randomly initialized Llamas
(plain and scaled RoPE; examples/patch_llama.py) and Qwen2-VL / Qwen3-VL text models (mRoPE)
against the unpatched ones. Each comparison runs on the GPU and, through the host emulator, on
CPU tensors."""

import importlib.util
import math
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import references as ref  # noqa: E402
from conftest import ROOT  # noqa: E402

import ropejit  # noqa: E402
import ropejit.nn  # noqa: E402
from ropejit.nn import RotaryEmbedding  # noqa: E402

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
requires_transformers = pytest.mark.skipif(not HAVE_TRANSFORMERS,
                                           reason="transformers is not installed")
HF = ROOT / "tests" / "data" / "hf"


def transformers_major():
    import transformers
    return int(transformers.__version__.split(".")[0])


def test_from_a_4x_style_config():
    config = types.SimpleNamespace(hidden_size=256, num_attention_heads=4, rope_theta=1e6,
                                   partial_rotary_factor=0.5, max_position_embeddings=128,
                                   rope_scaling=None)
    rope = RotaryEmbedding.from_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.base, rope.freqs) == (64, 32, 1e6, "computed")
    assert rope.max_position_embeddings == 128


def test_from_a_5x_style_config():
    config = types.SimpleNamespace(hidden_size=256, num_attention_heads=4, head_dim=80,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5e5},
                                   max_position_embeddings=64)
    rope = RotaryEmbedding.from_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.base) == (80, 80, 5e5)


@pytest.mark.parametrize("name, freqs, mrope", [
    ("llama2-7b-linear.json", "linear", None), ("llama2-7b-dynamic.json", "dynamic_ntk", None),
    ("llama3.1-8b.json", "llama3", None), ("qwen2.5-7b-yarn.json", "yarn", None),
    ("phi-3-mini-128k.json", "longrope", None), ("deepseek-v2-lite.json", "yarn", None),
    ("qwen2-vl-7b.json", "computed", ((16, 24, 24), False)),
    ("qwen3-vl-8b.json", "computed", ((24, 20, 20), True)),
    ("gemma3-4b.json", "linear", None), ("mistral-nemo.json", "computed", None)])
def test_every_rope_type_the_reader_accepts(name, freqs, mrope):
    rope = RotaryEmbedding.from_config(HF / name)
    assert rope.freqs == freqs and rope.model == ropejit.model_from_hf_config(HF / name)
    if mrope:
        assert (rope.model.mrope_section, rope.model.mrope_interleaved) == mrope
    assert f"freqs={freqs}" in repr(rope)


def test_the_constructor_reads_its_arguments_with_the_same_reader():
    rope = RotaryEmbedding(64, rotary_dim=32, base=5e5, max_position_embeddings=1024,
                           style="gptj", scaling={"rope_type": "llama3", "factor": 8.0,
                                                  "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 256})
    m = rope.model
    assert (m.freqs, m.rotary_dim, m.head_dim, m.style, m.spec.style) == (
        "llama3", 32, 64, "gptj", "gptj")
    assert (m.scaling.factor, m.scaling.original_max_positions) == (8.0, 256)
    plain = RotaryEmbedding(64)
    assert (plain.rotary_dim, plain.base, plain.freqs, plain.style) == (64, 1e4, "computed", "neox")


@pytest.mark.parametrize("scaling, words", [
    ({"rope_type": "proportional"}, ['rope_scaling.rope_type ("proportional") is not a '
                                     'rope_type ropejit knows']),
    ({"rope_type": "yarn"}, ["rope_scaling.factor is missing"]),
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0],
      "original_max_position_embeddings": 64}, ["rope_scaling.short_factor ([1.0]) must be an "
                                                "array of rotary_dim / 2 (32) numbers"]),
])
def test_bad_configs_raise_the_readers_message(scaling, words):
    config = {"hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 128,
              "rope_scaling": scaling}
    for build in (lambda: RotaryEmbedding.from_config(config),
                  lambda: RotaryEmbedding(64, scaling=scaling, max_position_embeddings=128)):
        with pytest.raises(ropejit.InvalidArgument) as e:
            build()
        assert e.value.code == ropejit.ErrorCode.invalid_argument
        for word in words:
            assert word in str(e.value), str(e.value)


def test_bad_arguments():
    with pytest.raises(ropejit.InvalidArgument, match=r"rotary_dim \(33\)"):
        RotaryEmbedding(64, rotary_dim=33)
    with pytest.raises(ropejit.InvalidArgument, match=r"max_position_embeddings \(0\)"):
        RotaryEmbedding(64, max_position_embeddings=0)
    with pytest.raises(ropejit.InvalidArgument, match=r"style \('rot'\) must be 'neox' or 'gptj'"):
        RotaryEmbedding(64, style="rot")
    with pytest.raises(ropejit.InvalidArgument, match=r"head_dim \(None\) must be a positive int"):
        RotaryEmbedding()
    with pytest.raises(ropejit.InvalidArgument, match=r"model \('x'\) must be a ropejit.ModelRope"):
        RotaryEmbedding(model="x")
    rope = RotaryEmbedding(64)
    with pytest.raises(ropejit.InvalidArgument, match=r"layer_type \('chunked'\) must be one of"):
        rope(torch.zeros(1), torch.zeros(1, 4, dtype=torch.long), "chunked")
    with pytest.raises(ropejit.InvalidArgument, match=r"no mRoPE sections: position_ids must be "
                                                      r"\[batch, seq\], got shape \[3, 1, 4\]"):
        rope(torch.zeros(1), torch.zeros(3, 1, 4, dtype=torch.long))
    mla = RotaryEmbedding.from_config(HF / "deepseek-v2-lite.json")
    with pytest.raises(ropejit.InvalidArgument, match=r"last 64 elements of each head "
                                                      r"\(rotary_offset 128, DeepSeek MLA\)"):
        mla.apply(torch.zeros(1, 16, 4, 192))


# transformers configs for the comparisons: head_dim 64 (32 pairs), small, no weights.
def _llama(rope_scaling=None, rope_theta=5e4, max_positions=512):
    from transformers import LlamaConfig
    return LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                       max_position_embeddings=max_positions, rope_theta=rope_theta,
                       rope_scaling=rope_scaling)


LONG_FACTORS = dict(short_factor=[1.0 + 0.05 * i for i in range(32)],
                    long_factor=[1.0 + 0.5 * i for i in range(32)])


def _phi3():
    from transformers import Phi3Config
    return Phi3Config(hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=1024, original_max_position_embeddings=128,
                      rope_theta=1e4, rope_scaling=dict(type="longrope", **LONG_FACTORS))


def _qwen_vl(kind, interleaved):
    import transformers
    text = getattr(transformers, f"{kind}TextConfig")
    return text(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                max_position_embeddings=4096,
                rope_parameters=dict(rope_type="default", rope_theta=1e6, mrope_section=[8, 12, 12],
                                     mrope_interleaved=interleaved))


# name: (config, transformers' rotary module as modeling package and class, largest position)
HF_CASES = {
    "default": (lambda: _llama(), ("llama", "LlamaRotaryEmbedding"), 400),
    "linear": (lambda: _llama({"rope_type": "linear", "factor": 4.0}),
               ("llama", "LlamaRotaryEmbedding"), 400),
    # beyond max_position_embeddings (64): the base is rescaled for the call's length
    "dynamic": (lambda: _llama({"rope_type": "dynamic", "factor": 2.0}, max_positions=64),
                ("llama", "LlamaRotaryEmbedding"), 300),
    "llama3": (lambda: _llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                              rope_theta=5e5), ("llama", "LlamaRotaryEmbedding"), 400),
    "yarn": (lambda: _llama({"rope_type": "yarn", "factor": 4.0,
                             "original_max_position_embeddings": 128}),
             ("llama", "LlamaRotaryEmbedding"), 400),
    "yarn-mscale": (lambda: _llama({"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                                    "mscale_all_dim": 0.8, "beta_fast": 16,
                                    "original_max_position_embeddings": 128}),
                    ("llama", "LlamaRotaryEmbedding"), 400),
    "longrope-short": (_phi3, ("phi3", "Phi3RotaryEmbedding"), 100),  # max + 1 <= 128: short
    "longrope-long": (_phi3, ("phi3", "Phi3RotaryEmbedding"), 700),
    "mrope": (lambda: _qwen_vl("Qwen2VL", False), ("qwen2_vl", "Qwen2VLRotaryEmbedding"), 300),
    "mrope-interleaved": (lambda: _qwen_vl("Qwen3VL", True),
                          ("qwen3_vl", "Qwen3VLTextRotaryEmbedding"), 300),
}


def _positions(name, device, batch=2, seq=24):
    """[batch, seq] ids up to the case's largest position (mRoPE: [3, batch, seq], rows that
    differ, as an image's tokens have)."""
    top = HF_CASES[name][2]
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, top, (batch, seq), generator=g)
    ids[0, -1] = top - 1
    if name.startswith("mrope"):
        ids = torch.stack((ids, ids // 2, torch.randint(0, top, (batch, seq), generator=g)))
    return ids.to(device)


def _transformers_cos_sin(name, config, ids, layer_type=None):
    """transformers' own rotary module, built and called in float64."""
    import importlib
    package, cls = HF_CASES[name][1] if name in HF_CASES else name
    module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    x = torch.zeros(1, dtype=torch.float64)
    with ref.transformers_in_float64():
        rotary = getattr(module, cls)(config)
        args = (x, ids.cpu()) + ((layer_type,) if layer_type else ())
        cos, sin = rotary(*args)
    assert cos.dtype == torch.float64 and sin.dtype == torch.float64
    return cos, sin


def _needs(name):
    if not HAVE_TRANSFORMERS:
        pytest.skip("transformers is not installed")
    if name.startswith("mrope") and transformers_major() < 5:
        pytest.skip("the mRoPE rotary modules return composed [batch, seq, R] cos/sin from "
                    "transformers 5 on")


@pytest.mark.parametrize("name", list(HF_CASES))
def test_forward_matches_transformers_in_float64(backend, name):
    _needs(name)
    config = HF_CASES[name][0]()
    ids = _positions(name, backend.device)
    want_cos, want_sin = _transformers_cos_sin(name, config, ids)
    rope = RotaryEmbedding.from_config(config)
    x = torch.zeros(1, dtype=torch.float32, device=backend.device)
    cos, sin = rope(x, ids)
    backend.sync()
    assert cos.shape == want_cos.shape == ids.shape[-2:] + (64,) and cos.dtype == torch.float32
    # The kernel's cos/sin are within 2.5e-7 of float64 (times the attention factor), then
    # rounded to float32.
    bound = 2.5e-7 * max(1.0, want_cos.abs().max().item()) + 1.2e-7
    torch.testing.assert_close(cos.double().cpu(), want_cos, rtol=0, atol=bound)
    torch.testing.assert_close(sin.double().cpu(), want_sin, rtol=0, atol=bound)


@pytest.mark.parametrize("name", ["llama3", "yarn", "longrope-long", "dynamic", "mrope",
                                  "mrope-interleaved"])
def test_apply_matches_transformers_in_float64(backend, name):
    _needs(name)
    config = HF_CASES[name][0]()
    ids = _positions(name, backend.device)
    want_cos, want_sin = _transformers_cos_sin(name, config, ids)
    q = torch.randn(2, 2, 24, 64).to(backend.device)  # bhsd, as transformers' attention
    k = torch.randn(2, 1, 24, 64).to(backend.device)
    got_q, got_k = RotaryEmbedding.from_config(config).apply(q, k, ids)
    backend.sync()
    want_q, want_k = ref.hf(q.cpu(), k.cpu(), want_cos, want_sin)
    ref.assert_close(got_q, want_q)
    ref.assert_close(got_k, want_k)


def test_gemma3_layer_types_match_transformers(backend):
    _needs("gemma3")
    if transformers_major() < 5:
        pytest.skip("per-layer-type rope_parameters are transformers 5's")
    from transformers import Gemma3TextConfig
    config = Gemma3TextConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=64, max_position_embeddings=4096,
                              rope_parameters={"full_attention": dict(rope_type="linear",
                                                                      factor=8.0, rope_theta=1e6),
                                               "sliding_attention": dict(rope_type="default",
                                                                         rope_theta=1e4)})
    rope = RotaryEmbedding.from_config(config)
    assert (rope.freqs, rope.model.local_base) == ("linear", 1e4)
    ids = torch.randint(0, 3000, (1, 16)).to(backend.device)
    x = torch.zeros(1, device=backend.device)
    for layer_type in ("full_attention", "sliding_attention"):
        want_cos, want_sin = _transformers_cos_sin(("gemma3", "Gemma3RotaryEmbedding"), config,
                                                   ids, layer_type)
        cos, sin = rope(x, ids, layer_type)
        backend.sync()
        torch.testing.assert_close(cos.double().cpu(), want_cos, rtol=0, atol=4e-7)
        torch.testing.assert_close(sin.double().cpu(), want_sin, rtol=0, atol=4e-7)


def test_sequence_length_picks_the_frequencies(backend):
    # LongRoPE: positions below original_max_position_embeddings (128) take the short factors,
    # unless the call says the sequence is longer; dynamic NTK likewise rescales for seq_len.
    phi = RotaryEmbedding.from_config({"hidden_size": 128, "num_attention_heads": 2,
                                       "max_position_embeddings": 1024,
                                       "original_max_position_embeddings": 128,
                                       "rope_scaling": dict(type="longrope", **LONG_FACTORS)})
    ids = torch.arange(0, 40, dtype=torch.long)[None].to(backend.device)
    x = torch.zeros(1, device=backend.device)
    short, _ = phi(x, ids)
    long, _ = phi(x, ids, seq_len=129)
    backend.sync()
    for got, seq_len in ((short, 40), (long, 129)):
        want, _ = ref.scaled_cos_sin("longrope", 64, 1e4, phi.model.scaling, seq_len, ids[0])
        torch.testing.assert_close(got[0, :, :32].double().cpu(), want, rtol=0, atol=4e-7)
    q = torch.randn(1, 1, 40, 64).to(backend.device)
    got, _ = phi.apply(q, seq_len=129)  # offset positions 0..39, long factors
    backend.sync()
    c, s = ref.scaled_cos_sin("longrope", 64, 1e4, phi.model.scaling, 129, torch.arange(40))
    ref.assert_close(got, ref.rotate(q.cpu(), c, s, False))  # [40, 32] over bhsd's seq axis


def test_direct_apply(backend):
    rope = RotaryEmbedding(64, rotary_dim=32, max_position_embeddings=100).to(backend.device)
    q = torch.randn(2, 4, 6, 64).to(torch.bfloat16).to(backend.device)
    k = torch.randn(2, 1, 6, 64).to(torch.bfloat16).to(backend.device)
    ids = torch.randint(0, 100, (2, 6), device=backend.device)
    got_q, got_k = rope.apply(q, k, ids)
    backend.sync()
    c, s = ref.scaled_cos_sin("computed", 32, 1e4, None, 0, ids)
    ref.assert_close(got_q, ref.rotate(q.cpu(), c[:, None], s[:, None], False))
    ref.assert_close(got_k, ref.rotate(k.cpu(), c[:, None], s[:, None], False))


def test_one_launch_computes_cos_and_sin(backend):
    if backend.name != "emulated":
        pytest.skip("counts launches through the emulator")
    rope = RotaryEmbedding.from_config(HF / "llama3.1-8b.json")
    cos, sin = rope(torch.zeros(1, dtype=torch.bfloat16), torch.arange(8)[None])
    assert len(backend.launches) == 1 and cos.dtype == torch.bfloat16
    spec, args = backend.launches[0]
    assert (spec.freqs, args.base, args.scaling.factor) == (ropejit._capi.FREQS["llama3"], 5e5,
                                                            8.0)


def _example():
    path = ROOT / "examples" / "patch_llama.py"
    spec = importlib.util.spec_from_file_location("patch_llama", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["patch_llama"] = module
    spec.loader.exec_module(module)
    return module


@requires_transformers
@pytest.mark.parametrize("rope", ["default", "llama3", "yarn", "longrope", "dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_patched_llama_matches_the_unpatched_model(backend, dtype, rope):
    if backend.name == "emulated" and dtype == torch.bfloat16:
        pytest.skip("bf16 matmuls on the CPU are slow; the GPU runs this case")
    example = _example()
    # 40 tokens: beyond the trained lengths of the longrope (32) and dynamic (32) configs
    diff, scale, calls = example.compare(dtype, device=backend.device, tokens=40, rope=rope)
    assert calls == 2  # one per layer: ropejit did the rotation
    assert diff <= example.limit(dtype, scale), (diff, scale)
    assert not math.isnan(diff)


@pytest.mark.parametrize("kind", ["Qwen2VL", "Qwen3VL"])
def test_patched_mrope_text_models_match_the_unpatched_ones(backend, kind):
    # Image-like position rows (temporal, height, width differ) through the whole text model:
    # patch_hf_model swaps its rotary module (mRoPE sections from the config; Qwen3-VL's
    # interleaved) and apply_rotary_pos_emb.
    _needs("mrope")
    import importlib
    import transformers
    package = {"Qwen2VL": "qwen2_vl", "Qwen3VL": "qwen3_vl"}[kind]
    modeling = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    params = dict(rope_type="default", rope_theta=1e6, mrope_section=[4, 6, 6])
    if kind == "Qwen3VL":
        params["mrope_interleaved"] = True
    config = getattr(transformers, f"{kind}TextConfig")(
        vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        rope_parameters=params, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(0)
    model = getattr(modeling, f"{kind}TextModel")(config).to(backend.device).eval()
    ids = torch.randint(0, 256, (2, 12), device=backend.device)
    g = torch.Generator().manual_seed(1)
    pos = torch.stack((torch.arange(12).expand(2, 12), torch.randint(0, 30, (2, 12), generator=g),
                       torch.randint(0, 30, (2, 12), generator=g))).to(backend.device)
    with torch.no_grad():
        want = model(input_ids=ids, position_ids=pos).last_hidden_state
    original = modeling.apply_rotary_pos_emb
    try:
        assert ropejit.nn.patch_hf_model(model).rotary == ["rotary_emb"]
        assert model.rotary_emb.model.mrope_interleaved == (kind == "Qwen3VL")
        with torch.no_grad():
            got = model(input_ids=ids, position_ids=pos).last_hidden_state
    finally:
        modeling.apply_rotary_pos_emb = original
    backend.sync()
    assert (got - want).abs().max().item() <= 1e-4 * max(want.abs().max().item(), 1.0)
