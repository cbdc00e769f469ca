#!/bin/sh
# pipeline_zb_check.sh PROG FILE [MAX]: runs fixture FILE through the
# zero-bubble schedules zb-h2 and zb-v (two chunks per stage in a V, so
# 2*pp <= n_layer) in every layout that fits: pp = 2..n_layer (at most 4),
# every micro-batch count dividing the batch, selective recomputation, then
# with tp 2 and with dp 2 (ZeRO 1) around them, up to MAX ranks (default 8).
# fixture_check also holds each stage's activation slots used to the
# checker's peak. PROG is build/fixture_check (thread ranks) or
# build/fixture_check_mpi (mpirun).
prog=$1 file=$2 max=${3:-8}
. "$(dirname "$0")/fixture_runs.sh"
p=2
while [ "$p" -le "$L" ] && [ "$p" -le 4 ]; do
    v=""
    [ $((2 * p)) -le "$L" ] && v=1
    m=1
    while [ "$m" -le "$B" ]; do
        if [ $((B % m)) -eq 0 ]; then
            try "$p" --pp "$p" --schedule zb-h2 --microbatches "$m"
            [ -z "$v" ] || try "$p" --pp "$p" --schedule zb-v --chunks 2 --microbatches "$m"
        fi
        m=$((m + 1))
    done
    try "$p" --pp "$p" --schedule zb-h2 --microbatches "$B" --recompute selective
    [ -z "$v" ] || try "$p" --pp "$p" --schedule zb-v --chunks 2 --microbatches "$B" --recompute selective
    if [ $((nh % 2)) -eq 0 ]; then
        try $((2 * p)) --tp 2 --pp "$p" --schedule zb-h2 --microbatches "$B"
        [ -z "$v" ] || try $((2 * p)) --tp 2 --pp "$p" --schedule zb-v --chunks 2 --microbatches "$B"
    fi
    if [ $((B % 2)) -eq 0 ]; then
        try $((2 * p)) --dp 2 --zero 1 --pp "$p" --schedule zb-h2 --microbatches $((B / 2))
        [ -z "$v" ] || try $((2 * p)) --dp 2 --zero 1 --pp "$p" --schedule zb-v --chunks 2 \
            --microbatches $((B / 2))
    fi
    p=$((p + 1))
done
finish "zero-bubble pipeline layouts"
