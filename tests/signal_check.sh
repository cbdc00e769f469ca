#!/bin/sh
# SIGINT or SIGTERM stops build/train after the current step with a
# checkpoint (exit 130 / 143) that resumes to the uninterrupted run's
# losses; a second SIGINT ends it at once (the checkpoint write it cuts
# short leaves no checkpoint). Thread ranks (dp 2) and MPI ranks stop at the
# same step: every rank all-reduces the flag each step.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad=0
common="--preset tiny --batch 4 --seq 32 --steps 2000 --warmup 5 --eval-every 1000 --log-every 1
        --sample-tokens 0 --seed 5 --peak-gflops 100"
losses() { grep '^step' "$1" | awk -F'|' '{print $1 $2}'; }
ok() { echo "ok: $1"; }
no() { echo "FAIL: $1"; bad=1; }
# wait_step LOG PID N: until LOG has step N's line (or the run ended)
wait_step() {
    n=0
    until grep -q "^step *$3/" "$1" 2>/dev/null || ! kill -0 "$2" 2>/dev/null || [ $n -gt 3000 ]
    do
        n=$((n + 1))
        sleep 0.01
    done
}
# interrupt NAME SIGNAL CODE CMD...: CMD in the background, SIGNAL to it after step 5
interrupt() {
    name=$1 sig=$2 code=$3
    shift 3
    "$@" >"$dir/$name.log" 2>&1 &
    pid=$!
    wait_step "$dir/$name.log" $pid 5
    kill -"$sig" $pid
    wait $pid
    rc=$?
    saved=$(sed -n 's/.* after step \([0-9]*\) of .*holds it; continue .*--resume .*/\1/p' \
        "$dir/$name.log")
    if [ "$rc" -eq "$code" ] && [ -n "$saved" ] && [ -f "$dir/$name.safetensors" ]; then
        ok "$name: SIG$sig, exit $rc, a checkpoint at step $saved and how to resume"
    else
        no "$name: SIG$sig: exit $rc (wanted $code), step '$saved' saved"
        tail -n 5 "$dir/$name.log"
        saved=
    fi
}
# resumes NAME CMD...: resumed for 5 steps it prints the reference run's losses
resumes() {
    name=$1
    shift
    [ -n "$saved" ] || return
    "$@" --resume "$dir/$name.safetensors" --stop-after $((saved + 5)) >"$dir/$name.resumed.log" 2>&1
    losses "$dir/$name.resumed.log" >"$dir/b"
    losses "$dir/ref.log" | awk -v a="$saved" -v b=$((saved + 5)) '$2 + 0 > a && $2 + 0 <= b' \
        >"$dir/a"
    if [ "$(wc -l <"$dir/a")" -eq 5 ] && diff "$dir/a" "$dir/b" >/dev/null; then
        ok "$name: resumed, steps $((saved + 1))-$((saved + 5)) equal the uninterrupted run's"
    else
        no "$name: resumed, not the uninterrupted run's losses"
        diff "$dir/a" "$dir/b" | head -n 6
    fi
}

# the reference: the first 60 steps, uninterrupted (the schedule is --steps')
build/train $common --threads 2 --stop-after 60 >"$dir/ref.log" 2>&1
interrupt serial INT 130 build/train $common --threads 2 --checkpoint "$dir/serial.safetensors"
resumes serial build/train $common --threads 2
# thread ranks: both stop at the same step (else the job would hang or fail)
interrupt dp TERM 143 build/train $common --dp 2 --checkpoint "$dir/dp.safetensors"
[ -n "$saved" ] && { build/sample "$dir/dp.safetensors" --tokens 5 >/dev/null 2>&1 ||
                         no "dp: the checkpoint does not load"; }

# a second SIGINT while the checkpoint is written (slowed): out at once, no checkpoint
PTRAIN_TEST_WRITE_DELAY_MS=40 build/train_faults $common --threads 2 \
    --checkpoint "$dir/twice.safetensors" >"$dir/twice.log" 2>&1 &
pid=$!
wait_step "$dir/twice.log" $pid 5
kill -INT $pid
n=0
until grep -q '^stopping after this step' "$dir/twice.log" || [ $n -gt 1000 ]; do
    n=$((n + 1))
    sleep 0.01
done
sleep 0.2
kill -INT $pid
wait $pid
rc=$?
if [ $rc -eq 130 ] && ! [ -f "$dir/twice.safetensors" ] && ! grep -q '^checkpoint:' "$dir/twice.log"
then
    ok "a second SIGINT during the checkpoint write: exit 130 at once, the write cut short"
else
    no "a second SIGINT: exit $rc, $(ls "$dir" | grep -c twice.safetensors) checkpoint files"
fi

# MPI: SIGTERM to one rank's process; the all-reduced flag stops both after the same step
if [ -x build/train_mpi ] && command -v mpirun >/dev/null 2>&1; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none \
        OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
        timeout 60 mpirun --allow-run-as-root --oversubscribe --bind-to none -n 2 \
        build/train_mpi $common --dp 2 --checkpoint "$dir/mpi.safetensors" >"$dir/mpi.log" 2>&1 &
    pid=$!
    wait_step "$dir/mpi.log" $pid 5
    # timeout -> mpirun -> the ranks (from /proc: a bare system may have no ps)
    children() { cat /proc/[0-9]*/stat 2>/dev/null | awk -v p="$1" '$4 == p {print $1}'; }
    launcher=$(children $pid | head -n 1)
    victim=
    for c in $(children "$launcher"); do
        tr '\0' ' ' <"/proc/$c/cmdline" 2>/dev/null | grep -q '^build/train_mpi ' && victim=$c
    done
    [ -n "$victim" ] && kill -TERM "$victim"
    wait $pid
    rc=$?
    saved=$(sed -n 's/.* after step \([0-9]*\) of .*holds it; continue .*/\1/p' "$dir/mpi.log")
    if [ -n "$victim" ] && [ $rc -eq 143 ] && [ -n "$saved" ] &&
        build/sample "$dir/mpi.safetensors" --tokens 5 >/dev/null 2>&1; then
        ok "MPI dp 2: SIGTERM to one rank, the job stops after step $saved with a checkpoint (exit 143)"
    else
        no "MPI dp 2: SIGTERM to rank process '$victim': exit $rc, step '$saved' saved"
        tail -n 12 "$dir/mpi.log"
    fi
else
    echo "SKIP: MPI (no build/train_mpi or mpirun)"
fi
exit $bad
