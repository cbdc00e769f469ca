#!/bin/sh
# build/train's run-level features, each on a small case:
#   the loss history (STEM.loss.csv, STEM.loss.svg beside the checkpoint),
#   continued without duplicates by a resume;
#   --val-data (an llm.c token file: the validation loss is on it, not on a
#   share of --data);
#   --eval-only (loss and perplexity of a checkpoint, the same in any layout);
#   --init-from (a Hugging Face GPT-2 file or a ptrain checkpoint: its
#   weights, a fresh AdamW, in any layout).
set -u
. tests/check.sh
tiny="--preset tiny --batch 4 --seq 32 --sample-tokens 0 --peak-gflops 100"
# the loss of an eval line
loss() { sed -n 's/^eval: .*: loss \([0-9.]*\) nats\/token, perplexity \([0-9.]*\).*/\1 \2/p' "$1"; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= t) }'; }

# the loss history, and a resume that continues it
build/train $tiny --steps 20 --log-every 5 --eval-every 10 --stop-after 10 \
    --checkpoint "$dir/h.safetensors" >"$dir/h1.log" 2>&1
build/train $tiny --steps 20 --log-every 5 --eval-every 10 --resume latest \
    --checkpoint "$dir/h.safetensors" >"$dir/h2.log" 2>&1
check "loss history: a CSV row per progress line, validation every 10 steps, one run across a resume" \
    [ "$(cut -d, -f1,3- "$dir/h.loss.csv" | sed 's/[0-9]\.[0-9]*/x/g' | tr '\n' ' ')" = \
      "step,train_loss,val_loss 5,x, 10,x,x 15,x, 20,x,x " ]
check "... tokens seen = step x batch x seq" has "^20,2560," "$dir/h.loss.csv"
check "... drawn as an SVG: train and validation loss against tokens seen" \
    [ "$(grep -c '<polyline' "$dir/h.loss.svg")" -eq 2 ]
check "... whose curves have the CSV's points (4 train, 2 validation)" sh -c \
    "grep '<title>train loss' '$dir/h.loss.svg' | grep -o ',' | wc -l | grep -qx 4 &&
     grep '<title>validation loss' '$dir/h.loss.svg' | grep -o ',' | wc -l | grep -qx 2"

# llm.c token files: a training file of varied tokens, a validation file of one token
perl -e 'print pack("l<3", 20240520, 1, 4000), "\0" x 1012, pack("S<*", map { ($_ * 7) % 200 } 1 .. 4000)' \
    >"$dir/d_train.bin"
perl -e 'print pack("l<3", 20240520, 1, 600), "\0" x 1012, pack("S<*", (42) x 600)' >"$dir/d_val.bin"
build/train $tiny --steps 4 --eval-every 2 --data "$dir/d_train.bin" --val-data "$dir/d_val.bin" \
    --checkpoint "$dir/v.safetensors" >"$dir/v.log" 2>&1
check "--val-data: loaded, and validation measured on it (its unigram entropy is 0)" sh -c \
    "grep -q 'validation data: $dir/d_val.bin, 600 tokens' '$dir/v.log' &&
     grep -q '^validation: 600 tokens ($dir/d_val.bin), .*unigram entropy 0.000' '$dir/v.log'"
build/train --batch 4 --seq 32 --eval-only --resume "$dir/v.safetensors" \
    --val-data "$dir/d_val.bin" >"$dir/ev.log" 2>&1
check "--eval-only --val-data: the whole file, 600 tokens = 4 batches of 4 x 32" \
    has "on $dir/d_val.bin: 4 batches of 4 x 32 tokens: loss" "$dir/ev.log"

# --eval-only on the embedded task: serial, tp 2 x pp 2, dp 2 give the same loss
for layout in "" "--tp 2 --pp 2" "--dp 2"; do
    build/train --batch 4 --seq 32 --eval-only --eval-batches 8 --init-from "$dir/h.safetensors" \
        $layout >"$dir/e.log" 2>&1
    set -- $(loss "$dir/e.log")
    if [ -z "$layout" ]; then ref=${1:-}; fi
    ppl=$(awk -v l="${1:-0}" 'BEGIN { print exp(l) }')
    check "--eval-only ${layout:-serial}: loss ${1:-none} (serial $ref), perplexity ${2:-none}" \
        near "${1:-}" "$ref" 1e-3
    check "... = exp(loss) = $ppl" near "${2:-}" "$ppl" 1e-2
done

# --init-from a ptrain checkpoint: its weights (a low first loss), a fresh AdamW (adam_t
# counts this run's 3 steps), with a pipeline
build/train --batch 4 --seq 32 --sample-tokens 0 --peak-gflops 100 --steps 3 --log-every 1 \
    --init-from "$dir/h.safetensors" --pp 2 --grad-accum 2 \
    --checkpoint "$dir/i.safetensors" >"$dir/i.log" 2>&1
first=$(sed -n 's/^step *1\/3 | loss \([0-9.]*\).*/\1/p' "$dir/i.log")
check "--init-from a checkpoint (pp 2): first loss ${first:-none} below a fresh model's 5" \
    awk -v l="${first:-9}" 'BEGIN { exit !(l < 5) }'
check "... with a fresh AdamW (adam_t 3)" grep -aq '"adam_t":"3"' "$dir/i.safetensors"

# --init-from a Hugging Face GPT-2 file (a fixture: transformer.* names, no n_head stored):
# fine-tuned with a learning rate of 0 on tp 2 (another --seed: its random weights would
# differ), its checkpoint and the file itself evaluated in three layouts give one loss
f=tests/fixtures/gpt2_wide_vocab.safetensors
build/train --batch 4 --seq 8 --heads 4 --steps 1 --lr 0 --min-lr 0 --weight-decay 0 --seed 5 \
    --sample-tokens 0 --init-from "$f" --tp 2 --peak-gflops 100 \
    --checkpoint "$dir/hf.safetensors" >"$dir/hft.log" 2>&1
check "--init-from a Hugging Face file: fine-tuned from it (tp 2)" has "^step     1/1 | loss" \
    "$dir/hft.log"
# (greedy samples tell weights apart where losses near ln(vocab) cannot)
build/sample "$f" --n-head 4 --prompt-ids 1,2,3 --tokens 24 --temperature 0 >"$dir/s1" 2>/dev/null
build/sample "$dir/hf.safetensors" --prompt-ids 1,2,3 --tokens 24 --temperature 0 >"$dir/s2" \
    2>/dev/null
check "... whose checkpoint holds the file's weights (the same greedy sample)" \
    sh -c "[ -s '$dir/s1' ] && cmp -s '$dir/s1' '$dir/s2'"
ref=
for run in "$f:" "$f:--tp 2" "$f:--pp 2" "$dir/hf.safetensors:"; do
    file=${run%%:*} layout=${run#*:}
    build/train --batch 4 --seq 8 --heads 4 --eval-only --eval-batches 4 --init-from "$file" \
        $layout >"$dir/hf.log" 2>&1
    set -- $(loss "$dir/hf.log")
    [ -n "$ref" ] || ref=${1:-}
    check "... --eval-only $(basename "$file") ${layout:-serial}: loss ${1:-none}" \
        near "${1:-}" "$ref" 1e-3
done
exit $bad
