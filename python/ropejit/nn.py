"""RotaryEmbedding, a torch.nn.Module holding a model's cos/sin tables (built once in float64)
and applying them with ropejit; built from arguments or from a Hugging Face config, and able to
stand in for a transformers model's rotary module (patch_hf_model)."""

import sys

import torch

from ropejit import ops
from ropejit.dropin import hf
from ropejit.errors import InvalidArgument


def _rope_type(scaling):
    if not scaling:
        return "default"
    return scaling.get("rope_type") or scaling.get("type") or "default"


class RotaryEmbedding(torch.nn.Module):
    """RoPE with rotary_dim frequencies base^(-2i/rotary_dim) over positions
    [0, max_position_embeddings).

    forward(x, position_ids) -> (cos, sin) is transformers' rotary-module interface ([batch,
    seq, rotary_dim] in x's dtype), so the module can replace a model's `rotary_emb`, paired
    with ropejit.dropin.hf.apply_rotary_pos_emb (patch_hf_model does both). apply(q, k,
    position_ids) is the direct path: one launch reading the fp32 tables by position id, no
    gathered cos/sin tensors.

    `scaling` is the config's rope_scaling / rope_parameters dict. Only rope_type 'default' is
    supported until the C API's scaled frequencies (linear, dynamic, llama3, yarn, longrope)
    have kernels: other types raise NotImplementedError."""

    def __init__(self, head_dim, rotary_dim=None, base=10000.0, max_position_embeddings=2048,
                 style="neox", scaling=None, device=None):
        super().__init__()
        rope_type = _rope_type(scaling)
        if rope_type != "default":
            raise NotImplementedError(
                f"ropejit: rope_type {rope_type!r} needs scaled frequencies, which ropejit's C "
                f"API declares but has no kernels for yet; only 'default' is supported")
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_dim:
            raise InvalidArgument(f"ropejit: rotary_dim ({rotary_dim}) must be even and in "
                                  f"[2, head_dim ({head_dim})]")
        if max_position_embeddings <= 0:
            raise InvalidArgument(f"ropejit: max_position_embeddings ({max_position_embeddings}) "
                                  f"must be positive")
        self.head_dim, self.rotary_dim, self.base = head_dim, rotary_dim, float(base)
        self.max_position_embeddings, self.style = max_position_embeddings, style
        # float64 angles, rounded once to fp32: HF's fp32 angles lose ~1e-3 rad by position 2^15.
        pairs = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device)
        inv_freq = self.base ** (-pairs / rotary_dim)
        angles = torch.arange(max_position_embeddings, dtype=torch.float64,
                              device=device)[:, None] * inv_freq
        self.register_buffer("cos_table", angles.cos().float(), persistent=False)
        self.register_buffer("sin_table", angles.sin().float(), persistent=False)

    @classmethod
    def from_config(cls, config, device=None):
        """From a transformers config: rope_parameters (transformers 5) or rope_theta,
        rope_scaling and partial_rotary_factor (4.x); head_dim, else hidden_size /
        num_attention_heads."""
        params = dict(getattr(config, "rope_parameters", None) or {})
        scaling = params or dict(getattr(config, "rope_scaling", None) or {})
        base = params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        partial = params.get("partial_rotary_factor",
                             getattr(config, "partial_rotary_factor", None) or 1.0)
        head_dim = getattr(config, "head_dim", None) or (config.hidden_size //
                                                         config.num_attention_heads)
        return cls(head_dim, rotary_dim=int(head_dim * partial), base=base,
                   max_position_embeddings=config.max_position_embeddings, scaling=scaling,
                   device=device)

    def extra_repr(self):
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"max_position_embeddings={self.max_position_embeddings}, style={self.style}")

    @torch.no_grad()
    def forward(self, x, position_ids):
        """(cos, sin) at position_ids ([batch, seq]): [batch, seq, rotary_dim] in x's dtype,
        each frequency twice ([f, f]), as transformers' rotary modules return them."""
        cos = self.cos_table[position_ids]
        sin = self.sin_table[position_ids]
        return (torch.cat((cos, cos), dim=-1).to(x.dtype),
                torch.cat((sin, sin), dim=-1).to(x.dtype))

    def apply(self, q, k=None, position_ids=None, *, layout="bhsd", position_offset=0):
        """Rotated (q, k) as new tensors (differentiable): positions from position_ids
        (int32/int64, one per token; [batch, seq] is fine), else index + position_offset."""
        ids = None if position_ids is None else position_ids.reshape(-1)
        return ops.rope(q, k, cos=self.cos_table, sin=self.sin_table, layout=layout,
                        style=self.style, rotary_dim=self.rotary_dim, position_ids=ids,
                        position_offset=position_offset)


def patch_hf_model(model):
    """Makes a transformers model use ropejit: every `rotary_emb` submodule becomes a
    RotaryEmbedding from the model's config, and its modeling module's apply_rotary_pos_emb
    becomes ropejit.dropin.hf.apply_rotary_pos_emb. The function is patched in that module,
    so it applies to every model of the class. Returns the names of the replaced modules."""
    config = model.config
    config = getattr(config, "get_text_config", lambda: config)()
    replaced = []
    for name, module in list(model.named_modules()):
        child = getattr(module, "rotary_emb", None)
        if isinstance(child, torch.nn.Module) and not isinstance(child, RotaryEmbedding):
            buffer = next(iter(child.buffers()), None)
            device = buffer.device if buffer is not None else None
            setattr(module, "rotary_emb", RotaryEmbedding.from_config(config, device=device))
            replaced.append(f"{name}.rotary_emb" if name else "rotary_emb")
    modeling = sys.modules[type(model).__module__]
    if not hasattr(modeling, "apply_rotary_pos_emb"):
        raise InvalidArgument(f"ropejit: {modeling.__name__} has no apply_rotary_pos_emb to "
                              f"replace")
    modeling.apply_rotary_pos_emb = hf.apply_rotary_pos_emb
    return replaced
