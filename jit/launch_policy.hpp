// What the engine asks about RoPE launches, and nothing more (the decode families ask
// jit/decode/policy.hpp's questions). The engine owns this interface;
// autotune/ implements it (tuning file, heuristic, tune-on-miss) and api/ installs it, so
// jit/ never reaches up into the layer that tunes.
#pragma once

#include <vector>

#include "jit/launch_config.hpp"

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
};

}  // namespace ropejit::detail
