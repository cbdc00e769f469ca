#!/bin/sh
# Peak memory and step time of ptrain's activation recomputation against PyTorch's,
# on one step (default gpt2-124m B=8 T=256), fp32 and bf16: build/bench_step with
# --recompute none, selective and full, then bench/torch_ref.py without recomputation
# (the same step) and with torch.utils.checkpoint around each block (--recompute full),
# each run a process of its own (its own peak RSS: ru_maxrss, the program and its
# libraries included), one after the other so all see the same machine load. Prints
# each run's median ms/step and peak RSS, the load average before it, and each ptrain
# row's RSS over PyTorch's without recomputation at the same precision.
#   sh bench/recompute.sh [CONFIG B T STEPS]      (needs build/bench_step, python3-torch)
set -e
cd "$(dirname "$0")/.."
PY=${PY:-/usr/bin/python3}  # Debian's python3 has torch; a pyenv python3 may not
THREADS=${THREADS:-2}
cfg=${1:-gpt2-124m} b=${2:-8} t=${3:-256} n=${4:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args="--config $cfg --batch $b --seq $t --steps $n --threads $THREADS --json"
for p in fp32 bf16; do
    for rc in none selective full; do
        cut -d' ' -f1 /proc/loadavg >"$out/load"
        # shellcheck disable=SC2086 # $args is split into words on purpose
        build/bench_step $args --precision $p --recompute $rc | sed "s/}$/, \"load\": $(cat "$out/load")}/" >>"$out/runs"
    done
    for rc in none full; do
        cut -d' ' -f1 /proc/loadavg >"$out/load"
        # shellcheck disable=SC2086
        "$PY" bench/torch_ref.py $args --precision $p --recompute $rc | sed "s/}$/, \"load\": $(cat "$out/load")}/" >>"$out/runs"
    done
done
"$PY" - "$out/runs" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
base = {r["precision"]: r["peak_rss_mib"] for r in runs if "torch" in r and r["recompute"] == "none"}
r0 = runs[0]
print("%s B=%d T=%d, %d threads, median of %d steps; RSS ratio: over PyTorch's without recomputation"
      % (r0["config"], r0["batch"], r0["seq"], r0["threads"], r0["steps"]))
print("%-8s %-5s %-10s %10s %10s %10s %6s" % ("program", "prec", "recompute", "ms/step",
                                              "RSS MiB", "RSS ratio", "load"))
for r in runs:
    print("%-8s %-5s %-10s %10.1f %10.0f %9.2fx %6.2f" % (
        "torch" if "torch" in r else "ptrain", r["precision"], r["recompute"], r["ms_per_step"],
        r["peak_rss_mib"], r["peak_rss_mib"] / base[r["precision"]], r["load"]))
PY
