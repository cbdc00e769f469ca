#!/bin/sh
# A host that dies mid-run: train_mpi across 2 network-namespace hosts (dp 2,
# a checkpoint every 10 steps, the last 2 kept); once the first step file is
# there, every process of host 1 (rank 1 and its Open MPI daemon) is killed.
# The run must end with a non-zero status within 30 s of the kill, never
# hang (hosts.sh's timeout: 124, or 137 when mpirun ignores its TERM), with a message naming the dead host
# (10.213.0.2 holds rank 1); the newest checkpoint must load and train on,
# in another layout (2 thread ranks).
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
    echo "FAIL: $*"
    sed -n '1,200p' "$dir/log" 2>/dev/null | tail -n 30
    exit 1
}
sh tests/hosts.sh --hosts 2 --rate 1gbit --timeout 120 --kill-host "1:$dir/run-step*.safetensors" \
    -- build/train_mpi --dp 2 --preset mini --steps 100000 --batch 8 --seq 64 \
    --checkpoint "$dir/run.safetensors" --checkpoint-every 10 --keep 2 --sample-tokens 0 \
    --log-every 10 >"$dir/log" 2>&1
rc=$?
if [ "$rc" -eq 77 ]; then
    head -n 1 "$dir/log"
    exit 77
fi
case $rc in 124 | 137) fail "the run hung after its host died (hosts.sh's 120 s timeout)" ;; esac
[ "$rc" -ne 0 ] || fail "the run ended with status 0 after a host died"
line=$(grep '^hosts.sh: host 1 killed; mpirun ended' "$dir/log") ||
    fail "host 1 was not killed (no checkpoint step file appeared)"
secs=$(echo "$line" | sed 's/.*ended \([0-9.]*\) s later/\1/')
awk -v s="$secs" 'BEGIN { exit !(s <= 30) }' || fail "the run ended $secs s after the kill (> 30 s)"
grep -q '10\.213\.0\.2' "$dir/log" || fail "no message names the dead host 10.213.0.2 (rank 1)"
echo "ok: status $rc, $secs s after host 1 died, the dead host named"
# the newest step file: whole, and it trains on (2 thread ranks, ZeRO 1)
ck=$(ls "$dir"/run-step*.safetensors | sort | tail -n 1)
step=$(echo "$ck" | sed 's/.*-step0*\([0-9][0-9]*\)\.safetensors/\1/')
build/train --resume "$ck" --dp 2 --zero 1 --steps $((step + 3)) --batch 8 --seq 64 \
    --sample-tokens 0 >"$dir/resume.log" 2>&1 || {
    cp "$dir/resume.log" "$dir/log"
    fail "the checkpoint from before the death ($ck) did not resume"
}
grep -q "^resumed from $ck at step $step" "$dir/resume.log" ||
    { cp "$dir/resume.log" "$dir/log"; fail "no 'resumed from $ck at step $step'"; }
grep -q "^step *$((step + 3))/$((step + 3))" "$dir/resume.log" ||
    { cp "$dir/resume.log" "$dir/log"; fail "the resumed run did not reach step $((step + 3))"; }
echo "ok: $ck (step $step) resumed on 2 thread ranks to step $((step + 3))"
