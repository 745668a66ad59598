"""patch_hf_model(model, fuse="all") on transformers Llama models with random weights, judged
against the same weights in float32: the patched bf16 model's logits are at least as close to
the float32 model's as the unpatched bf16 model's (relative L2 and argmax agreement), greedy
generation runs in eager and under torch.compile with a static cache, and no weight is held
twice."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from conftest import requires_cuda  # noqa: E402

import ropejit  # noqa: E402


def _config(rope):
    from transformers import LlamaConfig
    scaling = None
    if rope == "llama3":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    config = LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1536,
                         num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=64, max_position_embeddings=2048, rope_theta=500000.0,
                         rms_norm_eps=1e-5, rope_scaling=scaling, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    return config


def _models(config):
    """The float32 model and a bf16 copy of its weights, built as from_pretrained builds one:
    the rotary module's inv_freq stays float32 (model.to(bf16) would round it)."""
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    fp32 = LlamaForCausalLM(config).cuda().eval()
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    bf16.model.rotary_emb.inv_freq = fp32.model.rotary_emb.inv_freq.clone()
    bf16.model.rotary_emb.original_inv_freq = fp32.model.rotary_emb.original_inv_freq.clone()
    assert bf16.model.rotary_emb.inv_freq.dtype == torch.float32
    return fp32, bf16


def _rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@requires_cuda
@pytest.mark.parametrize("rope", ["default", "llama3"])
def test_the_fused_model_is_at_least_as_close_to_float32_as_transformers(rope, monkeypatch):
    from transformers.models.llama import modeling_llama
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb",
                        modeling_llama.apply_rotary_pos_emb)  # restored after the test
    config = _config(rope)
    fp32, bf16 = _models(config)
    ids = torch.randint(0, config.vocab_size, (2, 300), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        want = fp32(ids).logits
        plain = bf16(ids).logits
    fused = copy.deepcopy(bf16)
    report = ropejit.nn.patch_hf_model(fused, fuse="all")
    assert report.layers == [f"model.layers.{i}" for i in range(3)] and not report.not_fused
    layer = fused.model.layers[0]
    qkv = layer._ropejit["qkv"]
    assert layer.self_attn.k_proj.weight.data_ptr() == qkv.data_ptr() + 512 * 512 * 2
    with torch.no_grad():
        got = fused(ids).logits
    err_plain, err_fused = _rel_l2(plain, want), _rel_l2(got, want)
    agree_plain = (plain.argmax(-1) == want.argmax(-1)).float().mean().item()
    agree_fused = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    print(f"{rope}: rel L2 to float32 transformers bf16 {err_plain:.4e}, fused {err_fused:.4e}; "
          f"argmax agreement {agree_plain:.4f}, {agree_fused:.4f}")
    assert err_fused <= err_plain * 1.02
    assert agree_fused >= agree_plain - 0.01

    # Greedy generation, eager and compiled with a static cache; the decode steps take the
    # fused kernels (one token per sequence).
    prompt = ids[:, :16]
    with torch.no_grad():
        eager = fused.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        compiled = fused.generate(prompt, max_new_tokens=8, min_new_tokens=8, do_sample=False,
                                  cache_implementation="static")
    assert eager.shape == compiled.shape == (2, 24)
    # bf16 ties can flip a greedy token between two valid implementations; most must agree.
    assert (eager[:, 16:] == compiled[:, 16:]).float().mean().item() >= 0.75


@requires_cuda
def test_layers_that_cannot_be_fused_are_named_and_keep_transformers_forward(monkeypatch):
    from transformers.models.llama import modeling_llama
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb",
                        modeling_llama.apply_rotary_pos_emb)
    config = _config("default")
    config.attention_bias = True
    _, bf16 = _models(config)
    report = ropejit.nn.patch_hf_model(bf16, fuse="all")
    assert report.layers == []
    assert report.not_fused["model.layers.0"] == \
        "its q_proj has a bias (the fused projection takes none)"
    assert "forward" not in vars(bf16.model.layers[0])
    with pytest.raises(ropejit.InvalidArgument, match=r"fuse \('everything'\) must be"):
        ropejit.nn.patch_hf_model(bf16, fuse="everything")
