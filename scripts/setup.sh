#!/usr/bin/env bash
# Sets up a Debian 12 machine for tiny-mixtral and builds tmx: installs the Debian packages the
# build needs (idempotent: only what is missing), then configures and builds tmx into build/ (the
# tests: scripts/test.sh). The CUDA backend is built where the CUDA toolkit is installed and an
# NVIDIA GPU is present (its kernels are most of the build's time); --cuda ON builds it without a
# GPU, --cuda OFF never. Run as root (or with sudo available).
# Usage: scripts/setup.sh [--build-dir DIR] [--cuda AUTO|ON|OFF] [--all]
#   --all  build everything (the tests, benchmarks and link check too), not only tmx
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir="$root/build"
cuda=""
target=(--target tmx)
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    --cuda) cuda="$2"; shift 2 ;;
    --all) target=(); shift ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

packages=(
  g++ cmake ninja-build pkg-config git
  libgtest-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev
  libopenblas-dev libopenblas0-openmp
  libsentencepiece-dev libpcre2-dev libicu-dev libcpp-httplib-dev libboost-dev
  libvulkan-dev glslang-tools mesa-vulkan-drivers vulkan-validationlayers
  libopenmpi-dev openmpi-bin
)

source "$root/scripts/lib/packages.sh"
ensure_packages setup "${packages[@]}"

if [ -z "$cuda" ]; then
  # A machine without an NVIDIA GPU cannot run the CUDA backend: skip its kernels.
  if [ -e /dev/nvidia0 ] || nvidia-smi -L > /dev/null 2>&1; then
    cuda=AUTO
  else
    cuda=OFF
    echo "setup: no NVIDIA GPU here: building without the CUDA backend (--cuda ON builds it)" >&2
  fi
fi
case "$cuda" in
  AUTO|ON|OFF) ;;
  *) echo "setup.sh: --cuda: expected AUTO, ON or OFF, got '$cuda'" >&2; exit 2 ;;
esac
cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTMX_CUDA="$cuda" >/dev/null
cmake --build "$build_dir" --parallel "$(nproc)" "${target[@]}"
echo "setup: built $build_dir/${target[1]:-everything}" >&2
