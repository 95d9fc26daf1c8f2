#!/usr/bin/env bash
# Checks the formatting (scripts/check-format.sh), sets everything up (scripts/setup.sh: the CUDA
# backend too wherever the toolkit is, GPU or not, so that its code is compiled and its host-side
# tests run) and runs the whole test suite with ctest.
# Tests that need ../shared (the development data beside the checkout) skip when it is absent.
# It also installs the clients that test tmx from outside: Node.js, npm's official `openai`
# package and `playwright-core` for `tmx serve`, `@huggingface/gguf` for `tmx export --format
# gguf` (into build/npm) and Debian's chromium for the playground's browser test, and ends with
# a short load test of the server. Where one cannot be installed (no reachable npm registry or
# Debian mirror) its tests skip and the run goes on, except under CI=true, where the run fails:
# there a skip would hide them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/check-format.sh"
"$root/scripts/setup.sh" --cuda AUTO --all "$@"
source "$root/scripts/lib/packages.sh"
# not_installed WHAT TESTS: outside CI, says that TESTS will skip; under CI=true, fails the run.
not_installed() {
  if [ "${CI:-}" = true ]; then
    echo "test.sh: could not install $1, so $2 would skip; under CI=true that fails the run" >&2
    exit 1
  fi
  echo "test.sh: could not install $1; $2 will skip" >&2
}
# Node.js may come from elsewhere than Debian (NodeSource's bundles npm and conflicts with
# Debian's npm package): install Debian's only where there is no node or npm at all.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  ensure_packages test nodejs npm || true
fi
if command -v node >/dev/null && command -v npm >/dev/null; then
  # Major versions pinned (@huggingface/gguf is at 0.x, where a minor release may break).
  npm install --prefix "$root/build/npm" --no-audit --no-fund --silent openai@7 \
    playwright-core@1 @huggingface/gguf@0.4 ||
    not_installed "npm's openai, playwright-core and @huggingface/gguf" \
      "the server's client and browser tests and the GGUF outside-reader test"
else
  not_installed "nodejs and npm" \
    "the server's client and browser tests and the GGUF outside-reader test"
fi
ensure_packages test chromium || not_installed chromium "the playground's browser test"
ensure_packages test python3
cd "$root/build"
ctest --output-on-failure --parallel "$(nproc)"
# A short bounded load test of tmx serve (scripts/load-test.py): every answer complete and well
# formed, the server's memory flat.
python3 "$root/scripts/load-test.py" --tmx "$root/build/tmx" --model "$root/assets/demo" \
  --clients 4 --requests 40 --max-tokens 16
