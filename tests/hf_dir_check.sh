#!/bin/sh
# Hugging Face model directories from the command line (build/train
# --init-from, build/sample), made without PyTorch by scripts/hf_llama.py
# --from (a ptrain LLaMA file's weights under LlamaForCausalLM's names, its
# config.json from the metadata):
#   a LLaMA fixture (tests/fixtures/llama, made by the PyTorch reference) as
#   a directory, and as its model.safetensors with config.json beside it,
#   evaluates to the fixture's own loss; without config.json it is refused,
#   naming it; so does a GPT-2 directory (a GPT-2 config.json);
#   a LLaMA directory with a tokenizer.json (llama-tiny trained here on a
#   tokenizer learned here) fine-tunes on text, its tokenizer reading --data
#   by default: the loss falls, the checkpoint and the directory sample text;
#   shapes on the command line that disagree with the directory are refused
#   naming both.
set -u
. tests/check.sh
losses() { sed -n 's/^step *\([0-9]*\)\/.* loss \([0-9.]*\).*/\1 \2/p' "$1"; }
evalloss() { sed -n 's/^eval: .*: loss \([0-9.]*\) nats\/token.*/\1/p' "$1"; }
py=python3
hf="$py scripts/hf_llama.py"

# a LLaMA fixture as a Hugging Face directory: the same loss as the fixture itself
f=tests/fixtures/llama/llama_mqa_tied.safetensors
$hf --from "$f" --out "$dir/fix" >"$dir/fix.log" 2>&1 || { cat "$dir/fix.log"; exit 1; }
check "hf_llama.py --from: model.safetensors and config.json as transformers writes them" sh -c \
    "grep -q '\"architectures\": \[' '$dir/fix/config.json' && grep -q '\"num_key_value_heads\": 1,' '$dir/fix/config.json' &&
     grep -q '\"tie_word_embeddings\": true' '$dir/fix/config.json' && ! grep -aq 'fixture.logits' '$dir/fix/model.safetensors'"
perl -e 'print pack("l<3", 20240520, 1, 400), "\0" x 1012, pack("S<*", map { ($_ * 7) % 53 } 1 .. 400)' \
    >"$dir/v53.bin"
ref=
for m in "$f" "$dir/fix" "$dir/fix/model.safetensors"; do
    build/train --init-from "$m" --eval-only --val-data "$dir/v53.bin" --batch 2 --seq 12 \
        >"$dir/e.log" 2>&1
    l=$(evalloss "$dir/e.log")
    [ -n "$ref" ] || ref=$l
    check "--eval-only --init-from $(basename "$m"): loss ${l:-none} = the fixture's ${ref:-none}" \
        sh -c "[ -n '$l' ] && [ '$l' = '$ref' ]"
done
mkdir "$dir/alone"
cp "$dir/fix/model.safetensors" "$dir/alone/"
build/train --init-from "$dir/alone/model.safetensors" --eval-only --val-data "$dir/v53.bin" \
    --batch 2 --seq 12 >"$dir/a.log" 2>&1
rc=$?
check "a LLaMA model.safetensors without config.json: exit $rc, its config.json asked for" \
    sh -c "[ $rc -eq 1 ] && grep -q 'its shapes do not give the heads, its config.json does' '$dir/a.log'"

# a GPT-2 directory: a GPT-2 file (no n_head stored) and GPT-2's config.json
g=tests/fixtures/gpt2_wide_vocab.safetensors
mkdir "$dir/gpt2"
$py -c "
import sys; sys.path.insert(0, 'scripts'); import hf_llama as h
meta, t = h.read_safetensors('$g')
h.write_safetensors('$dir/gpt2/model.safetensors',
                    [(k, s, raw) for k, (d, s, raw) in t.items() if not k.startswith('fixture.')])
" || exit 1
printf '{"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 8, "n_embd": 16, "n_head": 4, "n_inner": null, "n_layer": 2, "n_positions": 8, "vocab_size": 997}\n' \
    >"$dir/gpt2/config.json"
perl -e 'print pack("l<3", 20240520, 1, 400), "\0" x 1012, pack("S<*", map { ($_ * 7) % 997 } 1 .. 400)' \
    >"$dir/v997.bin"
build/train --init-from "$g" --heads 4 --eval-only --val-data "$dir/v997.bin" --batch 2 --seq 8 \
    >"$dir/g1.log" 2>&1
build/train --init-from "$dir/gpt2" --eval-only --val-data "$dir/v997.bin" --batch 2 --seq 8 \
    >"$dir/g2.log" 2>&1
check "a GPT-2 directory (its config.json gives the heads): the file's loss $(evalloss "$dir/g1.log")" \
    sh -c "[ -n '$(evalloss "$dir/g1.log")' ] && [ '$(evalloss "$dir/g1.log")' = '$(evalloss "$dir/g2.log")' ]"

# a LLaMA directory with a tokenizer.json, fine-tuned on text
cat README.md LICENSE >"$dir/corpus.txt"
build/bpe_train --vocab-size 300 --output "$dir/tok.json" "$dir/corpus.txt" >/dev/null 2>&1
build/train --preset llama-tiny --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" --steps 2 \
    --batch 4 --seq 32 --sample-tokens 0 --peak-gflops 100 --checkpoint "$dir/base.safetensors" \
    >"$dir/base.log" 2>&1 || { cat "$dir/base.log"; exit 1; }
$hf --from "$dir/base.safetensors" --tokenizer "$dir/tok.json" --out "$dir/llama" >/dev/null ||
    exit 1
build/train --init-from "$dir/llama" --data "$dir/corpus.txt" --steps 40 --batch 8 --seq 32 \
    --lr 3e-3 --warmup 0 --log-every 10 --eval-every 40 --sample-tokens 24 --peak-gflops 100 \
    --checkpoint "$dir/ft.safetensors" >"$dir/ft.log" 2>&1
rc=$?
losses "$dir/ft.log" >"$dir/ft.loss"
check "train --init-from DIR --data TEXT: exit $rc, DIR's tokenizer.json reads the text (the base run's cache: the same tokenizer)" sh -c \
    "[ $rc -eq 0 ] && grep -q '^tokenizer: $dir/llama/tokenizer.json, 300 ids (--init-from' '$dir/ft.log' &&
     grep -q '^tokens of $dir/corpus.txt read from $dir/corpus.txt.tokens.bin' '$dir/ft.log'"
check "... the model: line names LLaMA and its choices" \
    has "^model: LLaMA (RMSNorm, SwiGLU 176 wide, rotary positions, 2 key/value heads, no biases, untied head), 2 layers" "$dir/ft.log"
check "... the loss falls ($(tr '\n' ' ' <"$dir/ft.loss"))" \
    awk 'NR == 1 { a = $2 } END { exit !(NR >= 3 && $2 < a - 0.3) }' "$dir/ft.loss"
sed -n '/^--- sample (temperature/,/^---$/p' "$dir/ft.log" | sed '1d;$d' >"$dir/sample.txt"
check "... and samples text at the end" sh -c "[ -s '$dir/sample.txt' ] && ! grep -q 'sample token ids' '$dir/ft.log'"
build/sample "$dir/ft.safetensors" --tokenizer "$dir/llama" --prompt "The model" --tokens 8 \
    >"$dir/s1.txt" 2>"$dir/s1.err"
check "sample CHECKPOINT --tokenizer DIR prints text" grep -q "^The model" "$dir/s1.txt"
build/sample "$dir/llama" --prompt "The model" --tokens 8 >"$dir/s2.txt" 2>"$dir/s2.err"
check "sample DIR: its tokenizer.json by default, the architecture named" sh -c \
    "grep -q '^The model' '$dir/s2.txt' && grep -q '^model: $dir/llama, LLaMA (RMSNorm' '$dir/s2.err'"

# shapes that disagree with the directory, refused naming both
build/train --init-from "$dir/llama" --heads 8 --data "$dir/corpus.txt" --steps 1 >"$dir/h.log" 2>&1
rc=$?
check "--heads 8 with a 4-head directory: exit $rc, both named" \
    sh -c "[ $rc -eq 1 ] && grep -q -- '--heads 8: $dir/llama has 4 heads' '$dir/h.log'"
build/train --init-from "$dir/llama" --preset llama-124m --data "$dir/corpus.txt" --steps 1 \
    >"$dir/p.log" 2>&1
rc=$?
check "--preset llama-124m with it: exit $rc, both named" \
    sh -c "[ $rc -eq 1 ] && grep -q -- '--preset llama-124m (LLaMA .*, 12 layers, 12 heads, 768 wide, .*) is not the model of $dir/llama (LLaMA .*, 2, 4, 64' '$dir/p.log'"
if [ "$bad" -ne 0 ]; then
    for f in e a g1 g2 ft h p; do [ -f "$dir/$f.log" ] && { echo "--- $f.log"; tail -n 12 "$dir/$f.log"; }; done
fi
exit "$bad"
