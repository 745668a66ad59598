"""vLLM's `rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)`
(vllm._custom_ops) on ropejit: in place, one launch for query and key. `forward_cuda(rope,
positions, query, key=None, offsets=None)` is the call vLLM's models make through
`RotaryEmbedding.forward_cuda`, given the module (or anything with its head_size,
is_neox_style and cos_sin_cache): any get_rope variant, since the scaled ones differ only in
the cache they build.

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
