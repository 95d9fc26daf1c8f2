#!/usr/bin/env bash
# Checks the formatting (scripts/check-format.sh), sets everything up (scripts/setup.sh: the CUDA
# backend too wherever the toolkit is, GPU or not, so that its code is compiled and its host-side
# tests run) and runs the whole test suite with ctest.
# Tests that need ../shared (the development data beside the checkout) skip when it is absent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/check-format.sh"
"$root/scripts/setup.sh" --cuda AUTO --all "$@"
cd "$root/build"
ctest --output-on-failure --parallel "$(nproc)"
