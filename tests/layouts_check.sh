#!/bin/sh
# layouts_check.sh PROG FILE [MAX]: runs fixture FILE in every tensor x data x
# ZeRO layout with up to MAX ranks (default 16; tp dividing n_head, dp
# dividing the batch B): on thread ranks (PROG = build/fixture_check), or on
# MPI processes under mpirun (PROG = build/fixture_check_mpi). Passes if
# every layout passes; prints one line per failing layout and the count run.
prog=$1 file=$2 max=${3:-16}
mpi=""
case "$prog" in
*_mpi) # Open MPI as root, more ranks than cores (../shared/ENVIRONMENT.md)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
    export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
    mpi="mpirun --allow-run-as-root --oversubscribe --bind-to none -n" ;;
esac
launch() { # launch NRANKS PROG ARGS...
    n=$1
    shift
    if [ -n "$mpi" ]; then timeout 60 $mpi "$n" "$@"; else timeout 60 "$@"; fi
}
head=$(launch 1 $prog "$file" 2>&1 | head -n 1)
nh=$(echo "$head" | sed -n 's/.* n_head=\([0-9]*\) .*/\1/p')
B=$(echo "$head" | sed -n 's/.* B=\([0-9]*\) .*/\1/p')
[ -n "$nh" ] && [ -n "$B" ] || { echo "cannot read n_head and B from: $head"; exit 1; }
runs=0 bad=0
tp=1
while [ "$tp" -le "$nh" ]; do
    if [ $((nh % tp)) -eq 0 ]; then
        dp=1
        while [ "$dp" -le "$B" ]; do
            if [ $((B % dp)) -eq 0 ] && [ $((tp * dp)) -le "$max" ]; then
                for zero in 0 1 2; do
                    runs=$((runs + 1))
                    if ! out=$(launch $((tp * dp)) $prog "$file" --tp $tp --dp $dp --zero $zero \
                        2>&1); then
                        bad=$((bad + 1))
                        echo "FAIL tp=$tp dp=$dp zero=$zero"
                        echo "$out" | grep -E "FAIL|error" | head -n 5
                    fi
                done
            fi
            dp=$((dp + 1))
        done
    fi
    tp=$((tp + 1))
done
echo "$runs layouts of $(basename "$file") (n_head=$nh, B=$B), $bad failed"
[ "$bad" -eq 0 ]
