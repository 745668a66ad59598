"""The decode block as torch.library ops: RMSNorm (with the residual add), the QKV projection
(RMSNorm -> packed projection -> RoPE, optionally k and v appended to a KV cache) and the FFN's
gate/up. Each op's fake implementation runs the Python checks of ropejit.decode and allocates
its outputs, so torch.compile(fullgraph=True) traces them; caches, the residual and counters are
declared as mutated arguments, so functionalization and CUDA graphs see the writes. ropejit.ops
re-exports the callable wrappers."""

from typing import Optional

import torch
from torch import Tensor

from ropejit import decode


def _rms_norm_impl(x: Tensor, weight: Tensor, residual: Optional[Tensor], eps: float,
                   norm: str) -> Tensor:
    return decode.rms_norm(x, weight, eps, residual=residual, norm=norm)


rms_norm_op = torch.library.custom_op("ropejit::rms_norm", _rms_norm_impl,
                                      mutates_args=("residual",))


@rms_norm_op.register_fake
def _rms_norm_fake(x, weight, residual, eps, norm):
    return decode.rms_norm(x, weight, eps, residual=residual, norm=norm, _fake=True)


def _rms_norm_plain_impl(x: Tensor, weight: Tensor, eps: float, norm: str) -> Tensor:
    return decode.rms_norm(x, weight, eps, norm=norm)


# RMSNorm without the residual: an op that mutates nothing (inductor cannot lower the
# functionalized form of an op whose mutable arguments are all None).
rms_norm_plain_op = torch.library.custom_op("ropejit::rms_norm_plain", _rms_norm_plain_impl,
                                            mutates_args=())


@rms_norm_plain_op.register_fake
def _rms_norm_plain_fake(x, weight, eps, norm):
    return decode.rms_norm(x, weight, eps, norm=norm, _fake=True)


def _qkv_projection_impl(x: Tensor, weight: Tensor, norm_weight: Optional[Tensor],
                         weight_scale: Optional[Tensor], position_ids: Optional[Tensor],
                         cos: Optional[Tensor], sin: Optional[Tensor], k_cache: Optional[Tensor],
                         v_cache: Optional[Tensor], slot_mapping: Optional[Tensor],
                         kv_indptr: Optional[Tensor], kv_indices: Optional[Tensor],
                         kv_last_page_len: Optional[Tensor], cache_seqlens: Optional[Tensor],
                         cu_seqlens: Optional[Tensor], skipped: Optional[Tensor],
                         k_cache_scales: Optional[Tensor], v_cache_scales: Optional[Tensor],
                         q_heads: int, kv_heads: int, head_dim: int, rotary_dim: int, norm: str,
                         eps: float, position_offset: int, base: float, style: str, path: str,
                         k_scale: float, v_scale: float, write_kv: bool, kv_layout: str = "NHD",
                         bias: Optional[Tensor] = None, _fake: bool = False) -> Tensor:
    return decode.qkv_projection(
        x, weight, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
        rotary_dim=rotary_dim or None, norm_weight=norm_weight, eps=eps, norm=norm,
        position_ids=position_ids, position_offset=position_offset, cos=cos, sin=sin, base=base,
        style=style, path=path, weight_scale=weight_scale, k_cache=k_cache, v_cache=v_cache,
        slot_mapping=slot_mapping, kv_indptr=kv_indptr, kv_indices=kv_indices,
        kv_last_page_len=kv_last_page_len, cache_seqlens=cache_seqlens, k_scale=k_scale,
        v_scale=v_scale, skipped=skipped, write_kv=write_kv, cu_seqlens=cu_seqlens,
        k_cache_scales=k_cache_scales, v_cache_scales=v_cache_scales, kv_layout=kv_layout,
        bias=bias, _packed=True, _fake=_fake)


def _qkv_projection_op_impl(x: Tensor, weight: Tensor, norm_weight: Optional[Tensor],
                            weight_scale: Optional[Tensor], position_ids: Optional[Tensor],
                            cos: Optional[Tensor], sin: Optional[Tensor],
                            k_cache: Optional[Tensor], v_cache: Optional[Tensor],
                            slot_mapping: Optional[Tensor], kv_indptr: Optional[Tensor],
                            kv_indices: Optional[Tensor], kv_last_page_len: Optional[Tensor],
                            cache_seqlens: Optional[Tensor], cu_seqlens: Optional[Tensor],
                            skipped: Optional[Tensor], k_cache_scales: Optional[Tensor],
                            v_cache_scales: Optional[Tensor], q_heads: int, kv_heads: int,
                            head_dim: int, rotary_dim: int, norm: str, eps: float,
                            position_offset: int, base: float, style: str, path: str,
                            k_scale: float, v_scale: float, write_kv: bool,
                            kv_layout: str, bias: Optional[Tensor] = None) -> Tensor:
    # The op's schema is inferred from these annotations; the private _fake flag stays out.
    return _qkv_projection_impl(x, weight, norm_weight, weight_scale, position_ids, cos, sin,
                                k_cache, v_cache, slot_mapping, kv_indptr, kv_indices,
                                kv_last_page_len, cache_seqlens, cu_seqlens, skipped,
                                k_cache_scales, v_cache_scales, q_heads, kv_heads, head_dim,
                                rotary_dim, norm, eps, position_offset, base, style, path,
                                k_scale, v_scale, write_kv, kv_layout, bias)


# q, k and v are views of one [tokens, q_heads + 2 kv_heads, head_dim] tensor: the op returns it
# whole (outputs of a custom op may not alias each other) and the wrapper splits it.
qkv_projection_op = torch.library.custom_op(
    "ropejit::qkv_projection", _qkv_projection_op_impl,
    mutates_args=("k_cache", "v_cache", "skipped", "k_cache_scales", "v_cache_scales"))


@qkv_projection_op.register_fake
def _qkv_projection_fake(*args):
    return _qkv_projection_impl(*args, _fake=True)


_NO_CACHE = (None,) * 11  # k_cache .. v_cache_scales


def _qkv_projection_plain_impl(x: Tensor, weight: Tensor, norm_weight: Optional[Tensor],
                               weight_scale: Optional[Tensor], position_ids: Optional[Tensor],
                               cos: Optional[Tensor], sin: Optional[Tensor], q_heads: int,
                               kv_heads: int, head_dim: int, rotary_dim: int, norm: str,
                               eps: float, position_offset: int, base: float, style: str,
                               path: str, bias: Optional[Tensor] = None,
                               _fake: bool = False) -> Tensor:
    return _qkv_projection_impl(x, weight, norm_weight, weight_scale, position_ids, cos, sin,
                                *_NO_CACHE, q_heads, kv_heads, head_dim, rotary_dim, norm, eps,
                                position_offset, base, style, path, 1.0, 1.0, True, "NHD", bias,
                                _fake=_fake)


def _qkv_projection_plain_op_impl(x: Tensor, weight: Tensor, norm_weight: Optional[Tensor],
                                  weight_scale: Optional[Tensor], position_ids: Optional[Tensor],
                                  cos: Optional[Tensor], sin: Optional[Tensor], q_heads: int,
                                  kv_heads: int, head_dim: int, rotary_dim: int, norm: str,
                                  eps: float, position_offset: int, base: float, style: str,
                                  path: str, bias: Optional[Tensor] = None) -> Tensor:
    return _qkv_projection_plain_impl(x, weight, norm_weight, weight_scale, position_ids, cos,
                                      sin, q_heads, kv_heads, head_dim, rotary_dim, norm, eps,
                                      position_offset, base, style, path, bias)


# The projection without a KV cache: an op that mutates nothing. Inductor cannot lower the
# functionalized form of an op whose mutable arguments are all None.
qkv_projection_plain_op = torch.library.custom_op(
    "ropejit::qkv_projection_plain", _qkv_projection_plain_op_impl, mutates_args=())


@qkv_projection_plain_op.register_fake
def _qkv_projection_plain_fake(*args):
    return _qkv_projection_plain_impl(*args, _fake=True)


def _ffn_gate_up_impl(x: Tensor, gate_weight: Tensor, up_weight: Tensor,
                      norm_weight: Optional[Tensor], gate_scale: Optional[Tensor],
                      up_scale: Optional[Tensor], eps: float, norm: str, act: str,
                      path: str) -> Tensor:
    return decode.ffn_gate_up(x, gate_weight=gate_weight, up_weight=up_weight,
                              norm_weight=norm_weight, eps=eps, norm=norm, act=act, path=path,
                              gate_scale=gate_scale, up_scale=up_scale)


ffn_gate_up_op = torch.library.custom_op("ropejit::ffn_gate_up", _ffn_gate_up_impl,
                                         mutates_args=())


@ffn_gate_up_op.register_fake
def _ffn_gate_up_fake(x, gate_weight, up_weight, norm_weight, gate_scale, up_scale, eps, norm,
                      act, path):
    return decode.ffn_gate_up(x, gate_weight=gate_weight, up_weight=up_weight,
                              norm_weight=norm_weight, eps=eps, norm=norm, act=act, path=path,
                              gate_scale=gate_scale, up_scale=up_scale, _fake=True)
