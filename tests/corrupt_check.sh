#!/bin/sh
# A damaged checkpoint is a clear error and exit status 1, never a crash (a
# signal) or a silently wrong run: a flipped byte in a tensor's data, a
# truncated file, a flipped byte in the header and a bad header length, each
# read by build/train --resume and by build/sample. A checkpoint without
# checksums (written before they existed) is covered by the unit tests.
#   sh tests/corrupt_check.sh CHECKPOINT   (a tiny-preset checkpoint)
set -u
ck=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad=0
hl=$(od -An -tu8 -N8 "$ck" | tr -d ' ')
size=$(wc -c <"$ck" | tr -d ' ')

flip() { # flip FILE OFFSET: xor the byte at OFFSET with 1
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "\\$(printf %03o $((b ^ 1)))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}
expect() { # expect WHAT PATTERN FILE: train and sample both refuse FILE with PATTERN
    for prog in train sample; do
        if [ $prog = train ]; then
            build/train --preset tiny --steps 50 --batch 4 --seq 32 --sample-tokens 0 \
                --threads 2 --resume "$3" >"$dir/out" 2>&1
        else
            build/sample "$3" --tokens 5 >"$dir/out" 2>&1
        fi
        rc=$?
        if [ $rc -ne 1 ] || ! grep -q -- "$2" "$dir/out"; then
            echo "FAIL: $1 read by $prog: exit $rc, wanted 1 and \"$2\""
            tail -n 5 "$dir/out"
            bad=1
        else
            echo "ok: $1 ($prog): $(grep -m1 -- "$2" "$dir/out")"
        fi
    done
}

cp "$ck" "$dir/data.safetensors"
flip "$dir/data.safetensors" $((8 + hl + (size - 8 - hl) / 2))
expect "a flipped byte in the data" "fails its checksum" "$dir/data.safetensors"

head -c $((size - 4096)) "$ck" >"$dir/short.safetensors"
expect "a truncated file" "truncated" "$dir/short.safetensors"

cp "$ck" "$dir/meta.safetensors" # a digit of a metadata value: the JSON stays valid
at=$(grep -abo '"step":"[0-9]' "$ck" | head -n 1 | cut -d: -f1)
flip "$dir/meta.safetensors" $((at + 8))
expect "a changed metadata value" "metadata fails its checksum" "$dir/meta.safetensors"

cp "$ck" "$dir/json.safetensors"
flip "$dir/json.safetensors" 8 # the header's opening brace
expect "a broken header" "not a JSON object" "$dir/json.safetensors"

cp "$ck" "$dir/len.safetensors"
flip "$dir/len.safetensors" 5 # the header length, now beyond the file
expect "a bad header length" "header length" "$dir/len.safetensors"
exit $bad
