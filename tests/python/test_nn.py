"""ropejit.nn.RotaryEmbedding: from Hugging Face configs (4.x and 5.x shapes), the scaling
hook, its tables against transformers' rotary module, the direct apply path, and a patched
randomly initialized Llama against the unpatched one (examples/patch_llama.py)."""

import importlib.util
import sys
import types

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import references as ref  # noqa: E402
from conftest import ROOT  # noqa: E402

import ropejit  # noqa: E402
from ropejit.nn import RotaryEmbedding  # noqa: E402

HAVE_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
requires_transformers = pytest.mark.skipif(not HAVE_TRANSFORMERS,
                                           reason="transformers is not installed")


def test_from_a_4x_style_config():
    config = types.SimpleNamespace(hidden_size=256, num_attention_heads=4, rope_theta=1e6,
                                   partial_rotary_factor=0.5, max_position_embeddings=128,
                                   rope_scaling=None)
    rope = RotaryEmbedding.from_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.base) == (64, 32, 1e6)
    assert rope.cos_table.shape == (128, 16) and rope.cos_table.dtype == torch.float32


def test_from_a_5x_style_config():
    config = types.SimpleNamespace(hidden_size=256, num_attention_heads=4, head_dim=80,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5e5},
                                   max_position_embeddings=64)
    rope = RotaryEmbedding.from_config(config)
    assert (rope.head_dim, rope.rotary_dim, rope.base) == (80, 80, 5e5)


@pytest.mark.parametrize("scaling", [{"rope_type": "llama3", "factor": 8.0},
                                     {"type": "linear", "factor": 2.0},
                                     {"rope_type": "yarn", "factor": 4.0}])
def test_scaled_rope_types_are_not_implemented_yet(scaling):
    name = scaling.get("rope_type") or scaling["type"]
    with pytest.raises(NotImplementedError, match=f"rope_type '{name}'"):
        RotaryEmbedding(64, scaling=scaling)
    config = types.SimpleNamespace(hidden_size=256, num_attention_heads=4,
                                   max_position_embeddings=64, rope_scaling=scaling)
    with pytest.raises(NotImplementedError):
        RotaryEmbedding.from_config(config)


def test_bad_arguments():
    with pytest.raises(ropejit.InvalidArgument, match=r"rotary_dim \(33\)"):
        RotaryEmbedding(64, rotary_dim=33)
    with pytest.raises(ropejit.InvalidArgument, match=r"max_position_embeddings \(0\)"):
        RotaryEmbedding(64, max_position_embeddings=0)


def test_tables_are_float64_exact():
    rope = RotaryEmbedding(64, base=10000.0, max_position_embeddings=4096)
    pos = torch.arange(4096, dtype=torch.float64)[:, None]
    angles = pos * 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert torch.equal(rope.cos_table, angles.cos().float())
    assert torch.equal(rope.sin_table, angles.sin().float())


@requires_transformers
def test_forward_matches_transformers_rotary_module():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=512,
                         rope_theta=50000.0)
    ids = torch.arange(300)[None].expand(2, 300)
    x = torch.zeros(1, dtype=torch.float32)
    want_cos, want_sin = LlamaRotaryEmbedding(config)(x, ids)
    got_cos, got_sin = RotaryEmbedding.from_config(config)(x, ids)
    assert got_cos.shape == want_cos.shape == (2, 300, 64)
    # transformers' fp32 angles are off by up to ~3e-5 rad at position 300; the tables are not.
    torch.testing.assert_close(got_cos, want_cos, rtol=0, atol=1e-4)
    torch.testing.assert_close(got_sin, want_sin, rtol=0, atol=1e-4)


def test_direct_apply(backend):
    rope = RotaryEmbedding(64, rotary_dim=32, max_position_embeddings=100).to(backend.device)
    q = torch.randn(2, 4, 6, 64).to(torch.bfloat16).to(backend.device)
    k = torch.randn(2, 1, 6, 64).to(torch.bfloat16).to(backend.device)
    ids = torch.randint(0, 100, (2, 6), device=backend.device)
    got_q, got_k = rope.apply(q, k, ids)
    backend.sync()
    c = rope.cos_table.cpu()[ids.cpu()][:, None]
    s = rope.sin_table.cpu()[ids.cpu()][:, None]
    ref.assert_close(got_q, ref.rotate(q.cpu(), c, s, False))
    ref.assert_close(got_k, ref.rotate(k.cpu(), c, s, False))


def _example():
    path = ROOT / "examples" / "patch_llama.py"
    spec = importlib.util.spec_from_file_location("patch_llama", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["patch_llama"] = module
    spec.loader.exec_module(module)
    return module


@requires_transformers
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_patched_llama_matches_the_unpatched_model(backend, dtype):
    if backend.name == "emulated" and dtype == torch.bfloat16:
        pytest.skip("bf16 matmuls on the CPU are slow; the GPU runs this case")
    diff, scale, calls = _example().compare(dtype, device=backend.device, tokens=24)
    assert calls == 2  # one per layer: ropejit did the rotation
    limit = {torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype] * max(scale, 1.0)
    assert diff <= limit, (diff, scale)
