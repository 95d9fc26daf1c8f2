#!/usr/bin/env bash
# Data-parallel training on CUDA, as far as one machine's GPUs allow (scripts/gpu-check.sh
# --only dist runs it): the NCCL communicator on one GPU (TMX_FORCE_NCCL=1: a one-rank NCCL
# communicator is valid) against the same run without it, which must give the same losses; then,
# where the machine has N >= 2 GPUs and mpirun, N ranks against one GPU accumulating N
# micro-batches, replicated and with --shard-optimizer. The demo config on a dataset of this
# repository's docs; fp32, so that the comparison is not bf16's.
# Usage: scripts/dist-check.sh TMX WORKDIR
set -euo pipefail
tmx=$1 work=$2
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$work" && mkdir -p "$work"
cat "$root"/README.md "$root"/docs/*.md > "$work/corpus.txt"
"$tmx" prepare --input "$work/corpus.txt" --format paragraphs --val-fraction 0.1 \
  --tokenizer "$root/assets/demo/tokenizer.model" --out "$work/data"
train() {  # train OUT [FLAGS...]
  local out=$1; shift
  "$tmx" train --config "$root/assets/demo/config.json" --data "$work/data" --out "$work/$out" \
    --backend cuda --precision fp32 --batch-size 4 --seq-len 64 --max-steps 20 --log-every 1 \
    --eval-every 10 --eval-batches 2 --warmup-steps 5 "$@"
}
# Per-step losses of two runs, compared: exactly, or within a relative tolerance.
compare() {  # compare RUN_A RUN_B TOLERANCE
  python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3" << 'PY'
import json, sys
def losses(path):
    return {j["step"]: j["loss"] for j in map(json.loads, open(path)) if "loss" in j}
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
assert a.keys() == b.keys() and len(a) >= 20, (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print(f"{sys.argv[1]} vs {sys.argv[2]}: {len(a)} steps, largest relative loss difference {worst:.3g}")
sys.exit(0 if worst <= tol else 1)
PY
}
train one-gpu
# The gradient sums started during the backward pass (1 MiB buckets: several per pass of the
# demo model, on NCCL's own stream), then one sum after the pass.
TMX_FORCE_NCCL=1 train one-gpu-nccl --grad-bucket-mb 1 2>&1 | tee "$work/nccl.log"
grep -q "NCCL" "$work/nccl.log" || { echo "dist-check: the NCCL communicator was not used" >&2; exit 1; }
compare one-gpu one-gpu-nccl 0
TMX_FORCE_NCCL=1 train one-gpu-nccl-after --grad-bucket-mb 0
compare one-gpu one-gpu-nccl-after 0
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -ge 2 ] && command -v mpirun > /dev/null; then
  mpi=(mpirun --allow-run-as-root -np "$gpus")
  train accumulated --grad-accum "$gpus"
  "${mpi[@]}" "$tmx" train --config "$root/assets/demo/config.json" --data "$work/data" \
    --out "$work/ranks" --backend cuda --precision fp32 --batch-size 4 --seq-len 64 \
    --max-steps 20 --log-every 1 --eval-every 10 --eval-batches 2 --warmup-steps 5 \
    --grad-bucket-mb 1
  compare accumulated ranks 1e-4
  "${mpi[@]}" "$tmx" train --config "$root/assets/demo/config.json" --data "$work/data" \
    --out "$work/sharded" --backend cuda --precision fp32 --batch-size 4 --seq-len 64 \
    --max-steps 20 --log-every 1 --eval-every 10 --eval-batches 2 --warmup-steps 5 \
    --shard-optimizer
  compare ranks sharded 1e-4
else
  echo "dist-check: $gpus GPU(s)$(command -v mpirun > /dev/null || echo ', no mpirun'): only the one-GPU NCCL run"
fi
echo "dist-check: passed"
