#!/bin/sh
# Checkpoints are the whole model and optimizer in every layout: a run
# stopped half-way on a pipeline (pp 2), on tp 2 x pp 2, sequence parallel
# (tp 2 --sp with dp 2, ZeRO 1; with pp 2), on dp 2 ZeRO 3 (and x pp 2) and on tp 2 x dp 2
# ZeRO 1 writes as many tensors as the serial run, build/sample generates from
# it, and resumed in another layout (serial; dp 2 x pp 2 gpipe; tp 2 x pp 2;
# tp 4 --sp, ZeRO 2; tp 2; dp 2 x pp 2 ZeRO 3, gpipe; tp 2 --sp x dp 2 ZeRO 3) it prints the serial run's
# losses (to 2e-3: float sums in another order).
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common="--preset tiny --steps 12 --batch 8 --seq 32 --grad-accum 2 --log-every 1 --eval-every 100
        --sample-tokens 0 --seed 3 --peak-gflops 100"
# tensors in a safetensors file: entries with a dtype in its JSON header
count() {
    n=$(od -An -t u8 -N 8 "$1" | tr -d ' ')
    head -c $((8 + n)) "$1" | tail -c "$n" | grep -o '"dtype"' | wc -l
}
losses() { grep '^step' "$1" | sed 's/^step *\([0-9]*\)\/[0-9]* | loss \([0-9.]*\) .*/\1 \2/'; }
same() { # same A B: every step of B has A's loss
    awk 'NR == FNR {want[$1] = $2; next}
         {n++; d = want[$1] - $2; if (d < 0) d = -d
          if (!($1 in want) || d > 2e-3) {print "step " $1 ": " want[$1] " vs " $2; bad = 1}}
         END {if (n < 6) {print "only " n " steps"; bad = 1}; exit bad}' "$1" "$2"
}
build/train $common --checkpoint "$dir/serial.safetensors" >"$dir/serial.log"
losses "$dir/serial.log" >"$dir/serial"
want=$(count "$dir/serial.safetensors")
for layout in "pp:--pp 2:" "tpp:--tp 2 --pp 2:--dp 2 --pp 2 --schedule gpipe" \
    "sp:--tp 2 --sp --dp 2 --zero 1:--tp 2 --pp 2" "spp:--tp 2 --sp --pp 2:--tp 4 --sp --zero 2" \
    "z3:--dp 2 --zero 3:--tp 2" "z3pp:--dp 2 --pp 2 --zero 3:--pp 2 --dp 2 --zero 3 --schedule gpipe" \
    "z3in:--tp 2 --dp 2 --zero 1:--tp 2 --sp --dp 2 --zero 3 --recompute full"; do
    name=${layout%%:*} rest=${layout#*:}
    first=${rest%%:*} then=${rest#*:}
    build/train $common $first --stop-after 6 --checkpoint "$dir/$name.safetensors" \
        >"$dir/$name.log"
    got=$(count "$dir/$name.safetensors")
    [ "$got" -eq "$want" ] ||
        { echo "$name ($first): $got tensors in the checkpoint, the serial run's has $want"; exit 1; }
    build/sample "$dir/$name.safetensors" --tokens 20 >/dev/null 2>"$dir/sample.log" ||
        { echo "$name ($first): sample failed"; cat "$dir/sample.log"; exit 1; }
    build/train $common $then --resume "$dir/$name.safetensors" >"$dir/$name.resumed.log"
    losses "$dir/$name.resumed.log" >"$dir/$name"
    same "$dir/serial" "$dir/$name" ||
        { echo "$name ($first) resumed with '$then': not the serial run's losses"; exit 1; }
done
echo "pp 2, tp 2 x pp 2, tp 2 --sp x dp 2, tp 2 --sp x pp 2, dp 2 ZeRO 3 (x pp 2) and tp 2 x dp 2 ZeRO 1" \
    "checkpoints: $want tensors as serially, sampled, resumed (serial; dp 2 x pp 2; tp 2 x pp 2;" \
    "tp 4 --sp, ZeRO 2; tp 2; dp 2 x pp 2 ZeRO 3; tp 2 --sp x dp 2 ZeRO 3) with the serial run's losses"
