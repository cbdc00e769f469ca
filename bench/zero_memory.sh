#!/bin/sh
# Per-rank memory of data parallelism at ZeRO 0, 1, 2 and 3: gpt2-124m, batch 8
# (4 rows a rank), 256 tokens, dp 2 as two MPI processes (each its own peak
# RSS), one training step and an evaluation. For each stage: train's memory
# report (weights, gradients, AdamW state, activations; per rank), their sum
# weights + gradients + AdamW as a share of ZeRO 0's, and the process's peak
# resident memory (VmHWM, read after the step and the evaluation) beside the
# report's total.
#
#   ZEROS="1 3" PRESET=gpt2-124m sh bench/zero_memory.sh
set -e
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
[ -x build/train_mpi ] || make build/train_mpi >/dev/null
out=$(mktemp)
trap 'rm -f "$out"' EXIT
printf '%-5s %9s %9s %9s %9s %11s %9s %10s %11s %6s\n' ZeRO "params" "grads" "AdamW" "w+g+opt" \
    "of ZeRO 0" "acts" "report" "peak RSS" "RSS/rep"
base=""
for z in ${ZEROS:-0 1 2 3}; do
    mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 build/train_mpi \
        --preset "${PRESET:-gpt2-124m}" --dp 2 --zero "$z" --batch 8 --seq 256 --steps 1 \
        --eval-every 1 --eval-batches 1 --sample-tokens 0 --log-every 1 --peak-gflops 100 >"$out"
    mem=$(grep '^memory per rank' "$out")
    peak=$(grep '^peak resident memory' "$out" | sed 's/^peak resident memory: \([0-9.]*\) MiB.*/\1/')
    echo "$mem" | sed 's/[^0-9.]/ /g' | awk -v z="$z" -v peak="$peak" -v base="$base" '
        {p = $1; g = $2; o = $3; a = $4; s = $NF; w = p + g + o; tot = w + a + s
         if (base == "") base = w
         printf "%-5s %9.1f %9.1f %9.1f %9.1f %10.3fx %9.1f %10.1f %11.1f %6.3f\n",
                z, p, g, o, w, w / base, a, tot, peak, peak / tot}'
    [ -n "$base" ] || base=$(echo "$mem" | sed 's/[^0-9.]/ /g' | awk '{print $1 + $2 + $3}')
done
echo "(MiB per rank; report = params + grads + AdamW + activations + scratch; peak RSS: VmHWM"
echo " of rank 0's process after the step and the evaluation, before any sampling)"
