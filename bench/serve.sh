#!/bin/sh
# make bench-serve: build/serve under load (bench/serve_bench.py), on a model of GPT-2 124M's
# shape (--preset gpt2-124m, block_size 512; its weights after one step: speed does not depend
# on them), or MODEL=path (any model: the prompts are token ids below 256). Prints the ratios the issue asks for:
#   shared prefix (64 requests, 256-token common prefix, 16 new tokens, 8 at a time):
#     throughput and time to first token with --kv-reuse on over off
#   batched decode: 8 concurrent requests over one at a time, completion tokens/s
# A benchmark, not a test: on a shared machine the numbers move; the ratios are within one run.
set -u
tmp=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
model=${MODEL:-build/bench_serve_model.safetensors}
if [ ! -f "$model" ]; then
    echo "bench-serve: making $model (--preset gpt2-124m --block-size 512, one step)"
    build/train --preset gpt2-124m --block-size 512 --seq 64 --batch 1 --steps 1 \
        --checkpoint "$model" --force >"$tmp/train.log" 2>&1 || { cat "$tmp/train.log"; exit 1; }
fi
start() { # start NAME ARGS...: a server on a free port into $port
    name=$1
    shift
    build/serve "$model" --port 0 "$@" 2>"$tmp/$name.log" &
    pids="$pids $!"
    while ! grep -q 'listening on' "$tmp/$name.log"; do
        kill -0 $! 2>/dev/null || { cat "$tmp/$name.log"; exit 1; }
        sleep 0.2
    done
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/$name.log")
    head -n 1 "$tmp/$name.log"
}
val() { sed -n "s/^$1 //p" "$2"; }
start on --kv-reuse on --kv-cache-mb 512 --max-batch 8
python3 bench/serve_bench.py prefix "$port" >"$tmp/on.txt" || exit 1
python3 bench/serve_bench.py decode "$port" >"$tmp/decode.txt" || exit 1
start off --kv-reuse off --kv-cache-mb 512 --max-batch 8
python3 bench/serve_bench.py prefix "$port" >"$tmp/off.txt" || exit 1
echo "shared prefix, reuse on:  $(paste -sd' ' "$tmp/on.txt")"
echo "shared prefix, reuse off: $(paste -sd' ' "$tmp/off.txt")"
echo "batched decode:           $(paste -sd' ' "$tmp/decode.txt")"
awk -v a="$(val tokens_per_s "$tmp/on.txt")" -v b="$(val tokens_per_s "$tmp/off.txt")" \
    -v c="$(val ttft_mean_s "$tmp/off.txt")" -v d="$(val ttft_mean_s "$tmp/on.txt")" \
    -v e="$(val eight_at_once_tokens_per_s "$tmp/decode.txt")" \
    -v f="$(val one_at_a_time_tokens_per_s "$tmp/decode.txt")" 'BEGIN {
    printf "shared prefix: throughput %.2fx with reuse (goal >= 3x), time to first token %.2fx shorter (goal >= 3x)\n", a / b, c / d
    printf "batched decode: 8 concurrent %.2fx the tokens/s of one at a time (goal >= 2.5x)\n", e / f }'
