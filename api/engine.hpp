// The engine as the public entry points use it: jit/'s engine with autotune/'s launch policy
// installed. This is the one place where the two layers meet.
#pragma once

#include "jit/decode/engine.hpp"
#include "jit/engine.hpp"
#include "jit/mla/engine.hpp"

namespace ropejit::api {

// The process's engine, its launch policy installed on first use. Everything that launches
// without an explicit configuration (apply(), the command, tests, benchmarks) goes through it.
detail::Engine& engine();
// The decode families' engine (on the same core engine), its policy installed on first use.
detail::DecodeEngine& decode_engine();

}  // namespace ropejit::api
