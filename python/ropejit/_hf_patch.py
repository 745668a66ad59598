"""A transformers decoder layer run through ropejit's decode block (ropejit.nn.patch_hf_model with
fuse="all"): per layer, input RMSNorm -> packed QKV projection -> RoPE in one op, the cache
update and attention as transformers does them, o_proj, then the residual add, RMSNorm and
gate/up -> SiLU * up in one op, and down_proj. The q/k/v and gate/up weights are packed once at
patch time and the model's Linear weights re-pointed into the packed tensors, so no weight is
held twice."""

import sys
import types

import torch

from ropejit import ops
from ropejit.errors import InvalidArgument

# Decoder layers whose dataflow is Llama's (transformers' LlamaDecoderLayer and the classes that
# copy it: Mistral's, Qwen2's without biases, ...), by the attributes the patched forward reads.
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP_PARTS = ("gate_proj", "up_proj", "down_proj")


def _why_not(layer):
    """Why `layer` cannot run the fused forward ("" when it can)."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None:
        return "it has no self_attn and mlp"
    for owner, parts in ((attn, _ATTN_PARTS), (mlp, _MLP_PARTS)):
        for part in parts:
            linear = getattr(owner, part, None)
            if not isinstance(linear, torch.nn.Linear):
                return f"its {part} is not a torch.nn.Linear"
            if linear.bias is not None and part != "o_proj" and part != "down_proj":
                return f"its {part} has a bias (the fused projection takes none)"
    for norm in ("input_layernorm", "post_attention_layernorm"):
        module = getattr(layer, norm, None)
        if module is None or getattr(module, "weight", None) is None or not hasattr(
                module, "variance_epsilon"):
            return f"its {norm} is not an RMSNorm with a weight and variance_epsilon"
        if type(module).__name__.startswith("Gemma"):
            return f"its {norm} scales by (1 + w) around other pre/post norms (Gemma)"
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return "its attention normalizes q and k per head (QK-norm, Qwen3): not fused yet"
    act = getattr(mlp, "act_fn", None)
    if type(act).__name__ not in ("SiLU", "SiLUActivation"):
        return f"its MLP activation is {type(act).__name__}, not SiLU"
    if getattr(attn, "sliding_window", None):
        return "its attention has a sliding window"
    return ""


def _pack(linears):
    """One tensor holding the Linear layers' weights (rows in order), their weights re-pointed
    into it: the packed tensor is the only copy."""
    packed = torch.cat([linear.weight.detach() for linear in linears], dim=0)
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight = torch.nn.Parameter(packed[start:start + rows],
                                           requires_grad=linear.weight.requires_grad)
        start += rows
    return packed


class _Frequencies:
    """What the projection reads for RoPE: computed from the base for a plain model, else
    float32 cos/sin tables [max_positions, rotary_dim / 2] of the scaled variant, from ropejit's
    RotaryEmbedding (its kernel's values, within 2.5e-7 of float64, times the attention factor),
    built once per model and shared by its layers."""

    def __init__(self, rope, device):
        m = rope.model
        self.rotary_dim, self.base = m.rotary_dim, m.base
        if m.mrope_section is not None or m.rotary_offset or m.local_base:
            raise InvalidArgument("ropejit: fuse='all' takes one RoPE per model (no mRoPE, MLA "
                                  "slices or per-layer bases): use fuse='rope'")
        self.cos = self.sin = None
        if m.freqs != "computed":
            rows = m.max_positions
            if not rows:
                raise InvalidArgument("ropejit: a scaled RoPE needs max_position_embeddings for "
                                      "its tables")
            ids = torch.arange(rows, device=device).unsqueeze(0)
            x = torch.empty(0, dtype=torch.float32, device=device)
            cos, sin = rope(x, ids, seq_len=rows)
            half = self.rotary_dim // 2
            self.cos = cos[0, :, :half].contiguous()
            self.sin = sin[0, :, :half].contiguous()


class NoPositionEmbeddings(torch.nn.Module):
    """Stands in for a model's rotary module once every layer computes RoPE in its projection:
    the model still calls it, and (None, None) costs no launch."""

    def forward(self, x, position_ids=None, *args, **kwargs):
        return None, None


def _forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
             use_cache=False, position_embeddings=None, **kwargs):
    """LlamaDecoderLayer.forward with ropejit's decode block (see the module docstring)."""
    rj = self._ropejit
    attn = self.self_attn
    batch, seq, hidden = hidden_states.shape
    tokens = batch * seq
    x = hidden_states.reshape(tokens, hidden)
    ids = position_ids.expand(batch, seq).reshape(tokens)
    q, k, v = ops.qkv_projection(
        x, rj["qkv"], q_heads=rj["q_heads"], kv_heads=rj["kv_heads"], head_dim=rj["head_dim"],
        rotary_dim=rj["freqs"].rotary_dim, norm_weight=self.input_layernorm.weight,
        eps=self.input_layernorm.variance_epsilon, position_ids=ids, cos=rj["freqs"].cos,
        sin=rj["freqs"].sin, base=rj["freqs"].base)
    query = q.view(batch, seq, rj["q_heads"], rj["head_dim"]).transpose(1, 2)
    key = k.view(batch, seq, rj["kv_heads"], rj["head_dim"]).transpose(1, 2)
    value = v.view(batch, seq, rj["kv_heads"], rj["head_dim"]).transpose(1, 2)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, attn.layer_idx)
    interface = rj["attention"].get_interface(attn.config._attn_implementation, rj["eager"])
    out, _ = interface(attn, query, key, value, attention_mask, dropout=0.0,
                       scaling=attn.scaling, **kwargs)
    out = attn.o_proj(out.reshape(batch, seq, -1).contiguous())
    hidden_states = hidden_states + out
    gated = ops.ffn_gate_up(hidden_states.reshape(tokens, hidden), rj["gate_up"],
                            norm_weight=self.post_attention_layernorm.weight,
                            eps=self.post_attention_layernorm.variance_epsilon)
    return hidden_states + self.mlp.down_proj(gated).view(batch, seq, hidden)


def patch_layers(model, rope):
    """Runs every decoder layer of `model` that has Llama's dataflow through the fused forward;
    returns (patched layer names, {refused layer name: why})."""
    config = model.config
    config = getattr(config, "get_text_config", lambda: config)()
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    patched, refused, freqs = [], {}, None
    for name, module in model.named_modules():
        if not (hasattr(module, "self_attn") and hasattr(module, "mlp")):
            continue
        why = _why_not(module)
        if why:
            refused[name] = why
            continue
        attn = module.self_attn
        head_dim = getattr(attn, "head_dim", None) or config.hidden_size // \
            config.num_attention_heads
        if freqs is None:
            freqs = _Frequencies(rope, attn.q_proj.weight.device)
        modeling = sys.modules[type(module).__module__]
        module._ropejit = {
            "qkv": _pack([attn.q_proj, attn.k_proj, attn.v_proj]),
            "gate_up": _pack([module.mlp.gate_proj, module.mlp.up_proj]),
            "q_heads": attn.q_proj.weight.shape[0] // head_dim,
            "kv_heads": attn.k_proj.weight.shape[0] // head_dim,
            "head_dim": head_dim, "freqs": freqs, "attention": ALL_ATTENTION_FUNCTIONS,
            "eager": getattr(modeling, "eager_attention_forward", None),
        }
        module.forward = types.MethodType(_forward, module)
        patched.append(name)
    return patched, refused
