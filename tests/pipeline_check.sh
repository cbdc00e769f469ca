#!/bin/sh
# pipeline_check.sh PROG FILE [MAX]: runs fixture FILE through every pipeline
# layout that fits it: pp = 2..n_layer (at most 4), each schedule (gpipe,
# 1f1b, zb-h1; interleaved with 2 chunks when 2*pp <= n_layer and pp divides
# m), every micro-batch count m dividing the batch, then with tp 2 and with
# dp 2 (ZeRO 1) around it where they fit, up to MAX ranks (default 8). PROG is
# build/fixture_check (thread ranks) or build/fixture_check_mpi (mpirun).
prog=$1 file=$2 max=${3:-8}
mpi=""
case "$prog" in
*_mpi)
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
L=$(echo "$head" | sed -n 's/.* n_layer=\([0-9]*\) .*/\1/p')
B=$(echo "$head" | sed -n 's/.* B=\([0-9]*\) .*/\1/p')
[ -n "$nh" ] && [ -n "$L" ] && [ -n "$B" ] || { echo "cannot read the fixture's shape: $head"; exit 1; }
runs=0 bad=0
try() { # try NRANKS ARGS...
    n=$1
    shift
    [ "$n" -le "$max" ] || return 0
    runs=$((runs + 1))
    if ! out=$(launch "$n" $prog "$file" "$@" 2>&1); then
        bad=$((bad + 1))
        echo "FAIL $*"
        echo "$out" | grep -E "FAIL|error" | head -n 5
    fi
}
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
    # composed with tensor and data parallelism
    if [ $((nh % 2)) -eq 0 ]; then try $((2 * p)) --tp 2 --pp "$p" --schedule 1f1b --microbatches 1; fi
    if [ $((B % 2)) -eq 0 ]; then
        try $((2 * p)) --dp 2 --zero 1 --pp "$p" --schedule zb-h1 --microbatches $((B / 2))
    fi
    p=$((p + 1))
done
echo "$runs pipeline layouts of $(basename "$file") (n_layer=$L, n_head=$nh, B=$B), $bad failed"
[ "$bad" -eq 0 ]
