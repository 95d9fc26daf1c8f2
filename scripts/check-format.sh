#!/usr/bin/env bash
# Fails when a C++ or CUDA file of the project drifts from .clang-format, naming each one
# (`clang-format -i FILE` fixes it). Installs clang-format (Debian's, 14) when it is missing.
# scripts/test.sh runs it first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/lib/packages.sh"
command -v clang-format > /dev/null || ensure_packages check-format clang-format
cd "$root"
drift=()
while IFS= read -r -d '' f; do
  clang-format --dry-run -Werror "$f" > /dev/null 2>&1 || drift+=("$f")
done < <(git ls-files -z -- '*.cpp' '*.h' '*.cu' '*.cuh' 2> /dev/null ||
         find engine backends dist apps tests benchmarks \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0)
if [ ${#drift[@]} -gt 0 ]; then
  echo "check-format: ${#drift[@]} files drift from .clang-format (clang-format -i fixes them):" >&2
  printf '  %s\n' "${drift[@]}" >&2
  exit 1
fi
echo "check-format: every C++ and CUDA file matches .clang-format"
