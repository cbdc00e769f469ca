#!/bin/sh
# pipeline_chimera_check.sh PROG FILE [MAX]: runs fixture FILE through
# Chimera (two replicas in opposite directions: stage s holds block s of
# replica 0 and block p-1-s of replica 1) in every layout that fits: even
# pp = 2..n_layer (at most 4), every micro-batch count that is a multiple of
# pp and divides the batch, selective and full recomputation, then with tp 2
# and with dp 2 (ZeRO 0 and 1) around it, up to MAX ranks (default 8).
# Chimera is synchronous: the serial tolerances hold. fixture_check also
# holds each stage's activation slots used to the checker's peak. PROG is
# build/fixture_check (thread ranks) or build/fixture_check_mpi (mpirun).
# With PROBE=1 it only counts the layouts that fit (exit 77: none).
prog=$1 file=$2 max=${3:-8}
. "$(dirname "$0")/fixture_runs.sh"
p=2
while [ "$p" -le "$L" ] && [ "$p" -le 4 ]; do
    m=$p
    while [ "$m" -le "$B" ]; do
        if [ $((B % m)) -eq 0 ] && [ $((m % p)) -eq 0 ]; then
            try "$p" --pp "$p" --schedule chimera --microbatches "$m"
            last=$m
        fi
        m=$((m + p))
    done
    if [ -n "$last" ]; then
        for rc in selective full; do
            try "$p" --pp "$p" --schedule chimera --microbatches "$last" --recompute "$rc"
        done
        if [ $((kv % 2)) -eq 0 ]; then
            try $((2 * p)) --tp 2 --pp "$p" --schedule chimera --microbatches "$last"
        fi
        if [ $((B % (2 * p))) -eq 0 ]; then
            for z in 0 1; do
                try $((2 * p)) --dp 2 --zero "$z" --pp "$p" --schedule chimera \
                    --microbatches $((B / 2 / p * p))
            done
        fi
    fi
    last=""
    p=$((p + 2))
done
finish "chimera pipeline layouts"
