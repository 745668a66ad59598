"""ropejit.fused.qk_norm_rope as the torch.library op ``ropejit::qk_norm_rope``: QK-norm, RoPE,
the FP8 or in-place outputs and the KV-cache append in one launch, traceable by torch.compile
and captured by CUDA graphs. Every tensor the kernel writes (q and k in place, q_out, k_out,
the caches, their scales, the skipped counter) is a declared mutated argument and the op returns
nothing, so functionalization orders the writes. ropejit.ops re-exports the callable wrapper."""

from typing import List, Optional

import torch
from torch import Tensor

from ropejit import _model, fused

# The op's tensor arguments, in schema order, as fused.qk_norm_rope names them.
TENSORS = ("q", "k", "v", "cos", "sin", "position_ids", "seq_offsets", "cu_seqlens",
           "q_norm_weight", "k_norm_weight", "q_out", "k_out", "k_cache", "v_cache", "kv_indptr",
           "kv_indices", "kv_last_page_len", "slot_mapping", "cache_seqlens", "skipped",
           "q_out_scale", "k_out_scale", "k_cache_scales", "v_cache_scales")
MUTATED = ("q", "k", "q_out", "k_out", "k_cache", "v_cache", "skipped", "q_out_scale",
           "k_out_scale", "k_cache_scales", "v_cache_scales")
# The other arguments, in schema order. A ropejit.Scaling travels as Scaling.to_list() (empty:
# none) and mRoPE as its three sections, as in ropejit::rope.
OPTIONS = ("layout", "style", "rotary_dim", "position_offset", "base", "freqs", "scaling",
           "seq_len", "mrope_section", "mrope_interleaved", "norm", "norm_eps", "out_scale",
           "write_k", "kv_layout", "k_scale", "v_scale")


def _impl(q: Tensor, k: Optional[Tensor], v: Optional[Tensor], cos: Optional[Tensor],
          sin: Optional[Tensor], position_ids: Optional[Tensor], seq_offsets: Optional[Tensor],
          cu_seqlens: Optional[Tensor], q_norm_weight: Optional[Tensor],
          k_norm_weight: Optional[Tensor], q_out: Optional[Tensor], k_out: Optional[Tensor],
          k_cache: Optional[Tensor], v_cache: Optional[Tensor], kv_indptr: Optional[Tensor],
          kv_indices: Optional[Tensor], kv_last_page_len: Optional[Tensor],
          slot_mapping: Optional[Tensor], cache_seqlens: Optional[Tensor],
          skipped: Optional[Tensor], q_out_scale: Optional[Tensor],
          k_out_scale: Optional[Tensor], k_cache_scales: Optional[Tensor],
          v_cache_scales: Optional[Tensor], layout: str, style: str, rotary_dim: int,
          position_offset: int, base: float, freqs: Optional[str], scaling: List[float],
          seq_len: Optional[int], mrope_section: Optional[List[int]], mrope_interleaved: bool,
          norm: Optional[str], norm_eps: float, out_scale: float, write_k: bool,
          kv_layout: str, k_scale: float, v_scale: float) -> None:
    args = dict(zip(TENSORS + OPTIONS, (
        q, k, v, cos, sin, position_ids, seq_offsets, cu_seqlens, q_norm_weight, k_norm_weight,
        q_out, k_out, k_cache, v_cache, kv_indptr, kv_indices, kv_last_page_len, slot_mapping,
        cache_seqlens, skipped, q_out_scale, k_out_scale, k_cache_scales, v_cache_scales,
        layout, style, rotary_dim, position_offset, base, freqs, scaling, seq_len,
        mrope_section, mrope_interleaved, norm, norm_eps, out_scale, write_k, kv_layout,
        k_scale, v_scale)))
    args["rotary_dim"] = rotary_dim or None
    args["scaling"] = _model.Scaling.from_list(scaling) if scaling else None
    args["mrope_section"] = None if mrope_section is None else tuple(mrope_section)
    fused.qk_norm_rope(**args)


op = torch.library.custom_op("ropejit::qk_norm_rope", _impl, mutates_args=MUTATED)


@op.register_fake
def _fake(*args):
    # The kernel's checks need real addresses (the C API checks overlaps and ranges); a trace
    # only needs to know that nothing is returned. A bad argument fails at the first real call.
    return None
