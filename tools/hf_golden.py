#!/usr/bin/env python3
"""Golden RoPE frequencies for tests/data/hf/*.json, computed by the transformers library itself.

Each config is loaded with transformers' own config classes (AutoConfig: their field names,
legacy names and defaults), and the model's own rotary-embedding module (or, for the lengths that
pick dynamic and longrope frequencies, transformers' rope init function) gives the inverse
frequencies and the attention factor. transformers writes float32 explicitly; this script makes
float64 the default and rebinds torch's float32 names to float64 first, so the same code runs in
float64, and checks that every tensor it reads is float64. Output: tests/data/hf_golden.json (read by
tests/test_scaling.cpp). Not run by the build or CI:

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install torch transformers
    /tmp/hf/bin/python tools/hf_golden.py tests/data/hf tests/data/hf_golden.json
"""
import glob
import importlib
import inspect
import json
import math
import os
import sys

import torch

torch.set_default_dtype(torch.float64)
torch.float = torch.float64
torch.float32 = torch.float64
torch.Tensor.float = lambda self, *args, **kwargs: self.double()

import transformers  # noqa: E402  (after the rebinding, so its modules see float64)
from transformers import AutoConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

# model_type -> the transformers package holding its modeling code
PACKAGES = {"qwen3_vl_text": "qwen3_vl", "gemma3_text": "gemma3", "qwen2_vl_text": "qwen2_vl",
            "qwen2_5_vl_text": "qwen2_5_vl"}


def as_list(t):
    assert t.dtype == torch.float64, t.dtype
    return [float(v) for v in t.tolist()]


def rotary_module(config):
    package = PACKAGES.get(config.model_type, config.model_type)
    module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    for name, cls in inspect.getmembers(module, inspect.isclass):
        if name.endswith("RotaryEmbedding") and "Vision" not in name and cls.__module__ == module.__name__:
            return cls(config=config)
    return None


def gptj_inverse_frequencies(config):
    # GPT-J has no rotary module: it tabulates sin|cos rows; position 1's row holds the angles.
    module = importlib.import_module("transformers.models.gptj.modeling_gptj")
    row = module.create_sinusoidal_positions(2, config.rotary_dim)[1]
    half = config.rotary_dim // 2
    return [math.atan2(s, c) for s, c in zip(as_list(row[:half]), as_list(row[half:]))]


def cases_for(config, params, layer_type=None):
    rope_type = params["rope_type"]
    kwargs = {"layer_type": layer_type} if layer_type else {}
    if rope_type == "dynamic":
        n = config.max_position_embeddings
        lengths = [None, n, n + 1, 2 * n, 3 * n + 17]
    elif rope_type == "longrope":
        n = params["original_max_position_embeddings"]
        lengths = [None, n, n + 1, config.max_position_embeddings]
    else:
        return None
    out = []
    for seq_len in lengths:
        inv, factor = ROPE_INIT_FUNCTIONS[rope_type](config, None, seq_len=seq_len, **kwargs)
        out.append({"seq_len": seq_len, "inv_freq": as_list(inv), "attention_factor": float(factor)})
    return out


def golden(path):
    raw = json.load(open(path))
    config = AutoConfig.for_model(**raw).get_text_config()
    entry = {
        "file": os.path.basename(path),
        "transformers": transformers.__version__,
        "model_type": config.model_type,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
        "max_position_embeddings": config.max_position_embeddings,
        "head_dim": getattr(config, "head_dim", None)
        or config.hidden_size // config.num_attention_heads,
        "layers": [],
    }
    if config.model_type == "gptj":
        inv = gptj_inverse_frequencies(config)
        entry["layers"].append({"layer": "all", "rope_type": "default", "rope_theta": 10000.0,
                                "cases": [{"seq_len": None, "inv_freq": inv, "attention_factor": 1.0}]})
        return entry
    params = config.rope_parameters
    rotary = rotary_module(config)
    layer_types = [k for k in ("full_attention", "sliding_attention") if k in params]
    for layer in layer_types or [None]:
        p = params[layer] if layer else params
        prefix = f"{layer}_" if layer else ""
        inv = getattr(rotary, f"{prefix}inv_freq")
        factor = getattr(rotary, f"{prefix}attention_scaling") if layer else rotary.attention_scaling
        cases = cases_for(config, p, layer) or [
            {"seq_len": None, "inv_freq": as_list(inv), "attention_factor": float(factor)}]
        entry["layers"].append({"layer": layer or "all", "rope_type": p["rope_type"],
                                "rope_theta": float(p["rope_theta"]), "cases": cases})
    return entry


def main():
    source, out = sys.argv[1], sys.argv[2]
    entries = [golden(p) for p in sorted(glob.glob(os.path.join(source, "*.json")))]
    note = ("Generated by tools/hf_golden.py from the configs beside it: transformers' own config "
            "classes and rotary modules, run in float64. Do not edit by hand.")
    with open(out, "w") as f:
        json.dump({"note": note, "models": entries}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(entries)} models to {out}")


if __name__ == "__main__":
    main()
