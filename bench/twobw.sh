#!/bin/sh
# twobw.sh [TRAIN OPTIONS]: make run's task (the embedded additions and
# sentences, preset mini) on a 2-stage pipeline, trained by 1F1B and by
# PipeDream-2BW over the same tokens with the same number of weight updates:
# 1F1B (synchronous, an update every 2 micro-batches of 8 rows: --grad-accum 2
# --batch 16, 1600 steps) and 2BW (asynchronous, 8 micro-batches a step, an
# update every 2 of them from the gradient at the weights one update older:
# --grad-accum 8 --batch 64, 400 steps; warm-up, cosine decay and evaluation
# at the same token counts). Both at make run's peak learning rate (6e-3) and
# at a third of it (2e-3): a one-update-old gradient halves the largest
# stable step of gradient descent, so the gap depends on the rate. All four
# loss curves in one picture (build/twobw/loss.svg), final validation losses
# side by side. Extra options go to every run. About 20 minutes on 2 cores.
set -e
cd "$(dirname "$0")/.."
out=build/twobw
mkdir -p "$out"
[ -x build/train ] && [ -x build/curves ] || make build/train build/curves >/dev/null
run() { # NAME LR SCHEDULE OPTIONS...
    name=$1 lr=$2 sched=$3
    shift 3
    echo "== $name"
    build/train --pp 2 --schedule "$sched" --lr "$lr" --min-lr "$(echo "$lr" | awk '{print $1 / 10}')" \
        --checkpoint "$out/$name.safetensors" --force --sample-tokens 0 "$@" >"$out/$name.log"
    grep -E '^validation loss|^additions' "$out/$name.log"
    grep -E '^step' "$out/$name.log" | tail -n 1
}
for lr in 6e-3 2e-3; do
    run "1f1b-lr$lr" "$lr" 1f1b --grad-accum 2 --batch 16 --steps 1600 --warmup 48 --eval-every 100 "$@"
    run "2bw-lr$lr" "$lr" 2bw --grad-accum 8 --batch 64 --steps 400 --warmup 12 --eval-every 25 "$@"
done
echo
build/curves --out "$out/loss.svg" \
    --title "ptrain: make run's task on 2 stages, 1F1B and PipeDream-2BW at two learning rates" \
    "1f1b lr 6e-3=$out/1f1b-lr6e-3.loss.csv" "2bw lr 6e-3=$out/2bw-lr6e-3.loss.csv" \
    "1f1b lr 2e-3=$out/1f1b-lr2e-3.loss.csv" "2bw lr 2e-3=$out/2bw-lr2e-3.loss.csv"
