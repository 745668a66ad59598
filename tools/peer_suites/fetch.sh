#!/usr/bin/env bash
# Puts the peers' RoPE test suites into DIR (default .peer-suites), with the peers' own code the
# suites import, at pinned releases; tools/peer_suites/run.py runs them against ropejit.dropin.
# Needs network, git and pip; installs nothing. Peer source stays in DIR, out of the repository.
#   tools/peer_suites/fetch.sh [DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mkdir -p "${1:-$root/.peer-suites}" && cd "${1:-$root/.peer-suites}" && pwd)
python=${PYTHON:-python3}

TE_TAG=v2.18             # github.com/NVIDIA/TransformerEngine
FLASH_TAG=v2.8.3         # github.com/Dao-AILab/flash-attention
VLLM_TAG=v0.33.0         # github.com/vllm-project/vllm
LIGER_VERSION=0.8.5      # PyPI sdist liger-kernel (it carries test/)
EINOPS_VERSION=0.8.1     # PyPI wheel: flash-attn's test and reference import einops

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# git_files SUITE URL TAG PATH...: those paths of the repository at TAG into DIR/SUITE. A shallow,
# blobless clone downloads one commit's trees and the blobs of the paths checked out, no more.
git_files() {
  local suite=$1 url=$2 tag=$3
  shift 3
  local clone=$work/$suite
  git clone --quiet --depth 1 --branch "$tag" --filter=blob:none --no-checkout "$url" "$clone"
  git -C "$clone" checkout --quiet HEAD -- "$@"
  rm -rf "${dir:?}/$suite"
  mkdir -p "$dir/$suite"
  tar -C "$clone" -cf - "$@" | tar -C "$dir/$suite" -xf -
  echo "$url $tag $(git -C "$clone" rev-parse HEAD)" > "$dir/$suite/SOURCE"
  echo "fetch: $suite  $url $tag"
}

# TransformerEngine's sdist and wheels carry no tests: the repository.
git_files te https://github.com/NVIDIA/TransformerEngine "$TE_TAG" \
  tests/pytorch/test_fused_rope.py \
  transformer_engine/pytorch/attention/rope.py

# flash-attn's sdist has flash_attn/ but not tests/: the repository.
git_files flash https://github.com/Dao-AILab/flash-attention "$FLASH_TAG" \
  tests/test_rotary.py \
  flash_attn/layers/rotary.py \
  flash_attn/bert_padding.py

# vLLM's sdist has tests/, but pip only downloads it after building its metadata (torch, cmake,
# setuptools-rust): the repository.
git_files vllm https://github.com/vllm-project/vllm "$VLLM_TAG" \
  tests/kernels/__init__.py \
  tests/kernels/allclose_default.py \
  tests/kernels/core/test_pos_encoding.py \
  vllm/model_executor/layers/rotary_embedding

# Liger's sdist carries the package and its tests; the suite runs against this package.
"$python" -m pip download --quiet --no-deps --no-binary :all: -d "$work/pip" \
  "liger-kernel==$LIGER_VERSION"
sdist=$work/pip/liger_kernel-$LIGER_VERSION.tar.gz
tar -C "$work" -xzf "$sdist"
rm -rf "${dir:?}/liger"
mkdir -p "$dir/liger"
(cd "$work/liger_kernel-$LIGER_VERSION" &&
  tar -cf - src/liger_kernel test/__init__.py test/conftest.py test/utils.py \
    test/transformers/test_rope.py) | tar -C "$dir/liger" -xf -
sha256=$("$python" -c 'import hashlib, sys
print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$sdist")
echo "pypi liger-kernel==$LIGER_VERSION sha256:$sha256" > "$dir/liger/SOURCE"
echo "fetch: liger  pypi liger-kernel==$LIGER_VERSION (sdist)"

# The GPU host may lack einops; run.py puts these wheels on the suites' path, unpacked.
rm -rf "${dir:?}/wheels"
"$python" -m pip download --quiet --no-deps --only-binary :all: -d "$dir/wheels" \
  "einops==$EINOPS_VERSION"
echo "fetch: wheels  $(ls "$dir/wheels")"
