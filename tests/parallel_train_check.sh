#!/bin/sh
# build/train on tensor x data parallel layouts (thread ranks, and MPI
# processes through build/train_mpi) prints the serial run's losses: the same
# model, data and optimizer, split over tensor, data and pipeline ranks.
# Losses agree to 2e-3 (float sums in
# another order over 30 steps). A checkpoint written by one layout (tp 2 x
# dp 2, ZeRO 2) and resumed in another (dp 2, ZeRO 1) continues the same run.
# With --sp the printed losses are tp 2's, digit for digit.
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common="--preset tiny --steps 30 --batch 8 --seq 32 --log-every 5 --eval-every 15 --sample-tokens 0 --seed 3"
losses() { grep '^step' "$1" | sed 's/^step *\([0-9]*\)\/[0-9]* | loss \([0-9.]*\) | val *\([-0-9.]*\) .*/\1 \2 \3/'; }
build/train $common >"$dir/serial.log"
build/train $common --tp 2 --dp 2 --zero 2 --grad-accum 2 >"$dir/threads.log"
build/train $common --tp 2 --sp --dp 2 --zero 2 --grad-accum 2 >"$dir/sp.log"
build/train $common --tp 2 --pp 2 --grad-accum 4 --schedule zb-h1 >"$dir/pipeline.log"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -n 4 \
    build/train_mpi $common --tp 4 --zero 0 >"$dir/mpi.log"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none -n 4 \
    build/train_mpi $common --dp 2 --pp 2 --zero 1 --grad-accum 2 --schedule gpipe \
    >"$dir/mpi_pipeline.log"
build/train $common --tp 2 --dp 2 --zero 2 --stop-after 15 --checkpoint "$dir/c.safetensors" \
    >"$dir/first.log"
build/train $common --dp 2 --zero 1 --resume "$dir/c.safetensors" >"$dir/second.log"
cat "$dir/first.log" "$dir/second.log" >"$dir/resumed.log"
losses "$dir/serial.log" >"$dir/a"
[ "$(wc -l <"$dir/a")" -ge 6 ] || { echo "serial run printed too few steps"; exit 1; }
# sequence parallelism prints tp's losses (its sums are tp's but for the norms' weight
# gradients, summed in another order: the printed digits agree)
losses "$dir/threads.log" >"$dir/b"
losses "$dir/sp.log" | cmp -s - "$dir/b" || { echo "--sp losses differ from tp 2's"; exit 1; }
for run in threads sp pipeline mpi mpi_pipeline resumed; do
    losses "$dir/$run.log" >"$dir/b"
    # every step the serial run printed, with the same loss and validation loss (where a
    # resumed run has computed one)
    if ! awk 'NR == FNR {want[$1] = $2; wval[$1] = $3; next} {got[$1] = $2; gval[$1] = $3}
              END {for (s in want) {d = want[s] - got[s]; if (d < 0) d = -d
                                    e = wval[s] == "-" || gval[s] == "-" ? 0 : wval[s] - gval[s]
                                    if (e < 0) e = -e
                                    if (!(s in got) || d > 2e-3 || e > 2e-3) {
                                        print "step " s ": " want[s] " " wval[s] " vs " got[s] " " gval[s]; bad = 1}}
                   exit bad}' "$dir/a" "$dir/b"; then
        echo "$run losses differ from the serial run"
        exit 1
    fi
done
echo "serial, threads (tp 2 x dp 2, ZeRO 2, 2 micro-batches, with and without --sp; tp 2 x pp 2 zb-h1, 4" \
    "micro-batches), MPI (tp 4; dp 2 x pp 2 gpipe), and a run stopped at step 15 (tp 2 x dp 2)" \
    "and resumed (dp 2, ZeRO 1): the same losses"
paste "$dir/a" "$dir/b" | head -n 3
