#!/usr/bin/env bash
# One entry point for a fresh machine: fetch dependencies (no root needed), configure, build,
# then run the demo or the tests.
#   tools/dev.sh demo [ARGS...]   build, then `ropejit demo ARGS`
#   tools/dev.sh test             build, then ctest: the CPU suite, and the GPU suite when
#                                 `ropejit info` sees a GPU (skipped visibly otherwise)
#   tools/dev.sh build            build only
#   tools/dev.sh gpu              say whether this machine can run the GPU suite (no build)
# ROPEJIT_BUILD_DIR picks the build folder (default build), ROPEJIT_CMAKE_ARGS adds -D options.
# For the test of this script (tests/test_dev_sh.cpp): ROPEJIT_SKIP_BUILD=1 uses the build
# folder as it is, ROPEJIT_CTEST replaces the ctest command.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-build}
shift || true
build=${ROPEJIT_BUILD_DIR:-build}

if [ "$what" != gpu ] && [ "${ROPEJIT_SKIP_BUILD:-0}" != 1 ]; then
  tools/fetch-deps.sh .deps
  generator=()
  if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
  if [ ! -f "$build/CMakeCache.txt" ]; then
    # shellcheck disable=SC2086  # ROPEJIT_CMAKE_ARGS holds extra -D options, split on spaces
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DROPEJIT_WERROR=ON ${ROPEJIT_CMAKE_ARGS:-}
  fi
  cmake --build "$build" -j "$(nproc)"
fi
# Absolute from here on: the test step runs ctest from inside the build folder, and a relative
# path to the command once made every GPU host look GPU-less.
build=$(cd "$build" && pwd)
ropejit="$build/ropejit"

# Prints "yes" when ropejit sees a GPU, "no: WHY" when this machine has none. A machine whose
# driver lists a GPU that ropejit cannot use is an error, never a skip: that is how the GPU
# suite went missing on GPU hosts before.
gpu_state() {
  if [ ! -x "$ropejit" ]; then
    echo "dev.sh: $ropejit is missing or not executable; build first (tools/dev.sh build)" >&2
    return 2
  fi
  local info
  if ! info=$("$ropejit" info 2>&1); then
    echo "dev.sh: '$ropejit info' failed:" >&2
    echo "$info" >&2
    return 2
  fi
  if grep -q '^gpu ' <<<"$info"; then
    echo yes
    return 0
  fi
  local driver_gpus=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    driver_gpus=$(nvidia-smi -L 2>/dev/null | grep '^GPU ' || true)
  fi
  if [ -n "$driver_gpus" ]; then
    echo "dev.sh: nvidia-smi lists a GPU but '$ropejit info' finds none:" >&2
    echo "$driver_gpus" >&2
    echo "$info" >&2
    return 2
  fi
  echo "no: $(grep '^driver' <<<"$info" | sed 's/^driver *//')"
}

case "$what" in
  build) ;;
  gpu) gpu_state ;;
  demo) "$ropejit" demo "$@" ;;
  test)
    state=$(gpu_state)
    ctest_cmd=${ROPEJIT_CTEST:-ctest}
    cd "$build"
    if [ "$state" = yes ]; then
      echo "dev.sh: GPU found: running the CPU and GPU suites"
      $ctest_cmd --output-on-failure
    else
      echo "dev.sh: no usable GPU here (${state#no: }): tests labelled 'gpu' are excluded (ctest -LE gpu)"
      $ctest_cmd --output-on-failure -LE gpu
      echo "dev.sh: GPU tests SKIPPED: $($ctest_cmd -N -L gpu | tail -1)"
    fi
    ;;
  *) echo "usage: tools/dev.sh demo|test|build|gpu" >&2; exit 2 ;;
esac
