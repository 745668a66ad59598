"""TransformerEngine's `apply_rotary_pos_emb(t, freqs, tensor_format="sbhd",
start_positions=None, interleaved=False, fused=False, cu_seqlens=None, cp_size=1, cp_rank=0)`
(transformer_engine.pytorch) on ropejit: sbhd, bshd and thd, per-sequence start positions,
context parallelism, forward and backward.

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
- a position beyond freqs' rows gives NaN for that token (cp_size 1)."""

import torch

from ropejit import ops
from ropejit.errors import InvalidArgument

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
    if cp_size > 1 and start_positions is not None:
        _fail("start_positions with cp_size > 1 is not supported (as in TransformerEngine)")
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
