#!/usr/bin/env bash
# Checks the formatting (scripts/check-format.sh), sets everything up (scripts/setup.sh: the CUDA
# backend too wherever the toolkit is, GPU or not, so that its code is compiled and its host-side
# tests run) and runs the whole test suite with ctest.
# Tests that need ../shared (the development data beside the checkout) skip when it is absent.
# It also installs the clients that test tmx from outside: Node.js, npm's official `openai`
# package and `playwright-core` for `tmx serve`, `@huggingface/gguf` for `tmx export --format
# gguf` (into build/npm; without a reachable npm registry those tests skip) and Debian's chromium
# for the playground's browser test, and ends with a short load test of the server.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/check-format.sh"
"$root/scripts/setup.sh" --cuda AUTO --all "$@"
source "$root/scripts/lib/packages.sh"
# Node.js may come from elsewhere than Debian (NodeSource's bundles npm and conflicts with
# Debian's npm package): install Debian's only where there is no node or npm at all.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  ensure_packages test nodejs npm ||
    echo "test.sh: could not install nodejs and npm; the server's client tests will skip" >&2
fi
ensure_packages test chromium ||
  echo "test.sh: could not install chromium; the playground's browser test will skip" >&2
ensure_packages test python3
# Major versions pinned (@huggingface/gguf is at 0.x, where a minor release may break).
npm install --prefix "$root/build/npm" --no-audit --no-fund --silent openai@7 playwright-core@1 \
  @huggingface/gguf@0.4 ||
  echo "test.sh: npm could not install openai, playwright-core and @huggingface/gguf; the" \
    "server's client and browser tests and the GGUF outside-reader test will skip" >&2
cd "$root/build"
ctest --output-on-failure --parallel "$(nproc)"
# A short bounded load test of tmx serve (scripts/load-test.py): every answer complete and well
# formed, the server's memory flat.
python3 "$root/scripts/load-test.py" --tmx "$root/build/tmx" --model "$root/assets/demo" \
  --clients 4 --requests 40 --max-tokens 16
