"""patch_hf_model(model, fuse="all") on transformers Llama, Qwen2 (q/k/v biases) and Qwen3 (QK-norm)
models with random weights,
judged against the same weights in float32: the patched bf16 model's logits and static-cache
contents are at least as close to the float32 model's as the unpatched bf16 model's (relative L2
and argmax agreement), greedy generation runs in eager and under torch.compile with a static
cache, and no weight is held twice."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

from conftest import requires_cuda  # noqa: E402

import ropejit  # noqa: E402


def _config(rope):
    """A small random config: Llama with the default or llama3 RoPE, Qwen2 (q/k/v biases) or
    Qwen3 (QK-norm)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    scaling = None
    if rope == "llama3":
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
    shapes = dict(vocab_size=512, hidden_size=512, intermediate_size=1536, num_hidden_layers=3,
                  num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                  max_position_embeddings=2048, tie_word_embeddings=False)
    if rope == "qwen3":
        config = Qwen3Config(rope_theta=1000000.0, rms_norm_eps=1e-6, **shapes)
    elif rope == "qwen2":
        config = Qwen2Config(rope_theta=1000000.0, rms_norm_eps=1e-6, **shapes)
    else:
        config = LlamaConfig(rope_theta=500000.0, rms_norm_eps=1e-5, rope_scaling=scaling,
                             **shapes)
    config._attn_implementation = "sdpa"
    return config


def _keep_apply_rotary(monkeypatch, config):
    """patch_hf_model replaces the modeling module's apply_rotary_pos_emb: restored after the
    test."""
    import importlib
    module = importlib.import_module(f"transformers.models.{config.model_type}.modeling_"
                                     f"{config.model_type}")
    monkeypatch.setattr(module, "apply_rotary_pos_emb", module.apply_rotary_pos_emb)


def _models(config):
    """The float32 model and a bf16 copy of its weights, built as from_pretrained builds one:
    the rotary module's inv_freq stays float32 (model.to(bf16) would round it)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    fp32 = AutoModelForCausalLM.from_config(config).cuda().eval()
    with torch.no_grad():  # transformers starts biases at zero: make Qwen2's count
        for module in fp32.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, 0.5)
    bf16 = copy.deepcopy(fp32).to(torch.bfloat16)
    bf16.model.rotary_emb.inv_freq = fp32.model.rotary_emb.inv_freq.clone()
    bf16.model.rotary_emb.original_inv_freq = fp32.model.rotary_emb.original_inv_freq.clone()
    assert bf16.model.rotary_emb.inv_freq.dtype == torch.float32
    return fp32, bf16


def _rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@requires_cuda
@pytest.mark.long
@pytest.mark.parametrize("rope", ["default", "llama3", "qwen2", "qwen3"])
def test_the_fused_model_is_at_least_as_close_to_float32_as_transformers(rope, monkeypatch):
    config = _config(rope)
    _keep_apply_rotary(monkeypatch, config)
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
    if rope == "qwen2":  # the biases packed the same way, one copy
        bias = layer._ropejit["qkv_bias"]
        assert layer.self_attn.v_proj.bias.data_ptr() == bias.data_ptr() + (512 + 128) * 2
        assert float(bias.abs().max()) > 0.5
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
    config = _config("default")
    _keep_apply_rotary(monkeypatch, config)
    config.mlp_bias = True
    _, bf16 = _models(config)
    for layer in bf16.model.layers[1:]:
        layer.mlp.gate_proj.bias = layer.mlp.up_proj.bias = None
    bf16.model.layers[1].self_attn.k_proj.bias = torch.nn.Parameter(
        torch.zeros(128, dtype=torch.bfloat16, device="cuda"))
    report = ropejit.nn.patch_hf_model(bf16, fuse="all")
    assert report.layers == ["model.layers.2"]
    assert report.not_fused["model.layers.0"] == \
        "its gate_proj has a bias (the fused gate/up takes none)"
    assert report.not_fused["model.layers.1"] == \
        "its biases are on k_proj only (the fused projection takes q_proj, k_proj and v_proj " \
        "biases together)"
    assert "forward" not in vars(bf16.model.layers[0])
    with pytest.raises(ropejit.InvalidArgument, match=r"fuse \('everything'\) must be"):
        ropejit.nn.patch_hf_model(bf16, fuse="everything")


@requires_cuda
@pytest.mark.long
@pytest.mark.parametrize("kind", ["static", "dynamic"])
@pytest.mark.parametrize("rope", ["llama3", "qwen2", "qwen3"])
def test_the_cache_holds_what_transformers_writes(rope, kind, monkeypatch):
    """A StaticCache or DynamicCache filled by the patched model (prefill through update(),
    decode steps appended by the projection itself, then a 3-token chunk: appended too into a
    StaticCache, through update() into a DynamicCache) holds k and v at least as close to the
    float32 model's as the unpatched bf16 model's cache, at the same rows and the same length
    (a StaticCache: zeros beyond). The DynamicCache's room is made 2 rows, so the decode steps
    outgrow it twice."""
    from ropejit import _hf_patch
    from transformers import DynamicCache, StaticCache
    monkeypatch.setattr(_hf_patch, "_ROOM_ROWS", 2)
    config = _config(rope)
    _keep_apply_rotary(monkeypatch, config)
    fp32, bf16 = _models(config)
    fused = copy.deepcopy(bf16)
    ropejit.nn.patch_hf_model(fused, fuse="all")
    ids = torch.randint(0, config.vocab_size, (2, 32), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(2))
    caches = []
    for model in (fp32, bf16, fused):
        cache = StaticCache(config=config, max_cache_len=48) if kind == "static" else \
            DynamicCache(config=config)
        with torch.no_grad():
            model(ids[:, :24], past_key_values=cache, use_cache=True)
            for t in range(24, 29):  # one token per sequence: the fused kernel's append
                model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            model(ids[:, 29:32], past_key_values=cache, use_cache=True)  # a chunk: cu_seqlens
        caches.append(cache)
    torch.cuda.synchronize()
    want, plain, got = caches
    for i in range(config.num_hidden_layers):
        assert got.get_seq_length(i) == plain.get_seq_length(i) == 32
        for name in ("keys", "values"):
            w, p, g = (getattr(c.layers[i], name) for c in caches)
            assert g.shape == p.shape == (2, 2, 48 if kind == "static" else 32, 64)
            if kind == "static":
                assert torch.all(g[:, :, 32:] == 0), f"layer {i} {name}: a row past the length"
            err_plain, err_fused = _rel_l2(p[:, :, :32], w[:, :, :32]), \
                _rel_l2(g[:, :, :32], w[:, :, :32])
            assert err_fused <= err_plain * 1.05 + 1e-4, (i, name, err_plain, err_fused)


@requires_cuda
def test_the_eager_step_repeats_its_plan_only_while_its_addresses_hold(monkeypatch):
    """Decode steps outside a trace repeat the layer's previous plan: the same logits as a fresh
    plan, and a norm weight replaced by a new tensor (a new address) is read, not the old one."""
    config = _config("llama3")
    _keep_apply_rotary(monkeypatch, config)
    _, bf16 = _models(config)
    ropejit.nn.patch_hf_model(bf16, fuse="all")
    ids = torch.randint(0, config.vocab_size, (2, 9), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(3))
    layer = bf16.model.layers[1]

    def last_step():
        from transformers import DynamicCache
        cache = DynamicCache(config=config)
        with torch.no_grad():
            bf16(ids[:, :8], past_key_values=cache, use_cache=True)
            return bf16(ids[:, 8:], past_key_values=cache, use_cache=True).logits

    first = last_step()  # makes the plans
    assert layer._ropejit["qkv_plan"] is not None and layer._ropejit["ffn_plan"] is not None
    assert torch.equal(last_step(), first)  # repeated plans: the same bits
    for norm in (layer.input_layernorm, layer.post_attention_layernorm):
        norm.weight = torch.nn.Parameter(norm.weight.detach() * 2)
    scaled = last_step()
    layer._ropejit["qkv_plan"] = layer._ropejit["ffn_plan"] = None
    assert torch.equal(scaled, last_step())  # the same as fresh plans with the new weights
    assert not torch.equal(scaled, first)


@requires_cuda
def test_the_deferred_stop_check_returns_the_same_tokens(monkeypatch):
    """patch_hf_model(fuse="all") defers generate()'s stop check on CUDA: an eos-stopped greedy
    generation returns the same tokens as without, after one extra (undone) step; off, no
    extra step."""
    from ropejit import _hf_patch
    config = _config("default")
    _keep_apply_rotary(monkeypatch, config)
    _, bf16 = _models(config)
    report = ropejit.nn.patch_hf_model(bf16, fuse="all")
    assert report.deferred_stop and bf16.generate.__func__ is _hf_patch._deferred_generate
    prompt = torch.randint(0, config.vocab_size, (1, 12), device="cuda",
                           generator=torch.Generator("cuda").manual_seed(4))
    forwards = []
    never = torch.zeros(1, dtype=torch.bool, device="cuda")

    def steps(input_ids, scores, **_):  # a stopping criterion: called once per decode step
        forwards.append(1)
        return never

    from transformers import StoppingCriteriaList
    kwargs = dict(do_sample=False, pad_token_id=0, max_new_tokens=10,
                  stopping_criteria=StoppingCriteriaList([steps]))
    with torch.no_grad():
        free = bf16.generate(prompt, min_new_tokens=10, **kwargs)
        eos = int(free[0, 12 + 4])  # stop at the fifth new token
        if eos in free[0, 12:16].tolist():
            pytest.skip("the greedy tokens repeat before the fifth; no clean eos to test")
        results = {}
        for static in (False, True):
            for on in (True, False):
                ropejit.nn.defer_stop(bf16, on)
                forwards.clear()
                out = bf16.generate(prompt, eos_token_id=eos,
                                    cache_implementation="static" if static else None, **kwargs)
                results[static, on] = (out, len(forwards))
    for static in (False, True):
        (deferred, n_deferred), (synced, n_synced) = results[static, True], results[static, False]
        assert torch.equal(deferred, synced) and deferred.shape[1] == 12 + 5
        assert n_deferred == n_synced + 1 == 6, (static, n_deferred, n_synced)
    assert "generate" not in vars(bf16)  # defer_stop(model, False) restores the class's


def test_the_deferred_generate_belongs_to_its_model():
    """defer_stop(model) binds generate() to the model itself: a deepcopy defers (and runs) its
    own generate(), and turning it off restores the class's. Runs on the CPU too (where
    transformers itself decides whether to defer)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from ropejit import _hf_patch
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, max_position_embeddings=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    prompt = torch.randint(0, 64, (1, 5), generator=torch.Generator().manual_seed(5))
    kwargs = dict(do_sample=False, max_new_tokens=4, min_new_tokens=4, pad_token_id=0)
    with torch.no_grad():
        plain = model.generate(prompt, **kwargs)
        assert ropejit.nn.defer_stop(model, True)
        assert model.generate.__func__ is _hf_patch._deferred_generate
        twin = copy.deepcopy(model)
        assert twin.generate.__self__ is twin and model.generate.__self__ is model
        torch.nn.init.zeros_(twin.lm_head.weight)  # the twin's tokens are all 0
        assert torch.equal(model.generate(prompt, **kwargs), plain)
        assert torch.equal(twin.generate(prompt, **kwargs)[:, 5:], torch.zeros(1, 4).long())
    ropejit.nn.defer_stop(model, False)
    assert "generate" not in vars(model) and "generate" in vars(twin)
