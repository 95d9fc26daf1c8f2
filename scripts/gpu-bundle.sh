#!/usr/bin/env bash
# Packs GPU builds made on a machine without a GPU for a GPU machine that lacks the build's
# Debian packages: each build directory's tmx and tmx_tests with the files ctest reads, the
# runtime libraries a stock CUDA image lacks (SentencePiece, OpenBLAS, the Vulkan loader, MPI,
# cpp-httplib, ...; not glibc, libstdc++, OpenSSL or NCCL, which the image has in newer
# versions), the Khronos validation layer with its manifest, and the Vulkan loader's and glvnd's
# Debian packages. On the GPU machine, with the checkout at the same absolute path as here (the
# tests have the source and binary paths compiled in):
#   tar -C DIR -xJf bundle.tar.xz && for f in DIR/debs/*.deb; do dpkg -x "$f" /; done && ldconfig
#   ln -sfn DIR/BUILD ROOT/BUILD          # each build directory, where the tests expect it
#   export LD_LIBRARY_PATH=DIR/lib VK_LAYER_PATH=DIR/layers
#   export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json  # where it is
#   scripts/gpu-check.sh REPORT --prebuilt --build-dir ROOT/BUILD --only tests
# DIR must be the absolute path given as --unpacked-at (the layer's manifest names its library
# by absolute path).
#
# Usage: scripts/gpu-bundle.sh --unpacked-at DIR OUT.tar.xz BUILD_DIR...
# Needs: ldd, apt-get (downloads the .debs; network), xz.
set -euo pipefail
[ "${1:-}" = --unpacked-at ] && [ $# -ge 4 ] ||
  { echo "usage: scripts/gpu-bundle.sh --unpacked-at DIR OUT.tar.xz BUILD_DIR..." >&2; exit 2; }
at=$2 out=$(realpath -m "$3"); shift 3
stage=$(mktemp -d); trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/layers" "$stage/debs"
for dir in "$@"; do
  name=$(basename "$dir")
  mkdir -p "$stage/$name/tests" "$stage/$name/benchmarks"
  [ -x "$dir/tmx" ] && cp "$dir/tmx" "$stage/$name/"
  cp "$dir/CTestTestfile.cmake" "$stage/$name/"
  # Each gtest_discover_tests call has its own pair of files (tmx_tests[N]_include.cmake and
  # _tests.cmake): ctest refuses to start when one of them is missing.
  cp "$dir/tests/tmx_tests" "$dir/tests/CTestTestfile.cmake" "$dir"/tests/tmx_tests\[*\]_include.cmake \
     "$dir"/tests/tmx_tests\[*\]_tests.cmake "$stage/$name/tests/"
done
first=$1
ldd "$first/tests/tmx_tests" $( [ -x "$first/tmx" ] && echo "$first/tmx") | awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|libssl|libcrypto|libz|libudev|libnccl)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
layer=/usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so
manifest=/usr/share/vulkan/explicit_layer.d/VkLayer_khronos_validation.json
if [ -f "$layer" ] && [ -f "$manifest" ]; then
  cp "$layer" "$stage/lib/"
  sed "s|\"library_path\": \"[^\"]*\"|\"library_path\": \"$at/lib/libVkLayer_khronos_validation.so\"|" \
    "$manifest" > "$stage/layers/VkLayer_khronos_validation.json"
else
  echo "gpu-bundle: no validation layer here (vulkan-validationlayers); its tests will skip" >&2
fi
(cd "$stage/debs" && apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 > /dev/null)
tar -C "$stage" -cJf "$out" .
ls -l "$out"
