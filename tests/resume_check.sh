#!/bin/sh
# build/train interrupted at a checkpoint and resumed in a new process prints
# the same training losses, to the last digit, as an uninterrupted run (the
# unit tests compare the floats themselves bit for bit).
set -e
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common="--preset tiny --batch 4 --seq 32 --steps 40 --warmup 5 --eval-every 100 --log-every 1 --sample-tokens 0 --threads 2 --seed 5"
build/train $common >"$dir/full.log"
build/train $common --stop-after 20 --checkpoint "$dir/c.safetensors" >"$dir/first.log"
build/train $common --resume "$dir/c.safetensors" >"$dir/resumed.log"
losses() { grep '^step' "$1" | awk -F'|' '{print $1 $2}' | awk '$2+0 > 20'; }
losses "$dir/full.log" >"$dir/a"
losses "$dir/resumed.log" >"$dir/b"
[ "$(wc -l <"$dir/a")" -eq 20 ] || { echo "expected 20 loss lines"; cat "$dir/a"; exit 1; }
diff "$dir/a" "$dir/b"
echo "steps 21-40 after a resume equal the uninterrupted run"
