#!/bin/sh
# build/train with context parallelism (--cp, ring attention) prints the
# serial run's losses within 1e-3 relative (the ring's merge sums the
# softmax in another order): GPT-2 and LLaMA (grouped-query, RoPE at global
# positions) on thread ranks, cp 2 x dp 2 under ZeRO 1, tp 2 x cp 2, MPI
# processes (build/train_mpi, cp 2), and a run stopped at step 15 under
# cp 2 x dp 2 (ZeRO 2) and resumed at dp 2 (ZeRO 1). At --seq 40, cp 5 (an
# odd ring, 8 tokens a rank): alone, with dp 2 (ZeRO 1), pp 2 (1f1b),
# LLaMA's tp 2 --sp, and on 5 MPI processes. Prints the largest relative
# difference seen. A --seq that 2cp does not divide is refused.
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common="--steps 30 --batch 4 --seq 32 --log-every 1 --eval-every 15 --sample-tokens 0 --seed 3"
gpt="--preset tiny $common" llama="--preset llama-tiny --layers 2 $common"
gpt40="$gpt --seq 40" llama40="$llama --seq 40" # (the last --seq counts)
losses() { grep '^step' "$1" | sed 's/^step *\([0-9]*\)\/[0-9]* | loss \([0-9.]*\) | val *\([-0-9.]*\) .*/\1 \2 \3/'; }
mpirun_() {
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
        OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none "$@"
}
build/train $gpt >"$dir/serial.log"
build/train $llama >"$dir/lserial.log"
build/train $gpt --cp 2 >"$dir/cp2.log"
build/train $gpt --cp 4 >"$dir/cp4.log"
build/train $gpt --cp 2 --dp 2 --zero 1 >"$dir/cpdp.log"
build/train $llama --cp 2 >"$dir/lcp2.log"
build/train $llama --cp 2 --tp 2 --sp >"$dir/ltpcp.log"
mpirun_ -n 2 build/train_mpi $gpt --cp 2 >"$dir/mpi.log"
build/train $gpt40 >"$dir/serial40.log"
build/train $llama40 >"$dir/lserial40.log"
build/train $gpt40 --cp 5 >"$dir/cp5_40.log"
build/train $gpt40 --cp 5 --dp 2 --zero 1 >"$dir/cp5dp_40.log"
build/train $gpt40 --cp 5 --pp 2 >"$dir/cp5pp_40.log"
build/train $llama40 --cp 5 --tp 2 --sp >"$dir/lcp5tp_40.log"
mpirun_ -n 5 build/train_mpi $gpt40 --cp 5 >"$dir/mpi5_40.log"
build/train $gpt --cp 2 --dp 2 --zero 2 --stop-after 15 --checkpoint "$dir/c.safetensors" \
    >"$dir/first.log"
build/train $gpt --dp 2 --zero 1 --resume "$dir/c.safetensors" >"$dir/second.log"
cat "$dir/first.log" "$dir/second.log" >"$dir/resumed.log"
grep -q "x cp 2 (16 tokens a rank, ring attention)" "$dir/cp2.log" ||
    { echo "the layout line does not name cp"; exit 1; }
worst=0
for run in cp2 cp4 cpdp lcp2 ltpcp mpi resumed cp5_40 cp5dp_40 cp5pp_40 lcp5tp_40 mpi5_40; do
    case $run in l*_40) ref=lserial40 ;; *_40) ref=serial40 ;; l*) ref=lserial ;; *) ref=serial ;; esac
    losses "$dir/$ref.log" >"$dir/a"
    losses "$dir/$run.log" >"$dir/b"
    [ "$(wc -l <"$dir/a")" -ge 30 ] || { echo "$ref printed too few steps"; exit 1; }
    # every step the serial run printed: its loss and validation loss within 1e-3 relative
    w=$(awk 'NR == FNR {want[$1] = $2; wval[$1] = $3; next} {got[$1] = $2; gval[$1] = $3}
             END {worst = 0
                  for (s in want) {
                      if (!(s in got)) {print "missing step " s > "/dev/stderr"; exit 1}
                      d = (want[s] - got[s]) / want[s]; if (d < 0) d = -d
                      if (d > worst) worst = d
                      if (wval[s] != "-" && gval[s] != "-") {
                          e = (wval[s] - gval[s]) / wval[s]; if (e < 0) e = -e
                          if (e > worst) worst = e }}
                  print worst}' "$dir/a" "$dir/b") || { echo "$run: steps missing"; exit 1; }
    if awk -v w="$w" 'BEGIN {exit !(w > 1e-3)}'; then
        echo "$run losses differ from the $ref run by $w relative"
        paste "$dir/a" "$dir/b" | head -n 5
        exit 1
    fi
    awk -v w="$w" -v t="$worst" 'BEGIN {exit !(w > t)}' && worst=$w
    echo "$run: largest relative difference from $ref $w"
done
if build/train $gpt --cp 3 >"$dir/refused.log" 2>&1; then
    echo "--cp 3 with --seq 32 was not refused"
    exit 1
fi
grep -q "seq=32 is not a multiple of 2\*cp=6" "$dir/refused.log" ||
    { echo "the refusal does not name seq and cp:"; cat "$dir/refused.log"; exit 1; }
echo "train --cp (GPT-2 cp 2, 4, cp 2 x dp 2 ZeRO 1, MPI cp 2, resumed from cp 2 x dp 2 ZeRO 2;" \
    "LLaMA cp 2, tp 2 --sp x cp 2; at seq 40: GPT-2 cp 5, cp 5 x dp 2 ZeRO 1, cp 5 x pp 2, MPI" \
    "cp 5, LLaMA tp 2 --sp x cp 5): the serial losses within $worst relative (at most 1e-3)"
