#!/bin/sh
# sp_check.sh PROG FILE [MAX]: sequence parallelism (--sp) on fixture FILE
# against the serial tolerances, with up to MAX ranks (default 8): every tp
# >= 2 dividing n_kv_head and T, with ZeRO 0-2 (and 3 over dp 2) and dp 2; then at tp 2: pp 2
# under gpipe, 1f1b, zb-h1, chimera, 2bw, zb-v and interleaved (4+ layers),
# recomputation selective and full, bf16. Threads (PROG = build/fixture_check) or MPI
# (build/fixture_check_mpi). Passes if every run passes; 77 if none fits.
prog=$1 file=$2 max=${3:-8}
. "$(dirname "$0")/fixture_runs.sh"
T=$(echo "$head" | sed -n 's/.* T=\([0-9]*\) .*/\1/p')
tp=2
while [ "$tp" -le "$kv" ]; do
    if [ $((kv % tp)) -eq 0 ] && [ $((T % tp)) -eq 0 ]; then
        for zero in 0 1 2; do
            try "$tp" --tp "$tp" --sp --zero $zero
            [ $((B % 2)) -eq 0 ] && try $((tp * 2)) --tp "$tp" --sp --dp 2 --zero $zero
        done
        [ $((B % 2)) -eq 0 ] && try $((tp * 2)) --tp "$tp" --sp --dp 2 --zero 3
    fi
    tp=$((tp + 1))
done
if [ $((kv % 2)) -eq 0 ] && [ $((T % 2)) -eq 0 ]; then
    try 2 --tp 2 --sp --recompute selective
    try 2 --tp 2 --sp --recompute full
    try 2 --tp 2 --sp --precision bf16
    if [ "$L" -ge 2 ]; then
        try 4 --tp 2 --sp --pp 2 --schedule gpipe --microbatches "$B"
        try 4 --tp 2 --sp --pp 2 --schedule 1f1b --microbatches "$B" --recompute selective
        try 4 --tp 2 --sp --pp 2 --schedule zb-h1 --microbatches "$B"
        [ $((B % 2)) -eq 0 ] && try 8 --tp 2 --sp --pp 2 --dp 2 --zero 1 --microbatches $((B / 2))
    fi
    if [ $((B % 2)) -eq 0 ]; then
        try 4 --tp 2 --sp --pp 2 --schedule chimera --microbatches "$B"
        try 4 --tp 2 --sp --pp 2 --schedule 2bw --microbatches "$B"
    fi
    if [ "$L" -ge 4 ]; then
        try 4 --tp 2 --sp --pp 2 --schedule zb-v --microbatches "$B"
        [ $((B % 2)) -eq 0 ] &&
            try 4 --tp 2 --sp --pp 2 --schedule interleaved --chunks 2 --microbatches 2
    fi
fi
finish "sequence-parallel layouts"
