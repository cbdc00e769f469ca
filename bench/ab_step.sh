#!/bin/sh
# Two bench_step binaries (say main's and a branch's) on the same step, alternated
# ROUNDS times (old, new, old, new, ...) so both see the same machine load; prints
# each one's median ms/step and peak RSS and the ratio new/old (< 1: new is faster).
#   ROUNDS=5 sh bench/ab_step.sh OLD_BENCH_STEP NEW_BENCH_STEP [bench_step options]
# e.g. sh bench/ab_step.sh /tmp/old/build/bench_step build/bench_step \
#          --config gpt2-124m --batch 8 --seq 256 --steps 5 --precision bf16
set -e
old=$1 new=$2
shift 2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
i=0
while [ "$i" -lt "${ROUNDS:-5}" ]; do
    "$old" "$@" --json >>"$out/old"
    "$new" "$@" --json >>"$out/new"
    i=$((i + 1))
done
python3 - "$out/old" "$out/new" <<'PY'
import json, statistics, sys
med = {}
for name, path in zip(("old", "new"), sys.argv[1:]):
    runs = [json.loads(line) for line in open(path) if line.startswith("{")]
    ms = [r["ms_per_step"] for r in runs]
    rss = [r["peak_rss_bytes"] / 2**20 for r in runs]
    med[name] = statistics.median(ms), statistics.median(rss)
    print("%s: median %.1f ms/step (%s), peak RSS %.0f MiB" %
          (name, med[name][0], " ".join("%.0f" % x for x in ms), med[name][1]))
print("new/old: time %.3f, peak RSS %.3f" % (med["new"][0] / med["old"][0], med["new"][1] / med["old"][1]))
PY
