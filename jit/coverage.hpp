// Which keys the kernel templates can express in this build. The key space (Spec) runs ahead of
// the kernels: values whose device code has not landed must be refused by everything that would
// compile them, not compiled into a kernel that silently ignores them.
#pragma once

#include <string>

#include "ropejit/ropejit.hpp"

namespace ropejit::detail {

// "" when templates/ renders every axis value of the canonical spec; else the first value it
// does not, e.g. "freqs comp-yarn". Update it as each kernel lands (jit/call.cpp refuses calls
// with the same values).
std::string missing_kernel(const Spec& canonical);

// Throws Error (invalid_argument) "KEY: freqs comp-yarn has no kernel in this build yet" when
// missing_kernel() names something.
void require_kernel(const Spec& canonical);

}  // namespace ropejit::detail
