#!/usr/bin/env bash
# CI's second stage: the whole test suite built with AddressSanitizer and
# UndefinedBehaviorSanitizer (any finding fails the test), then a short libFuzzer run of each
# reader of untrusted files (safetensors, config, token shard, corpus, GGUF, the Hugging Face
# shard index, the JSON Schema compiler, the Vulkan tuning file where the Vulkan backend is
# built), on the seeds in tests/fuzz/seeds. Builds with clang into build-sanitize/, its own
# directory, with CUDA off (nvcc cannot build with the sanitizers), without MPI (OpenMPI's own
# leaks, below) and without the benchmarks.
# Usage: scripts/sanitize.sh [--fuzz-seconds N]   (N per fuzz target, default 25; 0: no fuzzing)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir="$root/build-sanitize"
fuzz_seconds=25
while [ $# -gt 0 ]; do
  case "$1" in
    --fuzz-seconds) fuzz_seconds="$2"; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
start=$SECONDS

# clang, its sanitizer and libFuzzer runtimes, and its OpenMP runtime; scripts/setup.sh (run by
# scripts/test.sh before this stage) installed everything else.
packages=(clang libclang-rt-14-dev libomp-14-dev)
source "$root/scripts/lib/packages.sh"
ensure_packages sanitize "${packages[@]}"

# Without MPI: OpenMPI leaks from MPI_Init on (libmpi, PMIx, hwloc, its op components; some
# through frames LeakSanitizer cannot name), so its job tests would fail on leaks that are not
# ours, and suppressing them would take patterns wide enough to hide our own.
CC=clang CXX=clang++ cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTMX_SANITIZE=ON -DTMX_CUDA=OFF -DTMX_MPI=OFF -DTMX_BUILD_BENCHMARKS=OFF >/dev/null
cmake --build "$build_dir" --parallel "$(nproc)"
built=$SECONDS

# halt_on_error: every finding fails the process (and with it the test); the suppressions
# cover exactly the third-party leak described in tests/sanitizers/lsan.supp, which the preloaded
# library (tests/sanitizers) lets LeakSanitizer attribute.
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0"
(cd "$build_dir" &&
  LD_PRELOAD="$build_dir/tests/libtmx_keep_libraries_loaded.so" \
  ctest --output-on-failure --parallel "$(nproc)")
# Only a build without MPI runs this test (elsewhere it skips): see that it ran here, not skipped.
mpi_off_test='OpenCommunicator.WithoutMpiRefusesToRunAsOneOfSeveralRanks'
mpi_off_run=$(cd "$build_dir" && LD_PRELOAD="$build_dir/tests/libtmx_keep_libraries_loaded.so" \
  ctest -R "^$mpi_off_test\$")
if ! grep -q "$mpi_off_test .*Passed" <<<"$mpi_off_run"; then
  echo "sanitize: $mpi_off_test did not run and pass in the build without MPI" >&2
  exit 1
fi
tested=$SECONDS

if [ "$fuzz_seconds" -gt 0 ]; then
  for target in safetensors config token_shard corpus gguf hf_index tokenizer_model tokenizer_json \
      chat_template openai_request json_schema vulkan_tuning; do
    # Built only with the Vulkan backend (tests/fuzz/CMakeLists.txt).
    if [ "$target" = vulkan_tuning ] && [ ! -e "$build_dir/tests/fuzz/tmx_fuzz_$target" ]; then
      echo "sanitize: fuzz $target: not built (no Vulkan backend), skipped"
      continue
    fi
    seeds=("$root/tests/fuzz/seeds/$target")
    [ "$target" = config ] && seeds=("$root/assets/configs" "$root/tests/fixtures/hf_configs")
    corpus="$build_dir/fuzz-corpus/$target"
    mkdir -p "$corpus"
    log="$build_dir/fuzz-$target.log"
    if ! "$build_dir/tests/fuzz/tmx_fuzz_$target" -max_total_time="$fuzz_seconds" -timeout=10 \
        -artifact_prefix="$build_dir/fuzz-$target-" \
        -rss_limit_mb=4096 -print_final_stats=1 "$corpus" "${seeds[@]}" >"$log" 2>&1; then
      tail -n 60 "$log" >&2
      echo "sanitize: fuzz target $target found a problem (input saved in $build_dir; log $log)" >&2
      exit 1
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    echo "sanitize: fuzz $target: ${runs:-?} executions in ${fuzz_seconds} s, no finding"
  done
fi
echo "sanitize: done in $((SECONDS - start)) s (build $((built - start)) s, tests" \
     "$((tested - built)) s, fuzzing $((SECONDS - tested)) s)"
