// The FFN gate/up half's call checks, argument blocks and rendering.
#include "jit/decode/ffn.hpp"

#include <cfloat>
#include <cmath>
#include <map>
#include <utility>

#include "jit/call.hpp"
#include "jit/decode/dequant.hpp"
#include "jit/decode/norm.hpp"
#include "jit/embedded.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"
#include "jit/names.hpp"

namespace ropejit::detail {
namespace {

constexpr int64_t kMaxIntermediate = int64_t(1) << 24;
constexpr int64_t kMaxGridY = 65535;

}  // namespace

FfnShape check_ffn_call(const FfnSpec& c, const FfnArgs& a) {
  FfnShape s;
  const int64_t elem = element_bytes(c.dtype);
  if (!is_valid(a.path)) invalid("args.path (", int32_t(a.path), ") is not a known value");
  if (a.tokens < 0) invalid("args.tokens (", a.tokens, ") must be >= 0");
  if (a.tokens > kMaxGridY * 8)
    invalid("args.tokens (", a.tokens, ") exceeds ", kMaxGridY * 8,
            "; the FFN's gate/up is for decode-sized calls");
  const bool w8 = c.weights == Weights::e4m3;
  const int64_t welem = w8 ? 1 : elem;
  check_hidden(a.hidden, c.weights);
  if (a.intermediate < 1 || a.intermediate > kMaxIntermediate)
    invalid("args.intermediate (", a.intermediate, ") must be in [1, ", kMaxIntermediate, "]");
  s.tokens = a.tokens;
  s.hidden = a.hidden;
  s.intermediate = a.intermediate;
  const int64_t x_stride = a.x_stride == 0 ? a.hidden : a.x_stride;
  const int64_t w_stride = a.weight_stride == 0 ? a.hidden : a.weight_stride;
  const int64_t out_stride = a.out_stride == 0 ? a.intermediate : a.out_stride;
  check_matrix("args.x", "args.x_stride", a.x, a.tokens, a.hidden, x_stride, elem);
  check_matrix("args.gate_weight", "args.weight_stride", a.gate_weight, a.intermediate, a.hidden,
               w_stride, welem);
  check_matrix("args.up_weight", "args.weight_stride", a.up_weight, a.intermediate, a.hidden,
               w_stride, welem);
  if (w8) {
    const std::pair<const char*, const float*> scales[] = {{"args.gate_scale", a.gate_scale},
                                                           {"args.up_scale", a.up_scale}};
    for (const auto& [name, p] : scales) {
      if (!p) invalid(name, " is null but spec.weights is e4m3");
      if (reinterpret_cast<uintptr_t>(p) % 4 != 0)
        invalid(name, " (", static_cast<const void*>(p), ") is not aligned to its 4-byte floats");
    }
  }
  if (c.norm != Norm::none) {
    if (!a.norm_weight) invalid("args.norm_weight is null but spec.norm is ", to_string(c.norm));
    check_matrix("args.norm_weight", "args.hidden", a.norm_weight, 1, a.hidden, a.hidden, elem);
    check_norm_eps(a.norm_eps);
  }
  if (!a.out) invalid("args.out is null");
  if (reinterpret_cast<uintptr_t>(a.out) % uintptr_t(elem) != 0)
    invalid("args.out (", a.out, ") is not aligned to its ", elem, "-byte elements");
  if (out_stride < a.intermediate)
    invalid("args.out_stride (", out_stride, ") is smaller than a row (", a.intermediate,
            " elements)");
  int64_t span = 0;
  if (__builtin_mul_overflow(std::max<int64_t>(a.tokens, 1), out_stride, &span) ||
      __builtin_mul_overflow(span, elem, &span) ||
      reinterpret_cast<uintptr_t>(a.out) > UINTPTR_MAX - uint64_t(span))
    invalid("args.out: ", a.tokens, " rows of ", out_stride, " elements overflow 64-bit offsets");

  if (a.tokens > 0) {
    const Range written = range_of("args.out", a.out, a.tokens, out_stride, a.intermediate, elem);
    const Range inputs[] = {
        range_of("args.x", a.x, a.tokens, x_stride, a.hidden, elem),
        range_of("args.gate_weight", a.gate_weight, a.intermediate, w_stride, a.hidden, welem),
        range_of("args.up_weight", a.up_weight, a.intermediate, w_stride, a.hidden, welem),
        range_of("args.norm_weight", c.norm != Norm::none ? a.norm_weight : nullptr, 1, a.hidden,
                 a.hidden, elem),
        range_of("args.gate_scale", w8 ? a.gate_scale : nullptr, a.intermediate, 1, 1, 4),
        range_of("args.up_scale", w8 ? a.up_scale : nullptr, a.intermediate, 1, 1, 4)};
    check_untouched(&written, 1, inputs, std::size(inputs));
    const Range all[] = {inputs[0], inputs[1], inputs[2], inputs[3], inputs[4], inputs[5], written};
    check_workspace(a.workspace, a.workspace_bytes, all, 7);
  }
  if (a.path == ProjPath::unfused)
    if (const std::string why = ffn_split_problem(c, a, s, true); !why.empty())
      invalid(why, " (args.path is unfused)");
  return s;
}

ropejit_dev::ProjParams make_ffn_params(const FfnSpec& c, const FfnArgs& a, const FfnShape& s) {
  ropejit_dev::ProjParams p{};
  p.x = a.x;
  p.norm_w = c.norm != Norm::none ? a.norm_weight : nullptr;
  p.w = a.gate_weight;
  p.w2 = a.up_weight;
  p.w_scale = c.weights == Weights::e4m3 ? a.gate_scale : nullptr;
  p.w2_scale = c.weights == Weights::e4m3 ? a.up_scale : nullptr;
  p.x_stride = a.x_stride == 0 ? a.hidden : a.x_stride;
  p.w_stride = a.weight_stride == 0 ? a.hidden : a.weight_stride;
  p.tokens = s.tokens;
  p.hidden = s.hidden;
  p.pairs = s.intermediate;
  p.out[0].data = a.out;
  p.out[0].stride_token = a.out_stride == 0 ? a.intermediate : a.out_stride;
  p.out[0].heads = 1;
  p.norm_eps = float(a.norm_eps);
  return p;
}

RenderedKernel render(const FfnSpec& c, const ProjVariant& v) {
  const bool w8 = c.weights == Weights::e4m3;
  if (const std::string why = proj_variant_problem(v, w8); !why.empty())
    invalid("projection variant ", v.name(), ": ", why);
  // The projection kernel with its GLU epilogue; the RoPE constants are unused.
  return render_entry(c.key(), v.name(), "proj_entry.cu.in",
                      {
                          {"dtype", std::to_string(int(c.dtype))},
                          {"head_dim", "2"},
                          {"rotary_dim", "0"},
                          {"table_dtype", std::to_string(int(DType::f32))},
                          {"norm", std::to_string(int(c.norm))},
                          {"act", std::to_string(int(c.act))},
                          {"glu", "true"},
                          {"w8", w8 ? "true" : "false"},
                          {"wide", v.wide ? "true" : "false"},
                          {"swap", v.swap ? "true" : "false"},
                          {"rows", std::to_string(v.rows)},
                          {"cache", "0"},
                          {"cache_e4m3", "false"},
                          {"token_tiles", std::to_string(v.token_tiles)},
                          {"splits", std::to_string(v.splits)},
                          {"unroll", std::to_string(v.unroll)},
                          {"cluster", std::to_string(v.cluster)},
                          {"neox", "true"},
                          {"pos_ids", "false"},
                          {"idx64", "false"},
                          {"computed", "false"},
                          {"table_full", "false"},
                          {"threads", std::to_string(v.threads())},
                          {"min_blocks", std::to_string(v.min_blocks(w8, true))},
                      });
}

size_t ffn_product_bytes(const FfnSpec& c, int64_t tokens, int64_t intermediate) {
  size_t bytes = 0;
  int64_t columns = 0;
  if (__builtin_mul_overflow(intermediate, int64_t(2), &columns) ||
      !aligned_product({tokens, columns, element_bytes(c.dtype)}, &bytes))
    invalid("args.tokens (", tokens, ") x 2 x args.intermediate (", intermediate, ") x ",
            element_bytes(c.dtype), " bytes (the gate/up products) overflows size_t");
  return bytes;
}

size_t ffn_workspace_bytes(const FfnSpec& c, int64_t tokens, int64_t hidden, int64_t intermediate) {
  if (intermediate < 1 || intermediate > kMaxIntermediate)  // bounds 2 * intermediate below
    invalid("args.intermediate (", intermediate, ") must be in [1, ", kMaxIntermediate, "]");
  return workspace_sum(
      {norm_workspace_bytes(c.dtype, c.norm, tokens, hidden),
       ffn_product_bytes(c, tokens, intermediate),
       dequant_workspace_bytes(c.dtype, c.weights, hidden, 2 * intermediate), kGemmWorkspaceBytes},
      concat("args.tokens (", tokens, "), args.hidden (", hidden, ") and args.intermediate (",
             intermediate, ")"));
}

std::string ffn_split_problem(const FfnSpec& c, const FfnArgs& a, const FfnShape& s,
                              bool need_workspace) {
  const int64_t elem = element_bytes(c.dtype);
  if (c.norm != Norm::none && s.hidden * elem > int64_t(kNormThreads) * 16 * 16)
    return concat("args.hidden (", s.hidden, ") exceeds the RMSNorm key's ",
                  int64_t(kNormThreads) * 16 * 16 / elem, " elements per row (unfused path)");
  if (need_workspace) {
    const size_t need = ffn_workspace_bytes(c, s.tokens, s.hidden, s.intermediate);
    if (!a.workspace)
      return concat("args.workspace is null; the unfused path needs ", need,
                    " bytes (ffn_gate_up_workspace_bytes)");
    if (a.workspace_bytes < need)
      return concat("args.workspace_bytes (", a.workspace_bytes, ") is smaller than the ", need,
                    " bytes the unfused path needs at ", s.tokens, " tokens of ", s.hidden, " -> ",
                    s.intermediate, " (ffn_gate_up_workspace_bytes)");
  }
  return "";
}

std::string glu_key(const FfnSpec& c) {
  return std::string("glu_") + to_string(c.dtype) + '_' + to_string(c.act);
}

RenderedKernel render_glu(const FfnSpec& c, const GluVariant& v) {
  if (v.vec != 1 && v.vec != 8) invalid("GLU variant ", v.name(), ": vec must be 1 or 8");
  return render_entry(glu_key(c), v.name(), "glu_entry.cu.in",
                      {
                          {"dtype", std::to_string(int(c.dtype))},
                          {"act", std::to_string(int(c.act))},
                          {"vec", std::to_string(v.vec)},
                          {"threads", std::to_string(kGluThreads)},
                      });
}

}  // namespace ropejit::detail
