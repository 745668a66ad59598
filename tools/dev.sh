#!/usr/bin/env bash
# One entry point for a fresh machine: fetch dependencies (no root needed), configure, build,
# then run the demo or the tests.
#   tools/dev.sh demo [ARGS...]   build the library and the command, then `ropejit demo ARGS`
#   tools/dev.sh test             build, then ctest: the CPU suite, and the GPU suite when
#                                 `ropejit info` sees a GPU (skipped visibly otherwise), less
#                                 the sweeps over every variant (label `exhaustive`); beside it
#                                 the Python package (see `python`). Every test process of the
#                                 run shares one fresh kernel cache, so each kernel is compiled
#                                 once per run
#   tools/dev.sh exhaustive       build, then the GPU sweeps over every variant (ctest -L
#                                 exhaustive); run before a change to templates/, jit/ or
#                                 autotune/ lands
#   tools/dev.sh python           pip-install the Python package into BUILD/pyenv, a virtual
#                                 environment that also sees the system's packages (a GPU
#                                 host's torch), and run pytest on tests/python
#   tools/dev.sh build            build only
#   tools/dev.sh gpu              say whether this machine can run the GPU suite (no build)
# ROPEJIT_BUILD_DIR picks the build folder (default build), ROPEJIT_CMAKE_ARGS adds -D options,
# ROPEJIT_PYTHON the interpreter (default python3), ROPEJIT_PIP_ARGS extra pip options (an
# offline host: "--no-index --find-links DIR"), ROPEJIT_CTEST_JOBS and ROPEJIT_PYTEST_JOBS the
# test processes run side by side (default: the cores; pytest at most 16, with pytest-xdist).
# A ROPEJIT_CACHE_DIR set by the caller is used instead of the run's own kernel cache.
# For the test of this script (tests/test_dev_sh.cpp): ROPEJIT_SKIP_BUILD=1 uses the build
# folder as it is, ROPEJIT_CTEST replaces the ctest command, ROPEJIT_PYTEST the Python step.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
what=${1:-build}
shift || true
build=${ROPEJIT_BUILD_DIR:-build}


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

# A virtual environment for the Python package, seeing the system's packages. Without ensurepip
# (Debian's python3 lacking python3-venv, or the base interpreter of an environment made by uv)
# it is made without pip and uses the pip it can see; with none, python3-venv is installed when
# root, else named.
python_env() {
  local env=$1 py=${ROPEJIT_PYTHON:-python3}
  if [ -x "$env/bin/python" ]; then return 0; fi
  if ! "$py" -m venv --system-site-packages "$env" >/dev/null 2>&1; then
    rm -rf "$env"
    "$py" -m venv --system-site-packages --without-pip "$env" || return 2
  fi
  # --system-site-packages reaches the base interpreter's packages only: when $py is itself in a
  # virtual environment (a GPU host's python3 holding torch), a .pth file adds that one's after
  # ours, so the package under test still comes from $env.
  local parent site
  parent=$("$py" -c 'import site, sys
if sys.prefix != sys.base_prefix: print("\n".join(site.getsitepackages()))')
  if [ -n "$parent" ]; then
    site=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\n' "$parent" > "$site/ropejit-dev-parent-env.pth"
  fi
  if "$env/bin/python" -m pip --version >/dev/null 2>&1; then return 0; fi
  rm -rf "$env"
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "dev.sh: no pip for '$py -m venv': installing python3-venv" >&2
    { apt-get install -y -qq python3-venv >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq python3-venv >/dev/null; }; } &&
      "$py" -m venv --system-site-packages "$env" && return 0
  fi
  echo "dev.sh: '$py -m venv' gives no pip: install python3-venv (Debian/Ubuntu) or set ROPEJIT_PYTHON" >&2
  return 2
}

# Builds and installs the package with pip (pyproject.toml: scikit-build-core over this CMake
# project) into BUILD/pyenv, then runs pytest: the CPU tests always, the GPU tests where torch
# sees a GPU (skipped with their reason otherwise, -rs lists them).
python_install() {
  local env="$build/pyenv"
  python_env "$env"
  local py="$env/bin/python" missing
  missing=$("$py" -c 'import importlib.util as u
print(" ".join(p for m, p in (("pytest", "pytest"), ("numpy", "numpy"),
      ("scikit_build_core", "scikit-build-core")) if u.find_spec(m) is None))')
  if [ -n "$missing" ]; then
    echo "dev.sh: installing $missing into $env"
    # shellcheck disable=SC2086
    "$py" -m pip install -q ${ROPEJIT_PIP_ARGS:-} $missing
  fi
  echo "dev.sh: pip install . into $env"
  # The wheel's CMake build is kept in BUILD/wheel: a later run recompiles only what changed.
  # shellcheck disable=SC2086
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$py" -m pip install -q --no-build-isolation --no-deps \
    --force-reinstall -C "build-dir=$build/wheel/{wheel_tag}" ${ROPEJIT_PIP_ARGS:-} .
}

python_pytest() {
  local py="$build/pyenv/bin/python"
  if [ "${state:-}" = yes ] && ! "$py" -c 'import torch' >/dev/null 2>&1; then
    echo "dev.sh: a GPU is here but $py cannot import torch: the Python GPU tests are SKIPPED"
  fi
  local jobs=()
  if "$py" -c 'import xdist' >/dev/null 2>&1; then
    # A worker a core, up to 16 (each holds torch and a CUDA context): once ctest is done,
    # pytest's tail has the host to itself.
    local n=${ROPEJIT_PYTEST_JOBS:-$(nproc)}
    if [ -z "${ROPEJIT_PYTEST_JOBS:-}" ] && [ "$n" -gt 16 ]; then n=16; fi
    if [ "$n" -gt 1 ]; then jobs=(-n "$n"); fi
  fi
  # The slowest cases in the log: what to split when the run outgrows the GPU host's call.
  "$py" -m pytest -rs --durations=15 "${jobs[@]}" tests/python
}

python_tests() {
  if [ -n "${ROPEJIT_PYTEST:-}" ]; then $ROPEJIT_PYTEST; return; fi
  python_install && python_pytest
}

# One kernel cache for every test process of this run (ctest's cases and pytest's workers): a
# kernel is compiled once per run, the per-entry lock making the others wait and load it. Fresh
# per run, so that compiling stays under test; removed at exit. Unless the caller set
# ROPEJIT_CACHE_DIR.
run_scoped_cache() {
  if [ -n "${ROPEJIT_CACHE_DIR+set}" ]; then return 0; fi
  run_cache=$(mktemp -d "$build/test-kernels.XXXXXX")
  export ROPEJIT_CACHE_DIR=$run_cache
}

# At exit: the run's kernel cache goes, and a pip build still running (the C++ build or the GPU
# check failed) is stopped with its compilers (its own process group).
cleanup() {
  if [ -n "${install_pid:-}" ]; then kill -- "-$install_pid" 2>/dev/null || true; fi
  if [ -n "${run_cache:-}" ]; then rm -rf "$run_cache"; fi
}
trap cleanup EXIT

# The test command's pip build of the Python package starts before the C++ build, beside it (both
# compile the library, on the same cores), and pytest starts beside ctest once it is done.
# ROPEJIT_TEST_SERIAL=1 runs the whole Python stage after ctest instead.
install_pid=""
beside=no
if [ "$what" = test ] && [ "${ROPEJIT_TEST_SERIAL:-0}" != 1 ]; then beside=yes; fi
if [ $beside = yes ] && [ -z "${ROPEJIT_PYTEST:-}" ]; then
  mkdir -p "$build/test-logs"
  install_status="$build/test-logs/python-install.status"
  rm -f "$install_status"
  # Job control for this one job: its own process group, which cleanup() can stop whole.
  set -m
  (python_install; echo $? > "$install_status") > "$build/test-logs/python.log" 2>&1 &
  install_pid=$!
  set +m
fi

if [ "$what" != gpu ] && [ "${ROPEJIT_SKIP_BUILD:-0}" != 1 ]; then
  tools/fetch-deps.sh .deps
  generator=()
  if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
  if [ ! -f "$build/CMakeCache.txt" ]; then
    # shellcheck disable=SC2086  # ROPEJIT_CMAKE_ARGS holds extra -D options, split on spaces
    cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DROPEJIT_WERROR=ON ${ROPEJIT_CMAKE_ARGS:-}
  elif { [ "$what" = test ] || [ "$what" = exhaustive ]; } && grep -q '^ROPEJIT_BUILD_TESTS:BOOL=OFF' "$build/CMakeCache.txt"; then
    # A folder configured for benchmarks alone: the test command turns its tests back on.
    echo "dev.sh: $build was configured with ROPEJIT_BUILD_TESTS=OFF; turning the tests on"
    cmake -S . -B "$build" -DROPEJIT_BUILD_TESTS=ON > /dev/null
  fi
  # The demo needs the library and the command only, not every test and benchmark.
  targets=()
  if [ "$what" = demo ]; then targets=(--target ropejit_cli); fi
  cmake --build "$build" -j "$(nproc)" "${targets[@]}"
fi
# Absolute from here on: the test step runs ctest from inside the build folder, and a relative
# path to the command once made every GPU host look GPU-less.
build=$(cd "$build" && pwd)
ropejit="$build/ropejit"

case "$what" in
  build) ;;
  gpu) gpu_state ;;
  demo) "$ropejit" demo "$@" ;;
  python) state=$(gpu_state) && python_tests ;;
  test)
    state=$(gpu_state)
    run_scoped_cache
    ctest_cmd=${ROPEJIT_CTEST:-ctest}
    # Test processes run side by side (the GPU ones too: each checks its own buffers, and no
    # test asserts a time); ROPEJIT_CTEST_JOBS=1 runs them one at a time.
    # A build without its tests (ROPEJIT_BUILD_TESTS=OFF in an old cache) fails rather than
    # passing on no tests at all.
    jobs=(--parallel "${ROPEJIT_CTEST_JOBS:-$(nproc)}" --no-tests=error)
    # Every stage runs even when one fails, and one line at the end names what failed.
    failed=()
    # The Python stage (its own build, started above, then pytest) runs beside ctest, its output
    # in a log that is printed when both are done: the stages share the machine's cores and GPU,
    # not a sequence.
    mkdir -p "$build/test-logs"
    python_log="$build/test-logs/python.log"
    if [ $beside = yes ]; then
      echo "dev.sh: the Python package runs beside ctest (log: $python_log)"
      if [ -n "$install_pid" ]; then
        # pytest once the pip build (a sibling job) is done and has succeeded.
        (
          while [ ! -s "$install_status" ] && kill -0 "$install_pid" 2>/dev/null; do sleep 1; done
          [ "$(cat "$install_status" 2>/dev/null)" = 0 ] || exit 1
          cd "$root" && python_pytest
        ) >> "$python_log" 2>&1 &
      else
        (cd "$root" && python_tests) > "$python_log" 2>&1 &
      fi
      python_pid=$!
    fi
    cd "$build"
    if [ "$state" = yes ]; then
      echo "dev.sh: GPU found: running the CPU and GPU suites, less the sweeps over every variant"
      $ctest_cmd "${jobs[@]}" --output-on-failure -LE exhaustive || failed+=("ctest (C++ suites)")
      echo "dev.sh: the sweeps over every variant were left out" \
        "($($ctest_cmd -N -L exhaustive | tail -1); tools/dev.sh exhaustive runs them)"
    else
      echo "dev.sh: no usable GPU here (${state#no: }): tests labelled 'gpu' are excluded (ctest -LE gpu)"
      $ctest_cmd "${jobs[@]}" --output-on-failure -LE gpu || failed+=("ctest (CPU suite)")
      echo "dev.sh: GPU tests SKIPPED: $($ctest_cmd -N -L gpu | tail -1)"
    fi
    cd "$root"
    python_status=0
    if [ $beside = yes ]; then
      wait "$python_pid" || python_status=$?
      install_pid=""
      echo "dev.sh: the Python package"
      cat "$python_log"
    else
      echo "dev.sh: the Python package"
      python_tests || python_status=$?
    fi
    if [ "$python_status" != 0 ]; then failed+=("pytest (Python package)"); fi
    if [ ${#failed[@]} -gt 0 ]; then
      echo "dev.sh: FAILED: $(IFS=,; echo "${failed[*]}" | sed 's/,/, /g')" >&2
      exit 1
    fi
    echo "dev.sh: all stages passed"
    ;;
  exhaustive)
    state=$(gpu_state)
    if [ "$state" != yes ]; then
      echo "dev.sh: the exhaustive sweeps need a usable GPU; here: ${state#no: }" >&2
      exit 2
    fi
    run_scoped_cache
    cd "$build"
    ${ROPEJIT_CTEST:-ctest} --parallel "${ROPEJIT_CTEST_JOBS:-$(nproc)}" --no-tests=error \
      --output-on-failure -L exhaustive
    ;;
  *) echo "usage: tools/dev.sh demo|test|exhaustive|python|build|gpu" >&2; exit 2 ;;
esac
