#!/bin/sh
# layouts_check.sh PROG FILE: runs fixture FILE in every tensor x data x ZeRO
# layout with up to 16 ranks (tp dividing n_head, dp dividing the batch B),
# on thread ranks (PROG = build/fixture_check). Passes if every layout passes;
# prints one line per failing layout and the count run.
prog=$1 file=$2
head=$($prog "$file" 2>&1 | head -n 1)
nh=$(echo "$head" | sed -n 's/.* n_head=\([0-9]*\) .*/\1/p')
B=$(echo "$head" | sed -n 's/.* B=\([0-9]*\) .*/\1/p')
[ -n "$nh" ] && [ -n "$B" ] || { echo "cannot read n_head and B from: $head"; exit 1; }
runs=0 bad=0
tp=1
while [ "$tp" -le "$nh" ]; do
    if [ $((nh % tp)) -eq 0 ]; then
        dp=1
        while [ "$dp" -le "$B" ]; do
            if [ $((B % dp)) -eq 0 ] && [ $((tp * dp)) -le 16 ]; then
                for zero in 0 1 2; do
                    runs=$((runs + 1))
                    if ! out=$(timeout 60 $prog "$file" --tp $tp --dp $dp --zero $zero 2>&1); then
                        bad=$((bad + 1))
                        echo "FAIL tp=$tp dp=$dp zero=$zero"
                        echo "$out" | grep -E "FAIL|error" | head -n 5
                    fi
                done
            fi
            dp=$((dp + 1))
        done
    fi
    tp=$((tp + 1))
done
echo "$runs layouts of $(basename "$file") (n_head=$nh, B=$B), $bad failed"
[ "$bad" -eq 0 ]
