#!/bin/sh
# How a training step shares the machine: the small configuration's step on
# all n cores alone, on n-1 threads alone, and on n threads beside one busy
# process (a shell loop that never sleeps), with ptrain's passive waiting and
# with spinning OpenMP threads (OMP_WAIT_POLICY=active) for comparison.
# A fair share of the cores would slow the step by (n+1)/n; GEMMs split their
# work evenly over the threads, so the one sharing a core sets the pace and
# n-1 threads alone is the realistic floor. Ratios are from this one run.
set -e
cd "$(dirname "$0")/.."
n=$(nproc)
[ "$n" -ge 2 ] || { echo "contention: needs 2 or more cores"; exit 0; }
step() {  # step THREADS [ENV...]: median ms/step
    t=$1; shift
    env "$@" build/bench_step --config small --batch 8 --seq 128 --steps 8 --threads "$t" \
        --json | sed -n 's/.*"ms_per_step": *\([0-9.]*\).*/\1/p'
}
alone=$(step "$n")
fewer=$(step $((n - 1)))
sh -c 'while :; do :; done' &
busy=$!
trap 'kill $busy 2>/dev/null || true' EXIT
sleep 0.5
shared=$(step "$n")
spin=$(step "$n" OMP_WAIT_POLICY=active)
awk -v a="$alone" -v f="$fewer" -v s="$shared" -v p="$spin" -v n="$n" 'BEGIN {
    printf "  %d threads alone                    %7.1f ms/step\n", n, a
    printf "  %d threads alone                    %7.1f ms/step  %.2fx\n", n - 1, f, f / a
    printf "  %d threads beside 1 busy process    %7.1f ms/step  %.2fx (fair share %.2fx)\n", n, s, s / a, (n + 1) / n
    printf "  same, OpenMP threads spinning      %7.1f ms/step  %.2fx\n", p, p / a
}'
