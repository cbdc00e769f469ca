#!/bin/sh
# layouts_check.sh PROG FILE [MAX]: runs fixture FILE in every tensor x data x
# ZeRO layout with up to MAX ranks (default 16; tp dividing n_kv_head, dp
# dividing the batch B): on thread ranks (PROG = build/fixture_check), or on
# MPI processes under mpirun (PROG = build/fixture_check_mpi). Passes if
# every layout passes; prints one line per failing layout and the count run.
prog=$1 file=$2 max=${3:-16}
. "$(dirname "$0")/fixture_runs.sh"
tp=1
while [ "$tp" -le "$nh" ]; do
    if [ $((kv % tp)) -eq 0 ]; then
        dp=1
        while [ "$dp" -le "$B" ]; do
            if [ $((B % dp)) -eq 0 ] && [ $((tp * dp)) -le "$max" ]; then
                for zero in 0 1 2 3; do
                    try $((tp * dp)) --tp $tp --dp $dp --zero $zero
                done
            fi
            dp=$((dp + 1))
        done
    fi
    tp=$((tp + 1))
done
finish "layouts"
