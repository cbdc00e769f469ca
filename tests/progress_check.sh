#!/bin/sh
# The progress line's rates count from the run's first step, whatever saves
# happen: on a clock where every step takes 1 s (build/train_faults
# --debug-step-seconds 1), each line of a run with a save every 10 steps
# reads batch x seq = 128 tokens/s and an ETA of its remaining steps in
# seconds, fresh and after a resume (rates taken from the last save's step
# read 10x off after it).
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common="--preset tiny --batch 4 --seq 32 --log-every 1 --eval-every 1000 --sample-tokens 0
        --peak-gflops 100 --threads 2 --debug-step-seconds 1"
exact() { # exact LOG STEPS: every line 128 tok/s, ETA (STEPS - step) s
    grep '^step' "$1" | sed 's/^step *\([0-9]*\)\/.*| *\([0-9]*\) tok\/s.*ETA \([0-9]*\)m\([0-9]*\)s$/\1 \2 \3 \4/' |
        awk -v n="$2" '{ lines++ } $2 != 128 || $3 * 60 + $4 != n - $1 {
                           print "step " $1 ": " $2 " tok/s, ETA " $3 "m" $4 "s"; bad = 1 }
                       END { if (lines < 20) { print "only " lines " lines"; bad = 1 }; exit bad }'
}
build/train_faults $common --steps 40 --checkpoint-every 10 --checkpoint "$dir/c.safetensors" \
    >"$dir/a.log"
exact "$dir/a.log" 40
build/train_faults $common --steps 60 --stop-after 10 --checkpoint "$dir/r.safetensors" >/dev/null
build/train_faults $common --steps 60 --checkpoint-every 10 --resume "$dir/r.safetensors" \
    --checkpoint "$dir/r.safetensors" >"$dir/b.log"
exact "$dir/b.log" 60
echo "1 s steps with a save every 10, fresh and resumed: every line 128 tokens/s and the right ETA"
