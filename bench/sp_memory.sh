#!/bin/sh
# Per-rank memory and step time of tensor parallelism with and without
# sequence parallelism (--sp): gpt2-124m, tp 2, batch 8, 256 tokens.
# 1. The memory report (bench_parallel --memory, vocabulary 50257; a meta
#    build: nothing allocated): weights, gradients, AdamW state, activations
#    (the slot's saved tensors), scratch (one layer's, the head's block), and
#    the activations as a share of tp 2's.
# 2. Measured: train --preset gpt2-124m (the embedded task's vocabulary) on
#    two thread ranks, one step and an evaluation: its memory report a rank
#    and the peak resident memory of the process (VmHWM, read before any
#    sampling) beside twice the report's total.
# 3. Step time on two thread ranks (bench_parallel --steps 3: the median of
#    three whole steps after two warm-up steps), tp 2 and tp 2 --sp
#    alternating $ROUNDS times (default 2) in one run, and their ratio.
#
#   sh bench/sp_memory.sh          (parts 2 and 3 take minutes on 2 cores)
set -e
[ -x build/bench_parallel ] || make build/bench_parallel >/dev/null
[ -x build/train ] || make build/train >/dev/null
out=$(mktemp)
trap 'rm -f "$out"' EXIT
model="--layers 12 --batch 8 --seq 256 --tp 2"
echo "1. gpt2-124m (V 50257), tp 2, B 8, T 256: the memory report, MiB per rank"
printf '%-10s %8s %8s %8s %9s %8s %8s %9s\n' layout params grads AdamW acts "of tp 2" scratch total
base=0
for sp in "" --sp; do
    m=$(build/bench_parallel --memory $model $sp | grep 'memory per rank' |
        sed 's/ZeRO [0-9]//; s/model\/tp.*4P.*8P\/dp = [0-9.]* MiB//; s/[^0-9.]/ /g')
    [ "$base" != 0 ] || base=$(echo "$m" | awk '{print $4}')
    echo "$m" | awk -v l="tp 2 $sp" -v base="$base" \
        '{printf "%-10s %8.1f %8.1f %8.1f %9.1f %7.3fx %8.1f %9.1f\n", l, $1, $2, $3, $4, $4 / base, $5, $6}'
done
echo
echo "2. train --preset gpt2-124m (embedded task vocabulary), tp 2 on two thread ranks, B 8, T 256:"
echo "   the report a rank and the measured peak RSS of the process (both ranks), MiB"
printf '%-10s %8s %8s %8s %9s %8s %9s %9s %7s\n' layout params grads AdamW acts scratch total \
    "peak RSS" "RSS/2tot"
for sp in "" --sp; do
    build/train --preset gpt2-124m --tp 2 $sp --batch 8 --seq 256 --steps 1 --eval-every 1 \
        --eval-batches 1 --sample-tokens 0 --log-every 1 --peak-gflops 100 >"$out"
    m=$(grep '^memory per rank' "$out" | sed 's/([0-9]* slots*)//; s/[^0-9.]/ /g')
    peak=$(grep '^peak resident memory' "$out" | sed 's/^peak resident memory: \([0-9.]*\) MiB.*/\1/')
    echo "$m" | awk -v l="tp 2 $sp" -v peak="$peak" \
        '{t = $1 + $2 + $3 + $4 + $5
          printf "%-10s %8.1f %8.1f %8.1f %9.1f %8.1f %9.1f %9.1f %7.3f\n", l, $1, $2, $3, $4, $5, t, peak, peak / (2 * t)}'
done
echo
echo "3. step time, gpt2-124m (V 50257), tp 2 on two thread ranks, B 8, T 256 (ms, the slower rank)"
rounds=${ROUNDS:-2}
r=0
while [ "$r" -lt "$rounds" ]; do
    for sp in "" --sp; do
        ms=$(build/bench_parallel $model $sp --steps 3 | grep '^  step' |
            sed 's/.*: *\([0-9.]*\) ms,.*/\1/' | sort -n | tail -1)
        echo "tp 2 $sp $ms"
    done
    r=$((r + 1))
done | tee "$out"
awk '{ if (NF == 4) sp[n2++] = $4; else tp[n1++] = $3 }
     END {for (i = 0; i < n1; i++) { a += tp[i]; b += sp[i] }
          printf "--sp / tp 2: %.3f (means over %d rounds)\n", b / a, n1}' "$out"
