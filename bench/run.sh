#!/bin/sh
# make bench: end-to-end training steps of the three reference configurations,
# each against the sgemm peak measured in the same run.
set -e
echo "== kernels at gpt2-124m shapes (B=8, T=256), each checked, then timed =="
build/bench_kernels --config gpt2-124m --batch 8 --seq 256
echo
echo "== end-to-end training step (forward + backward + AdamW), median of the timed steps"
build/bench_step --config small --batch 8 --seq 128 --steps 5
build/bench_step --config gpt2-124m --batch 4 --seq 64 --steps 3
build/bench_step --config gpt2-124m --batch 8 --seq 256 --steps 3
echo
echo "== long context: attention memory is linear in T (only the log-sum-exp is saved)"
build/bench_step --config gpt2-124m --batch 1 --seq 1024 --steps 2
echo
echo "== sharing the machine: the small step beside one busy process (a shell loop)"
sh bench/contention.sh
echo
echo "== tensor and data parallelism: compute and communication per rank (gpt2-124m widths)"
sh bench/parallel.sh
echo
echo "== pipeline schedules: measured bubble vs theory, activation slots vs the checker"
sh bench/pipeline.sh
echo
echo "== communication behind computation: a started all-reduce across 2 namespace hosts (TCP)"
sh bench/overlap.sh
echo
echo "== the simulator against real steps here (tp, dp, pp up to 4, every schedule)"
build/plan --calibrate
build/sim_vs_real --all
