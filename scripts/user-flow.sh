#!/usr/bin/env bash
# A user's path through tmx on one backend, with its defaults (bf16 on CUDA): generation from the
# shipped demo model (default precision and fp32), stories sampled from it written as JSONL and
# prepared into a dataset (no data needs to travel with the repo), a short training run of the
# demo config stopped by SIGINT, resumed to a later step, evaluated, and generating; then a batch
# that cannot fit, which must be refused with exit 2. Stops at the first command that fails.
# scripts/gpu-check.sh runs it on CUDA (its `flow` group); it runs on any backend that trains.
#
# Usage: scripts/user-flow.sh TMX BACKEND WORK_DIR [TRAIN_SECONDS]
#   TMX            the tmx executable
#   BACKEND        cpu or cuda
#   WORK_DIR       emptied, then holds the stories, the dataset and the run
#   TRAIN_SECONDS  how long the first training run goes before its SIGINT (default 20)
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: scripts/user-flow.sh TMX BACKEND WORK_DIR [TRAIN_SECONDS]" >&2; exit 2; }
tmx=$1 backend=$2 work=$3 train_seconds=${4:-20}
root=$(cd "$(dirname "$0")/.." && pwd)
demo="$root/assets/demo"
rm -rf "$work" && mkdir -p "$work"
run() { echo "+ $*" >&2; "$@"; }

echo "== generation from the demo model: the backend's default precision, then fp32 (greedy)"
run "$tmx" generate --model "$demo" --backend "$backend" --prompt "Once upon a time" \
    --max-new-tokens 48 --temperature 0
run "$tmx" generate --model "$demo" --backend "$backend" --precision fp32 \
    --prompt "Once upon a time" --max-new-tokens 48 --temperature 0

echo "== a dataset: 64 stories sampled from the demo model, as JSONL"
for i in $(seq 64); do echo "Once upon a time"; done > "$work/prompts.txt"
run "$tmx" generate --model "$demo" --backend "$backend" --prompts-file "$work/prompts.txt" \
    --max-new-tokens 200 --seed 1 --json > "$work/stories.jsonl"
[ "$(wc -l < "$work/stories.jsonl")" -eq 64 ] || { echo "expected 64 stories" >&2; exit 1; }
run "$tmx" prepare --input "$work/stories.jsonl" --tokenizer "$demo" --out "$work/data" \
    --val-fraction 0.125 --quiet

echo "== training, stopped by SIGINT after $train_seconds s, then resumed"
train=("$tmx" train --config "$demo/config.json" --data "$work/data" --out "$work/run"
       --backend "$backend" --batch-size 16 --seq-len 128 --max-steps 300 --eval-every 50
       --eval-batches 2 --checkpoint-every 50 --log-every 25)
echo "+ timeout --preserve-status -s INT $train_seconds ${train[*]}"
rc=0
timeout --preserve-status -s INT "$train_seconds" "${train[@]}" || rc=$?
# 130: stopped by the signal with a checkpoint; 0: the 300 steps ended first.
[ $rc -eq 130 ] || [ $rc -eq 0 ] || { echo "training exited with $rc (expected 130 or 0)" >&2; exit 1; }
run "$tmx" train --resume "$work/run" --max-steps 400
run "$tmx" eval --model "$work/run/best" --data "$work/data" --split val --backend "$backend"
run "$tmx" generate --model "$work/run/best" --backend "$backend" --prompt "Once upon a time" \
    --max-new-tokens 48 --seed 2

echo "== a batch that cannot fit is refused before anything is allocated (exit 2)"
rc=0
"$tmx" train --config "$demo/config.json" --data "$work/data" --out "$work/too-big" \
    --backend "$backend" --batch-size 100000000 --seq-len 256 --max-steps 1 || rc=$?
[ $rc -eq 2 ] || { echo "a batch of 100,000,000 exited with $rc (expected 2)" >&2; exit 1; }
[ ! -e "$work/too-big/step_00000001" ] || { echo "the refused run wrote a checkpoint" >&2; exit 1; }
echo "user-flow: every step passed on $backend"
