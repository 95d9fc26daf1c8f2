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
# Google Benchmark libraries, the Vulkan loader, headers and shader compiler, and the GL
# dispatch libraries (libglvnd) that NVIDIA's Vulkan driver loads.
packages=(
  nlohmann-json3-dev libcli11-dev
  libopenblas-dev libopenblas0 libopenblas0-openmp libopenblas-openmp-dev libgfortran5
  libsentencepiece-dev libsentencepiece0 libprotobuf-lite32
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  libvulkan-dev libvulkan1 glslang-tools
  libglvnd0 libgl1 libglx0 libegl1 libopengl0 libgles2
)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download "${packages[@]}")
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$prefix"; done
# What the build never reads, so the prefix travels light: static archives
# other than the test libraries (OpenBLAS is linked as a shared library), documentation, and
# the Vulkan registry (the prefix is about 75 MB, 12 MB as a .tar.xz).
find "$prefix" -name '*.a' ! -name 'libgtest*' ! -name 'libgmock*' ! -name 'libbenchmark*' -delete
rm -rf "$prefix/usr/share/doc" "$prefix/usr/share/man" "$prefix/usr/share/vulkan/registry"
echo "fetch-deps: unpacked ${#packages[@]} packages under $prefix" >&2
