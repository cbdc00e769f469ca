#!/bin/sh
# Chimera against 1F1B on a Megatron-style A100 cluster, simulated (build/plan,
# the same schedules the executor runs): GPT-2-style models of 1.3B and 2.7B
# parameters at p = 4 stages, tp 1, 32 GPUs (dp 8), micro-batches of one
# sequence, m = 4..32 micro-batches a pipeline, no recomputation, ZeRO 0 and
# ZeRO 1 (where Chimera's replica all-reduce moves only each rank's dp shard,
# after the dp reduce-scatter: 1/dp of the bytes between the stage pairs).
# Assumed shapes (the Chimera paper's exact ones are not at hand here): 1.3B
# as GPT-3's XL (24 layers, hidden 2048, 16 heads), 2.7B as GPT-3's 2.7B (32
# layers, hidden 2560, 32 heads), GPT-2's sequence 1024 and vocabulary 50257.
# Published (Li & Hoefler, SC'21, abstract): on GPT-2 1.3B over 2,048 Piz
# Daint nodes, Chimera 1.16-2.34x the throughput of the synchronous and
# asynchronous pipeline baselines together.
set -e
cd "$(dirname "$0")/.."
[ -x build/plan ] || make build/plan >/dev/null
field() { sed -n "s/.*\"$1\": \([0-9.e+-]*\).*/\1/p" "$2" | head -n 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-6s %4s %4s %14s %14s %8s %9s %9s\n' model ZeRO m "1f1b tok/s" "chimera tok/s" \
    ratio "1f1b GiB" "chim. GiB"
for model in "1.3B 24 2048 16" "2.7B 32 2560 32"; do
    set -- $model
    for z in 0 1; do
        for m in 4 8 16 32; do
            for s in 1f1b chimera; do
                build/plan --layers "$2" --hidden "$3" --heads "$4" --seq 1024 --vocab 50257 \
                    --tp 1 --pp 4 --gpus 32 --batch $((8 * m)) --microbatch 1 --schedule "$s" \
                    --zero "$z" --recompute none --json >"$tmp/$s"
            done
            a=$(field tokens_per_s "$tmp/1f1b") b=$(field tokens_per_s "$tmp/chimera")
            ma=$(field memory_per_gpu_bytes "$tmp/1f1b") mb=$(field memory_per_gpu_bytes "$tmp/chimera")
            awk -v n="$1" -v z="$z" -v m="$m" -v a="$a" -v b="$b" -v ma="$ma" -v mb="$mb" 'BEGIN {
                printf "%-6s %4d %4d %14.0f %14.0f %7.2fx %9.1f %9.1f\n", n, z, m, a, b, b / a,
                    ma / 1073741824, mb / 1073741824 }'
        done
    done
done
