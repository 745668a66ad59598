// autotune's answer to the engine's LaunchPolicy: the tuning file, else the built-in heuristic,
// with optional tuning on a miss.
#pragma once

#include <string>
#include <vector>

#include "jit/decode/policy.hpp"
#include "jit/launch_config.hpp"
#include "jit/launch_policy.hpp"

namespace ropejit::autotune {

// How the tuning file is used (ROPEJIT_TUNING=off|use|auto|frozen, default use;
// ROPEJIT_AUTOTUNE=1 is the same as auto).
enum class TuningMode {
  off,       // built-in heuristic only
  use,       // tuned entry if present, else the heuristic
  autotune,  // tuned entry if present, else tune now (never during graph capture) and save
  frozen,    // tuned entry required: a miss is an error (deployments that must not tune)
};
TuningMode tuning_mode();

// The built-in heuristic's launch for a call shape (autotune/heuristic.cpp says why).
detail::LaunchConfig heuristic_config(const Spec& canonical, const detail::CallShape& shape,
                                      const detail::DeviceInfo& device);

// The configuration a call launches with: tuning file -> heuristic, per tuning_mode().
// Runs once per (context, key, token bucket, heads, alignment); the engine remembers it.
// `capturing`: the stream is being captured into a graph, so tuning is not allowed.
detail::LaunchConfig select_config(const Spec& canonical, const detail::CallShape& shape,
                                   const detail::DeviceInfo& device, bool capturing);

// Every kernel variant select_config() may choose for `canonical` at this call's alignment,
// whatever the token and head counts: the default variants (jit/launch_config.hpp), then those of
// the tuning file's entries for the key that the alignment allows (none with ROPEJIT_TUNING=off).
// The engine loads them all when it plans a call, so a later shape never loads a module, not even
// inside a CUDA graph capture (a decode bucket whose tuned kernel differs from prefill's, say).
std::vector<detail::KernelVariant> policy_variants(const Spec& canonical,
                                                   const detail::CallShape& shape,
                                                   const detail::DeviceInfo& device);

// The QKV projection's variant for a call (autotune/decode/proj_heuristic.cpp), and every variant
// it may return for a key (compiled together on the key's first use).
detail::ProjVariant proj_heuristic(const QkvProjSpec& canonical, const detail::ProjShape& shape,
                                   const detail::DeviceInfo& device);
// `shape`'s hidden size and head counts fix the grid's columns, so the clusters the heuristic can
// pick for it at any token count; with shape.pairs 0 the variants without clusters.
std::vector<detail::ProjVariant> proj_heuristic_variants(const QkvProjSpec& canonical,
                                                         const detail::ProjShape& shape,
                                                         const detail::DeviceInfo& device);

// The QKV projection's path for a call shape: the heuristic's (fused up to 16 tokens), and the
// tuning file's projection entry for the shape's token bucket where there is one (ROPEJIT_TUNING
// off: the heuristic only; a miss is never an error nor tuned on the spot: `ropejit tune --key
// qkvproj_...` measures it).
ProjPath proj_heuristic_path(const QkvProjSpec& canonical, const detail::ProjShape& shape,
                             const detail::DeviceInfo& device);
ProjPath select_proj_path(const QkvProjSpec& canonical, const detail::ProjShape& shape,
                          const detail::DeviceInfo& device);

// The fused kernel's variant for a call: the tuning file's entry for the key, bucket and weight
// shape where it names one this GPU can run (`ropejit tune` times the candidates), else the
// heuristic's; and every variant a key may launch at `shape`'s weight shape (the heuristic's and
// the tuned ones), compiled together on the key's first use.
detail::ProjVariant select_proj_variant(const QkvProjSpec& canonical,
                                        const detail::ProjShape& shape,
                                        const detail::DeviceInfo& device);
std::vector<detail::ProjVariant> select_proj_variants(const QkvProjSpec& canonical,
                                                      const detail::ProjShape& shape,
                                                      const detail::DeviceInfo& device);

// The FFN's gate/up: the same variants as the projection's (by token tiles), the same path rule
// (fused up to 16 tokens) and the tuning file's entry for the key, bucket and weight shape.
detail::ProjVariant ffn_heuristic(const FfnSpec& canonical, const detail::ProjShape& shape,
                                  const detail::DeviceInfo& device);
std::vector<detail::ProjVariant> ffn_heuristic_variants(const FfnSpec& canonical,
                                                        const detail::DeviceInfo& device);
ProjPath ffn_heuristic_path(const FfnSpec& canonical, const detail::ProjShape& shape,
                            const detail::DeviceInfo& device);
ProjPath select_ffn_path(const FfnSpec& canonical, const detail::ProjShape& shape,
                         const detail::DeviceInfo& device);
detail::ProjVariant select_ffn_variant(const FfnSpec& canonical, const detail::ProjShape& shape,
                                       const detail::DeviceInfo& device);
std::vector<detail::ProjVariant> select_ffn_variants(const FfnSpec& canonical,
                                                     const detail::DeviceInfo& device);

// The policy api/ installs in the engine: select_config() and policy_variants() behind
// detail::LaunchPolicy. One per process.
detail::LaunchPolicy& tuning_policy();
// The same policy's answers for the decode families, behind detail::DecodePolicy.
detail::DecodePolicy& decode_tuning_policy();

// Tunings performed in this process (tests: a second process must reuse, not re-time).
size_t tunings_performed();

}  // namespace ropejit::autotune
