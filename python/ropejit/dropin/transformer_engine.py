"""TransformerEngine's `apply_rotary_pos_emb(t, freqs, tensor_format="sbhd",
start_positions=None, interleaved=False, fused=False, cu_seqlens=None, cp_size=1, cp_rank=0)`
(transformer_engine.pytorch) on ropejit: sbhd, bshd and thd, per-sequence start positions,
context parallelism, forward and backward. `apply_fused_qkv_rotary_pos_emb(qkv, q_freqs,
k_freqs, qkv_split_arg_list, tensor_format="sbhd", start_positions=None, interleaved=False,
cu_seqlens=None, cp_size=1, cp_rank=0)` takes the packed QKV projection (Megatron's grouped layout) and
returns q and k rotated and v, one launch for q and k when they share their freqs.

Context parallelism (cp_size > 1) follows TE's load-balanced split: each sequence of
cp_size * s tokens is cut into 2 * cp_size chunks, and rank r holds chunks r and
2 * cp_size - 1 - r, so its local token j of a sequence of local length s (even) sits at
position r * s/2 + j in the first half and cp_size * s - (r + 1) * s/2 + (j - s/2) in the
second. For thd, cu_seqlens is the padded one of the whole sequences (TE's cu_seqlens_padded),
and each sequence's local length is its share, cu_seqlens // cp_size.

Differences from TransformerEngine's:
- freqs holds angles, so each call computes their cos/sin (two small fp32 tables, as TE's
  unfused path does); with cp_size > 1 the table is the rank's rows, gathered per call (and for
  thd, one row per token, with one host check that every position is in freqs: a sync). A model
  that keeps its own tables saves that with ropejit.ops.rope.
- t that is not contiguous is copied first (the kernel reads rows with a unit last-dimension
  stride); the output is contiguous, as TE's.
- `fused` is accepted and unused: every call is one fused launch.
- the older signature, with interleaved in start_positions' place, is accepted: a bool there is
  taken for interleaved.
- a position beyond freqs' rows gives NaN for that token (cp_size 1).
- apply_fused_qkv_rotary_pos_emb gives each token of each group its position id (one int32
  per row of qkv, made per call), and its gradient is assembled with one concatenation."""

import torch

from ropejit import ops
from ropejit.errors import InvalidArgument
from ropejit.ops import _dense  # a gradient ropejit can read

_FORMATS = ("sbhd", "bshd", "thd")


def _fail(message):
    raise InvalidArgument(f"ropejit: {message}")


def _rank_rows(seqlen, cp_size, cp_rank, device):
    """The positions of a rank's local tokens 0..seqlen-1 in a sequence of cp_size * seqlen."""
    seg = seqlen // 2
    full = cp_size * seqlen
    return torch.cat([torch.arange(cp_rank * seg, (cp_rank + 1) * seg, device=device),
                      torch.arange(full - (cp_rank + 1) * seg, full - cp_rank * seg,
                                   device=device)])


def _thd_rank_rows(cu_local, tokens, cp_size, cp_rank):
    """Per token of a thd batch on this rank, its position in its whole sequence."""
    lengths = (cu_local[1:] - cu_local[:-1]).long()
    seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu_local.device),
                                  lengths, output_size=tokens)
    j = torch.arange(tokens, device=cu_local.device) - cu_local[:-1].long()[seq]
    length = lengths[seq]
    seg = length // 2
    first = cp_rank * seg + j
    second = cp_size * length - (cp_rank + 1) * seg + (j - seg)
    return torch.where(j < seg, first, second)


def _check_cp(t, tensor_format, cp_size, cp_rank, start_positions):
    if isinstance(cp_size, bool) or not isinstance(cp_size, int) or cp_size < 1:
        _fail(f"cp_size ({cp_size!r}) must be an int >= 1")
    if isinstance(cp_rank, bool) or not isinstance(cp_rank, int) or not 0 <= cp_rank < cp_size:
        _fail(f"cp_rank ({cp_rank!r}) must be an int in [0, cp_size ({cp_size}))")
    if cp_size > 1 and tensor_format != "thd":
        seqlen = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
        if seqlen % 2:
            _fail(f"with cp_size {cp_size}, each rank holds two chunks of a sequence: its "
                  f"local sequence length ({seqlen}) must be even")


def apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", start_positions=None, interleaved=False,
                         fused=False, cu_seqlens=None, cp_size=1, cp_rank=0):
    """t: [seq, batch, heads, head_dim] (sbhd), [batch, seq, ...] (bshd) or [tokens, heads,
    head_dim] (thd, with cu_seqlens int32 [batch + 1]); freqs: [rows, 1, 1, rotary_dim] float
    angles (TE's RotaryPositionEmbedding output: [f, f], or f0 f0 f1 f1 ... when interleaved);
    rotary_dim <= head_dim, the rest passes through. start_positions: int tensor [batch], each
    sequence's first position. Returns a new contiguous tensor; differentiable in t."""
    if isinstance(start_positions, bool):
        # The older signature (t, freqs, tensor_format, interleaved, fused, ...): what came in as
        # interleaved is its `fused`, unused.
        start_positions, interleaved = None, start_positions
    if tensor_format not in _FORMATS:
        _fail(f"tensor_format ({tensor_format!r}) must be 'sbhd', 'bshd' or 'thd'")
    if tensor_format == "thd" and cu_seqlens is None:
        _fail("tensor_format 'thd' needs cu_seqlens")
    if not isinstance(freqs, torch.Tensor) or freqs.dim() != 4 or freqs.shape[1] != 1 or \
            freqs.shape[2] != 1:
        _fail(f"freqs must be [rows, 1, 1, rotary_dim], got shape "
              f"{list(getattr(freqs, 'shape', ()))}")
    _check_cp(t, tensor_format, cp_size, cp_rank, start_positions)
    if not t.is_contiguous():
        t = t.contiguous()
    angles = freqs.reshape(freqs.shape[0], freqs.shape[3]).float()
    offsets = start_positions
    if cp_size > 1 and start_positions is not None:
        return _rope_cp_started(t, angles, tensor_format, start_positions, interleaved,
                                cu_seqlens, cp_size, cp_rank, freqs.shape[3])
    if cp_size > 1 and tensor_format == "thd":
        cu_seqlens = torch.div(cu_seqlens, cp_size, rounding_mode="floor").to(torch.int32)
        rows = _thd_rank_rows(cu_seqlens, t.shape[0], cp_size, cp_rank)
        if rows.numel() and int(rows.max()) >= angles.shape[0]:
            _fail(f"freqs has {angles.shape[0]} rows; the sequences of cu_seqlens (x cp_size "
                  f"{cp_size}) need {int(rows.max()) + 1}")
        # One row per token, addressed by its index: sequence b starts at row cu_seqlens[b].
        angles, offsets = angles[rows], cu_seqlens[:-1]
    elif cp_size > 1:
        seqlen = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
        needed = cp_size * seqlen - cp_rank * (seqlen // 2)  # the second chunk's end
        if needed > angles.shape[0]:
            _fail(f"freqs has {angles.shape[0]} rows; rank {cp_rank} of {cp_size} with local "
                  f"sequence length {seqlen} needs {needed}")
        angles = angles[_rank_rows(seqlen, cp_size, cp_rank, angles.device)]
    out, _ = ops.rope(t, cos=torch.cos(angles), sin=torch.sin(angles), layout=tensor_format,
                      style="gptj" if interleaved else "neox", rotary_dim=freqs.shape[3],
                      seq_offsets=offsets, cu_seqlens=cu_seqlens)
    return out


def _rope_cp_started(t, angles, tensor_format, start_positions, interleaved, cu_seqlens,
                     cp_size, cp_rank, rotary_dim):
    """Context parallelism with start positions: each local token's position is its sequence's
    start plus its place in the whole sequence (the rank's two chunks), as TE's unfused path
    offsets the freqs; one position id per token."""
    start = start_positions.to(device=t.device, dtype=torch.long)
    if tensor_format == "thd":
        cu_local = torch.div(cu_seqlens, cp_size, rounding_mode="floor").to(torch.int32)
        lengths = (cu_local[1:] - cu_local[:-1]).long()
        if start.shape != lengths.shape:
            _fail(f"start_positions must be [batch] ({lengths.numel()}), got shape "
                  f"{list(start.shape)}")
        seq = torch.repeat_interleave(torch.arange(lengths.numel(), device=t.device), lengths,
                                      output_size=t.shape[0])
        ids = start[seq] + _thd_rank_rows(cu_local, t.shape[0], cp_size, cp_rank)
    else:
        seqlen, batch = (t.shape[0], t.shape[1]) if tensor_format == "sbhd" else \
            (t.shape[1], t.shape[0])
        if start.shape != (batch,):
            _fail(f"start_positions must be [batch] ({batch}), got shape {list(start.shape)}")
        # Sequence-major, as ropejit reads position ids in every layout.
        ids = (start[:, None] + _rank_rows(seqlen, cp_size, cp_rank, t.device)[None, :]).reshape(-1)
    if ids.numel() and int(ids.max()) >= angles.shape[0]:
        _fail(f"freqs has {angles.shape[0]} rows; start_positions (up to "
              f"{int(start.max())}) with rank {cp_rank} of {cp_size} need {int(ids.max()) + 1}")
    out, _ = ops.rope(t, cos=torch.cos(angles), sin=torch.sin(angles), layout=tensor_format,
                      style="gptj" if interleaved else "neox", rotary_dim=rotary_dim,
                      position_ids=ids)
    return out


def _check_qkv_split(qkv, split):
    """(q, k, v) widths of a group's row, and the head size (k's width: one k and one v head per
    group, q_width / head_size q heads)."""
    if split is None or len(split) != 3 or any(isinstance(n, bool) or not isinstance(n, int)
                                               or n < 1 for n in split):
        _fail(f"qkv_split_arg_list ({split!r}) must be three positive ints: the q, k and v "
              f"widths of a group")
    q, k, v = split
    if qkv.dim() != 4 or q + k + v != qkv.shape[-1]:
        _fail(f"qkv must be [seq, batch, groups, q + k + v] (or [batch, seq, ...]) with the "
              f"widths of qkv_split_arg_list {list(split)} summing to its last dimension, got "
              f"shape {list(qkv.shape)}")
    if k != v or q % k:
        _fail(f"qkv_split_arg_list {list(split)}: k and v are one head each (equal widths) and "
              f"q a whole number of heads of that size")
    return q, k, v


def _group_positions(qkv, tensor_format, seqlen, start_positions, cp_size, cp_rank, rows):
    """Each row of qkv (a token's group), its position: its sequence index, through the rank's
    chunks with cp_size > 1, plus its sequence's start position; int32, one per row."""
    device = qkv.device
    pos = (_rank_rows(seqlen, cp_size, cp_rank, device) if cp_size > 1
           else torch.arange(seqlen, device=device))
    batch, groups = (qkv.shape[1], qkv.shape[2]) if tensor_format == "sbhd" else \
        (qkv.shape[0], qkv.shape[2])
    start = (torch.zeros(batch, dtype=torch.long, device=device) if start_positions is None
             else start_positions.to(device=device, dtype=torch.long))
    if start.shape != (batch,):
        _fail(f"start_positions must be [batch] ({batch}), got shape {list(start.shape)}")
    if tensor_format == "sbhd":
        ids = pos[:, None] + start[None, :]
    else:
        ids = start[:, None] + pos[None, :]
    if cp_size > 1 and seqlen and int(pos.max()) >= rows:
        _fail(f"q_freqs has {rows} rows; rank {cp_rank} of {cp_size} with local sequence length "
              f"{seqlen} needs {int(pos.max()) + 1}")
    return ids[:, :, None].expand(-1, -1, groups).reshape(-1).to(torch.int32)


def _check_freqs(freqs, name):
    if not isinstance(freqs, torch.Tensor) or freqs.dim() != 4 or freqs.shape[1] != 1 or \
            freqs.shape[2] != 1:
        _fail(f"{name} must be [rows, 1, 1, rotary_dim], got shape "
              f"{list(getattr(freqs, 'shape', ()))}")


def _tables(freqs):
    angles = freqs.reshape(freqs.shape[0], freqs.shape[3]).float()
    return torch.cos(angles), torch.sin(angles)


def _rotate_groups(q, k, ids, q_freqs, k_freqs, interleaved, backward):
    """q [1, rows, q heads, d] and k [1, rows, 1, d] rotated at ids: one launch when they share
    their freqs, else one each."""
    style = "gptj" if interleaved else "neox"
    cos, sin = _tables(q_freqs)
    if k_freqs is q_freqs:
        return ops.rope(q, k, cos=cos, sin=sin, layout="bshd", style=style,
                        rotary_dim=q_freqs.shape[3], position_ids=ids, backward=backward)
    k_cos, k_sin = _tables(k_freqs)
    q_out, _ = ops.rope(q, cos=cos, sin=sin, layout="bshd", style=style,
                        rotary_dim=q_freqs.shape[3], position_ids=ids, backward=backward)
    k_out, _ = ops.rope(k, cos=k_cos, sin=k_sin, layout="bshd", style=style,
                        rotary_dim=k_freqs.shape[3], position_ids=ids, backward=backward)
    return q_out, k_out


class _FusedQKVRope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, q_freqs, k_freqs, ids, split, interleaved):
        q_w, k_w, _ = split
        d, n = k_w, qkv.numel() // qkv.shape[-1]
        flat = qkv.reshape(n, qkv.shape[-1])
        q_out, k_out = _rotate_groups(flat[:, :q_w].view(1, n, q_w // d, d),
                                      flat[:, q_w:q_w + k_w].view(1, n, 1, d), ids, q_freqs,
                                      k_freqs, interleaved, False)
        lead = qkv.shape[:2]
        ctx.save_for_backward(q_freqs, k_freqs, ids)
        ctx.shape, ctx.split, ctx.interleaved = qkv.shape, split, interleaved
        ctx.same_freqs = k_freqs is q_freqs
        return (q_out.view(*lead, -1, d), k_out.view(*lead, -1, d),
                flat[:, q_w + k_w:].reshape(*lead, -1, d).contiguous())

    @staticmethod
    def backward(ctx, dq, dk, dv):
        q_freqs, k_freqs, ids = ctx.saved_tensors
        if ctx.same_freqs:
            k_freqs = q_freqs
        q_w, k_w, v_w = ctx.split
        d, n = k_w, ids.numel()
        g_q, g_k = _rotate_groups(_dense(dq.reshape(1, n, q_w // d, d)),
                                  _dense(dk.reshape(1, n, 1, d)), ids, q_freqs, k_freqs,
                                  ctx.interleaved, True)
        grad = torch.cat((g_q.reshape(n, q_w), g_k.reshape(n, k_w), dv.reshape(n, v_w)), dim=1)
        return grad.view(ctx.shape), None, None, None, None, None


def apply_fused_qkv_rotary_pos_emb(qkv, q_freqs, k_freqs, qkv_split_arg_list=None,
                                   tensor_format="sbhd", start_positions=None, interleaved=False,
                                   cu_seqlens=None, cp_size=1, cp_rank=0):
    """qkv: [seq, batch, groups, q + k + v] (sbhd) or [batch, seq, ...] (bshd), each group's row
    holding its q heads, then one k head and one v head (widths qkv_split_arg_list); q_freqs,
    k_freqs: [rows, 1, 1, rotary_dim] float angles as apply_rotary_pos_emb takes them. Returns
    new contiguous (q [.., groups * q heads, head], k [.., groups, head], v [.., groups, head]),
    q and k rotated at each token's position (start_positions and context parallelism as in
    apply_rotary_pos_emb); differentiable in qkv. cu_seqlens is accepted and unused, as in TE
    (packed QKV has no thd form)."""
    del cu_seqlens
    if tensor_format not in ("sbhd", "bshd"):
        _fail(f"tensor_format ({tensor_format!r}) must be 'sbhd' or 'bshd' for packed QKV")
    split = _check_qkv_split(qkv, qkv_split_arg_list)
    _check_cp(qkv, tensor_format, cp_size, cp_rank, start_positions)
    _check_freqs(q_freqs, "q_freqs")
    _check_freqs(k_freqs, "k_freqs")
    seqlen = qkv.shape[0] if tensor_format == "sbhd" else qkv.shape[1]
    ids = _group_positions(qkv, tensor_format, seqlen, start_positions, cp_size, cp_rank,
                           q_freqs.shape[0])
    return _FusedQKVRope.apply(qkv, q_freqs, k_freqs, ids, tuple(split), bool(interleaved))
