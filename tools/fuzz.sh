#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for SECONDS over its seed
# corpus in tests/fuzz/corpus/ (new inputs go to a scratch copy, never into the repository).
# Fails on the first crash, leak, sanitizer report or abort; the input is left in OUT.
#   tools/fuzz.sh [SECONDS] [OUT]     (default 60 seconds per target, OUT build-fuzz/findings)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=build-fuzz
out=${2:-$build/findings}
tools/fetch-deps.sh .deps
if [ ! -f "$build/CMakeCache.txt" ]; then
  CXX=clang++ CC=clang cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_PREFIX_PATH="$PWD/.deps/usr" -DROPEJIT_FUZZ=ON -DROPEJIT_BUILD_TESTS=OFF \
    -DROPEJIT_BUILD_BENCH=OFF -DROPEJIT_BUILD_CLI=OFF > /dev/null
fi
cmake --build "$build" -j "$(nproc)" --target fuzz_key fuzz_tuning fuzz_cache_entry fuzz_hf_config fuzz_c_api
mkdir -p "$out"
export ROPEJIT_CACHE_DIR=off ROPEJIT_QUIET=1
for target in key tuning cache_entry hf_config c_api; do
  scratch=$(mktemp -d)
  cp tests/fuzz/corpus/$target/* "$scratch/"
  echo "fuzz: $target for ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      "$build/fuzz_$target" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix="$out/$target-" -print_final_stats=1 "$scratch" \
      > "$out/$target.log" 2>&1; then
    tail -n 40 "$out/$target.log"
    echo "fuzz: $target FAILED; the input is in $out/$target-*" >&2
    rm -rf "$scratch"
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|Done [0-9]+ runs" "$out/$target.log" | tail -1
  rm -rf "$scratch"
done
echo "fuzz: no crash in ${seconds}s per target"
