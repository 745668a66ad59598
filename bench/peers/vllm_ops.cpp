// Registers two of vLLM's fused QK-norm + RoPE entry points as torch operators in the
// `ropejit_vllm_peer` namespace, so that bench/compare_vllm.py can time them beside ropejit in
// one process. The kernels themselves are vLLM's: compare_vllm.py compiles them from a vLLM
// source tree the caller names (csrc/fused_qknorm_rope_kernel.cu and
// csrc/fused_qknorm_rope_cache_kernel.cu); nothing of vLLM is kept in this repository.
// The declarations below copy the two functions' signatures from vLLM's csrc/ops.h
// (vLLM 0.33.0), against PyTorch's stable ABI.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <cstdint>
#include <optional>
#include <string>

void fused_qk_norm_rope(torch::stable::Tensor& qkv, int64_t num_heads_q, int64_t num_heads_k,
                        int64_t num_heads_v, int64_t head_dim, double eps,
                        torch::stable::Tensor& q_weight, torch::stable::Tensor& k_weight,
                        torch::stable::Tensor& cos_sin_cache, bool is_neox,
                        torch::stable::Tensor& position_ids, int64_t forced_token_heads_per_warp);

namespace vllm {
void fused_qknorm_rope_cache(torch::stable::Tensor& q_out, torch::stable::Tensor& k_out,
                             torch::stable::Tensor& v_out, torch::stable::Tensor& qkv,
                             torch::stable::Tensor& q_weight, torch::stable::Tensor& k_weight,
                             torch::stable::Tensor& cos, torch::stable::Tensor& sin,
                             torch::stable::Tensor& positions, torch::stable::Tensor& slot_mapping,
                             torch::stable::Tensor& k_cache, torch::stable::Tensor& v_cache,
                             int64_t head_dim, int64_t num_q_heads, int64_t num_kv_heads,
                             int64_t rotary_pairs, double epsilon, double norm_weight_bias,
                             const std::string& kv_cache_dtype,
                             std::optional<torch::stable::Tensor> k_scale,
                             std::optional<torch::stable::Tensor> v_scale);
}  // namespace vllm

STABLE_TORCH_LIBRARY(ropejit_vllm_peer, ops) {
  ops.def(
      "fused_qk_norm_rope(Tensor! qkv, int num_heads_q, int num_heads_k, int num_heads_v, "
      "int head_dim, float eps, Tensor q_weight, Tensor k_weight, Tensor cos_sin_cache, "
      "bool is_neox, Tensor position_ids, int forced_token_heads_per_warp=-1) -> ()");
  ops.def(
      "fused_qknorm_rope_cache(Tensor! q_out, Tensor! k_out, Tensor! v_out, Tensor qkv, "
      "Tensor q_weight, Tensor k_weight, Tensor cos, Tensor sin, Tensor positions, "
      "Tensor slot_mapping, Tensor! k_cache, Tensor! v_cache, int head_dim, int num_q_heads, "
      "int num_kv_heads, int rotary_pairs, float epsilon, float norm_weight_bias, "
      "str kv_cache_dtype=\"auto\", Tensor? k_scale=None, Tensor? v_scale=None) -> ()");
}

STABLE_TORCH_LIBRARY_IMPL(ropejit_vllm_peer, CUDA, ops) {
  ops.impl("fused_qk_norm_rope", TORCH_BOX(&fused_qk_norm_rope));
  ops.impl("fused_qknorm_rope_cache", TORCH_BOX(&vllm::fused_qknorm_rope_cache));
}
