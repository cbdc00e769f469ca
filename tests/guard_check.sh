#!/bin/sh
# The numerical guard of build/train: a step whose gradient holds a NaN (one
# planted with --debug-nan-step) is skipped and reported with the tensor,
# and leaves weights and AdamW state exactly as they were; --max-bad-steps
# such steps in a row stop the run (exit 1) with a checkpoint of the last
# good state, from which --resume continues. Serially, on thread ranks
# (every rank agrees to skip, though only the ranks holding the tensor see
# the NaN) and on MPI ranks.
set -u
. tests/check.sh
common="--preset tiny --batch 4 --seq 32 --steps 20 --warmup 5 --eval-every 100 --log-every 1
        --sample-tokens 0 --seed 5 --peak-gflops 100"
data() { # the tensor bytes of a safetensors file: weights and AdamW moments
    hl=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    tail -c +$((hl + 9)) "$1" | cksum
}
quiet() { "$@" >/dev/null 2>&1; }

# one skipped step: the state after it is the state before it, and training goes on
build/train $common --threads 2 --stop-after 4 --checkpoint "$dir/good.safetensors" >"$dir/a.log"
build/train_faults $common --threads 2 --debug-nan-step 5 --checkpoint-every 5 --keep 4 \
    --checkpoint "$dir/skip.safetensors" >"$dir/b.log"
check "step 5 is skipped and names the tensor" has \
    "step     5/20 | skipped: .*first non-finite gradient is h.0.mlp.c_fc.weight" "$dir/b.log"
check "a skipped step leaves weights and AdamW moments as they were" \
    [ "$(data "$dir/good.safetensors")" = "$(data "$dir/skip-step00000005.safetensors")" ]
check "... and AdamW's step count" has '"adam_t":"4"' "$dir/skip-step00000005.safetensors"
check "... and the run goes on to the end" has "^step    20/20 | loss [0-9]" "$dir/b.log"

# three in a row stop the run with a checkpoint of the last good state
build/train_faults $common --threads 2 --debug-nan-step 5 --debug-nan-count 100 --max-bad-steps 3 \
    --checkpoint "$dir/stop.safetensors" >"$dir/c.log" 2>&1
check "three bad steps in a row stop the run with exit 1" [ $? -eq 1 ]
check "... saying why and where the last good state is" has \
    "error: 3 steps in a row .*step 7, first in h.0.mlp.c_fc.weight.*state of step 4" "$dir/c.log"
check "... which is step 4's weights and AdamW moments" \
    [ "$(data "$dir/good.safetensors")" = "$(data "$dir/stop.safetensors")" ]
build/train $common --threads 2 --resume "$dir/stop.safetensors" >"$dir/d.log" 2>&1
check "--resume continues from it to the end" has "^step    20/20 | loss" "$dir/d.log"

# thread ranks: tp 2 x dp 2 x pp 2 would need 8 threads; dp 2 x pp 2 with ZeRO 1
# puts the tensor on two of four ranks, in one's shard
par="--dp 2 --pp 2 --zero 1 --debug-nan-tensor h.1.attn.c_proj.bias"
build/train_faults $common $par --stop-after 2 --checkpoint "$dir/pgood.safetensors" >"$dir/e.log"
build/train_faults $common $par --debug-nan-step 3 --debug-nan-count 100 --max-bad-steps 2 \
    --checkpoint "$dir/pstop.safetensors" >"$dir/f.log" 2>&1
check "dp 2 x pp 2, ZeRO 1 (threads): every rank skips, then stops with exit 1" [ $? -eq 1 ]
check "... naming the tensor" has "step     3/20 | skipped: .* is h.1.attn.c_proj.bias" "$dir/f.log"
check "... with step 2's state in the checkpoint" \
    [ "$(data "$dir/pgood.safetensors")" = "$(data "$dir/pstop.safetensors")" ]

# MPI ranks: tp 2 x dp 2
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
    OMPI_MCA_hwloc_base_binding_policy=none OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
    timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -n 4 build/train_mpi_faults \
    $common --tp 2 --dp 2 --debug-nan-step 3 --debug-nan-count 100 --max-bad-steps 2 \
    --debug-nan-tensor h.1.mlp.c_proj.weight --checkpoint "$dir/mstop.safetensors" \
    >"$dir/g.log" 2>&1
check "tp 2 x dp 2 (MPI): every rank skips, then stops with exit 1" [ $? -eq 1 ]
check "... naming the tensor and the saved state" has \
    "error: 2 steps in a row .*first in h.1.mlp.c_proj.weight.*state of step 2" "$dir/g.log"
check "... whose checkpoint loads" quiet build/sample "$dir/mstop.safetensors" --tokens 5
[ $bad -eq 0 ] || tail -n 5 "$dir"/*.log
exit $bad
