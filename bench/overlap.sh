#!/bin/sh
# Communication behind computation across 2 "hosts" (network namespaces, Open MPI
# over TCP only, tbf-shaped links: tests/hosts.sh). See bench/bench_overlap.c.
#
# 1. Training steps (dp 2, one rank a host, 16 layers of 256, vocabulary 2048:
#    13.3M parameters, 53 MB of gradients) with pt_step_desc.overlap on and
#    off, and each rank's batch alone (the compute), at link rates from well
#    below to well above the one where the dp communication takes about as
#    long as the compute (~2 Gbit/s on the Zen 5 of 2026-11-26): a table of
#    step times beside the limit max(compute, communication), the exposed
#    communication (step - compute) with overlap as a share of the exposed
#    communication without, and the simulator's prediction of both steps
#    (this machine's profile, build/hw-local.txt, with the link as an
#    all-reduce across the hosts measures it).
# 2. How a started all-reduce progresses while a rank computes: without MPI
#    calls, and with pt_comm_test between slices of compute.
#
#   RATES="250mbit 1gbit" ZEROS="1" sh bench/overlap.sh
#   MODEL="--preset small --batch 4" RATES=1200mbit ZEROS="0 1 3" sh bench/overlap.sh
#                 (another model: train_mpi --preset small --dp 2 --batch 8, 4 a rank)
set -e
rates=${RATES:-500mbit 1gbit 2gbit 3gbit 4gbit 8gbit}
hw=${HW_FILE:-build/hw-local.txt}
[ -f "$hw" ] || build/plan --calibrate --hw-file "$hw" # (threads: a rank of one core's rates)
model="${MODEL:---preset small --layers 16 --vocab 2048 --batch 8} --seq 128 --steps ${STEPS:-4}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
run() { # run RATE ARGS...: one bench across 2 hosts; 77 (no namespaces) ends the script
    r=$1
    shift
    sh tests/hosts.sh --hosts 2 --rate "$r" --timeout 900 -- "$@" || {
        rc=$?
        [ "$rc" -eq 77 ] && exit 0
        exit "$rc"
    }
}
for zero in ${ZEROS:-1 0}; do
    for rate in $rates; do
        echo "-- 2 hosts, $rate links, ZeRO $zero"
        run "$rate" build/bench_overlap_mpi --step $model --zero "$zero" --hw-file "$hw" | tee -a "$out"
    done
done
echo
echo "| ZeRO | link | compute ms | off's dp calls ms | step off ms | step on ms | limit ms | on / limit | exposed on / off | simulated off ms (/ measured) | simulated on ms (/ measured) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
set -- $rates
i=0
grep '^row ' "$out" | while IFS='|' read -r name comp comm off on lim ratio soff qoff son qon; do
    n=$(echo "$rates" | wc -w)
    idx=$((i % n + 1))
    eval "rate=\${$idx}"
    zero=$(echo "$name" | sed 's/.* z//')
    echo "| $zero | $rate |$comp|$comm|$off|$on|$lim| $(awk -v a="$on" -v b="$lim" 'BEGIN { printf "%.2f", a / b }') |$ratio |$soff($(echo $qoff)) |$son($(echo $qon)) |"
    i=$((i + 1))
done
echo
# started all-reduce and compute, 16 MiB at 1 Gbit/s
echo "-- 2 hosts, 1gbit links: a started all-reduce while computing"
run 1gbit build/bench_overlap_mpi --mb 16 --reps 5
