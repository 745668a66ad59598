// What the decode families' engine asks about launches (the RoPE engine's questions are
// jit/launch_policy.hpp's). autotune/ implements both and api/ installs them, so jit/ never
// reaches up into the layer that tunes.
#pragma once

#include <vector>

#include "jit/decode/ffn.hpp"
#include "jit/decode/proj.hpp"
#include "jit/launch_config.hpp"

namespace ropejit::detail {

class DecodePolicy {
 public:
  virtual ~DecodePolicy() = default;

  // The decode block's QKV projection: the variant a call launches with (asked once per
  // context, key and token tiles), and every variant that may return for the key at the
  // shape's hidden size and head counts (any token count; `shape.pairs` 0: any shape's
  // variants that do not depend on it), which the engine compiles and loads together on the
  // first use of a key and shape.
  virtual ProjVariant choose_proj(const QkvProjSpec& canonical, const ProjShape& shape,
                                  const DeviceInfo& device) = 0;
  virtual std::vector<ProjVariant> proj_variants(const QkvProjSpec& canonical,
                                                 const ProjShape& shape,
                                                 const DeviceInfo& device) = 0;
  // The projection's path for calls of this shape (fused or unfused; asked once per context,
  // key, token bucket proj_path_bucket(tokens), hidden size and head counts). An unfused answer
  // is taken only where the call allows it (workspace, output layout, cuBLASLt present).
  virtual ProjPath choose_proj_path(const QkvProjSpec& canonical, const ProjShape& shape,
                                    const DeviceInfo& device) = 0;

  // The FFN's gate/up (jit/decode/ffn.hpp), the same three questions; `shape` is the call's
  // view as a projection (one column pair per intermediate column).
  virtual ProjVariant choose_ffn(const FfnSpec& canonical, const ProjShape& shape,
                                 const DeviceInfo& device) = 0;
  virtual std::vector<ProjVariant> ffn_variants(const FfnSpec& canonical,
                                                const DeviceInfo& device) = 0;
  virtual ProjPath choose_ffn_path(const FfnSpec& canonical, const ProjShape& shape,
                                   const DeviceInfo& device) = 0;
};

}  // namespace ropejit::detail
