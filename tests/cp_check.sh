#!/bin/sh
# cp_check.sh PROG FILE [MAX]: context parallelism (--cp, ring attention) on
# fixture FILE against the serial tolerances, with up to MAX ranks (default
# 10): every cp with 2cp dividing T up to MAX; then for cp 2 (4 | T) and
# cp 5 (10 | T: an odd ring): dp 2 under ZeRO 0-3, tp 2 (and --sp),
# recomputation selective and full, bf16, pp 2 under every schedule (gpipe,
# 1f1b with ZeRO 1, zb-h1, zb-h2; 2bw and chimera with an even batch; zb-v
# and interleaved, two chunks a stage, with 4 layers or more; ZeRO 3) and
# tp 2 --sp x pp 2. Threads (PROG = build/fixture_check) or MPI
# (build/fixture_check_mpi). Passes if every run passes; 77 if none fits.
prog=$1 file=$2 max=${3:-10}
. "$(dirname "$0")/fixture_runs.sh"
T=$(echo "$head" | sed -n 's/.* T=\([0-9]*\) .*/\1/p')
cp=2
while [ $((2 * cp)) -le "$T" ]; do
    [ $((T % (2 * cp))) -eq 0 ] && try "$cp" --cp "$cp"
    cp=$((cp + 1))
done
for c in 2 5; do
    [ $((T % (2 * c))) -eq 0 ] || continue
    r=$((2 * c)) # ranks of a cp x 2 layout (not n: try sets n)
    sp=""        # sequence parallelism splits each rank's T/cp tokens over tp 2
    [ $((T / c % 2)) -eq 0 ] && sp=1
    if [ $((B % 2)) -eq 0 ]; then
        for zero in 0 1 2 3; do try "$r" --cp "$c" --dp 2 --zero $zero; done
    fi
    if [ $((kv % 2)) -eq 0 ]; then
        try "$r" --cp "$c" --tp 2
        [ -z "$sp" ] || try "$r" --cp "$c" --tp 2 --sp
    fi
    try "$c" --cp "$c" --recompute selective
    try "$c" --cp "$c" --recompute full
    try "$c" --cp "$c" --precision bf16
    [ "$L" -ge 2 ] || continue
    for s in gpipe zb-h1 zb-h2; do
        try "$r" --cp "$c" --pp 2 --schedule $s --microbatches "$B"
    done
    try "$r" --cp "$c" --pp 2 --schedule 1f1b --microbatches "$B" --zero 1
    if [ $((B % 2)) -eq 0 ]; then # a weight version, a Chimera pair: every 2 micro-batches
        try "$r" --cp "$c" --pp 2 --schedule 2bw --microbatches "$B"
        try "$r" --cp "$c" --pp 2 --schedule chimera --microbatches "$B"
    fi
    if [ "$L" -ge 4 ]; then # two chunks a stage
        try "$r" --cp "$c" --pp 2 --schedule zb-v --chunks 2 --microbatches "$B"
        [ $((B % 2)) -eq 0 ] &&
            try "$r" --cp "$c" --pp 2 --schedule interleaved --chunks 2 --microbatches "$B"
    fi
    try "$r" --cp "$c" --pp 2 --zero 3 --microbatches "$B"
    [ $((kv % 2)) -eq 0 ] && [ -n "$sp" ] &&
        try $((4 * c)) --cp "$c" --tp 2 --sp --pp 2 --microbatches "$B"
done
finish "context-parallel layouts"
