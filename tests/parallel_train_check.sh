#!/bin/sh
# build/train on tensor x data parallel layouts (thread ranks, and MPI
# processes through build/train_mpi) prints the serial run's losses: the same
# model, data and optimizer, split. Losses agree to 2e-3 (float sums in
# another order over 30 steps).
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common="--preset tiny --steps 30 --batch 8 --seq 32 --log-every 5 --eval-every 15 --sample-tokens 0 --seed 3"
losses() { grep '^step' "$1" | sed 's/.*| loss \([0-9.]*\) .*/\1/'; }
build/train $common >"$dir/serial.log"
build/train $common --tp 2 --dp 2 --zero 2 --grad-accum 2 >"$dir/threads.log"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -n 4 \
    build/train_mpi $common --tp 4 --zero 0 >"$dir/mpi.log"
losses "$dir/serial.log" >"$dir/a"
[ "$(wc -l <"$dir/a")" -ge 6 ] || { echo "serial run printed too few steps"; exit 1; }
for run in threads mpi; do
    losses "$dir/$run.log" >"$dir/b"
    if ! paste "$dir/a" "$dir/b" | awk '{d = $1 - $2; if (d < 0) d = -d; if (NF != 2 || d > 2e-3) bad = 1}
                                         END {exit bad}'; then
        echo "$run losses differ from the serial run:"
        paste "$dir/a" "$dir/b"
        exit 1
    fi
    [ "$(wc -l <"$dir/b")" -eq "$(wc -l <"$dir/a")" ] || { echo "$run: step count differs"; exit 1; }
done
echo "serial, threads (tp 2 x dp 2, ZeRO 2, 2 micro-batches) and MPI (tp 4): the same losses"
paste "$dir/a" "$dir/b" | head -n 3
