#!/usr/bin/env bash
# Downloads the Debian 12 packages the build needs (not the compilers) and unpacks them under
# PREFIX, for a GPU machine that has the CUDA toolkit, CMake and g++ but no apt:
#   scripts/fetch-deps.sh deps          # here, on a Debian 12 machine with apt
#   scripts/gpu-check.sh report --deps deps   # there
# Nothing is installed here; `apt-get download` needs no root. Add PREFIX to
# .git/info/exclude when it lies inside the checkout.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: scripts/fetch-deps.sh PREFIX" >&2; exit 2; }
mkdir -p "$1"
prefix=$(cd "$1" && pwd)
# Headers and libraries of the build (with the shared libraries they load), the GoogleTest and
# Google Benchmark libraries, and the Vulkan loader, headers and shader compiler.
packages=(
  nlohmann-json3-dev libcli11-dev
  libopenblas-dev libopenblas0 libopenblas0-openmp libopenblas-openmp-dev libgfortran5
  libsentencepiece-dev libsentencepiece0 libprotobuf-lite32
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  libvulkan-dev libvulkan1 glslang-tools glslang-dev spirv-tools
)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}")
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
echo "fetch-deps: unpacked ${#packages[@]} packages under $prefix" >&2
