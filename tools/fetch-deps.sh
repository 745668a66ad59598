#!/usr/bin/env bash
# Unpacks ropejit's build dependencies (nlohmann_json, doctest, Google Benchmark, xxHash,
# CLI11) from Debian packages into a local folder, without installing anything system-wide.
# The folder also works on machines with no package registry (carry it there).
#   tools/fetch-deps.sh [DIR]     (default .deps; CMake: -DCMAKE_PREFIX_PATH=DIR/usr)
set -euo pipefail
dest=${1:-.deps}
packages=(nlohmann-json3-dev doctest-dev libbenchmark-dev libbenchmark1debian libxxhash-dev libcli11-dev)
if [ -f "$dest/.complete" ]; then exit 0; fi
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
chmod 755 "$scratch"  # apt's download sandbox user must be able to write here
download() { (cd "$scratch" && apt-get download "${packages[@]}" >/dev/null 2>&1); }
if ! download; then
  echo "fetch-deps: refreshing package lists" >&2
  apt-get update -qq >/dev/null 2>&1 || true
  download || { echo "fetch-deps: apt-get download ${packages[*]} failed" >&2; exit 1; }
fi
for deb in "$scratch"/*.deb; do dpkg -x "$deb" "$dest"; done
# Debian's doctest export hard-codes /usr; make it relative so the folder can move.
targets="$dest/usr/lib/cmake/doctest/doctestTargets.cmake"
if [ -f "$targets" ]; then
  sed -i 's|^set(_IMPORT_PREFIX "/usr")|get_filename_component(_IMPORT_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)|' "$targets"
fi
touch "$dest/.complete"
echo "fetch-deps: unpacked ${#packages[@]} packages into $dest"
