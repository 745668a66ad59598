// RMSNorm's variants, call checks, argument block and rendering.
#include "jit/decode/norm.hpp"

#include <cfloat>
#include <cmath>
#include <map>

#include "jit/call.hpp"
#include "jit/embedded.hpp"
#include "jit/errors.hpp"
#include "jit/launch_config.hpp"

namespace ropejit::detail {
namespace {

constexpr int32_t kMaxVecs = 16;
constexpr int64_t kMaxRows = 2147483647;  // gridDim.x

// A [rows][hidden] matrix of 16-byte rows, `stride` apart; `written`: rows may not overlap.
Operand check_rows(const char* name, const void* p, int64_t rows, int64_t hidden, int64_t stride,
                   int64_t elem, bool written) {
  if (!p) invalid(name, " is null");
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    invalid(name, " (", p, ") is not 16-byte aligned (the kernel reads 16-byte vectors)");
  if (stride % (16 / elem) != 0)
    invalid(name, " stride (", stride, ") is not a multiple of ", 16 / elem,
            " elements (16-byte rows)");
  if (written && rows > 1 && stride < hidden)
    invalid(name, " stride (", stride, ") makes rows overlap (needs >= ", hidden, ")");
  Operand op;
  const Dims dims = {Dim{stride, rows, "stride"}, Dim{0, 1, "-"}, Dim{0, 1, "-"}};
  check_strided(name, p, dims, hidden, elem, written, &op);
  return op;
}

}  // namespace

std::string NormVariant::name() const { return concat('v', vecs); }

NormShape check_norm_call(const RmsNormSpec& c, const RmsNormArgs& a) {
  NormShape s;
  const int64_t elem = element_bytes(c.dtype);
  const int64_t per = 16 / elem;
  if (a.rows < 0 || a.rows > kMaxRows)
    invalid("args.rows (", a.rows, ") must be in [0, ", kMaxRows, "]");
  const int64_t max_hidden = int64_t(kNormThreads) * kMaxVecs * per;
  if (a.hidden < per || a.hidden % per != 0 || a.hidden > max_hidden)
    invalid("args.hidden (", a.hidden, ") must be a multiple of ", per, " in [", per, ", ",
            max_hidden, "] for ", to_string(c.dtype));
  check_norm_eps(a.norm_eps);
  s.rows = a.rows;
  s.hidden = a.hidden;
  const int64_t per_thread = (a.hidden / per + kNormThreads - 1) / kNormThreads;
  while (s.variant.vecs < per_thread) s.variant.vecs *= 2;
  const int64_t xs = a.x_stride ? a.x_stride : a.hidden;
  const int64_t rs = a.residual_stride ? a.residual_stride : a.hidden;
  const int64_t os = a.out_stride ? a.out_stride : a.hidden;
  Operand ops[4];
  size_t n = 0;
  ops[n++] = check_rows("args.x", a.x, a.rows, a.hidden, xs, elem, false);
  ops[n++] = check_rows("args.weight", a.weight, 1, a.hidden, a.hidden, elem, false);
  if (c.residual)
    ops[n++] = check_rows("args.residual", a.residual, a.rows, a.hidden, rs, elem, true);
  ops[n++] = check_rows("args.out", a.out, a.rows, a.hidden, os, elem, true);
  // In place (out == x, same strides) is allowed: each row is read whole before it is written.
  const bool in_place = a.out == a.x && os == xs;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) {
      const Operand& p = ops[i];
      const Operand& q = ops[j];
      if (!(p.written || q.written) || p.first == p.end || q.first == q.end) continue;
      if (p.end <= q.first || q.end <= p.first) continue;
      if (in_place && std::string(p.name) == "args.x" && std::string(q.name) == "args.out")
        continue;
      invalid(p.name, " and ", q.name, " overlap in memory and one is written (only out == x ",
              "with equal strides may share memory)");
    }
  return s;
}

ropejit_dev::NormParams make_norm_params(const RmsNormSpec& c, const RmsNormArgs& a) {
  ropejit_dev::NormParams p{};
  p.x = a.x;
  p.residual = c.residual ? a.residual : nullptr;
  p.w = a.weight;
  p.out = a.out;
  p.x_stride = a.x_stride ? a.x_stride : a.hidden;
  p.residual_stride = a.residual_stride ? a.residual_stride : a.hidden;
  p.out_stride = a.out_stride ? a.out_stride : a.hidden;
  p.rows = a.rows;
  p.hidden = a.hidden;
  p.eps = float(a.norm_eps);
  return p;
}

RenderedKernel render(const RmsNormSpec& c, const NormVariant& v) {
  if (v.vecs < 1 || v.vecs > kMaxVecs || (v.vecs & (v.vecs - 1)) != 0)
    invalid("RMSNorm variant ", v.name(), ": vecs must be 1, 2, 4, 8 or 16");
  return render_entry(c.key(), v.name(), "norm_entry.cu.in",
                      {
                          {"dtype", std::to_string(int(c.dtype))},
                          {"vecs", std::to_string(v.vecs)},
                          {"one_plus", flag(c.norm == Norm::rms_one_plus)},
                          {"residual", flag(c.residual)},
                          {"threads", std::to_string(kNormThreads)},
                      });
}

}  // namespace ropejit::detail
