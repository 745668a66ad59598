#!/usr/bin/env bash
# Format and static checks, as CI runs them:
#   tools/lint.sh format        every tracked C++/CUDA file must match .clang-format
#   tools/lint.sh tidy BUILD    clang-tidy (.clang-tidy) over the library and the command, with
#                               BUILD's compile_commands.json
#   tools/lint.sh fix           reformat every tracked C++/CUDA file in place
set -euo pipefail
cd "$(dirname "$0")/.."
sources() { git ls-files --cached --others --exclude-standard '*.cpp' '*.hpp' '*.cuh' '*.cu' '*.h'; }
case "${1:-}" in
  format)
    if ! sources | xargs clang-format --dry-run --Werror 2> /tmp/ropejit-format.log; then
      grep -E "^[^ ].*(warning|error):" /tmp/ropejit-format.log | cut -d: -f1 | sort -u |
        sed 's/^/lint: not formatted: /'
      echo "lint: run tools/lint.sh fix (clang-format $(clang-format --version | grep -oE '[0-9]+\.[0-9.]+'))" >&2
      exit 1
    fi
    echo "lint: $(sources | wc -l) files formatted"
    ;;
  tidy)
    build=${2:?usage: tools/lint.sh tidy BUILD_DIR}
    [ -f "$build/compile_commands.json" ] || { echo "lint: $build has no compile_commands.json" >&2; exit 2; }
    git ls-files 'jit/*.cpp' 'oracle/*.cpp' 'autotune/*.cpp' 'api/*.cpp' 'cli/*.cpp' |
      xargs -P "$(nproc)" -n 1 clang-tidy -p "$build" --quiet
    echo "lint: clang-tidy clean"
    ;;
  fix) sources | xargs clang-format -i ;;
  *) echo "usage: tools/lint.sh format|tidy BUILD|fix" >&2; exit 2 ;;
esac
