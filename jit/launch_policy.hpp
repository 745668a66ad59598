// What the engine asks about launches, and nothing more. The engine owns this interface;
// autotune/ implements it (tuning file, heuristic, tune-on-miss) and api/ installs it, so
// jit/ never reaches up into the layer that tunes.
#pragma once

#include <vector>

#include "jit/ffn.hpp"
#include "jit/launch_config.hpp"
#include "jit/proj.hpp"

namespace ropejit::detail {

class LaunchPolicy {
 public:
  virtual ~LaunchPolicy() = default;

  // The configuration a call launches with. Asked once per (context, key, token bucket, head
  // counts, alignment); the engine remembers the answer and checks it with illegal_reason().
  // `capturing`: the stream is being captured into a CUDA graph (nothing may be timed).
  virtual LaunchConfig choose(const Spec& canonical, const CallShape& shape,
                              const DeviceInfo& device, bool capturing) = 0;

  // Every kernel variant choose() may return for this key at this call's alignment, whatever
  // the sizes. The engine prepares them all on the key's first use, so a later shape never
  // loads a module (which inside a graph capture it could not).
  virtual std::vector<KernelVariant> variants(const Spec& canonical, const CallShape& shape,
                                              const DeviceInfo& device) = 0;

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

  // The FFN's gate/up (jit/ffn.hpp), the same three questions; `shape` is the call's view as a
  // projection (one column pair per intermediate column).
  virtual ProjVariant choose_ffn(const FfnSpec& canonical, const ProjShape& shape,
                                 const DeviceInfo& device) = 0;
  virtual std::vector<ProjVariant> ffn_variants(const FfnSpec& canonical,
                                                const DeviceInfo& device) = 0;
  virtual ProjPath choose_ffn_path(const FfnSpec& canonical, const ProjShape& shape,
                                   const DeviceInfo& device) = 0;
};

}  // namespace ropejit::detail
