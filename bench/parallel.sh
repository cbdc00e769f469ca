#!/bin/sh
# Tensor and data parallelism on this machine: a GPT-2 small block (C=768, 12
# heads) and a whole 2-layer step at gpt2-124m widths (vocabulary 50257),
# B=8, T=64, for tp and dp of 1, 2 and 4, on thread ranks and on MPI ranks.
# Per rank: time in all and inside the communicator (which counts waiting for
# slower ranks). This machine has 2 cores: with 4 ranks they outnumber the
# cores, so those rows show time-sharing, not speed-up.
set -e
cd "$(dirname "$0")/.."
cores=$(nproc)
run() { # run BACKEND TP DP
    if [ "$1" = mpi ]; then
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
            OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
            OMP_NUM_THREADS=$(( cores / ($2 * $3) > 0 ? cores / ($2 * $3) : 1 )) \
            OPENBLAS_NUM_THREADS=$(( cores / ($2 * $3) > 0 ? cores / ($2 * $3) : 1 )) \
            mpirun --allow-run-as-root --oversubscribe --bind-to none -n $(($2 * $3)) \
            build/bench_parallel_mpi --tp "$2" --dp "$3"
    else
        build/bench_parallel --tp "$2" --dp "$3"
    fi
}
for backend in threads mpi; do
    if [ "$backend" = mpi ] && ! command -v mpirun >/dev/null; then
        echo "(no mpirun: MPI rows skipped)"
        continue
    fi
    for layout in "1 1" "2 1" "4 1" "1 2" "1 4"; do
        set -- $layout
        n=$(($1 * $2))
        note=""
        [ "$n" -gt "$cores" ] && note=" ($n ranks on $cores cores)"
        echo "-- $backend: tp $1 x dp $2$note"
        run "$backend" "$1" "$2" | grep -v '^gpt2'
    done
done
