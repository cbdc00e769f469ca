#!/bin/sh
# make bench: end-to-end training steps of the three reference configurations,
# each against the sgemm peak measured in the same run.
set -e
echo "end-to-end training step (forward + backward + AdamW), median of the timed steps"
build/bench_step --config small --batch 8 --seq 128 --steps 5
build/bench_step --config gpt2-124m --batch 4 --seq 64 --steps 3
build/bench_step --config gpt2-124m --batch 8 --seq 256 --steps 3
