#!/usr/bin/env bash
# One entry point for a fresh machine: fetch dependencies (no root needed), configure, build,
# then run the demo or the tests.
#   tools/dev.sh demo [ARGS...]   build, then `ropejit demo ARGS`
#   tools/dev.sh test             build, then ctest (GPU tests excluded, visibly, without a GPU)
#   tools/dev.sh build            build only
# ROPEJIT_BUILD_DIR picks the build folder (default build), ROPEJIT_CMAKE_ARGS adds -D options.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-build}
shift || true
build=${ROPEJIT_BUILD_DIR:-build}
tools/fetch-deps.sh .deps
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  # shellcheck disable=SC2086  # ROPEJIT_CMAKE_ARGS holds extra -D options, split on spaces
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DROPEJIT_WERROR=ON ${ROPEJIT_CMAKE_ARGS:-}
fi
cmake --build "$build" -j "$(nproc)"

gpu_usable() { "$build/ropejit" info | grep -q '^gpu '; }

case "$what" in
  build) ;;
  demo) "$build/ropejit" demo "$@" ;;
  test)
    cd "$build"
    if gpu_usable; then
      ctest --output-on-failure
    else
      echo "dev.sh: no usable GPU here: tests labelled 'gpu' are excluded (ctest -LE gpu)"
      ctest --output-on-failure -LE gpu
      echo "dev.sh: GPU tests SKIPPED: $(ctest -N -L gpu | tail -1)"
    fi
    ;;
  *) echo "usage: tools/dev.sh demo|test|build" >&2; exit 2 ;;
esac
