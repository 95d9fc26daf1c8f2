#!/usr/bin/env bash
# Checks a GPU machine end to end and writes one report: configures with CUDA (required),
# builds, runs every CUDA and Vulkan test (each in its own process, through ctest; a CUDA test
# that skips fails the step), runs the CUDA op suites under compute-sanitizer (memcheck,
# racecheck, synccheck, side by side), times `tmx bench` on the GPU backends (and profiles
# Vulkan's decode steps: `tmx bench --profile`), runs a user's commands on CUDA end to end
# (scripts/user-flow.sh), and, when
# ../shared/tools/torch_reference.py and PyTorch are there, times PyTorch on the same model and
# GPU. Without --quick it also trains at the largest batch (T512, bf16) whose tensors tmx counts
# at most 18 GiB, and fails unless tmx's peak and the device memory in use stay under 20 GB. Every
# step has a time limit, so a hung kernel fails its step instead of the whole run; with --quick
# the whole check takes about 4 minutes on an H100, plus the PyTorch steps. The group l4 builds
# the CUDA code a second time as PTX for compute_89 alone (no machine code for any GPU), so that
# the driver compiles the L4's (sm_89) variants of every kernel and runs them on this GPU, and
# runs the CUDA tests and compute-sanitizer's memcheck on that build.
#
# Tests run with TMX_REQUIRE_BACKENDS=cuda,vulkan (override it in the environment, e.g. =cuda on
# a machine without a Vulkan driver): a test whose backend cannot be opened fails instead of
# skipping, since on a GPU machine a skip checks nothing.
#
# Usage: scripts/gpu-check.sh REPORT_DIR [--deps PREFIX] [--build-dir DIR] [--quick] [--all-tests]
#                              [--only GROUPS] [--prebuilt] [--deadline SECONDS] [--baseline TMX]
#   REPORT_DIR  gets report.txt, report.json and one log per step
#   --deps      a prefix holding the build's Debian packages unpacked (scripts/fetch-deps.sh
#               makes it), for a machine without apt; searched before the system
#   --quick     training benchmarks at batch 8 instead of 32, and no torch.compile run
#   --all-tests also run the CPU tests (CI runs those on every change)
#   --only GROUPS  run only these comma-separated groups of steps (default: all): tests (the
#               CUDA and Vulkan tests), sanitizers, bench (tmx bench: both precisions, the
#               GEMM, Vulkan's profile), fit (the largest batch under 20 GB), flow
#               (scripts/user-flow.sh on CUDA: generate, prepare, train, SIGINT, resume,
#               eval, a refused batch), dist (scripts/dist-check.sh: data-parallel training on
#               NCCL, one GPU and, where there are several, all of them), torch (PyTorch), l4 (the compute_89 PTX build's CUDA
#               tests and memcheck, run through the driver's JIT; not part of the default set),
#               vulkan (Vulkan's tests, `tmx tune` of both models, and tuned/untuned benches
#               against CUDA; not part of the default set).
#               The full check takes longer than one 10-minute command on a lent machine;
#               split it, e.g. `--only tests,sanitizers`, then `--only bench,flow`, then
#               `--only fit,torch`, each into its own REPORT_DIR with the same --build-dir
#               (configure and build run each time, and are quick once built).
#   --prebuilt  use the binaries already in --build-dir (and, for l4, DIR-l4) instead of
#               configuring and building: for a lent machine without the build's packages,
#               given binaries built elsewhere at the same absolute path
#               (scripts/gpu-bundle.sh packs them with their runtime libraries)
#   --torch-ref FILE  torch_reference.py (default: ../shared/tools/torch_reference.py)
#   --deadline SECONDS  the whole check's wall-clock budget from its start: each step's limit
#               is cut to what is left, and a step with under 15 s left is skipped (reported
#               as such, and the check fails); for a lent machine's fixed minutes, so that the
#               report is written before the call's own limit kills everything
#   --baseline TMX  another build's tmx (a Vulkan-only build is enough): the vulkan group also
#               times its Vulkan decode and profile untuned beside this build's, in the same
#               call, to show what the changes between them bought
# CUDAARCHS=90 (say) builds for that architecture alone, which is quicker than the default set.
#   --peak-tflops N  the GPU's peak for the training steps' MFU (default: tmx bench's table
#               of published peaks, in each step's precision: H100, H200, A100, L40S, L4,
#               RTX 4090; other GPUs get no MFU)
# Needs: the CUDA toolkit >= 12.0 (nvcc), CMake >= 3.25, Ninja, a C++20 g++, python3, and the
# Debian packages scripts/setup.sh lists (installed, or unpacked under --deps).
# Exit status: 0 when every step passed, 1 otherwise (the report says which).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
report="" deps="" build_dir="$root/build-gpu" quick=0 all_tests=0 peak="" only="" prebuilt=0
deadline="" baseline=""
torch_ref="$root/../shared/tools/torch_reference.py"
while [ $# -gt 0 ]; do
  case "$1" in
    --deps) deps=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    --quick) quick=1; shift ;;
    --all-tests) all_tests=1; shift ;;
    --torch-ref) torch_ref="$2"; shift 2 ;;
    --peak-tflops) peak="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --prebuilt) prebuilt=1; shift ;;
    --deadline) deadline="$2"; shift 2 ;;
    --baseline) baseline=$(realpath "$2") || exit 2; shift 2 ;;
    -h|--help) sed -n '2,/^# Exit status/p' "$0"; exit 0 ;;
    -*) echo "gpu-check.sh: unknown option '$1'" >&2; exit 2 ;;
    *) [ -z "$report" ] || { echo "gpu-check.sh: one REPORT_DIR only" >&2; exit 2; }
       report="$1"; shift ;;
  esac
done
[ -n "$report" ] || { echo "usage: scripts/gpu-check.sh REPORT_DIR [--deps PREFIX] [--quick] [--only GROUPS]" >&2; exit 2; }
for group in ${only//,/ }; do
  case "$group" in
    tests|sanitizers|bench|vulkan|fit|flow|dist|torch|l4) ;;
    *) echo "gpu-check.sh: --only: unknown group '$group' (tests, sanitizers, bench, vulkan, fit, flow, dist, torch, l4)" >&2; exit 2 ;;
  esac
done
[ -z "$deadline" ] || [[ "$deadline" =~ ^[1-9][0-9]*$ ]] ||
  { echo "gpu-check.sh: --deadline: expected whole seconds, got '$deadline'" >&2; exit 2; }
[ -z "$baseline" ] || [ -x "$baseline" ] ||
  { echo "gpu-check.sh: --baseline: '$baseline' is not an executable tmx" >&2; exit 2; }
started=$(date +%s)
# wanted GROUP: whether --only includes it (everything but l4 and vulkan without --only).
wanted() { if [ -z "$only" ]; then [ "$1" != l4 ] && [ "$1" != vulkan ]; else [[ ",$only," == *",$1,"* ]]; fi; }
export TMX_REQUIRE_BACKENDS="${TMX_REQUIRE_BACKENDS-cuda,vulkan}"
mkdir -p "$report" && report=$(cd "$report" && pwd)
: > "$report/report.txt"
: > "$report/steps.tsv"

if [ -n "$deps" ]; then
  arch_dir="lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
  export CMAKE_PREFIX_PATH="$deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$deps/usr/$arch_dir/pkgconfig:$deps/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$deps"
  export LD_LIBRARY_PATH="$deps/usr/$arch_dir:$deps/usr/$arch_dir/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PATH="$deps/usr/bin:$PATH"
fi
export PATH="$PATH:/usr/local/cuda/bin"

say() { echo "$*" | tee -a "$report/report.txt"; }
failed=0
# step NAME SECONDS COMMAND...: runs it with its output in NAME.log and a time limit (cut to
# what --deadline leaves), records status and seconds; past the deadline it records a skip.
step() {
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  if [ -n "$deadline" ]; then
    # The kill that follows a step's TERM by 10 s counts against the deadline too.
    local left=$(( deadline - (t0 - started) - 10 ))
    if [ $left -lt 15 ]; then
      say "== $name: SKIPPED: ${left} s left of the ${deadline} s deadline"
      printf '%s\t%s\t%s\n' "$name" 125 0 >> "$report/steps.tsv"
      failed=1
      return 125
    fi
    [ $left -lt "$limit" ] && limit=$left
  fi
  say "== $name: $*"
  timeout --kill-after=10 "$limit" "$@" > "$report/$name.log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "(stopped at its ${limit} s limit)" >> "$report/$name.log"
  local secs=$(( $(date +%s) - t0 ))
  printf '%s\t%s\t%s\n' "$name" "$rc" "$secs" >> "$report/steps.tsv"
  if [ $rc -eq 0 ]; then say "   ok (${secs} s)"; else say "   FAILED: exit $rc (${secs} s), see $name.log"; failed=1; fi
  tail -n 5 "$report/$name.log" | sed 's/^/   | /' | tee -a "$report/report.txt"
  return $rc
}

say "gpu-check $(date -u +%FT%TZ) on $(hostname)"
step environment 60 bash -c 'nvidia-smi; nvcc --version; cmake --version | head -1; g++ --version | head -1'

tmx="$build_dir/tmx"
tests="$build_dir/tests/tmx_tests"
# Every CUDA and Vulkan test in its own process (NVIDIA's Vulkan driver refuses new instances
# after about 70 in one process). A CUDA test that skips on a GPU machine is a failure here: it
# checked nothing.
# gpu_tests BUILD_DIR NAME [REGEX]: the tests matching REGEX (default: CUDA and Vulkan, and the
# CLI tests that run the same command on every backend present).
gpu_tests() {
  local dir=$1 name=$2 regex=${3:-'[Cc]uda|[Vv]ulkan|WeightFormatCli|EveryBackend'}
  # CudaMemory measures the device's free memory, which other processes move: alone, after.
  # VulkanVariants runs at three lavapipe widths, which a GPU's driver ignores: one of them.
  ctest --test-dir "$dir" --output-on-failure --parallel "$(nproc)" \
        --output-junit "$report/$name.xml" -R "$regex" -E 'CudaMemory|\.lp(128|512)$' \
        > "$report/$name-ctest.log" 2>&1
  local rc=$?
  ctest --test-dir "$dir" --output-on-failure -R CudaMemory >> "$report/$name-ctest.log" 2>&1 || rc=1
  cat "$report/$name-ctest.log"
  local skipped
  skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .*[Cc]uda.*\(Skipped\)' "$report/$name-ctest.log")
  [ "$skipped" -eq 0 ] || echo "gpu-check: $skipped CUDA tests skipped on a GPU machine"
  [ $rc -eq 0 ] && [ "$skipped" -eq 0 ]
}
export build_dir report
export -f gpu_tests
# build DIR NAME [CUDAARCHS]: configures and builds DIR (nothing with --prebuilt but a check
# that the binaries are there).
build() {
  local dir=$1 name=$2 archs=${3:-${CUDAARCHS:-}}
  if [ $prebuilt -eq 1 ]; then
    step "$name-prebuilt" 10 ls -l "$dir/tmx" "$dir/tests/tmx_tests"
    return
  fi
  step "$name-configure" 300 env ${archs:+CUDAARCHS=$archs} cmake -S "$root" -B "$dir" -G Ninja \
       -DCMAKE_BUILD_TYPE=Release -DTMX_CUDA=ON &&
    step "$name-build" 900 cmake --build "$dir" --parallel "$(nproc)"
}
if build "$build_dir" main; then
  step devices 60 "$tmx" devices
  wanted tests && step gpu-tests 600 bash -c "gpu_tests '$build_dir' gpu-tests"
  [ $all_tests -eq 1 ] && step all-tests 1200 ctest --test-dir "$build_dir" --output-on-failure --parallel "$(nproc)"
  if ! wanted sanitizers; then
    :
  elif command -v compute-sanitizer > /dev/null; then
    # Side by side (one GPU holds them all). Racecheck leaves out the training-size
    # reproducibility test: its kernels are the ones the smaller tests run, at 40x the time.
    for tool in memcheck racecheck synccheck; do
      filter='Backends/*/cuda'
      [ $tool = racecheck ] && filter='Backends/*/cuda:-*AtTrainingSizes*'
      step "sanitizer-$tool" 420 compute-sanitizer --tool "$tool" --error-exitcode 99 \
           "$tests" --gtest_filter="$filter" &
    done
    wait
    grep -h "ERROR SUMMARY" "$report"/sanitizer-*.log | sed 's/^/   /' | tee -a "$report/report.txt"
  else
    say "== compute-sanitizer: not found (it ships with the full CUDA toolkit); skipped"
    failed=1
  fi
  if [ $quick -eq 1 ]; then
    bench_args=(--prompt 128 --decode 32 --batch 8 --repeats 3)
    train_args=(--train-batch 8 --train-seq 512)
  else
    bench_args=(--prompt 512 --decode 128 --batch 8 --repeats 5)
    train_args=(--train-batch 32 --train-seq 512)
  fi
  gpu_backends=cuda
  "$tmx" devices --json 2> /dev/null | python3 -c \
    'import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(x.get("type")!="cpu" for x in d.get("devices",[])) else 1)' \
    && gpu_backends=cuda,vulkan
  # Without --peak-tflops, tmx bench takes the published peak of the GPUs it knows.
  [ -n "$peak" ] && train_args+=(--peak-tflops "$peak")
  # Each backend runs in its default precision (CUDA bf16, Vulkan fp32 with fp16 weights); the
  # second run times CUDA in fp32 (ops, prefill, decode and the training step) for comparison.
  if wanted bench; then
    step bench 400 "$tmx" bench --backends "$gpu_backends" "${bench_args[@]}" "${train_args[@]}" --json
    step bench-fp32 300 "$tmx" bench --backends cuda "${bench_args[@]}" "${train_args[@]}" --precision fp32
    step bench-gemm 120 "$tmx" bench --backends "$gpu_backends" --prompt 16 --decode 4 --batch 1 --gemm 8192 --repeats 3
    # Where Vulkan's decode step spends its time: device time per shader, against the wall time.
    if [ "$gpu_backends" = cuda,vulkan ]; then
      step bench-profile 200 "$tmx" bench --backends vulkan --prompt 512 --decode 32 --batch 8 \
           --repeats 1 --profile
    fi
  fi
  # Vulkan's tuning (tmx tune, docs/commands.md), measurements first so that a --deadline cuts
  # the tests rather than the numbers: tiny-mixtral's shapes tuned (the device file is kept in
  # the report), its bench against CUDA tuned, untuned (TMX_VULKAN_TUNING=off) and CUDA in fp32
  # (the training comparison), Vulkan's prefill and decode profiles (tune's JSON times every
  # matrix-vector and decode-attention candidate, the subgroup forms too) and one training step,
  # --baseline's decode beside it; then every Vulkan test; then the same tune and benches for
  # tiny-mixtral-swiglu. On an H200 (2026-11-28) everything before the tests took 5 minutes,
  # the tunes 110 and 81 s; --quick trains at batch 8.
  if wanted vulkan; then
    export XDG_CACHE_HOME="$report/cache"
    # The issue's table's settings; no untimed CPU training step (minutes at B32).
    vk_bench=(--prompt 512 --decode 128 --batch 8 --repeats 3 --no-train-check)
    profile=(bench --backends vulkan --prompt 512 --decode 32 --batch 8 --repeats 1 --profile)
    # tune_and_bench CONFIG: the model's shapes tuned, then its benches.
    tune_and_bench() {
      local cfg=$1 config="$root/assets/configs/$1.json"
      # Training shapes at B8 (the bench's B32 rows take the nearest tuned class): each
      # shape's CPU reference and every candidate's check stay well inside the step's limit.
      # Three timed batches of about 3 ms a candidate: hundreds of candidates in minutes.
      # --gemm 4096: the benches' square fp32 GEMM runs tuned too (the issue's 25 TFLOP/s goal;
      # on 2026-11-28 it ran the default tile). The device file keeps it for the second model.
      local gemm=()
      [ "$cfg" = tiny-mixtral ] && gemm=(--gemm 4096)
      step "tune-$cfg" 240 "$tmx" tune --config "$config" --train-batch 8 --train-seq 512 \
           --repeats 3 --min-ms 3 "${gemm[@]}" --json
      step "bench-$cfg-tuned" 200 "$tmx" bench --config "$config" --backends cuda,vulkan \
           "${vk_bench[@]}" "${train_args[@]}" --gemm 4096 --json
      # CUDA first here too: a process whose first work is Vulkan's starts on an idle GPU's
      # clocks, and its op table ran 3x slower (2026-11-28).
      step "bench-$cfg-untuned" 200 env TMX_VULKAN_TUNING=off "$tmx" bench --config "$config" \
           --backends cuda,vulkan "${vk_bench[@]}" "${train_args[@]}" --gemm 4096 --json
      step "bench-$cfg-cuda-fp32" 120 "$tmx" bench --config "$config" --backends cuda \
           "${vk_bench[@]}" "${train_args[@]}" --precision fp32 --json
    }
    tune_and_bench tiny-mixtral
    # The default profile also profiles a training step: which backward shaders take it.
    step vulkan-profile 120 "$tmx" "${profile[@]}" "${train_args[@]}" --no-train-check
    if [ -n "$baseline" ]; then
      step vulkan-profile-untuned 120 env TMX_VULKAN_TUNING=off "$tmx" "${profile[@]}"
      step vulkan-profile-baseline 120 env TMX_VULKAN_TUNING=off "$baseline" "${profile[@]}"
      step bench-baseline-decode 120 env TMX_VULKAN_TUNING=off "$baseline" bench \
           --backends vulkan --prompt 512 --decode 128 --batch 8 --repeats 3 --json
    fi
    step vulkan-tests 300 bash -c "gpu_tests '$build_dir' vulkan-tests '[Vv]ulkan|TuneCli'"
    tune_and_bench tiny-mixtral-swiglu
    cp -r "$report/cache/tmx" "$report/tuning" 2> /dev/null
    unset XDG_CACHE_HOME
  fi
  # The L4's code path on this GPU: PTX for compute_89 only, so the driver JIT-compiles every
  # kernel's sm_89 variant (one block per SM, at most 99 KiB of shared memory) and no sm_90 code
  # exists to run instead; cuobjdump proves the build holds no machine code.
  if wanted l4; then
    l4_dir="$build_dir-l4"
    if build "$l4_dir" l4 89-virtual; then
      # cuobjdump names each PTX file after its target (name.sm_89.ptx) and lists no ELF.
      step l4-ptx-only 30 bash -c "cuobjdump --list-ptx '$l4_dir/tests/tmx_tests' | tee /dev/stderr |
        grep -Eq 'sm_89|compute_89' && ! cuobjdump --list-elf '$l4_dir/tests/tmx_tests' 2>&1 | tee /dev/stderr |
        grep -q 'sm_[0-9]*\.cubin' && echo 'PTX for sm_89 only, no machine code'"
      step l4-tests 600 bash -c "gpu_tests '$l4_dir' l4-tests '[Cc]uda'"
      step l4-memcheck 420 compute-sanitizer --tool memcheck --error-exitcode 99 \
           "$l4_dir/tests/tmx_tests" --gtest_filter='Backends/*/cuda'
    fi
  fi
  # A user's commands on CUDA with their defaults (bf16), end to end; its files stay in the
  # build directory (checkpoints are too large for a report).
  wanted flow && step user-flow 300 bash "$root/scripts/user-flow.sh" "$tmx" cuda "$build_dir/user-flow"
  # Data-parallel training: NCCL on one GPU against no communicator; N ranks where N GPUs are.
  wanted dist && step dist 300 bash "$root/scripts/dist-check.sh" "$tmx" "$build_dir/dist-check"
  if [ $quick -eq 0 ] && wanted fit; then
    # Does training fit an L4? The largest batch (a multiple of 8) at T512 whose tensors, as
    # `tmx params` counts them in bf16, stay within 18 GiB, timed; fit-check then holds under
    # 20 GB both tmx's measured peak (its tensors and CUDA ops' scratch) and the device memory
    # in use that nvidia-smi sampled meanwhile (which adds the CUDA context, cuBLASLt's
    # workspace and the pool's slack).
    fit_batch=$(python3 - "$tmx" "$root/assets/configs/tiny-mixtral.json" << 'EOF'
import json, subprocess, sys
tmx, cfg = sys.argv[1:3]
best = 0
for b in range(8, 513, 8):
    out = subprocess.run([tmx, "params", "--config", cfg, "--batch", str(b), "--seq", "512", "--json"],
                         check=True, capture_output=True, text=True).stdout
    if json.loads(out)["memory"]["engine_training"]["bf16"]["total"] > 18 * 2**30:
        break
    best = b
print(best)
EOF
)
    if [ "${fit_batch:-0}" -gt 0 ] 2> /dev/null; then
      nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 \
        > "$report/fit-memory.log" 2>&1 &
      sampler=$!
      # No CPU step at that batch (--no-train-check): it took minutes and cut the run off.
      step bench-train-fit 600 "$tmx" bench --backends cuda --prompt 16 --decode 4 --batch 1 \
           --repeats 2 --train-batch "$fit_batch" --train-seq 512 --precision bf16 --json \
           --no-train-check
      kill $sampler 2> /dev/null; wait $sampler 2> /dev/null
      step fit-check 10 python3 -c '
import json, sys
log = [l for l in open(sys.argv[1]) if l.startswith("{")]
t = json.loads(log[-1])["backends"][0]["train"]
used = [int(l) for l in open(sys.argv[2]) if l.strip().isdigit()]
device = max(used) * 2**20 if used else None
print("batch %d x %d (%s): %.0f tokens/s; tmx tensors %.2f GB, tmx peak %.2f GB, device in use %s"
      % (t["batch"], t["seq"], t["precision"], t["tokens_per_s"], t["engine_bytes"] / 1e9,
         t["peak_bytes"] / 1e9, "%.2f GB" % (device / 1e9) if device else "not sampled"))
sys.exit(0 if t["peak_bytes"] < 20e9 and (device or 0) < 20e9 else 1)' \
           "$report/bench-train-fit.log" "$report/fit-memory.log"
    else
      say "== bench-train-fit: FAILED: no batch from tmx params (got '${fit_batch:-}')"
      failed=1
    fi
  fi
fi

if ! wanted torch; then
  :
elif [ -f "$torch_ref" ] && python3 -c 'import torch; assert torch.cuda.is_available()' 2> /dev/null; then
  cfg="$root/assets/configs/tiny-mixtral.json"
  tb=32; [ $quick -eq 1 ] && tb=8
  step torch-train-eager-bf16 300 python3 "$torch_ref" bench-train "$cfg" --batch $tb --seq 512 --bf16
  [ $quick -eq 0 ] &&
    step torch-train-compile-bf16 400 python3 "$torch_ref" bench-train "$cfg" --batch $tb --seq 512 --bf16 --compile
  step torch-train-eager-fp32 300 python3 "$torch_ref" bench-train "$cfg" --batch $tb --seq 512
  step torch-decode-eager 120 python3 "$torch_ref" bench-decode "$cfg" --prompt 16 --new 128
  step torch-decode-eager-bf16 120 python3 "$torch_ref" bench-decode "$cfg" --prompt 16 --new 128 --bf16
else
  say "== PyTorch comparison: skipped (needs $torch_ref and PyTorch with CUDA)"
fi

# report.json: every step's status and time, the bench results, the PyTorch lines.
python3 - "$report" << 'EOF'
import json, os, sys
report = sys.argv[1]
steps = []
for line in open(os.path.join(report, "steps.tsv")):
    name, rc, secs = line.rstrip("\n").split("\t")
    steps.append({"step": name, "exit": int(rc), "seconds": int(secs)})
out = {"steps": steps, "passed": all(s["exit"] == 0 for s in steps)}
try:
    lines = [l for l in open(os.path.join(report, "bench.log")) if l.startswith("{")]
    out["bench"] = json.loads(lines[-1]) if lines else None
except OSError:
    out["bench"] = None
try:
    lines = [l for l in open(os.path.join(report, "bench-train-fit.log")) if l.startswith("{")]
    out["largest_batch_under_20gb"] = json.loads(lines[-1])["backends"][0]["train"] if lines else None
except (OSError, KeyError, IndexError):
    out["largest_batch_under_20gb"] = None
out["torch"] = {}
for s in steps:
    if s["step"].startswith("torch-"):
        with open(os.path.join(report, s["step"] + ".log")) as f:
            out["torch"][s["step"]] = [l.rstrip() for l in f if l.strip()][-5:]
json.dump(out, open(os.path.join(report, "report.json"), "w"), indent=1)
EOF
say "report: $report/report.txt, $report/report.json"
# Steps run side by side record their status only in steps.tsv.
awk -F'\t' '$2 != 0 { bad = 1 } END { exit bad }' "$report/steps.tsv" || failed=1
[ $failed -eq 0 ] && say "gpu-check: every step passed" || say "gpu-check: some steps FAILED"
exit $failed
