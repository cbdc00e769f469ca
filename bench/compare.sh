#!/bin/sh
# ptrain against PyTorch float32 on the same training step. Run it with
#   make bench-torch
# (or `sh bench/compare.sh` once build/bench_step is built and python3-torch installed).
# For each configuration it runs build/bench_step, then bench/torch_ref.py (the
# same model, AdamW, B, T and threads), one right after the other so both see
# the same machine load, and prints one table at the end. ratio columns are
# ptrain / torch: speed > 1 means ptrain is faster, RSS < 1 means it uses less.
set -e
cd "$(dirname "$0")/.."
PY=${PY:-/usr/bin/python3}  # Debian's python3 has torch; a pyenv python3 may not
THREADS=${THREADS:-2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# config B T steps
CONFIGS="small 8 128 5
gpt2-124m 4 64 3
gpt2-124m 8 256 2
llama-124m 8 256 2"

# summary FILE: losses at init and after one step (far apart between the two
# programs would mean the models differ), parameter count and sgemm peak
summary() {
    "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1]))
print("loss %s, params %d," % (r["loss_check"], r["params"]),
      "peak %.0f GFLOP/s" % r["peak_gflops"])' "$1"
}

echo "ptrain vs PyTorch $("$PY" -c 'import torch; print(torch.__version__)') float32," \
     "$THREADS threads, forward + backward + AdamW, median ms/step"
i=0  # numbers the result files, so the table keeps the run order
echo "$CONFIGS" | while read -r cfg b t n; do
    i=$((i + 1))
    args="--config $cfg --batch $b --seq $t --steps $n --threads $THREADS --json"
    # shellcheck disable=SC2086 # $args is split into words on purpose
    build/bench_step $args >"$out/$i.ptrain"
    # shellcheck disable=SC2086
    "$PY" bench/torch_ref.py $args >"$out/$i.torch"
    echo "$cfg B=$b T=$t"
    echo "  ptrain: $(summary "$out/$i.ptrain")"
    echo "  torch:  $(summary "$out/$i.torch")"
done

echo
"$PY" - "$out" <<'EOF'
import glob, json, os, sys

def load(path):
    with open(path) as f:
        return json.load(f)

head = ("config", "B", "T", "ptrain ms/step", "torch ms/step", "ptrain tok/s", "torch tok/s",
        "speed ratio", "ptrain MFU", "torch MFU", "ptrain RSS MiB", "torch RSS MiB", "RSS ratio")
rows = []
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.ptrain"))):
    a, b = load(p), load(p[: -len(".ptrain")] + ".torch")
    mib_a, mib_b = a["peak_rss_bytes"] / 2**20, b["peak_rss_bytes"] / 2**20
    rows.append((a["config"], a["batch"], a["seq"],
                 f"{a['ms_per_step']:.1f}", f"{b['ms_per_step']:.1f}",
                 f"{a['tokens_per_s']:.0f}", f"{b['tokens_per_s']:.0f}",
                 f"{a['tokens_per_s'] / b['tokens_per_s']:.2f}x",
                 f"{100 * a['mfu']:.1f}%", f"{100 * b['mfu']:.1f}%",
                 f"{mib_a:.0f}", f"{mib_b:.0f}", f"{mib_a / mib_b:.2f}x"))
width = [max(len(str(r[k])) for r in rows + [head]) for k in range(len(head))]
for r in [head] + rows:
    print("  ".join(str(v).ljust(w) if k == 0 else str(v).rjust(w)
                    for k, (v, w) in enumerate(zip(r, width))))
EOF
