#!/bin/sh
# Per-rank memory of data parallelism at ZeRO 0, 1, 2 and 3, dp 2, batch 8
# (4 rows a rank), 256 tokens.
# 1. The memory report of gpt2-124m (vocabulary 50257; a meta build: nothing
#    allocated): weights, gradients, AdamW state and their sum as a share of
#    ZeRO 0's, activations.
# 2. Measured: train_mpi --preset gpt2-124m (the embedded task's vocabulary)
#    as two MPI processes, one step and an evaluation, for each of $ZEROS:
#    its memory report and the peak resident memory of rank 0's process
#    (VmHWM, read before any sampling) beside the report's total.
#
#   ZEROS="1 3" sh bench/zero_memory.sh      (part 2 takes minutes a stage)
set -e
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[ -x build/bench_parallel ] || make build/bench_parallel >/dev/null
[ -x build/train_mpi ] || make build/train_mpi >/dev/null
out=$(mktemp)
trap 'rm -f "$out"' EXIT
row() { # row ZERO "params grads adamw acts scratch" BASE [PEAK]
    echo "$2" | awk -v z="$1" -v base="$3" -v peak="$4" '
        {w = $1 + $2 + $3; tot = w + $4 + $5
         printf "%-5s %8.1f %8.1f %8.1f %9.1f %8.3fx %8.1f %9.1f", z, $1, $2, $3, w,
                (base > 0 ? w / base : 1), $4, tot
         if (peak != "") printf " %9.1f %7.3f", peak, peak / tot
         printf "\n"}'
}
head() {
    printf '%-5s %8s %8s %8s %9s %9s %8s %9s %9s %7s\n' ZeRO params grads AdamW w+g+opt \
        "of ZeRO0" acts total "peak RSS" RSS/tot
}
echo "1. gpt2-124m (V 50257), dp 2, B 8, T 256: the memory report, MiB per rank"
head
base=0
for z in 0 1 2 3; do
    m=$(build/bench_parallel --memory --config gpt2-124m --layers 12 --dp 2 --batch 8 --seq 256 \
        --zero "$z" | grep 'memory per rank' | sed 's/|.*//; s/ZeRO [0-9]//; s/[^0-9.]/ /g')
    [ "$base" != 0 ] || base=$(echo "$m" | awk '{print $1 + $2 + $3}')
    row "$z" "$m 0" "$base"
done
echo
echo "2. train_mpi --preset gpt2-124m (embedded task vocabulary), dp 2, B 8, T 256: report and"
echo "   measured peak RSS of rank 0's process, MiB"
head
base=0
for z in ${ZEROS:-0 1 2 3}; do
    mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 build/train_mpi \
        --preset gpt2-124m --dp 2 --zero "$z" --batch 8 --seq 256 --steps 1 --eval-every 1 \
        --eval-batches 1 --sample-tokens 0 --log-every 1 --peak-gflops 100 >"$out"
    m=$(grep '^memory per rank' "$out" | sed 's/([0-9]* slots*)//; s/[^0-9.]/ /g')
    peak=$(grep '^peak resident memory' "$out" | sed 's/^peak resident memory: \([0-9.]*\) MiB.*/\1/')
    [ "$base" != 0 ] || base=$(echo "$m" | awk '{print $1 + $2 + $3}')
    row "$z" "$m" "$base" "$peak"
done
