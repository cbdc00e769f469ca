#!/bin/sh
# pipeline_2bw_check.sh PROG FILE [MAX]: runs fixture FILE through PipeDream-2BW
# (1F1B never flushed inside a step, a weight update every pp micro-batches,
# batch t at version t-1) in every layout that fits: pp = 2..n_layer (at most
# 4), every micro-batch count that is a multiple of pp and divides the batch,
# selective and full recomputation, then with tp 2 and with dp 2 (ZeRO 0 and
# 1) around it, up to MAX ranks (default 8). 2BW is asynchronous, so
# fixture_check holds it to a serial run of its own rule (losses and final
# weights), not to the fixture's synchronous steps; m = pp makes one update a
# step (no staleness), m >= 2pp the stale ones. PROG is build/fixture_check
# (thread ranks) or build/fixture_check_mpi (mpirun). With PROBE=1 it only
# counts the layouts that fit (exit 77: none).
prog=$1 file=$2 max=${3:-8}
. "$(dirname "$0")/fixture_runs.sh"
p=2
while [ "$p" -le "$L" ] && [ "$p" -le 4 ]; do
    m=$p last=""
    while [ "$m" -le "$B" ]; do
        if [ $((B % m)) -eq 0 ]; then
            try "$p" --pp "$p" --schedule 2bw --microbatches "$m"
            last=$m
        fi
        m=$((m + p))
    done
    if [ -n "$last" ]; then
        for rc in selective full; do
            try "$p" --pp "$p" --schedule 2bw --microbatches "$last" --recompute "$rc"
        done
        if [ $((kv % 2)) -eq 0 ]; then
            try $((2 * p)) --tp 2 --pp "$p" --schedule 2bw --microbatches "$last"
        fi
        if [ $((B % (2 * p))) -eq 0 ]; then
            for z in 0 1; do
                try $((2 * p)) --dp 2 --zero "$z" --pp "$p" --schedule 2bw \
                    --microbatches $((B / 2 / p * p))
            done
        fi
    fi
    p=$((p + 1))
done
finish "2bw pipeline layouts"
