#!/bin/bash
# Fails when clang-format (the project's .clang-format) would change any C source or header of
# the project. `// clang-format off` is for tables only. Fix with:
#   git ls-files '*.c' '*.h' | xargs clang-format -i
set -uo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(find orchestrator guest-agent proto daemon tests bench -name '*.[ch]' -type f | sort)
if ((${#files[@]} == 0)); then
  echo "check-format: no sources found" >&2
  exit 1
fi
clang-format --dry-run -Werror "${files[@]}"
