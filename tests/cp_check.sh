#!/bin/sh
# cp_check.sh PROG FILE [MAX]: context parallelism (--cp, ring attention) on
# fixture FILE against the serial tolerances, with up to MAX ranks (default
# 8): every cp with 2cp dividing T up to MAX; cp 2 with dp 2 under ZeRO 0-3,
# with tp 2 (and --sp), recomputation selective and full, bf16, pp 2 (gpipe,
# 1f1b, zb-h1, chimera with ZeRO 1/3) and tp 2 --sp x pp 2. Threads (PROG =
# build/fixture_check) or MPI (build/fixture_check_mpi). Passes if every run
# passes; 77 if none fits.
prog=$1 file=$2 max=${3:-8}
. "$(dirname "$0")/fixture_runs.sh"
T=$(echo "$head" | sed -n 's/.* T=\([0-9]*\) .*/\1/p')
cp=2
while [ $((2 * cp)) -le "$T" ]; do
    [ $((T % (2 * cp))) -eq 0 ] && try "$cp" --cp "$cp"
    cp=$((cp + 1))
done
if [ $((T % 4)) -eq 0 ]; then
    if [ $((B % 2)) -eq 0 ]; then
        for zero in 0 1 2 3; do try 4 --cp 2 --dp 2 --zero $zero; done
    fi
    if [ $((kv % 2)) -eq 0 ]; then
        try 4 --cp 2 --tp 2
        [ $((T / 2 % 2)) -eq 0 ] && try 4 --cp 2 --tp 2 --sp
    fi
    try 2 --cp 2 --recompute selective
    try 2 --cp 2 --recompute full
    try 2 --cp 2 --precision bf16
    if [ "$L" -ge 2 ]; then
        try 4 --cp 2 --pp 2 --schedule gpipe --microbatches "$B"
        try 4 --cp 2 --pp 2 --schedule 1f1b --microbatches "$B" --zero 1
        try 4 --cp 2 --pp 2 --schedule zb-h1 --microbatches "$B"
        [ $((B % 2)) -eq 0 ] && try 4 --cp 2 --pp 2 --schedule chimera --microbatches "$B"
        try 4 --cp 2 --pp 2 --zero 3 --microbatches "$B"
        [ $((kv % 2)) -eq 0 ] && [ $((T / 2 % 2)) -eq 0 ] &&
            try 8 --cp 2 --tp 2 --sp --pp 2 --microbatches "$B"
    fi
fi
finish "context-parallel layouts"
