#!/bin/sh
# Long sequences with context parallelism (--cp, ring attention): training
# steps of `mini` (4 layers of 128, batch 1) at each sequence length of SEQS
# (default 4096 8192 16384 32768) with cp 1, 2 and 4 on thread ranks
# (build/train --cp, the machine's cores shared by the ranks), then cp 2 and
# cp 4 on two namespace hosts (tests/hosts.sh: Open MPI over TCP, links
# shaped to RATE, default 1gbit; cp 4 puts two ranks on each host). A table
# of tokens/s (the last step's; the first of STEPS warms up) and peak
# resident memory per rank: a thread run's process divided by its ranks,
# an MPI rank's own process, and the library's memory report a rank.
#
#   sh bench/long_seq.sh                          # about an hour on 2 cores
#   SEQS="4096 8192" STEPS=3 CPS="1 2" sh bench/long_seq.sh
#   HOSTS=0 sh bench/long_seq.sh                  # threads only
#   THREADS=0 SEQS="4096 8192" sh bench/long_seq.sh   # the hosts only
set -e
seqs=${SEQS:-4096 8192 16384 32768}
cps=${CPS:-1 2 4}
steps=${STEPS:-2}
rate=${RATE:-1gbit}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
model="--preset mini --batch 1 --steps $steps --log-every 1 --eval-every $steps --eval-batches 1 --sample-tokens 0"
row() { # row WHERE SEQ CP RANKS_IN_PROCESS LOG: one table row from a train log
    tps=$(grep '^step' "$5" | tail -n 1 | sed 's/.*| *\([0-9]*\) tok\/s.*/\1/')
    rss=$(sed -n 's/^peak resident memory: \([0-9.]*\) MiB.*/\1/p' "$5")
    rep=$(sed -n 's/.*the memory report: \([0-9.]*\) MiB a rank.*/\1/p' "$5")
    [ -n "$tps" ] && [ -n "$rss" ] || { echo "no step or peak line in the log:"; cat "$5"; exit 1; }
    echo "| $1 | $2 | $3 | $tps | $(awk -v r="$rss" -v n="$4" 'BEGIN { printf "%.0f", r / n }') | ${rep%.*} |" |
        tee -a "$out"
}
log=$(mktemp)
trap 'rm -f "$out" "$log"' EXIT
for seq in $seqs; do
    [ "${THREADS:-1}" != 0 ] || break
    for cp in $cps; do
        [ $((seq % (2 * cp))) -eq 0 ] || continue
        c=""
        [ "$cp" -gt 1 ] && c="--cp $cp"
        echo "-- threads: seq $seq, cp $cp"
        build/train $model --seq "$seq" --block-size "$seq" $c >"$log" 2>&1 ||
            { cat "$log"; exit 1; }
        row threads "$seq" "$cp" "$cp" "$log"
    done
done
if [ "${HOSTS:-1}" != 0 ]; then
    for seq in $seqs; do
        for cp in $cps; do
            [ "$cp" -gt 1 ] && [ $((seq % (2 * cp))) -eq 0 ] || continue
            echo "-- 2 hosts ($rate links): seq $seq, cp $cp"
            rc=0
            sh tests/hosts.sh --hosts 2 --slots $((cp / 2)) --rate "$rate" --timeout 3600 -- \
                build/train_mpi $model --seq "$seq" --block-size "$seq" --cp "$cp" >"$log" 2>&1 ||
                rc=$?
            [ "$rc" -eq 77 ] && { grep '^SKIP' "$log"; break 2; }
            [ "$rc" -eq 0 ] || { cat "$log"; exit "$rc"; }
            row "2 hosts" "$seq" "$cp" 1 "$log"
        done
    done
fi
echo
echo "mini (4 layers, 4 heads, 128 wide), batch 1; tokens/s of the last of $steps steps;"
echo "peak resident memory per rank (threads: the process's over its ranks) and the memory report's"
echo
echo "| ranks | seq | cp | tokens/s | peak MiB a rank | report MiB a rank |"
echo "|---|---|---|---|---|---|"
cat "$out"
