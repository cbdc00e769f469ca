#!/bin/sh
# ptrain against PyTorch on the same training step, in fp32 and in bf16 (ptrain
# --precision bf16 against PyTorch's bf16 autocast). Run it with
#   make bench-torch
# (or `sh bench/compare.sh` once build/bench_step is built and python3-torch installed).
# For each configuration it runs build/bench_step in fp32 and in bf16 (a process
# each, so each has its own peak RSS), then bench/torch_ref.py in fp32 and in bf16,
# one right after the other so all see the same machine load, and prints one table
# at the end. Ratio
# columns are time over time: > 1 means the first named is slower, so
# "torch/ptrain" > 1 means ptrain is faster.
set -e
cd "$(dirname "$0")/.."
PY=${PY:-/usr/bin/python3}  # Debian's python3 has torch; a pyenv python3 may not
THREADS=${THREADS:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# config B T steps
# (CONFIGS in the environment replaces the list: e.g. the issue's two models only,
#  CONFIGS="gpt2-124m 8 256 3
#  llama-124m 8 256 3" sh bench/compare.sh)
CONFIGS=${CONFIGS:-"small 8 128 5
gpt2-124m 4 64 3
gpt2-124m 8 256 2
llama-124m 8 256 2"}

# summary FILE: losses at init and after one step (far apart between the two
# programs would mean the models differ), parameter count and sgemm peak
summary() {
    "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1]))
print("loss %s, params %d," % (r["loss_check"], r["params"]),
      "peak %.0f GFLOP/s" % r["peak_gflops"])' "$1"
}

echo "ptrain vs PyTorch $("$PY" -c 'import torch; print(torch.__version__)'), fp32 and bf16," \
     "$THREADS threads, forward + backward + AdamW, median ms/step"
i=0  # numbers the result files, so the table keeps the run order
echo "$CONFIGS" | while read -r cfg b t n; do
    i=$((i + 1))
    args="--config $cfg --batch $b --seq $t --steps $n --threads $THREADS --json"
    # shellcheck disable=SC2086 # $args is split into words on purpose
    for p in fp32 bf16; do
        # shellcheck disable=SC2086
        build/bench_step $args --precision $p >"$out/$i.ptrain_$p"
    done
    for p in fp32 bf16; do
        # shellcheck disable=SC2086
        "$PY" bench/torch_ref.py $args --precision $p >"$out/$i.torch_$p"
    done
    echo "$cfg B=$b T=$t"
    for f in ptrain_fp32 ptrain_bf16 torch_fp32 torch_bf16; do
        echo "  $f: $(summary "$out/$i.$f")"
    done
done

echo
"$PY" - "$out" <<'EOF'
import glob, json, os, sys

def load(path):
    with open(path) as f:
        return json.load(f)

def mib(r):
    return r["peak_rss_bytes"] / 2**20

head = ("config", "B", "T", "ptrain fp32", "ptrain bf16", "torch fp32", "torch bf16",
        "fp32 torch/ptrain", "bf16 torch/ptrain", "ptrain fp32/bf16", "ptrain fp32 MFU",
        "ptrain bf16 MFU",
        "ptrain RSS fp32, bf16", "torch RSS fp32, bf16")
rows = []
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.ptrain_fp32"))):
    stem = p[: -len(".ptrain_fp32")]
    pf, pb = load(p), load(stem + ".ptrain_bf16")
    tf, tb = load(stem + ".torch_fp32"), load(stem + ".torch_bf16")
    rows.append((pf["config"], pf["batch"], pf["seq"],
                 f"{pf['ms_per_step']:.1f}", f"{pb['ms_per_step']:.1f}",
                 f"{tf['ms_per_step']:.1f}", f"{tb['ms_per_step']:.1f}",
                 f"{tf['ms_per_step'] / pf['ms_per_step']:.2f}x",
                 f"{tb['ms_per_step'] / pb['ms_per_step']:.2f}x",
                 f"{pf['ms_per_step'] / pb['ms_per_step']:.2f}x",
                 f"{100 * pf['mfu_instr']:.1f}% of {pf['instr_peak_gflops']:.0f}",
                 f"{100 * pb['mfu_instr']:.1f}% of {pb['instr_peak_gflops']:.0f}",
                 f"{mib(pf):.0f}, {mib(pb):.0f} MiB", f"{mib(tf):.0f}, {mib(tb):.0f} MiB"))
print("median ms/step; peak RSS of each run (a process each)")
width = [max(len(str(r[k])) for r in rows + [head]) for k in range(len(head))]
for r in [head] + rows:
    print("  ".join(str(v).ljust(w) if k == 0 else str(v).rjust(w)
                    for k, (v, w) in enumerate(zip(r, width))))
EOF
