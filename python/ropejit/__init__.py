"""ropejit: Rotary Position Embedding kernels generated at run time (NVRTC + CUDA Driver API).

    import ropejit
    ropejit.apply(q, k, cos=cos, sin=sin, position_ids=ids)   # any CUDA tensors, in place
    model = ropejit.model_from_hf_config("config.json")       # ropejit's own config reader

PyTorch users: ropejit.ops (torch.library ops with autograd, torch.compile and CUDA graphs),
ropejit.dropin (the Hugging Face, flash-attn, vLLM, FlashInfer (MLA), TransformerEngine and Liger functions),
ropejit.nn.RotaryEmbedding. Serving steps: ropejit.fused (QK-norm, RoPE, FP8 and the KV-cache
append in one launch), ropejit.decode (RMSNorm -> QKV projection -> RoPE, the FFN's gate/up).
Importing needs no GPU: the driver is loaded on the first launch."""

from ropejit import _capi
from ropejit._apply import apply
from ropejit._library import (CacheCounts, Info, Spec, cache_counts, command_path, info, key,
                              precompile)
from ropejit._model import (ModelRope, Scaling, attention_factor, inverse_frequencies,
                            model_from_hf_config, model_from_hf_config_text)
from ropejit.errors import (CompileError, DriverError, Error, ErrorCode, InternalError,
                            InvalidArgument, NoDriverError)

__version__ = _capi.version()

# Subpackages load on first use (ropejit.ops, ropejit.nn, ...): `import ropejit` stays free of
# torch's import cost, and `ropejit.nn.patch_hf_model(...)` needs no import of its own.
_SUBMODULES = ("ops", "nn", "fused", "decode", "dropin", "mla")


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"ropejit.{name}")
    raise AttributeError(f"module 'ropejit' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))

__all__ = ["apply", "key", "precompile", "info", "Info", "cache_counts", "CacheCounts", "Spec",
           "Scaling", "ModelRope", "model_from_hf_config", "model_from_hf_config_text",
           "inverse_frequencies", "attention_factor", "command_path", "Error",
           "ErrorCode", "InvalidArgument", "CompileError", "NoDriverError", "DriverError",
           "InternalError", "__version__"]
