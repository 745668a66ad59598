// The engine as the public entry points use it: jit/'s engine with autotune/'s launch policy
// installed. This is the one place where the two layers meet.
#pragma once

#include "jit/engine.hpp"

namespace ropejit::api {

// The process's engine, its launch policy installed on first use. Everything that launches
// without an explicit configuration (apply(), the command, tests, benchmarks) goes through it.
detail::Engine& engine();

}  // namespace ropejit::api
