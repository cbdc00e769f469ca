#!/bin/sh
# Step time of ZeRO 3 against ZeRO 1, dp 2 on thread ranks (bench_parallel's
# whole steps: forward, backward, AdamW; the median of --steps), alternated
# ROUNDS times so that a loaded machine weighs on both alike; then the ratio
# of their medians. Overlap on (ZeRO 3: the next layer's gather behind this
# one's compute) unless OVERLAP=off.
#
#   CONFIG=small BATCH=8 SEQ=128 ROUNDS=2 sh bench/zero3_step.sh
set -e
[ -x build/bench_parallel ] || make build/bench_parallel >/dev/null
args="--dp 2 --config ${CONFIG:-small} --layers 0 --batch ${BATCH:-8} --seq ${SEQ:-128}"
args="$args --steps ${STEPS:-3} --overlap ${OVERLAP:-on}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
r=0
while [ "$r" -lt "${ROUNDS:-2}" ]; do
    for z in 1 3; do
        build/bench_parallel $args --zero "$z" | grep '^  step  rank 0' |
            sed "s/^  step  rank 0: *\([0-9.]*\) ms, communicating *\([0-9.]*\) ms.*/$z \1 \2/" >>"$out"
    done
    r=$((r + 1))
done
awk '{ms[$1] = ms[$1] " " $2; cm[$1] = cm[$1] " " $3; n[$1]++}
     END {for (z = 1; z <= 3; z += 2) printf "ZeRO %d: step ms%s (communicating%s)\n", z, ms[z], cm[z]}' "$out"
awk '{s[$1] += $2; n[$1]++} END {printf "mean step: ZeRO 3 / ZeRO 1 = %.3f\n", (s[3] / n[3]) / (s[1] / n[1])}' "$out"
