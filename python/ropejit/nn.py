"""RotaryEmbedding, a torch.nn.Module applying a model's RoPE with ropejit: described by ropejit's
own Hugging Face config reader (every rope_type it knows, mRoPE included), frequencies computed
in the kernel with the model's scaling, and able to stand in for a transformers model's rotary
module (patch_hf_model)."""

import dataclasses
import sys
import warnings

import torch

from ropejit import _model, ops
from ropejit.dropin import hf
from ropejit.errors import InvalidArgument

# The heads axis of q in each layout (the tokens are the other leading axes).
_HEADS_AXIS = {"bshd": 2, "sbhd": 2, "bhsd": 1, "thd": 1}
# Per-layer-type rope_parameters the C reader reads (Gemma 3): full_attention's are the model's,
# sliding_attention's base is ModelRope.local_base.
_LAYER_TYPES = (None, "full_attention", "sliding_attention")


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _arguments_config(head_dim, rotary_dim, base, max_position_embeddings, scaling):
    """The config.json fields that say what RotaryEmbedding's arguments say, for the C reader."""
    config = {"num_attention_heads": 1, "head_dim": head_dim, "rotary_dim": rotary_dim,
              "rope_theta": base, "max_position_embeddings": max_position_embeddings}
    if scaling:
        config["rope_scaling"] = dict(scaling)
    return config


class RotaryEmbedding(torch.nn.Module):
    """A model's RoPE: rotary_dim frequencies of its variant, computed in the kernel (float64
    frequencies from ropejit's definition of the variant, cos/sin within 2.5e-7 of float64 times
    the attention factor), at any position.

    from_config(config) reads a Hugging Face config with ropejit's C reader: rope_type default,
    linear, dynamic (NTK), llama3, yarn, longrope (and the legacy names mrope, su), mRoPE
    sections (Qwen2-VL, Qwen2.5-VL; interleaved: Qwen3-VL), partial rotary, DeepSeek MLA's
    rotary slice, Gemma 3's sliding-window base. `model` holds what it read (a ropejit.ModelRope).

    forward(x, position_ids) -> (cos, sin) is transformers' rotary-module interface ([batch,
    seq, rotary_dim] in x's dtype), so the module can replace a model's `rotary_emb`, paired
    with ropejit.dropin.hf.apply_rotary_pos_emb (patch_hf_model does both). apply(q, k,
    position_ids) is the direct path: one launch computing the frequencies in the kernel, no
    cos/sin tensors.

    Sequence length (dynamic NTK and LongRoPE switch on it; scaling.seq_len in the C API): the
    `seq_len` argument of forward/apply when given, else max(position_ids) + 1, which is what
    transformers' rotary modules use (one device-to-host read per call, as theirs), or with
    offset positions position_offset + seq. LongRoPE then matches transformers exactly (long
    factors beyond original_max_position_embeddings). Dynamic NTK differs in one respect:
    transformers' module keeps the largest length it has seen (it only grows, until a call
    falls back under max_position_embeddings), while this module is stateless and uses each
    call's length; the two agree for a call that is the longest so far, e.g. every step of one
    generation.

    The constructor takes the description as arguments instead: `scaling` is a config's
    rope_scaling / rope_parameters dict (read by the same C reader), `style` 'neox' or 'gptj'.
    `device` is accepted for transformers' signature: nothing is stored per device."""

    def __init__(self, head_dim=None, rotary_dim=None, base=10000.0, max_position_embeddings=2048,
                 style="neox", scaling=None, device=None, *, model=None):
        super().__init__()
        if model is None:
            if not _is_int(head_dim) or head_dim <= 0:
                raise InvalidArgument(f"ropejit: head_dim ({head_dim!r}) must be a positive int "
                                      f"(or build from a config: RotaryEmbedding.from_config)")
            rotary_dim = head_dim if rotary_dim is None else rotary_dim
            if (not _is_int(rotary_dim) or rotary_dim <= 0 or rotary_dim % 2
                    or rotary_dim > head_dim):
                raise InvalidArgument(f"ropejit: rotary_dim ({rotary_dim!r}) must be even and in "
                                      f"[2, head_dim ({head_dim})]")
            if not _is_int(max_position_embeddings) or max_position_embeddings <= 0:
                raise InvalidArgument(f"ropejit: max_position_embeddings "
                                      f"({max_position_embeddings!r}) must be a positive int")
            if style not in ("neox", "gptj"):
                raise InvalidArgument(f"ropejit: style ({style!r}) must be 'neox' or 'gptj'")
            if scaling is not None and not isinstance(scaling, dict):
                raise InvalidArgument(f"ropejit: scaling ({scaling!r}) must be a rope_scaling "
                                      f"dict or None")
            model = _model.model_from_hf_config(_arguments_config(
                head_dim, rotary_dim, base, max_position_embeddings, scaling))
            model = dataclasses.replace(model, style=style,
                                        spec=dataclasses.replace(model.spec, style=style))
        elif not isinstance(model, _model.ModelRope):
            raise InvalidArgument(f"ropejit: model ({model!r}) must be a ropejit.ModelRope")
        self.model = model
        self.head_dim, self.rotary_dim, self.base = model.head_dim, model.rotary_dim, model.base
        self.max_position_embeddings, self.style = model.max_positions, model.style
        self.freqs = model.freqs

    @classmethod
    def from_config(cls, config, device=None):
        """From a Hugging Face config: a transformers PretrainedConfig (4.x or 5.x fields; a
        multimodal one's text_config), a dict of config.json, or a path to config.json, read by
        ropejit's C reader (ropejit_spec_from_hf_config). A config it cannot use raises
        ropejit.InvalidArgument with the reader's message, which names the field and its
        value."""
        return cls(model=_model.model_from_hf_config(config), device=device)

    def extra_repr(self):
        m = self.model
        text = (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"max_position_embeddings={self.max_position_embeddings}, style={self.style}, "
                f"freqs={self.freqs}")
        if self.freqs != "computed":
            text += f", scaling={m.scaling}"
        if m.mrope_section is not None:
            text += f", mrope_section={m.mrope_section}, mrope_interleaved={m.mrope_interleaved}"
        if m.local_base:
            text += f", local_base={m.local_base}"
        return text

    def _frequency_args(self, layer_type, position_ids, seq_len, default_seq_len=None):
        """ops.rope's frequency arguments for a call."""
        m = self.model
        if layer_type not in _LAYER_TYPES:
            raise InvalidArgument(f"ropejit: layer_type ({layer_type!r}) must be one of "
                                  f"{', '.join(map(repr, _LAYER_TYPES))}")
        if layer_type == "sliding_attention" and m.local_base:
            return dict(base=m.local_base, freqs="computed")  # Gemma 3: unscaled, own base
        kwargs = dict(base=m.base, freqs=m.freqs)
        if m.freqs != "computed":
            kwargs["scaling"] = m.scaling
        if m.needs_seq_len:
            if seq_len is None and position_ids is not None:
                seq_len = int(position_ids.max()) + 1  # transformers' dynamic_rope_update
            kwargs["seq_len"] = default_seq_len if seq_len is None else seq_len
        elif seq_len is not None and (not _is_int(seq_len) or seq_len < 0):
            raise InvalidArgument(f"ropejit: seq_len ({seq_len!r}) must be an int >= 0")
        return kwargs

    def _rows(self, position_ids):
        """mRoPE models: the [3, batch, seq] position rows (a [batch, seq] tensor gives three equal
        rows, as transformers' modules expand it)."""
        if position_ids.dim() == 2:
            return position_ids.expand(3, -1, -1)
        if position_ids.dim() != 3 or position_ids.shape[0] != 3:
            raise InvalidArgument(f"ropejit: position_ids must be [3, batch, seq] (temporal, "
                                  f"height, width) or [batch, seq] for an mRoPE model, got shape "
                                  f"{list(position_ids.shape)}")
        return position_ids

    @torch.no_grad()
    def forward(self, x, position_ids, layer_type=None, *, seq_len=None):
        """(cos, sin) at position_ids ([batch, seq]; mRoPE models also [3, batch, seq]):
        [batch, seq, rotary_dim] in x's dtype, each frequency twice ([f, f]) and times the
        attention factor (yarn, longrope), as transformers' rotary modules return them (mRoPE:
        each pair from its section's row, as Qwen2-VL's and Qwen3-VL's modules compose them).
        layer_type: Gemma 3's 'sliding_attention' layers take local_base, unscaled. seq_len:
        see the class docstring.

        The values are the kernel's: it rotates the unit vector (1, 0) of every pair at each
        position, so cos and sin come out of the same frequency code as apply()'s."""
        position_ids = position_ids.to(x.device)
        kwargs = self._frequency_args(layer_type, position_ids, seq_len)
        if self.model.mrope_section is not None:
            rows = self._rows(position_ids)
            shape = tuple(rows.shape[1:])
            ids = rows.reshape(3, -1).contiguous()
            kwargs.update(mrope_section=self.model.mrope_section,
                          mrope_interleaved=self.model.mrope_interleaved)
        else:
            if position_ids.dim() > 2:
                raise InvalidArgument(f"ropejit: the model has no mRoPE sections: position_ids "
                                      f"must be [batch, seq], got shape "
                                      f"{list(position_ids.shape)}")
            shape = tuple(position_ids.shape)
            ids = position_ids.reshape(-1).contiguous()
        r, half = self.rotary_dim, self.rotary_dim // 2
        unit = torch.zeros((ids.shape[-1], 1, r), dtype=torch.float32, device=x.device)
        unit[..., :half] = 1.0
        out, _ = ops.rope(unit, layout="thd", style="neox", rotary_dim=r, position_ids=ids,
                          **kwargs)
        cos, sin = out[:, 0, :half], out[:, 0, half:]
        return (torch.cat((cos, cos), dim=-1).reshape(shape + (r,)).to(x.dtype),
                torch.cat((sin, sin), dim=-1).reshape(shape + (r,)).to(x.dtype))

    def apply(self, q, k=None, position_ids=None, *, layout="bhsd", position_offset=0,
              seq_len=None, layer_type=None):
        """Rotated (q, k) as new tensors (differentiable), frequencies computed in the kernel:
        positions from position_ids (int32/int64, one per token, [batch, seq] is fine; mRoPE
        models also take three rows, [3, batch, seq]), else index + position_offset (for an
        mRoPE model, three equal rows). DeepSeek MLA: pass the rotary slices (q_pe, k_pe),
        rotary_dim wide. seq_len and layer_type as in forward."""
        m = self.model
        if m.rotary_offset and q.shape[-1] != m.rotary_dim:
            raise InvalidArgument(
                f"ropejit: the model's rotary part is the last {m.rotary_dim} elements of each "
                f"head (rotary_offset {m.rotary_offset}, DeepSeek MLA): pass q[..., "
                f"{m.rotary_offset}:] and k_pe, {m.rotary_dim} wide; q's head size is "
                f"{q.shape[-1]}")
        if layout not in _HEADS_AXIS:
            raise InvalidArgument(f"ropejit: layout ({layout!r}) must be one of "
                                  f"{', '.join(map(repr, _HEADS_AXIS))}")
        default_seq_len = None
        if position_ids is None and layout != "thd" and q.dim() == 4:
            default_seq_len = position_offset + q.shape[0 if layout == "sbhd" else
                                                        2 if layout == "bhsd" else 1]
        kwargs = self._frequency_args(layer_type, position_ids, seq_len, default_seq_len)
        ids = None
        if position_ids is not None:
            heads = q.shape[_HEADS_AXIS[layout]] if q.dim() > _HEADS_AXIS[layout] else 1
            tokens = q.numel() // max(heads * q.shape[-1], 1)
            three_rows = (m.mrope_section is not None and position_ids.dim() >= 2
                          and position_ids.shape[0] == 3 and position_ids.numel() == 3 * tokens)
            if three_rows:
                ids = position_ids.reshape(3, -1)
                kwargs.update(mrope_section=m.mrope_section,
                              mrope_interleaved=m.mrope_interleaved)
            else:
                ids = position_ids.reshape(-1)  # one row: every pair takes the same position
        return ops.rope(q, k, layout=layout, style=self.style, rotary_dim=self.rotary_dim,
                        position_ids=ids, position_offset=position_offset, **kwargs)


def patch_hf_model(model, *, fuse="rope", defer_stop_check=None):
    """Makes a transformers model use ropejit. Returns a PatchReport (what was replaced, and
    what was not and why).

    fuse="rope": every `rotary_emb` submodule becomes a RotaryEmbedding from the model's config
    (its text config for a multimodal model), and its modeling module's apply_rotary_pos_emb
    becomes ropejit.dropin.hf.apply_rotary_pos_emb (patched in that module, so it applies to
    every model of the class).

    fuse="all": besides, every decoder layer with Llama's dataflow (Llama 3.x, Mistral, and the
    families that copy its layer without biases, QK-norm or sliding windows) runs ropejit's
    decode block: input RMSNorm -> packed QKV projection -> RoPE in one op
    (ropejit.ops.qkv_projection: one fused kernel for decode-sized calls, RMSNorm -> cuBLASLt ->
    RoPE beyond), transformers' cache update and attention, o_proj, the residual add, then
    RMSNorm -> gate/up -> SiLU * up in one op (ropejit.ops.ffn_gate_up), and down_proj. The q/k/v
    and gate/up weights are packed into one tensor each and the Linear weights re-pointed into
    them: no weight is held twice. Layers it cannot fuse keep transformers' forward (with
    ropejit's RoPE) and are listed in the report with the reason. Inference only.

    defer_stop_check (default: on with fuse="all", off with fuse="rope"): the model's generate()
    on CUDA reads its stop decision one step late, as transformers itself does only on Apple's
    mps, so the host prepares and queues step n + 1 while the GPU runs step n. generate() returns
    the same tokens. Where transformers can defer (a cache generate() hands back must be one it
    can crop), it runs one extra forward per call and undoes it. The report's ``deferred_stop``
    says whether it was installed; ``ropejit.nn.defer_stop(model, on)`` turns it on or off
    later."""
    if fuse not in ("rope", "all"):
        raise InvalidArgument(f"ropejit: fuse ({fuse!r}) must be 'rope' or 'all'")
    if defer_stop_check is None:
        defer_stop_check = fuse == "all"
    if not isinstance(defer_stop_check, bool):
        raise InvalidArgument(f"ropejit: defer_stop_check ({defer_stop_check!r}) must be True, "
                              f"False or None")
    config = model.config
    config = getattr(config, "get_text_config", lambda: config)()
    replaced = []
    rope = None
    for name, module in list(model.named_modules()):
        child = getattr(module, "rotary_emb", None)
        if isinstance(child, torch.nn.Module) and not isinstance(child, RotaryEmbedding):
            rope = RotaryEmbedding.from_config(config)
            setattr(module, "rotary_emb", rope)
            replaced.append(f"{name}.rotary_emb" if name else "rotary_emb")
        elif isinstance(child, RotaryEmbedding):
            rope = child
    modeling = sys.modules[type(model).__module__]
    if not hasattr(modeling, "apply_rotary_pos_emb"):
        raise InvalidArgument(f"ropejit: {modeling.__name__} has no apply_rotary_pos_emb to "
                              f"replace")
    modeling.apply_rotary_pos_emb = hf.apply_rotary_pos_emb
    report = PatchReport(rotary=replaced, layers=[], not_fused={})
    if fuse == "all":
        from ropejit import _hf_patch
        if rope is None:
            rope = RotaryEmbedding.from_config(config)
        report.layers, report.not_fused = _hf_patch.patch_layers(model, rope)
        if report.layers and not report.not_fused:
            # Every layer computes its RoPE in the projection: the model's cos/sin are unused.
            for owner in replaced:
                parent = model.get_submodule(owner.rpartition(".")[0]) if "." in owner else model
                parent.rotary_emb = _hf_patch.NoPositionEmbeddings()
    if hasattr(model, "generate"):
        report.deferred_stop = defer_stop(model, defer_stop_check)
    return report


def defer_stop(model, on=True):
    """Turns patch_hf_model's defer_stop_check on or off for `model` (a transformers model with
    generate()); returns whether it is on. Where this transformers cannot defer, warns and
    returns False."""
    from ropejit import _hf_patch
    if not isinstance(on, bool):
        raise InvalidArgument(f"ropejit: on ({on!r}) must be True or False")
    why = _hf_patch.defer_stop_check(model, on)
    if why:
        warnings.warn(f"ropejit: defer_stop_check stays off: {why}", stacklevel=2)
    return on and not why


@dataclasses.dataclass
class PatchReport:
    """What patch_hf_model did: the rotary modules replaced, the decoder layers running the fused
    decode block (fuse="all"), and the layers left to transformers with the reason."""
    rotary: list
    layers: list
    not_fused: dict
    deferred_stop: bool = False
