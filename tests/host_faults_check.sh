#!/bin/sh
# Faults across network-namespace hosts (tests/hosts.sh), one case a call:
#   link-down: train_mpi --dp 3 over 3 hosts, --comm-timeout 10, a checkpoint every 5 steps;
#     host 2's link goes down once step 10's file is there. Every process (ranks, Open MPI's
#     daemons, mpirun) must be gone within 45 s of it (10 s timeout + 5 s probe + Open MPI's
#     TCP giving up), the status non-zero, a rank naming 10.213.0.3 as the host that does
#     not answer, and the newest checkpoint must resume (2 thread ranks).
#   pipe-kill: train_mpi --pp 2 over 2 hosts; host 1 (the last stage) killed once step 4's
#     file is there, while stage 0 sends it activations: a non-zero status within 30 s
#     naming host 10.213.0.2, never a hang.
#   straggler: train_mpi --dp 3 over 3 hosts, host 2's rank given 5% of a core once
#     step 2's checkpoint is there (hosts.sh --slow-host: a cpu cgroup): a progress line names rank 2 on
#     10.213.0.3, and the per-host table counts it.
#   elastic: scripts/elastic.sh over 3 hosts (--overlap on: buckets in flight when the
#     link goes down); host 2's link down after step 10's file: the run restarts on 2
#     hosts from the newest checkpoint and completes its 25 steps; its losses after the
#     restart equal those of a run resumed by hand from that checkpoint on 2 hosts.
set -u
case=${1:-}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() {
    echo "FAIL: $*"
    grep -v '^\[vm' "$dir/log" 2>/dev/null | tail -n 40
    exit 1
}
skip77() { [ "$1" -ne 77 ] || { head -n 1 "$dir/log"; exit 77; }; }
secs_after() { # secs_after PATTERN: the seconds hosts.sh reported after "PATTERN ... S s later"
    sed -n "s/.*$1 \([0-9.]*\) s later.*/\1/p" "$dir/log" | tail -n 1
}
base="--preset tiny --batch 6 --seq 32 --sample-tokens 0 --eval-every 1000 --eval-batches 2"
case $case in
link-down)
    sh tests/hosts.sh --hosts 3 --timeout 120 --link-down "2:$dir/run-step00000010.safetensors" \
        -- build/train_mpi --dp 3 $base --steps 100000 --checkpoint "$dir/run.safetensors" \
        --checkpoint-every 5 --keep 2 --comm-timeout 10 --log-every 5 --overlap off >"$dir/log" 2>&1
    rc=$?
    skip77 $rc
    case $rc in 0 | 124 | 137) fail "status $rc: the run should end non-zero by itself" ;; esac
    gone=$(secs_after "every process gone")
    [ -n "$gone" ] || fail "processes were left behind after the link went down"
    awk -v s="$gone" 'BEGIN { exit !(s <= 45) }' || fail "the last process ended $gone s after the link went down (> 45 s)"
    grep -q 'no answer from rank 2 on host 10\.213\.0\.3' "$dir/log" ||
        fail "no rank named host 10.213.0.3 (rank 2) as the one not answering"
    grep -q 'waited [0-9.]* s, more than the comm timeout (10 s' "$dir/log" ||
        fail "no rank said which wait outlasted the comm timeout"
    echo "ok: status $rc; every process gone $gone s after host 2's link went down; host 10.213.0.3 named"
    ck=$(ls "$dir"/run-step*.safetensors | sort | tail -n 1)
    step=$(echo "$ck" | sed 's/.*-step0*\([0-9][0-9]*\)\.safetensors/\1/')
    build/train --resume "$ck" --dp 2 $base --steps $((step + 2)) >"$dir/log" 2>&1 ||
        fail "the newest checkpoint ($ck) does not resume"
    grep -q "^step *$((step + 2))/$((step + 2))" "$dir/log" || fail "the resumed run did not finish"
    echo "ok: $ck (step $step) resumed on 2 thread ranks"
    ;;
pipe-kill)
    sh tests/hosts.sh --hosts 2 --timeout 120 --kill-host "1:$dir/run-step*.safetensors" \
        -- build/train_mpi --pp 2 --grad-accum 4 --preset tiny --batch 8 --seq 32 --steps 100000 \
        --sample-tokens 0 --eval-every 1000 --checkpoint "$dir/run.safetensors" --checkpoint-every 2 \
        --keep 2 --comm-timeout 10 --log-every 2 >"$dir/log" 2>&1
    rc=$?
    skip77 $rc
    case $rc in 0 | 124 | 137) fail "status $rc: the run should end non-zero by itself" ;; esac
    after=$(secs_after "mpirun ended")
    [ -n "$after" ] || fail "host 1 was not killed"
    awk -v s="$after" 'BEGIN { exit !(s <= 30) }' || fail "mpirun ended $after s after the kill (> 30 s)"
    grep -q '10\.213\.0\.2' "$dir/log" || fail "no message names the dead host 10.213.0.2"
    echo "ok: status $rc, $after s after the last stage's host died, the host named"
    ;;
straggler)
    sh tests/hosts.sh --hosts 3 --timeout 120 --slow-host "2:$dir/run-step00000002.safetensors" \
        -- build/train_mpi --dp 3 --preset mini --batch 24 --seq 64 --steps 20 --sample-tokens 0 \
        --eval-every 1000 --log-every 5 --checkpoint "$dir/run.safetensors" --checkpoint-every 2 \
        --keep 2 >"$dir/log" 2>&1
    rc=$?
    skip77 $rc
    [ "$rc" -eq 0 ] || fail "status $rc"
    grep -q '^step .*| slow: rank 2 on 10\.213\.0\.3' "$dir/log" ||
        fail "no progress line names rank 2 on 10.213.0.3 (given 5% of a core)"
    awk '$1 ~ /^10\.213\.0\.3/ && $NF > 0 { ok = 1 } END { exit !ok }' "$dir/log" ||
        fail "the per-host table does not count host 10.213.0.3 as slow"
    echo "ok: $(grep -c '| slow: rank 2 on 10\.213\.0\.3' "$dir/log") of $(grep -c '^step' "$dir/log") progress lines name rank 2 on 10.213.0.3"
    sed -n 's/^hosts.sh: host 2.s ranks slowed by \(.*\)/    (the straggler capped by \1)/p' "$dir/log"
    ;;
elastic)
    args="$base --steps 25 --checkpoint-every 5 --keep 50 --comm-timeout 10 --log-every 1 --overlap on"
    sh tests/hosts.sh --hosts 3 --timeout 200 --run --link-down "2:$dir/run-step00000010.safetensors" \
        -- sh -c "exec sh scripts/elastic.sh --hostfile \"\$PT_HOSTFILE\" --max-restarts 2 -- \
        build/train_mpi $args --checkpoint $dir/run.safetensors" >"$dir/log" 2>&1
    rc=$?
    skip77 $rc
    [ "$rc" -eq 0 ] || fail "elastic.sh ended with status $rc"
    line=$(grep '^elastic: restart 1 of 2: lost 10\.213\.0\.3; resuming from' "$dir/log") ||
        fail "no restart without host 10.213.0.3 was logged"
    ck=$(echo "$line" | sed 's/.*resuming from \([^ ]*\) (step.*/\1/')
    step=$(echo "$line" | sed 's/.* (step \([0-9]*\),.*/\1/')
    grep -q '^elastic: 2 hosts, tp 1 x dp 2 x pp 1' "$dir/log" || fail "the restart did not run on 2 hosts, dp 2"
    grep -q '^step *25/25' "$dir/log" || fail "the run did not complete its 25 steps"
    echo "ok: restarted without 10.213.0.3 from $ck (step $step) on 2 hosts; all 25 steps done"
    sed -n "/^resumed from/,\$p" "$dir/log" | grep '^step' | cut -d'|' -f1-2 >"$dir/elastic.losses"
    mkdir "$dir/hand"
    sh tests/hosts.sh --hosts 2 --timeout 120 -- build/train_mpi --dp 2 $args --resume "$ck" \
        --checkpoint "$dir/hand/run.safetensors" >"$dir/log" 2>&1 || fail "the run resumed by hand failed"
    grep '^step' "$dir/log" | cut -d'|' -f1-2 >"$dir/hand.losses"
    [ -s "$dir/hand.losses" ] || fail "the run resumed by hand printed no step"
    cmp -s "$dir/elastic.losses" "$dir/hand.losses" || {
        diff "$dir/elastic.losses" "$dir/hand.losses" | head -n 10
        fail "the elastic run's losses after the restart differ from a run resumed by hand"
    }
    echo "ok: steps $((step + 1))-25 print the losses of a run resumed by hand from step $step on 2 hosts"
    ;;
*)
    echo "usage: $0 link-down | pipe-kill | straggler | elastic" >&2
    exit 2
    ;;
esac
