"""vLLM's `rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`
(vllm._custom_ops) on ropejit: in place, one launch for query and key. `forward_cuda(rope,
positions, query, key=None, offsets=None)` is the call vLLM's models make through
`RotaryEmbedding.forward_cuda`, given the module (or anything with its head_size,
is_neox_style and cos_sin_cache): any get_rope variant, since the scaled ones differ only in
the cache they build. `concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype,
scale)` is vLLM's MLA cache write, and `concat_and_cache_mla_rope_fused(positions, q_pe, k_pe,
kv_c, cos_sin_cache, is_neox, slot_mapping, kv_cache, kv_cache_dtype, kv_cache_scale)` its
RoPE and cache write in one op, both on ropejit's MLA kernel.

Differences from vLLM's:
- cos_sin_cache may be f32, f16 or bf16 whatever the query's dtype (vLLM requires the
  query's); positions may be int32 as well as int64.
- a position outside the cache gives NaN for that token (vLLM's kernel reads out of bounds).
- math in fp32 with one rounding (vLLM's CUDA kernel computes in the activation dtype)."""

from ropejit import ops
from ropejit.errors import InvalidArgument


def _heads_view(name, t, positions, head_size):
    """[batch, seq, heads, head_size] view of t ([..., heads * head_size] or [..., heads,
    head_size] over positions' shape)."""
    lead, shape = positions.dim(), list(t.shape)
    if t.dim() == lead + 1:
        if t.shape[-1] % head_size:
            raise InvalidArgument(f"ropejit: {name}.shape[-1] ({t.shape[-1]}) is not a multiple "
                                  f"of head_size ({head_size})")
        t = t.unflatten(-1, (-1, head_size))
    elif t.dim() != lead + 2 or t.shape[-1] != head_size:
        raise InvalidArgument(f"ropejit: {name} has shape {shape}: expected "
                              f"[*{list(positions.shape)}, heads * {head_size}] or "
                              f"[*{list(positions.shape)}, heads, {head_size}]")
    if tuple(t.shape[:lead]) != tuple(positions.shape):
        raise InvalidArgument(f"ropejit: {name} has shape {shape}, positions "
                              f"{list(positions.shape)}: one position per token")
    if lead == 1:
        return t.unsqueeze(0)
    if lead == 2:
        return t
    raise InvalidArgument(f"ropejit: positions must be [tokens] or [batch, seq], got shape "
                          f"{list(positions.shape)}")


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox):
    """Rotates query (and key, may be None) in place at `positions` ([tokens] or [batch, seq])
    by cos_sin_cache ([max_position, rot_dim]: cos in the first half of a row, sin in the
    second); rot_dim <= head_size, the rest passes through. is_neox: GPT-NeoX halves, else
    GPT-J pairs. Returns None, as vLLM's op."""
    rot = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rot % 2:
        raise InvalidArgument(f"ropejit: cos_sin_cache must be [max_position, rot_dim] with even "
                              f"rot_dim, got shape {list(cos_sin_cache.shape)}")
    q = _heads_view("query", query, positions, head_size)
    k = None if key is None else _heads_view("key", key, positions, head_size)
    ops.rope_(q, k, cos=cos_sin_cache[:, : rot // 2], sin=cos_sin_cache[:, rot // 2:],
              layout="bshd", style="neox" if is_neox else "gptj", rotary_dim=rot,
              position_ids=positions.reshape(-1))


def forward_cuda(rope, positions, query, key=None, offsets=None):
    """RotaryEmbedding.forward_cuda: rotates query and key ([tokens, heads * head_size], views
    of the packed QKV projection as vLLM's attention layers pass them) in place by the module's
    cos_sin_cache at `positions` (+ `offsets`, as older vLLM versions take them); returns
    (query, key)."""
    for name in ("head_size", "is_neox_style", "cos_sin_cache"):
        if not hasattr(rope, name):
            raise InvalidArgument(f"ropejit: rope ({type(rope).__name__}) has no {name}: pass "
                                  f"vLLM's RotaryEmbedding module")
    if offsets is not None:
        positions = positions + offsets
    cache = rope.cos_sin_cache
    if cache.device != query.device:
        raise InvalidArgument(f"ropejit: cos_sin_cache is on {cache.device}, query on "
                              f"{query.device}")
    rotary_embedding(positions, query, key, rope.head_size, cache, rope.is_neox_style)
    return query, key


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """vLLM's MLA cache write (`vllm._custom_ops.concat_and_cache_mla`): each token's row
    [kv_c | k_pe] into kv_cache ([num_blocks, block_size, kv_lora_rank + rope_dim], rows at
    slot_mapping, -1 padding), as given (vLLM rotates and normalizes before), in the cache's
    dtype ("auto") or as e4m3 codes of value / scale ("fp8", "fp8_e4m3"; vLLM keeps such a cache
    as uint8). ropejit's MLA kernel with an identity rotation (one table row, cos 1 and sin 0):
    finite values are copied exactly. Like vLLM, slot_mapping may have fewer tokens than kv_c (the
    CUDA graph's padding): its length is the number of tokens. DeepSeek-V3.2's "fp8_ds_mla"
    layout is not supported."""
    from ropejit import mla
    cache, cache_scale = _mla_cache(kv_cache, kv_cache_dtype, scale)
    tokens = slot_mapping.shape[0]
    positions, cos, sin = _identity(kv_c.device, k_pe.shape[-1] // 2, tokens)
    mla.prepare(positions, cos, sin, kv_c=kv_c[:tokens], k_pe=k_pe[:tokens], cache=cache,
                slots=slot_mapping, cache_scale=cache_scale)


# (device, half) -> (zero positions, cos row of ones, sin row of zeros): the identity rotation's
# inputs, made once and reused (positions grown as needed), so a call is one launch.
_IDENTITY = {}


def _identity(device, half, tokens):
    import torch
    have = _IDENTITY.get((device, half))
    if have is not None and have[0].shape[0] >= tokens:
        return have[0][:tokens], have[1], have[2]
    made = (torch.zeros(max(tokens, 256), dtype=torch.int32, device=device),
            torch.ones(1, half, device=device), torch.zeros(1, half, device=device))
    # Tensors made while a CUDA graph is captured are filled only when it replays: not kept.
    if device.type != "cuda" or not torch.cuda.is_current_stream_capturing():
        _IDENTITY[(device, half)] = made
    return made[0][:tokens], made[1], made[2]


def _mla_cache(kv_cache, kv_cache_dtype, scale):
    """The cache as the MLA kernel takes it: vLLM's uint8 FP8 cache viewed as e4m3."""
    import torch
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return kv_cache.view(torch.float8_e4m3fn), scale.reshape(1).float()
    if kv_cache_dtype == "auto":
        return kv_cache, None
    raise InvalidArgument(f"ropejit: kv_cache_dtype ({kv_cache_dtype!r}) must be 'auto', 'fp8' "
                          f"or 'fp8_e4m3'")


def concat_and_cache_mla_rope_fused(positions, q_pe, k_pe, kv_c, cos_sin_cache, is_neox,
                                    slot_mapping, kv_cache, kv_cache_dtype, kv_cache_scale):
    """vLLM's `concat_and_cache_mla_rope_fused`: q_pe [tokens, heads, rot_dim] and k_pe
    [tokens, rot_dim] (or [tokens, 1, rot_dim]) rotated in place by cos_sin_cache at positions,
    and each token's row [kv_c | rope(k_pe)] written into kv_cache at slot_mapping (-1 padding)
    as concat_and_cache_mla writes it. kv_c is taken as given (vLLM normalizes it before); kv_c
    and k_pe may be the two column ranges of one tensor. One launch. A slot_mapping shorter than
    positions (a padded CUDA graph batch) writes rows for its tokens and rotates every token's
    q_pe and k_pe (two more launches for the tail)."""
    from ropejit import mla
    rot = cos_sin_cache.shape[-1]
    if cos_sin_cache.dim() != 2 or rot % 2:
        raise InvalidArgument(f"ropejit: cos_sin_cache must be [max_position, rot_dim] with even "
                              f"rot_dim, got shape {list(cos_sin_cache.shape)}")
    if k_pe.dim() == 3 and k_pe.shape[1] == 1:
        k_pe = k_pe[:, 0]
    if k_pe.dim() != 2 or k_pe.shape[-1] != rot:
        raise InvalidArgument(f"ropejit: k_pe must be [tokens, rot_dim = {rot}] (or [tokens, 1, "
                              f"rot_dim]), got shape {list(k_pe.shape)}")
    cache, cache_scale = _mla_cache(kv_cache, kv_cache_dtype, kv_cache_scale)
    tokens, rows = positions.shape[0], slot_mapping.shape[0]
    if rows > tokens:
        raise InvalidArgument(f"ropejit: slot_mapping has {rows} tokens, positions {tokens}")
    cos, sin = cos_sin_cache[:, : rot // 2], cos_sin_cache[:, rot // 2:]
    style = "neox" if is_neox else "gptj"
    mla.prepare(positions[:rows], cos, sin, kv_c=kv_c[:rows], k_pe=k_pe[:rows], cache=cache,
                slots=slot_mapping, cache_scale=cache_scale, q_pe=q_pe[:rows], style=style,
                rotate_k_pe=True)
    if rows < tokens:
        mla.prepare(positions[rows:], cos, sin, q_pe=q_pe[rows:tokens], style=style)
        mla.prepare(positions[rows:], cos, sin, q_pe=k_pe[rows:tokens].unsqueeze(1), style=style)

