#!/bin/sh
# build/train --tokenizer: text in, text out.
#   A tokenizer learned here (build/bpe_train) reads --data and --val-data as
#   text, tokenized once into FILE.tokens.bin; the run's losses equal a run on
#   that token file itself (the tokens are the ones trained on); a second run
#   reads the cache as it is; another text rewrites it; the sample prints as
#   text; a Hugging Face GPT-2 file fine-tunes on text (--init-from). Bad paths: a missing tokenizer fails before step 1 naming the path,
#   a tokenizer larger than the model's vocabulary, --tokenizer without text,
#   and --tokenizer with --data-format are refused.
set -u
. tests/check.sh
losses() { sed -n 's/^step *\([0-9]*\)\/.* loss \([0-9.]*\).*/\1 \2/p' "$1"; }
run="--preset tiny --batch 4 --seq 32 --steps 12 --log-every 4 --eval-every 6 --peak-gflops 100"

# a text of this repository's own prose, and a tokenizer learned from it
cat README.md LICENSE >"$dir/corpus.txt"
sed -n '1,200p' README.md >"$dir/val.txt"
build/bpe_train --vocab-size 400 --output "$dir/tok.json" "$dir/corpus.txt" >"$dir/bpe.log" 2>&1 ||
    { echo "FAIL: bpe_train"; cat "$dir/bpe.log"; exit 1; }

build/train $run --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" --val-data "$dir/val.txt" \
    --sample-tokens 40 --checkpoint "$dir/a.safetensors" >"$dir/a.log" 2>&1
rc=$?
check "train --tokenizer: exits 0 (exit $rc)" [ "$rc" -eq 0 ]
check "the text is tokenized into FILE.tokens.bin beside it, for --data and --val-data" \
    sh -c "[ -s '$dir/corpus.txt.tokens.bin' -a -s '$dir/val.txt.tokens.bin' ] &&
           grep -q '^tokenized $dir/corpus.txt into $dir/corpus.txt.tokens.bin' '$dir/a.log'"
check "the model's vocabulary is the tokenizer's (400)" has 'vocabulary 400' "$dir/a.log"
# the sample: text of the corpus's tokens, not token ids
sed -n '/^--- sample (temperature/,/^---$/p' "$dir/a.log" | sed '1d;$d' >"$dir/sample.txt"
check "the sample prints as text (non-empty, no token-id listing)" \
    sh -c "[ -s '$dir/sample.txt' ] && ! grep -q 'sample token ids' '$dir/a.log'"

# the tokens trained on are the cache's: from the same weights (vocabulary 400), a run on
# the text and a run on its token file give the same losses
build/train $run --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" --val-data "$dir/val.txt" \
    --init-from "$dir/a.safetensors" --sample-tokens 0 >"$dir/b1.log" 2>&1
build/train $run --data "$dir/corpus.txt.tokens.bin" --val-data "$dir/val.txt.tokens.bin" \
    --init-from "$dir/a.safetensors" --sample-tokens 0 >"$dir/b2.log" 2>&1
losses "$dir/b1.log" >"$dir/b1.loss"
losses "$dir/b2.log" >"$dir/b2.loss"
check "losses equal a run on the token file itself ($(wc -l <"$dir/b1.loss") lines)" \
    sh -c "[ -s '$dir/b1.loss' ] && cmp -s '$dir/b1.loss' '$dir/b2.loss'"
losses "$dir/a.log" >"$dir/a.loss"

# fine-tuning a Hugging Face GPT-2 file on text (a fixture of the PyTorch reference: vocabulary
# 997, 8 positions, no n_head stored); the tokenizer's 400 ids fit its vocabulary
build/train --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" --val-data "$dir/val.txt" \
    --init-from tests/fixtures/gpt2_wide_vocab.safetensors --heads 4 --batch 8 --seq 8 \
    --steps 30 --log-every 10 --eval-every 30 --lr 3e-3 --warmup 0 --sample-tokens 20 \
    --peak-gflops 100 >"$dir/hf.log" 2>&1
rc=$?
losses "$dir/hf.log" >"$dir/hf.loss"
check "fine-tunes a Hugging Face GPT-2 file on text: exit $rc, vocabulary 997, the loss falls" \
    sh -c "[ $rc -eq 0 ] && grep -q 'vocabulary 997' '$dir/hf.log' &&
           awk 'NR == 1 { a = \$2 } END { exit !(NR >= 2 && \$2 < a - 0.3) }' '$dir/hf.loss'"

# a second run reads the cache as it is; another text rewrites it
cp "$dir/corpus.txt.tokens.bin" "$dir/cache.before"
build/train $run --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" --val-data "$dir/val.txt" \
    --sample-tokens 0 >"$dir/c.log" 2>&1
losses "$dir/c.log" | head -n 2 >"$dir/c.loss"
check "a second run: the same cache, the same first losses" \
    sh -c "grep -q '^tokens of $dir/corpus.txt read from' '$dir/c.log' && cmp -s '$dir/cache.before' '$dir/corpus.txt.tokens.bin' &&
           [ -s '$dir/c.loss' ] && head -n 2 '$dir/a.loss' | cmp -s - '$dir/c.loss'"
printf '\nOne more paragraph at the end changes the text.\n' >>"$dir/corpus.txt"
build/train $run --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" --sample-tokens 0 \
    >"$dir/d.log" 2>&1
rc=$?
check "another text: the cache is rewritten (exit $rc)" \
    sh -c "[ $rc -eq 0 ] && grep -q 'was of another text or tokenizer: tokenized' '$dir/d.log' && ! cmp -s '$dir/cache.before' '$dir/corpus.txt.tokens.bin'"

# bad paths
build/train $run --tokenizer "$dir/none.json" --data "$dir/corpus.txt" >"$dir/e.log" 2>&1
rc=$?
check "a missing tokenizer: exit 1 naming it, before step 1" \
    sh -c "[ $rc -eq 1 ] && grep -q 'none.json' '$dir/e.log' && ! grep -q '^step ' '$dir/e.log'"
build/train $run --tokenizer "$dir/tok.json" >"$dir/f.log" 2>&1
rc=$?
check "--tokenizer without --data: exit 2" sh -c "[ $rc -eq 2 ] && grep -q -- '--tokenizer reads' '$dir/f.log'"
build/train $run --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" --data-format bytes \
    >"$dir/g.log" 2>&1
rc=$?
check "--tokenizer with --data-format: exit 2" sh -c "[ $rc -eq 2 ] && grep -q -- '--data-format with --tokenizer' '$dir/g.log'"
build/train --preset tiny --batch 4 --seq 32 --steps 2 --data "$dir/corpus.txt" --sample-tokens 0 \
    --checkpoint "$dir/bytes.safetensors" --peak-gflops 100 >"$dir/h.log" 2>&1
build/train $run --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" \
    --init-from "$dir/bytes.safetensors" >"$dir/i.log" 2>&1
rc=$?
check "a tokenizer of 400 ids for a byte model (256): exit 2, named" \
    sh -c "[ $rc -eq 2 ] && grep -q 'has 400 ids but the model.s vocab_size is 256' '$dir/i.log'"

if [ "$bad" -ne 0 ]; then
    for f in a b1 b2 c hf i; do echo "--- $f.log"; tail -n 15 "$dir/$f.log"; done
fi
exit "$bad"
