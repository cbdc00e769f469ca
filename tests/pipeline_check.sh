#!/bin/sh
# pipeline_check.sh PROG FILE [MAX]: runs fixture FILE through every pipeline
# layout that fits it: pp = 2..n_layer (at most 4), each schedule (gpipe,
# 1f1b, zb-h1; interleaved with 2 chunks when 2*pp <= n_layer and pp divides
# m), every micro-batch count m dividing the batch, with selective and full
# recomputation, then with tp 2 and with dp 2 (ZeRO 1) around it where they
# fit, up to MAX ranks (default 8). PROG is
# build/fixture_check (thread ranks) or build/fixture_check_mpi (mpirun).
prog=$1 file=$2 max=${3:-8}
. "$(dirname "$0")/fixture_runs.sh"
p=2
while [ "$p" -le "$L" ] && [ "$p" -le 4 ]; do
    m=1
    while [ "$m" -le "$B" ]; do
        if [ $((B % m)) -eq 0 ]; then
            for s in gpipe 1f1b zb-h1; do
                try "$p" --pp "$p" --schedule "$s" --microbatches "$m"
            done
            if [ $((2 * p)) -le "$L" ] && [ $((m % p)) -eq 0 ]; then
                try "$p" --pp "$p" --schedule interleaved --chunks 2 --microbatches "$m"
            fi
        fi
        m=$((m + 1))
    done
    # with activation recomputation, every schedule (zb-h1 keeps its activations for W:
    # selective only)
    for s in gpipe 1f1b zb-h1; do
        try "$p" --pp "$p" --schedule "$s" --microbatches "$B" --recompute selective
        [ "$s" = zb-h1 ] || try "$p" --pp "$p" --schedule "$s" --microbatches "$B" --recompute full
    done
    if [ $((2 * p)) -le "$L" ] && [ $((B % p)) -eq 0 ]; then
        try "$p" --pp "$p" --schedule interleaved --chunks 2 --microbatches "$B" --recompute full
    fi
    # composed with tensor and data parallelism
    if [ $((kv % 2)) -eq 0 ]; then try $((2 * p)) --tp 2 --pp "$p" --schedule 1f1b --microbatches 1; fi
    if [ $((B % 2)) -eq 0 ]; then
        try $((2 * p)) --dp 2 --zero 1 --pp "$p" --schedule zb-h1 --microbatches $((B / 2))
    fi
    p=$((p + 1))
done
finish "pipeline layouts"
