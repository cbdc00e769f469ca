#!/bin/sh
# make bench-text: ptrain's tokenizer and BPE trainer against the references,
# side by side in one run. Needs the npm references (scripts/tokenizer_ref.sh),
# Debian's fortunes (English prose), python3.11-doc (English prose, reST) and
# sentencepiece (spm_train): apt-get install fortunes python3.11-doc sentencepiece.
#  - encode MB/s with GPT-2's vocabulary on prose (fortunes, 2.6 MB) and code (the
#    first 2.5 MB of /usr/include/**/*.h), ptrain on 1 thread and all cores, then
#    tiktoken (npm WASM), js-tiktoken, gpt-3-encoder, once their ids equal ptrain's
#  - a 50 MB file (Python docs + fortunes + C headers): ptrain 1 thread vs all cores
#  - BPE training of 16,384 tokens on the 50 MB: build/bpe_train vs spm_train
#    --model_type=bpe, and the tokens per byte of the result beside GPT-2's on
#    held-out text (/usr/share/common-licenses/GPL-3)
set -e
sh scripts/tokenizer_ref.sh >/dev/null
for f in /usr/share/games/fortunes/fortunes /usr/share/doc/python3.11/html/_sources; do
    [ -e "$f" ] || { echo "bench-text: missing $f: apt-get install fortunes python3.11-doc sentencepiece"; exit 1; }
done
command -v spm_train >/dev/null || { echo "bench-text: no spm_train: apt-get install sentencepiece"; exit 1; }
d=build/bench_text_data
mkdir -p "$d"
cat $(ls -d /usr/share/games/fortunes/* | grep -v -E '\.(dat|u8)$' | grep -v off) >"$d/prose.txt"
find /usr/include -name '*.h' | sort | xargs cat 2>/dev/null | head -c 2500000 >"$d/code.txt"
{ find /usr/share/doc/python3.11/html/_sources -name '*.txt' | sort | xargs cat; cat "$d/prose.txt";
  find /usr/include -name '*.h' | sort | xargs cat 2>/dev/null; } | head -c 50000000 >"$d/big50.txt"
echo "== encode, GPT-2 vocabulary (MB/s; each reference checked against ptrain's ids first)"
for f in prose code; do
    build/bench_text --tokenizer build/tok/gpt2 "$d/$f.txt" --ids "$d/$f.ids" --repeat 3
    node bench/tokenizer_bench.js build/npm/node_modules gpt2 "$d/$f.txt" "$d/$f.ids" 3
done
echo "== encode, 50 MB"
build/bench_text --tokenizer build/tok/gpt2 "$d/big50.txt" --repeat 1
echo "== BPE training, 16,384 tokens on 50 MB"
t0=$(date +%s.%N)
build/bpe_train --vocab-size 16384 --output "$d/bpe16k.json" "$d/big50.txt" \
    --check /usr/share/common-licenses/GPL-3 --compare build/tok/gpt2 2>/dev/null
t1=$(date +%s.%N)
spm_train --input="$d/big50.txt" --model_prefix="$d/spm16k" --vocab_size=16384 --model_type=bpe \
    --character_coverage=1.0 --byte_fallback=true --num_threads="$(nproc)" >"$d/spm.log" 2>&1
t2=$(date +%s.%N)
echo "$t0 $t1 $t2" | awk '{ printf "bpe_train %.1f s, spm_train --model_type=bpe %.1f s: %.2fx\n", $2 - $1, $3 - $2, ($3 - $2) / ($2 - $1) }'
