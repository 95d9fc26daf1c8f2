#!/usr/bin/env bash
# Sets up a Debian 12 machine for tiny-mixtral and builds it: installs the Debian packages the
# build needs (idempotent: only what is missing), then configures and builds into build/.
# Run as root (or with sudo available). Usage: scripts/setup.sh [--build-dir DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir="$root/build"
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

packages=(
  g++ cmake ninja-build pkg-config git
  libgtest-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev
  libopenblas-dev libopenblas0-openmp
  libsentencepiece-dev
  libvulkan-dev glslang-tools mesa-vulkan-drivers vulkan-validationlayers
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: run as root to install packages" >&2; exit 1; }
    as_root=(sudo)
  fi
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" --parallel "$(nproc)"
echo "setup: built $build_dir/tmx" >&2
