#!/usr/bin/env bash
# Sets everything up (scripts/setup.sh) and runs the whole test suite with ctest.
# Tests that need ../shared (the development data beside the checkout) skip when it is absent.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh" "$@"
cd "$root/build"
ctest --output-on-failure --parallel "$(nproc)"
