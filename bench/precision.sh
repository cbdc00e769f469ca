#!/bin/sh
# precision.sh [TRAIN OPTIONS]: make run's task (the embedded additions and
# sentences, preset mini, 1600 steps) trained twice over the same tokens, in
# fp32 and in bf16 mixed precision, then both loss curves in one picture
# (build/precision/loss.svg) and the final validation losses side by side.
# Exits 1 if bf16's final validation loss is more than 2% from fp32's.
# Extra options go to both runs (e.g. --steps 400 --preset tiny).
set -e
out=build/precision
mkdir -p "$out"
for p in fp32 bf16; do
    echo "== --precision $p"
    build/train --precision "$p" --checkpoint "$out/$p.safetensors" --force --sample-tokens 0 \
        "$@" >"$out/$p.log"
    grep -E '^threads|^validation loss|^additions' "$out/$p.log"
    grep -E '^step' "$out/$p.log" | tail -n 1
done
echo
build/curves --out "$out/loss.svg" --title "ptrain: make run's task, fp32 and bf16 GEMMs" \
    --max-diff 2 fp32="$out/fp32.loss.csv" bf16="$out/bf16.loss.csv"
