#!/usr/bin/env bash
# Everything that needs the GPU host, in one command: build (Release, with libropejit.so),
# then the GPU test suite and/or the measurements: tune a preset, the Google Benchmark suite
# (using the fresh tuning file), the same-run torch comparison, and the plots.
#   bench/run_gpu.sh OUTDIR [tests|bench|all]   (dependencies: tools/fetch-deps.sh .deps)
#   bench/run_gpu.sh OUTDIR cands ["NVRTC OPTIONS"]   every tuning candidate's time for the bench
#     shapes (and again compiled with the options)
#   bench/run_gpu.sh OUTDIR roofline   plain SM copies and bulk copies against the driver's copy
#   bench/run_gpu.sh OUTDIR weightread   one launch reading the projection's 50 MB weight: the
#     library's read pass, one-step reads, the projection kernel's order, bulk copies
#   bench/run_gpu.sh OUTDIR graphcfg   graph-replayed decode per forced launch configuration
#   bench/run_gpu.sh OUTDIR graphcfg-fused   the same for the fused Qwen3-style step
#   bench/run_gpu.sh OUTDIR profile "CASE[:tuned] ..."   Nsight Compute reports (ncu_*.txt)
#   bench/run_gpu.sh OUTDIR peers ["CASE ..."]   the same-run peer comparisons alone (peers.json,
#     fused_peers.json),
#     then Nsight Compute on each implementation's kernel for the named cases (ncu_peers_*.txt)
#   bench/run_gpu.sh OUTDIR against DIR   the heuristic's rope/graph rows of this tree and of
#     another checkout DIR (e.g. `git worktree add .base REV`), built alike, runs alternated
#   bench/run_gpu.sh OUTDIR unfused   the fused Qwen3-style step against its unfused passes, each
#     the fastest implementation on the host (unfused.json, unfused_fp8.json)
#   bench/run_gpu.sh OUTDIR proj   the decode block's projection (every variant and the default
#     against the weight-read floor) and RMSNorm against a copy (proj.json), and the unfused
#     torch block (proj_torch.json)
#   bench/run_gpu.sh OUTDIR flags "NVRTC OPTIONS"   kernel speed and cold compile with extra NVRTC
#     options against the defaults, heuristic launches, runs alternated A B A B (flags_*.json)
#   bench/run_gpu.sh OUTDIR sweep   the plain-RoPE shape sweep, heuristic and tuned, with the
#     peers (sweep.json), and its check against bench/baselines/sweep_<gpu>.json
# bench: tuned run (bench.json), heuristic-only run (bench_untuned.json), torch comparison
# (compare.json), peer comparison (peers.json: Liger-Kernel and FlashInfer where importable),
# plots/.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/run_gpu.sh OUTDIR [tests|bench|all|none|cands|profile|roofline|weightread|graphcfg|flags OPTIONS]}
what=${2:-all}
mkdir -p "$out"
out=$(cd "$out" && pwd)  # ropejit ignores a relative ROPEJIT_TUNING_FILE
build=build-gpu
export ROPEJIT_CACHE_DIR=${ROPEJIT_CACHE_DIR:-/tmp/ropejit-gpu-cache}
export LD_LIBRARY_PATH=$PWD/.deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
# Tests ON explicitly: a build folder configured without them would otherwise keep that.
if ! { cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=$PWD/.deps/usr \
         -DROPEJIT_BUILD_SHARED=ON -DROPEJIT_BUILD_TESTS=ON && cmake --build $build -j "$(nproc)"; } \
       > /tmp/ropejit-build.log 2>&1; then
  grep -E "error|Error" /tmp/ropejit-build.log | head -40
  exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader

# The other ropejit_bench cases and the torch comparison's fp16 case, as `ropejit tune` shapes
# (the sweep stays heuristic).
base="--heads 32,8 --positions ids"
shapes=("$base --tokens 4096 --head-dim 64" "$base --tokens 4096 --head-dim 80"
        "$base --tokens 4096 --head-dim 96" "$base --tokens 4096 --head-dim 256"
        "--heads 32,1 --positions ids --tokens 4096" "$base --tokens 8192 --dtype f32"
        "--heads 64,0 --positions ids --tokens 4096 --dtype f16"
        "$base --tokens 4096 --style gptj" "$base --tokens 4096 --freqs comp"
        "$base --tokens 8192 --layout thd"
        "--heads 64,64 --positions ids --tokens 4096 --head-dim 96 --rotary-dim 24"
        "--heads 64,64 --positions ids --tokens 8192 --dtype f16"
        "--heads 32,8 --tokens 4096 --key rope_bshd_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_qk_fwd_oop")

# The same-run comparison with Liger-Kernel and FlashInfer (bench/compare_peers.py): each peer
# that does not import or fails is reported as such and the others still run.
peers() {
  local tuning=(); [ -n "${1:-}" ] && tuning=(env ROPEJIT_TUNING_FILE="$1")
  "${tuning[@]}" env PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 python3 bench/compare_peers.py \
    --lib $build/libropejit.so --out "$out/peers.json" > "$out/peers.txt" 2>&1
  echo "compare_peers: exit $?"
  sed -n '/^| case | timing/,$p' "$out/peers.txt"
  # The fused FP8 paged step against FlashInfer's fused function (bench/compare_fused_peers.py).
  PYTHONUNBUFFERED=1 python3 bench/compare_fused_peers.py --lib $build/libropejit.so \
    --out "$out/fused_peers.json" > "$out/fused_peers.txt" 2>&1
  echo "compare_fused_peers: exit $?"
  grep -E '^\|' "$out/fused_peers.txt"
}

if [ "$what" = proj ]; then
  # The path per token bucket (fused kernel or RMSNorm -> cuBLASLt GEMM -> RoPE) measured by
  # `ropejit tune` at Llama-3-8B's shape; the benchmark's automatic rows read it.
  $build/ropejit tune --key qkvproj_bf16_d128_r128_neox_pos-ids-i64_tab-f32-half_nrms \
    --heads 32,8 --hidden 4096 --out "$out/proj_tuning.json" > "$out/proj_tune.txt" 2>&1
  echo "proj tune: exit $?"
  $build/ropejit tune --key ffnglu_bf16_nrms_silu --hidden 4096 --intermediate 14336 \
    --out "$out/proj_tuning.json" >> "$out/proj_tune.txt" 2>&1
  echo "ffn tune: exit $?"
  grep -E '^\| (key|qkvproj|ffnglu)' "$out/proj_tune.txt"
  ROPEJIT_TUNING_FILE="$out/proj_tuning.json" $build/bench/ropejit_bench \
    --benchmark_filter='^(proj|ffn|rmsnorm)' \
    --benchmark_out="$out/proj.json" --benchmark_out_format=json > "$out/proj.txt" 2>&1
  echo "proj bench: exit $?"
  grep -E "^(proj|ffn|rmsnorm)" "$out/proj.txt" | sed -E 's/ +/ /g' | cut -c1-200
  python3 bench/compare_proj_torch.py --out "$out/proj_torch.json" 2>&1 | tee "$out/proj_torch.txt"
  python3 bench/plot.py --proj "$out/proj.json" --proj-torch "$out/proj_torch.json" \
    --outdir "$out/plots"
  exit 0
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  # The README's test command (CPU and GPU suites), the sweeps over every variant, then
  # compute-sanitizer over the matrix's sanitizer subset: memcheck (out-of-bounds and misaligned
  # accesses), racecheck (shared-memory hazards of the computed-frequency path), initcheck
  # (reads of uninitialized device memory).
  ROPEJIT_BUILD_DIR=$build tools/dev.sh test > "$out/gpu_tests.log" 2>&1
  grep -E "dev.sh:|MESSAGE|tests passed|tests failed|\*\*\*Failed|ERROR" "$out/gpu_tests.log" | cut -c1-240
  ROPEJIT_BUILD_DIR=$build ROPEJIT_SKIP_BUILD=1 tools/dev.sh exhaustive > "$out/gpu_exhaustive.log" 2>&1
  echo "exhaustive sweeps: exit $?"
  grep -E "MESSAGE|tests passed|tests failed|\*\*\*Failed|ERROR" "$out/gpu_exhaustive.log" | cut -c1-240
  for tool in memcheck racecheck initcheck; do
    compute-sanitizer --tool $tool --error-exitcode 99 \
      $build/tests/ropejit_gpu_tests "--test-case=sanitizer subset*,projection: every axis*,projection, unfused path*,FFN gate/up: both paths*" \
      > "$out/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit $? ($(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$out/sanitizer_$tool.log" | tail -1))"
  done
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  $build/ropejit tune --preset llama3-8b --out "$out/tuning.json" > "$out/tune.txt" 2>&1
  # The benchmark's prefill shape too (the preset stops at 4096 tokens), and the other cases,
  # so that the tuned run shows what `ropejit tune` gives each of them.
  $build/ropejit tune --heads 32,8 --positions ids --tokens 32768 --out "$out/tuning.json" >> "$out/tune.txt" 2>&1
  for shape in "${shapes[@]}"; do
    # shellcheck disable=SC2086  # $shape holds several options
    $build/ropejit tune $shape --out "$out/tuning.json" >> "$out/tune.txt" 2>&1
  done
  tail -n 45 "$out/tune.txt" | cut -c1-200
  ROPEJIT_TUNING_FILE="$out/tuning.json" $build/bench/ropejit_bench --benchmark_out="$out/bench.json" \
    --benchmark_out_format=json --benchmark_counters_tabular=true > "$out/bench.txt" 2>&1
  grep -vE "^(Run on|CPU Caches|  L[123]|Load Average|\*\*\*WARNING)" "$out/bench.txt" | cut -c1-230
  # The built-in heuristic alone (no tuning file): what a user gets before tuning.
  ROPEJIT_TUNING=off $build/bench/ropejit_bench --benchmark_filter='^(rope|graph)/' \
    --benchmark_out="$out/bench_untuned.json" --benchmark_out_format=json \
    --benchmark_counters_tabular=true > "$out/bench_untuned.txt" 2>&1
  grep -E "^(rope|graph)/" "$out/bench_untuned.txt" | cut -c1-230
  # Cold compiles: NVRTC alone (no driver in the process), and in-process with NVRTC's own
  # cache switched off, next to the benchmark's jit row above.
  python3 bench/compile_phases.py --ropejit $build/ropejit --reps 4 --source bench/minimal_rope.cu --source bench/flat_rope.cu --trace > "$out/compile_phases.txt" 2>&1
  cat "$out/compile_phases.txt"
  ROPEJIT_NVRTC_FLAGS=-no-cache $build/bench/ropejit_bench --benchmark_filter='^jit' > "$out/jit_nocache.txt" 2>&1
  grep -E "^jit" "$out/jit_nocache.txt" | sed 's/^/-no-cache: /'
  # The Python package (python/ropejit over this build's libropejit.so): loads next to torch,
  # the same-run torch comparison, and its host cost per call next to the C++ call's.
  ROPEJIT_LIB=$build/libropejit.so PYTHONPATH=python PYTHONFAULTHANDLER=1 python3 -c "import torch, ropejit; print('package with torch loaded:', ropejit.key())"
  ROPEJIT_TUNING_FILE="$out/tuning.json" PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 python3 bench/compare_torch.py \
    --lib $build/libropejit.so --out "$out/compare.json" > "$out/compare.txt" 2>&1
  tail -n 20 "$out/compare.txt"
  peers "$out/tuning.json"
  ROPEJIT_LIB=$build/libropejit.so PYTHONPATH=python python3 bench/python_overhead.py \
    --bench $build/bench/ropejit_bench --out "$out/python_overhead.json" > "$out/python_overhead.txt" 2>&1
  cat "$out/python_overhead.txt"
  python3 bench/plot.py "$out/bench.json" --compare "$out/compare.json" --peers "$out/peers.json" \
    --outdir "$out/plots" 2>&1 | tail -4
fi
if [ "$what" = profile ]; then
  # Nsight Compute (clocks left as they are) on one launch of each named bench case, heuristic
  # launch unless the case name ends in ":tuned" (then bench/tuning_<gpu>.json's entry):
  #   bench/run_gpu.sh OUT profile "llama_bf16_t4096 llama_bf16_t4096:tuned computed"
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200" | tr A-Z a-z)
  # A case with a slash names the whole row (e.g. fused/qwen3_bf16_t1); NCU_SOURCE=1 also writes
  # the per-instruction SASS view with its stall samples (ncu_*_sass.csv), caches left warm as
  # under graph replay.
  for item in ${3:-llama_bf16_t4096}; do
    name=${item%%:*}
    tuning=off; [ "$item" != "$name" ] && tuning=on
    env_file=(env ROPEJIT_TUNING=off)
    [ $tuning = on ] && env_file=(env ROPEJIT_TUNING_FILE="$PWD/bench/tuning_$gpu.json")
    row="rope/$name"; [[ $name == */* ]] && row=$name
    tag=${name//\//_}
    log="$out/ncu_${tag}_$tuning.txt"
    what_to_collect=(--section SpeedOfLight --section Occupancy --section LaunchStats
                     --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables
                     --section SchedulerStats --section WarpStateStats --section InstructionStats)
    # NCU_METRICS=a,b,...: those metrics instead of the sections.
    [ -n "${NCU_METRICS:-}" ] && what_to_collect=(--metrics "$NCU_METRICS")
    "${env_file[@]}" ncu --clock-control none -k regex:rope_ --launch-skip 3 --launch-count 1 \
      "${what_to_collect[@]}" --print-details all \
      $build/bench/ropejit_bench --benchmark_filter="^$row(/|\$)" > "$log" 2>&1
    if [ -n "${NCU_SOURCE:-}" ]; then
      "${env_file[@]}" ncu --clock-control none -k regex:rope_ --launch-skip 3 --launch-count 1 \
        --cache-control none --set full --warp-sampling-interval 0 --import-source yes -f -o "/tmp/ncu_$tag" \
        $build/bench/ropejit_bench --benchmark_filter="^$row(/|\$)" > /dev/null 2>&1
      ncu -i "/tmp/ncu_$tag.ncu-rep" --page source --print-source sass --csv \
        > "$out/ncu_${tag}_sass.csv" 2>&1
    fi
    echo "== $item"
    [ -n "${NCU_METRICS:-}" ] && { grep -E "^  [a-z_]+|^    [a-z]" "$log" | head -40; continue; }
    grep -E "^  [a-z_]+|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Size|Grid Size|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|L1/TEX Hit|L2 Hit|Executed Instructions  " "$log" | head -40
  done
fi
if [ "$what" = peers ]; then
  peers
  python3 bench/plot.py --peers "$out/peers.json" --outdir "$out/plots" 2>&1 | tail -1
  for case in ${3:-}; do
    # Each implementation's kernels on a few eager calls: ropejit's keys (rope_*), Liger's
    # Triton kernel (_triton_rope), FlashInfer's (*Rotary*).
    ncu --clock-control none -k 'regex:rope|Rotary' --launch-count 40 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
      --section InstructionStats --section MemoryWorkloadAnalysis --print-details all \
      python3 bench/compare_peers.py --lib $build/libropejit.so --profile "$case" \
      > "$out/ncu_peers_$case.txt" 2>&1
    echo "== ncu $case (exit $?)"
    grep -E "^  [A-Za-z_]|Duration|Registers Per|Block Size|Grid Size|Executed Instructions  |Warp Cycles Per Issued|Memory Throughput" \
      "$out/ncu_peers_$case.txt" | cut -c1-160 | head -120
  done
fi
if [ "$what" = unfused ]; then
  # The fused Qwen3-style step against its unfused passes, each the fastest on the host (bf16,
  # then FP8 q and cache).
  for fp8 in "" --fp8; do
    PYTHONUNBUFFERED=1 python3 bench/compare_unfused.py --lib $build/libropejit.so $fp8 \
      --out "$out/unfused${fp8:+_fp8}.json" 2>&1 | tee "$out/unfused${fp8:+_fp8}.txt" |
      grep -E "^\|" | cut -c1-220
  done
  python3 bench/plot.py --unfused "$out/unfused.json" "$out/unfused_fp8.json" --outdir "$out/plots" 2>&1 | tail -1
fi
if [ "$what" = cands ]; then
  # Every candidate's time for the llama shapes and each bench case (ropejit tune --top), for
  # choosing the heuristic: cands.txt; with NVRTC options as a third argument, the same again
  # compiled with them: cands_flagged.txt.
  for side in default flagged; do
    extra=""
    if [ $side = flagged ]; then extra=${3:-}; [ -z "$extra" ] && break; fi
    for shape in "$base --tokens 1 64 256 4096 32768" "${shapes[@]}"; do
      echo "### $shape"
      # shellcheck disable=SC2086
      ROPEJIT_NVRTC_FLAGS="$extra" $build/ropejit tune $shape --top 400 --out /tmp/ropejit-cands.json 2>&1
    done > "$out/cands${extra:+_flagged}.txt"
  done
  wc -l "$out"/cands*.txt
fi
if [ "$what" = roofline ]; then
  # What plain SM kernels and bulk copies move next to the driver's copy (bench/sm_roofline.cu).
  nvcc -O3 -arch=sm_90 -std=c++17 bench/sm_roofline.cu -o $build/sm_roofline && $build/sm_roofline | tee "$out/roofline.txt"
fi
if [ "$what" = weightread ]; then
  # How fast one launch reads Llama-3-8B's projection weight from a cold L2 (bench/weight_read.cu).
  nvcc -O3 -arch=sm_90 -std=c++17 bench/weight_read.cu -o $build/weight_read && $build/weight_read | tee "$out/weight_read.txt"
fi
if [ "$what" = sweep ]; then
  # The shape sweep with this GPU's tuning file and the peers (bench/sweep.py), then the check
  # against this GPU kind's baseline (bench/sweep_check.py: exit 2 while there is none).
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200" | tr A-Z a-z)
  tuning=(); [ -f "bench/tuning_$gpu.json" ] && tuning=(--tuning "bench/tuning_$gpu.json")
  PYTHONUNBUFFERED=1 python3 bench/sweep.py --lib $build/libropejit.so "${tuning[@]}" --peers \
    --out "$out/sweep.json" > "$out/sweep.txt" 2>&1
  echo "sweep: exit $?"
  sed -n '/measured rows, lowest/,$p' "$out/sweep.txt"
  python3 bench/sweep_check.py "$out/sweep.json" | tee "$out/sweep_check.txt"
  echo "sweep_check: exit ${PIPESTATUS[0]}"
fi
if [ "$what" = graphcfg ]; then
  # Graph-replayed decode with forced launch configurations (bench/graph_configs.py).
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200" | tr A-Z a-z)
  python3 bench/graph_configs.py --like "bench/tuning_$gpu.json" --bench $build/bench/ropejit_bench | tee "$out/graph_configs.txt"
fi
if [ "$what" = graphcfg-fused ]; then
  # The same for the fused Qwen3-style step's decode rows.
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H100|H200" | tr A-Z a-z)
  python3 bench/graph_configs.py --fused --like "bench/tuning_$gpu.json" --bench $build/bench/ropejit_bench | tee "$out/graph_configs_fused.txt"
fi
if [ "$what" = against ]; then
  other=${3:?against mode needs the directory of the other checkout}
  if ! { cmake -S "$other" -B "$other/build-gpu" -G Ninja -DCMAKE_BUILD_TYPE=Release \
           -DCMAKE_PREFIX_PATH=$PWD/.deps/usr -DROPEJIT_BUILD_TESTS=OFF -DROPEJIT_BUILD_CLI=OFF &&
         cmake --build "$other/build-gpu" -j "$(nproc)" --target ropejit_bench; } > /tmp/ropejit-other.log 2>&1; then
    grep -E "error|Error" /tmp/ropejit-other.log | head -20
    exit 1
  fi
  for round in 1 2; do
    for side in this other; do
      bench=$build/bench/ropejit_bench; [ $side = other ] && bench=$other/build-gpu/bench/ropejit_bench
      ROPEJIT_CACHE_DIR=/tmp/ropejit-cache-$side ROPEJIT_TUNING=off $bench \
        --benchmark_filter='^(rope|graph)/' --benchmark_out="$out/against_${side}_$round.json" \
        --benchmark_out_format=json --benchmark_counters_tabular=true > "$out/against_${side}_$round.txt" 2>&1
      grep -E "^(rope|graph)" "$out/against_${side}_$round.txt" | cut -c1-200 | sed "s/^/$side $round: /"
    done
  done
fi
if [ "$what" = flags ]; then
  flags=${3:?flags mode needs the NVRTC options to compare}
  python3 bench/compile_phases.py --ropejit $build/ropejit --reps 4 --source bench/minimal_rope.cu --extra= --extra="$flags" \
    > "$out/flags_phases.txt" 2>&1
  cat "$out/flags_phases.txt"
  for round in 1 2; do
    for side in default flagged; do
      extra=""; [ $side = flagged ] && extra=$flags
      ROPEJIT_NVRTC_FLAGS="$extra" ROPEJIT_TUNING=off $build/bench/ropejit_bench \
        --benchmark_filter='^(jit|rope|graph)/?' --benchmark_out="$out/flags_${side}_$round.json" \
        --benchmark_out_format=json --benchmark_counters_tabular=true > "$out/flags_${side}_$round.txt" 2>&1
      grep -E "^(jit|rope|graph)" "$out/flags_${side}_$round.txt" | cut -c1-200 | sed "s/^/$side $round: /"
    done
  done
fi
