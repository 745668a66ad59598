"""A transformers decoder layer run through ropejit's decode block (ropejit.nn.patch_hf_model with
fuse="all"): per layer, input RMSNorm -> packed QKV projection -> RoPE in one op that also
appends k and v to a StaticCache (other caches get them through their update(); Qwen2's q/k/v
biases are added in the same op), attention as
transformers does it, o_proj, then the residual add, RMSNorm and gate/up -> SiLU * up in one op,
and down_proj. A layer with QK-norm (Qwen3) runs RMSNorm, the packed projection (torch's GEMM) and
one fused op for QK-norm -> RoPE -> the cache append instead of the first op. The q/k/v and gate/up
weights are packed once at patch time and the model's Linear weights re-pointed into the packed
tensors, so no weight is held twice."""

import sys
import threading
import types

import torch

from ropejit import decode, ops
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
            if linear.bias is not None and part in _MLP_PARTS[:2]:
                return f"its {part} has a bias (the fused gate/up takes none)"
    biased = [part for part in _ATTN_PARTS[:3] if getattr(attn, part).bias is not None]
    if biased and len(biased) != 3:
        return (f"its biases are on {', '.join(biased)} only (the fused projection takes q_proj, "
                f"k_proj and v_proj biases together)")
    for norm in ("input_layernorm", "post_attention_layernorm"):
        module = getattr(layer, norm, None)
        if module is None or getattr(module, "weight", None) is None or not hasattr(
                module, "variance_epsilon"):
            return f"its {norm} is not an RMSNorm with a weight and variance_epsilon"
        if type(module).__name__.startswith("Gemma"):
            return f"its {norm} scales by (1 + w) around other pre/post norms (Gemma)"
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        for norm in ("q_norm", "k_norm"):
            module = getattr(attn, norm, None)
            if module is None or getattr(module, "weight", None) is None or not hasattr(
                    module, "variance_epsilon") or module.weight.dim() != 1:
                return f"its {norm} is not an RMSNorm over head_dim with a weight"
        if attn.q_norm.variance_epsilon != attn.k_norm.variance_epsilon:
            return "its q_norm and k_norm have different epsilons"
    act = getattr(mlp, "act_fn", None)
    if type(act).__name__ not in ("SiLU", "SiLUActivation"):
        return f"its MLP activation is {type(act).__name__}, not SiLU"
    if getattr(attn, "sliding_window", None):
        return "its attention has a sliding window"
    return ""


def _pack(linears, name="weight"):
    """One tensor holding the Linear layers' weights (or biases: `name`), rows in order, the
    layers' parameters re-pointed into it: the packed tensor is the only copy."""
    packed = torch.cat([getattr(linear, name).detach() for linear in linears], dim=0)
    start = 0
    for linear in linears:
        old = getattr(linear, name)
        rows = old.shape[0]
        setattr(linear, name, torch.nn.Parameter(packed[start:start + rows],
                                                 requires_grad=old.requires_grad))
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


def _static_layer(cache, index, x, batch, kv_heads, head_dim, static_type):
    """The layer of a transformers StaticCache (`static_type`: its StaticLayer class) that the
    projection can append to directly (full attention, its tensors allocated by the prefill in
    x's dtype, a row per sequence of this batch), or None: then k and v go through the cache's
    update()."""
    layers = getattr(cache, "layers", None)
    if layers is None or index is None or index >= len(layers):
        return None
    layer = layers[index]
    # A subclass (the sliding-window layer) places rows differently.
    if type(layer) is not static_type or not layer.is_initialized:
        return None
    keys = layer.keys
    if keys.dim() != 4 or keys.dtype != x.dtype or keys.device != x.device or (
            keys.shape[0], keys.shape[1], keys.shape[3]) != (batch, kv_heads, head_dim):
        return None
    return layer


def _dynamic_layer(cache, index, x, batch, kv_heads, head_dim, dynamic_type):
    """The layer of a transformers DynamicCache (`dynamic_type`: its DynamicLayer class) whose
    next row the projection can write in place (see _room), or None: then k and v go through
    its update(), which concatenates."""
    layers = getattr(cache, "layers", None)
    if layers is None or index is None or index >= len(layers):
        return None
    layer = layers[index]
    if type(layer) is not dynamic_type or not layer.is_initialized:
        return None
    keys, values = layer.keys, layer.values
    if keys.dim() != 4 or keys.dtype != x.dtype or keys.device != x.device or (
            keys.shape[0], keys.shape[1], keys.shape[3]) != (batch, kv_heads, head_dim) or \
            values.shape != keys.shape or values.dtype != keys.dtype or keys.shape[2] == 0:
        return None
    return layer


_ROOM_ROWS = 256


def _room(rj, layer):
    """(k buffer, v buffer, length): [batch, kv_heads, capacity, head_dim] tensors whose first
    `length` rows are the DynamicLayer's keys and values, with room for one more. The layer's
    keys and values stay views of the buffers from one step to the next, so a decode step
    appends its row in place instead of concatenating the whole cache twice; anything else that
    replaced them (beam search's reorder, a cache built elsewhere) is copied into new buffers
    once. Rows past the length are written only by appends; a crop keeps the view."""
    keys, values = layer.keys, layer.values
    length = keys.shape[2]
    room = rj["room"]
    if room is not None:
        k_buf, v_buf = room
        if (keys.data_ptr() == k_buf.data_ptr() and values.data_ptr() == v_buf.data_ptr()
                and keys.stride() == k_buf.stride() and values.stride() == v_buf.stride()
                and keys.shape[:2] == k_buf.shape[:2] and length < k_buf.shape[2]):
            return k_buf, v_buf, length
    # Room for a quarter more (at least _ROOM_ROWS): the copy is paid once per that many steps.
    shape = (keys.shape[0], keys.shape[1], length + max(_ROOM_ROWS, length // 4), keys.shape[3])
    k_buf, v_buf = keys.new_empty(shape), values.new_empty(shape)
    k_buf[:, :, :length].copy_(keys)
    v_buf[:, :, :length].copy_(values)
    rj["room"] = (k_buf, v_buf)
    return k_buf, v_buf, length


def _lengths(rj, length, batch, device):
    """An int32 [batch] tensor of `length`, the decode step's cache_seqlens: made once per step
    and shared by the model's layers (their DynamicLayers have one length)."""
    shared = rj["shared"]
    key = (length, batch, device)
    memo = shared.get("lengths")
    if memo is None or memo[0] != key:
        memo = shared["lengths"] = (key, torch.full((batch,), length, dtype=torch.int32,
                                                    device=device))
    return memo[1]


def _qk_norm_projection(self, x, batch, seq, ids, cache):
    """(q, k, v) [tokens, heads, head_dim] of a QK-norm layer: RMSNorm, the packed projection,
    then QK-norm, RoPE and the cache append (`cache`: the static cache's arguments, or none) in
    one fused launch on views of the projection's output."""
    rj, attn = self._ropejit, self.self_attn
    heads = (rj["q_heads"], rj["kv_heads"], rj["kv_heads"])
    h = ops.rms_norm(x, self.input_layernorm.weight, self.input_layernorm.variance_epsilon)
    packed = torch.nn.functional.linear(h, rj["qkv"], rj["qkv_bias"]).view(
        x.shape[0], sum(heads), rj["head_dim"])
    q, k, v = packed.split(heads, dim=1)
    freqs = rj["freqs"]
    # v is read only for the cache append; without one it stays where the projection put it.
    ops.qk_norm_rope(
        *(t.view(batch, seq, -1, rj["head_dim"]) for t in ((q, k, v) if cache else (q, k))),
        layout="bshd",
        rotary_dim=freqs.rotary_dim, position_ids=ids, cos=freqs.cos, sin=freqs.sin,
        base=freqs.base, norm="rms", q_norm_weight=attn.q_norm.weight,
        k_norm_weight=attn.k_norm.weight, norm_eps=attn.q_norm.variance_epsilon, **cache)
    return q, k, v


def _forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
             use_cache=False, position_embeddings=None, **kwargs):
    """LlamaDecoderLayer.forward with ropejit's decode block (see the module docstring)."""
    rj = self._ropejit
    attn = self.self_attn
    batch, seq, hidden = hidden_states.shape
    tokens = batch * seq
    x = hidden_states.reshape(tokens, hidden)
    # One position per token, dense (transformers may pass [1, seq] for every sequence).
    ids = position_ids.expand(batch, seq).reshape(tokens).contiguous()
    layer = _static_layer(past_key_values, attn.layer_idx, x, batch, rj["kv_heads"],
                          rj["head_dim"], rj["static_layer"])
    cache, grown = {}, None
    eager = ops._direct(hidden_states)
    if layer is not None:
        # k and v go straight into the static cache's [batch, kv_heads, max_len, head_dim]
        # tensors at the rows from the layer's length on, as its update() would put them.
        cache = dict(k_cache=layer.keys, v_cache=layer.values, kv_layout="HND",
                     cache_seqlens=layer.cumulative_length.expand(batch).to(torch.int32))
    elif eager and seq == 1:
        grown = _dynamic_layer(past_key_values, attn.layer_idx, x, batch, rj["kv_heads"],
                               rj["head_dim"], rj["dynamic_layer"])
        if grown is not None:
            k_buf, v_buf, length = _room(rj, grown)
            cache = dict(k_cache=k_buf, v_cache=v_buf, kv_layout="HND",
                         cache_seqlens=_lengths(rj, length, batch, x.device))
    if rj["qk_norm"]:
        q, k, v = _qk_norm_projection(self, x, batch, seq, ids, cache)
    elif eager and seq == 1:
        q, k, v = _eager_projection(self, x, ids, cache)
    else:
        if layer is not None and seq > 1:
            cache["cu_seqlens"] = torch.arange(0, tokens + 1, seq, dtype=torch.int32,
                                               device=x.device)
        freqs = rj["freqs"]
        q, k, v = ops.qkv_projection(
            x, rj["qkv"], q_heads=rj["q_heads"], kv_heads=rj["kv_heads"],
            head_dim=rj["head_dim"], rotary_dim=freqs.rotary_dim,
            norm_weight=self.input_layernorm.weight, eps=self.input_layernorm.variance_epsilon,
            position_ids=ids, cos=freqs.cos, sin=freqs.sin, base=freqs.base,
            bias=rj["qkv_bias"], **cache)
    query = q.view(batch, seq, rj["q_heads"], rj["head_dim"]).transpose(1, 2)
    if layer is not None:
        layer.cumulative_length.add_(seq)
        key, value = layer.keys, layer.values
    elif grown is not None:
        grown.keys = key = cache["k_cache"][:, :, :length + 1]
        grown.values = value = cache["v_cache"][:, :, :length + 1]
    else:
        key = k.view(batch, seq, rj["kv_heads"], rj["head_dim"]).transpose(1, 2)
        value = v.view(batch, seq, rj["kv_heads"], rj["head_dim"]).transpose(1, 2)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, attn.layer_idx)
    implementation = attn.config._attn_implementation
    interface = rj["interfaces"].get(implementation)
    if interface is None:
        interface = rj["interfaces"][implementation] = rj["attention"].get_interface(
            implementation, rj["eager"])
    out, _ = interface(attn, query, key, value, attention_mask, dropout=0.0,
                       scaling=attn.scaling, **kwargs)
    out = attn.o_proj(out.reshape(batch, seq, -1).contiguous())
    hidden_states = hidden_states + out
    h = hidden_states.reshape(tokens, hidden)
    if eager:
        gated = _eager_gate_up(self, h)
    else:
        gated = ops.ffn_gate_up(h, rj["gate_up"], norm_weight=self.post_attention_layernorm.weight,
                                eps=self.post_attention_layernorm.variance_epsilon)
    return hidden_states + self.mlp.down_proj(gated).view(batch, seq, hidden)


# Outside a trace the decode step calls ropejit.decode itself, and repeats the plan of the
# layer's previous step when its key (the shapes, dtypes and every fixed address the plan holds)
# is unchanged: the plan cache's own key costs more Python than the step's other work.

def _eager_projection(self, x, ids, cache):
    """(q, k, v) of a one-token-per-sequence step outside a trace (see above)."""
    rj = self._ropejit
    norm = self.input_layernorm
    k_cache = cache.get("k_cache")
    bias = rj["qkv_bias"]
    key = (x.shape, x.stride(0), x.dtype, ids.dtype, norm.weight.data_ptr(), rj["qkv"].data_ptr(),
           None if bias is None else bias.data_ptr(),
           None if k_cache is None else (k_cache.shape, k_cache.stride(), k_cache.dtype))
    memo = rj["qkv_plan"]
    heads = (rj["q_heads"], rj["kv_heads"], rj["kv_heads"])
    if memo is not None and memo[0] == key:
        packed = decode.qkv_replay(memo[1], x, ids, k_cache, cache.get("v_cache"),
                                   cache.get("cache_seqlens"), *heads[:2], rj["head_dim"])
    else:
        freqs, plans = rj["freqs"], []
        packed = decode.qkv_projection(
            x, rj["qkv"], q_heads=heads[0], kv_heads=heads[1], head_dim=rj["head_dim"],
            rotary_dim=freqs.rotary_dim, norm_weight=norm.weight, eps=norm.variance_epsilon,
            position_ids=ids, cos=freqs.cos, sin=freqs.sin, base=freqs.base, bias=bias,
            _packed=True, _plans=plans, **cache)
        rj["qkv_plan"] = (key, plans[0]) if plans else None
    return packed.split(heads, dim=1)


def _eager_gate_up(self, h):
    """SiLU(gate) * up of RMSNorm(h) outside a trace (see above)."""
    rj = self._ropejit
    norm = self.post_attention_layernorm
    key = (h.shape, h.stride(0), h.dtype, norm.weight.data_ptr(), rj["gate_up"].data_ptr())
    memo = rj["ffn_plan"]
    if memo is not None and memo[0] == key:
        return decode.ffn_replay(memo[1], h, rj["gate_up"].shape[0] // 2)
    plans = []
    out = decode.ffn_gate_up(h, rj["gate_up"], norm_weight=norm.weight,
                             eps=norm.variance_epsilon, _plans=plans)
    rj["ffn_plan"] = (key, plans[0]) if plans else None
    return out


def patch_layers(model, rope):
    """Runs every decoder layer of `model` that has Llama's dataflow through the fused forward;
    returns (patched layer names, {refused layer name: why})."""
    config = model.config
    config = getattr(config, "get_text_config", lambda: config)()
    from transformers.cache_utils import DynamicLayer, StaticLayer
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    patched, refused, freqs, shared = [], {}, None, {}
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
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        module._ropejit = {
            "qkv": _pack(qkv),
            "qkv_bias": _pack(qkv, "bias") if attn.q_proj.bias is not None else None,
            "gate_up": _pack([module.mlp.gate_proj, module.mlp.up_proj]),
            "q_heads": attn.q_proj.weight.shape[0] // head_dim,
            "kv_heads": attn.k_proj.weight.shape[0] // head_dim,
            "head_dim": head_dim, "freqs": freqs, "attention": ALL_ATTENTION_FUNCTIONS,
            "qk_norm": hasattr(attn, "q_norm"), "static_layer": StaticLayer,
            "eager": getattr(modeling, "eager_attention_forward", None),
            "dynamic_layer": DynamicLayer, "interfaces": {}, "qkv_plan": None,
            "ffn_plan": None, "room": None, "shared": shared,
        }
        module.forward = types.MethodType(_forward, module)
        patched.append(name)
    return patched, refused


# Set while a model patched with defer_stop_check runs generate() (per thread).
_deferring = threading.local()


def defer_stop_check(model, on=True):
    """Lets `model.generate()` on CUDA read its stop decision one step late, as transformers
    does on Apple's mps (its DeferredStopCheck): the host then queues step n + 1 while the device
    runs step n, instead of waiting for step n's tokens before preparing the next call. Where
    transformers can defer (no cache it must hand back un-cropped), this costs one extra forward
    per generate() call, whose outputs it undoes; the tokens returned are the same. Returns ""
    when installed (or, with on=False, removed), else why not (a transformers without
    DeferredStopCheck)."""
    generate = model.__dict__.get("generate")
    if not on:
        if getattr(generate, "__func__", None) is _deferred_generate:
            del model.generate
        return ""
    try:
        from transformers.generation import utils
    except ImportError:
        return "transformers.generation.utils is missing"
    check = getattr(utils, "DeferredStopCheck", None)
    if check is None or not callable(getattr(check, "is_supported", None)):
        return "this transformers has no DeferredStopCheck"
    if not getattr(check.is_supported, "_ropejit", False):
        original = check.is_supported

        def is_supported(device, cache, cache_is_returned, is_assistant=False):
            if getattr(_deferring, "on", False) and device.type == "cuda" and not is_assistant:
                # transformers' own rule on mps: a returned cache must be croppable back.
                return cache is None or cache.is_croppable or not cache_is_returned
            return original(device, cache, cache_is_returned, is_assistant=is_assistant)

        is_supported._ropejit = True
        check.is_supported = staticmethod(is_supported)
    if getattr(generate, "__func__", None) is not _deferred_generate:
        # A method bound to the model, not a closure over it: a deepcopy of the model then
        # defers its own generate(), not the original's.
        model.generate = types.MethodType(_deferred_generate, model)
    return ""


def _deferred_generate(self, *args, **kwargs):
    """The model class's generate() with the stop check deferred (see defer_stop_check)."""
    before = getattr(_deferring, "on", False)
    _deferring.on = True
    try:
        return type(self).generate(self, *args, **kwargs)
    finally:
        _deferring.on = before
