#!/usr/bin/env bash
# Builds vLLM's fused QK-norm + RoPE kernels (from a vLLM source tree, not part of this
# repository) into one shared library that bench/compare_vllm.py loads with
# torch.ops.load_library. The operators are registered by bench/peers/vllm_ops.cpp.
#
#   bench/peers/build_vllm.sh VLLM_SRC OUT.so [TORCH_DIR]
#
# VLLM_SRC: an unpacked vLLM source tree; its csrc/ is used. The runs in
# bench/history/2026-11-25.md used vLLM 0.33.0's source archive from PyPI (its URL is in
# https://pypi.org/simple/vllm/ read with "Accept: application/vnd.pypi.simple.v1+json";
# `pip download --no-binary` would build it).
# TORCH_DIR: the torch package directory (its include/ and lib/); by default the one
# `python3 -c "import torch"` finds. The library is built against PyTorch's stable ABI at
# version 2.11, as vLLM 0.33.0 builds it, for sm_90 unless ROPEJIT_PEER_ARCH names another
# (sm_80, ...).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
src=$(cd "$1" && pwd)
out=$2
csrc=$src/csrc
[[ -d $src/csrc ]] || csrc=$src
for f in fused_qknorm_rope_kernel.cu fused_qknorm_rope_cache_kernel.cu torch_utils.h; do
  [[ -f $csrc/$f ]] || { echo "build_vllm.sh: $csrc/$f not found (VLLM_SRC must be a vLLM source tree)" >&2; exit 2; }
done
torch_dir=${3:-$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')}
[[ -f $torch_dir/include/torch/csrc/stable/library.h ]] || {
  echo "build_vllm.sh: $torch_dir has no stable-ABI headers (include/torch/csrc/stable)" >&2; exit 2; }
arch=${ROPEJIT_PEER_ARCH:-sm_90}
cuda=${CUDA_HOME:-/usr/local/cuda}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$(dirname "$out")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# vLLM's own definitions (its CMakeLists.txt and cmake/utils.cmake): the stable-ABI target
# version, CUDA, and FP8 conversions (without ENABLE_FP8 its FP8 cache path asserts).
defs=(-DUSE_CUDA -DTORCH_TARGET_VERSION=0x020B000000000000ULL -DENABLE_FP8)
incs=(-I"$csrc" -I"$torch_dir/include" -I"$cuda/include")
echo "build_vllm.sh: compiling vLLM's fused QK-norm + RoPE kernels for $arch (about a minute)"
nvcc_flags=(-std=c++17 -O3 -arch="$arch" --expt-relaxed-constexpr -Xcompiler -fPIC)
"$cuda/bin/nvcc" "${nvcc_flags[@]}" "${defs[@]}" "${incs[@]}" \
  -c "$csrc/fused_qknorm_rope_kernel.cu" -o "$work/inplace.o" &
inplace=$!
"$cuda/bin/nvcc" "${nvcc_flags[@]}" "${defs[@]}" "${incs[@]}" \
  -c "$csrc/fused_qknorm_rope_cache_kernel.cu" -o "$work/cache.o" &
cache=$!
ops=0
g++ -std=c++17 -O2 -fPIC "${defs[@]}" "${incs[@]}" -c "$here/vllm_ops.cpp" -o "$work/ops.o" || ops=$?
# Each compile waited for on its own (set -e stops at the first that failed), before the trap
# removes their folder.
wait "$inplace"
wait "$cache"
[[ $ops == 0 ]] || exit "$ops"
g++ -shared -o "$out" "$work/inplace.o" "$work/cache.o" "$work/ops.o" \
  -L"$torch_dir/lib" -ltorch -ltorch_cpu -lc10 -L"$cuda/lib64" -lcudart \
  -Wl,-rpath,"$torch_dir/lib"
echo "build_vllm.sh: wrote $out"
