#!/bin/sh
# Bad paths are refused by name before any work starts, with a non-zero
# status, and long work says what it does. tests/paths_check.sh SECTION:
#   text      bpe_train and tokenize on a directory, an empty file, an output
#             that cannot be written (checked before the work); the progress
#             line while tokenizing (on a terminal: script(1)); Ctrl-C while
#             train tokenizes: a message naming the text, exit 130, no cache
#             and no half-written one left
#   train     --preset against a checkpoint of another architecture (--resume
#             at any step, --init-from), an empty or directory --data,
#             --token-cache that is no directory or has no text to keep
#   readonly  a read-only data directory: train tokenizes without a cache and
#             says how to keep one (--token-cache DIR), a --token-cache,
#             --checkpoint or tokenize --output there is refused before the
#             work. As root (who writes anywhere) the runs drop to nobody
#             (setpriv); SKIP where that is not possible.
set -u
. tests/check.sh
# refuses NAME CODE PATTERN CMD...: CMD exits CODE and prints PATTERN
refuses() {
    what=$1 code=$2 pattern=$3
    shift 3
    "$@" >"$dir/r.log" 2>&1
    rc=$?
    if [ "$rc" -eq "$code" ] && grep -q -- "$pattern" "$dir/r.log"; then echo "ok: $what"; else
        echo "FAIL: $what (exit $rc, wanted $code and '$pattern')"
        tail -n 5 "$dir/r.log"
        bad=1
    fi
}
tiny="--preset tiny --batch 4 --seq 32 --sample-tokens 0 --peak-gflops 100"
cat README.md LICENSE >"$dir/corpus.txt"
: >"$dir/empty.txt"
mkdir "$dir/adir"
build/bpe_train --vocab-size 300 --output "$dir/tok.json" "$dir/corpus.txt" >/dev/null 2>&1 ||
    { echo "FAIL: bpe_train"; exit 1; }

case "${1:-}" in
text)
    refuses "bpe_train on a directory: the reason" 1 "cannot read '$dir/adir': Is a directory" \
        build/bpe_train --output "$dir/x.json" "$dir/adir"
    refuses "bpe_train on an empty file" 1 "'$dir/empty.txt' is empty" \
        build/bpe_train --output "$dir/x.json" "$dir/corpus.txt" "$dir/empty.txt"
    check "... writes no tokenizer" [ ! -e "$dir/x.json" ]
    refuses "bpe_train --output into a missing directory, before training" 1 \
        "output $dir/no/x.json: cannot create a file there (No such file or directory)" \
        build/bpe_train --output "$dir/no/x.json" "$dir/corpus.txt"
    refuses "bpe_train --check of a missing file, before training" 1 "check $dir/none.txt: No such" \
        build/bpe_train --output "$dir/x.json" --check "$dir/none.txt" "$dir/corpus.txt"
    check "... and nothing written" [ ! -e "$dir/x.json" ]
    refuses "tokenize on a directory: the reason" 1 "cannot read '$dir/adir': Is a directory" \
        build/tokenize --tokenizer "$dir/tok.json" --print-ids "$dir/adir"
    refuses "tokenize on an empty file" 1 "'$dir/empty.txt' is empty: nothing to tokenize" \
        build/tokenize --tokenizer "$dir/tok.json" --print-ids "$dir/empty.txt"
    refuses "tokenize --output into a missing directory, before encoding" 1 \
        "output $dir/no/x.bin: cannot create a file there (No such file or directory): fix the path before tokenizing" \
        build/tokenize --tokenizer "$dir/tok.json" --output "$dir/no/x.bin" "$dir/corpus.txt"
    check "... (no progress line: nothing was encoded)" sh -c "! grep -q '%' '$dir/r.log'"
    refuses "tokenize --output naming a directory" 1 "output $dir/adir is a directory" \
        build/tokenize --tokenizer "$dir/tok.json" --output "$dir/adir" "$dir/corpus.txt"
    # progress: on a terminal a line (rewritten in place) with MB, MB/s and ETA; elsewhere one
    # every 5 s, so none for a short text
    if command -v script >/dev/null 2>&1; then
        script -qec "build/train $tiny --steps 1 --tokenizer $dir/tok.json --data $dir/corpus.txt" \
            /dev/null >"$dir/tty.log" 2>&1
        check "train --tokenizer on a terminal: a progress line while tokenizing" \
            grep -q "tokenizing $dir/corpus.txt: 100.0% of [0-9.]* MB, [0-9.]* MB/s, ETA 0m00s" "$dir/tty.log"
        script -qec "build/tokenize --tokenizer $dir/tok.json --output $dir/c.bin $dir/corpus.txt" \
            /dev/null >"$dir/tty2.log" 2>&1
        check "tokenize --output on a terminal: the same progress line" \
            grep -q "tokenize: 100.0% of [0-9.]* MB, [0-9.]* MB/s, ETA 0m00s" "$dir/tty2.log"
    else
        echo "ok: (no script(1) here: the terminal's progress line is not checked)"
    fi
    rm -f "$dir/corpus.txt.tokens.bin"
    build/train $tiny --steps 1 --tokenizer "$dir/tok.json" --data "$dir/corpus.txt" >"$dir/pipe.log" 2>&1
    check "... not on a terminal: no line for a short text" sh -c "! grep -q '^tokenizing .*% of' '$dir/pipe.log'"
    # Ctrl-C while tokenizing (the cache write slowed down by the test build's hook: a kill
    # lands while PATH.tmp is half written)
    rm -f "$dir/corpus.txt.tokens.bin"
    PTRAIN_TEST_WRITE_DELAY_MS=4000 build/train_faults $tiny --steps 1 --tokenizer "$dir/tok.json" \
        --data "$dir/corpus.txt" >"$dir/int.log" 2>&1 &
    pid=$!
    n=0
    until [ -f "$dir/corpus.txt.tokens.bin.tmp" ] || ! kill -0 $pid 2>/dev/null || [ $n -gt 3000 ]; do
        n=$((n + 1))
        sleep 0.01
    done
    kill -INT $pid
    wait $pid
    rc=$?
    check "Ctrl-C while tokenizing: exit 130 (exit $rc) and what was interrupted" sh -c \
        "[ $rc -eq 130 ] && grep -q '^interrupted while tokenizing $dir/corpus.txt: no training started and no token cache written' '$dir/int.log'"
    check "... no cache and no half-written one left" \
        sh -c "[ ! -e '$dir/corpus.txt.tokens.bin' ] && [ ! -e '$dir/corpus.txt.tokens.bin.tmp' ]"
    ;;
train)
    build/train --preset llama-tiny --batch 4 --seq 32 --steps 3 --sample-tokens 0 --peak-gflops 100 \
        --checkpoint "$dir/llama.safetensors" >"$dir/l.log" 2>&1 || { cat "$dir/l.log"; exit 1; }
    refuses "--preset tiny with a llama-tiny checkpoint of its shape (--resume, --steps past it)" 1 \
        "preset tiny (GPT-2 (LayerNorm, GELU, learned positions), 2 layers, 4 heads, 64 wide, .*) is not the model of $dir/llama.safetensors (LLaMA (RMSNorm, SwiGLU" \
        build/train $tiny --steps 9 --resume "$dir/llama.safetensors"
    refuses "... and with --steps at or below its step (no model check skipped)" 1 \
        "preset tiny (GPT-2 .*) is not the model of $dir/llama.safetensors (LLaMA" \
        build/train $tiny --steps 2 --resume "$dir/llama.safetensors"
    refuses "... and with --init-from" 1 "preset tiny (GPT-2 .*) is not the model of" \
        build/train $tiny --steps 2 --init-from "$dir/llama.safetensors"
    refuses "--preset llama-tiny with it resumes: nothing to train at its step (exit 0)" 0 \
        "is at step 3, already at or past --steps 3" \
        build/train --preset llama-tiny --steps 3 --resume "$dir/llama.safetensors"
    refuses "an empty --data" 1 "data $dir/empty.txt holds no tokens: an empty file" \
        build/train $tiny --steps 1 --data "$dir/empty.txt"
    refuses "an empty --data through --tokenizer" 1 "data $dir/empty.txt holds no tokens" \
        build/train $tiny --steps 1 --data "$dir/empty.txt" --tokenizer "$dir/tok.json"
    refuses "a directory as --data: the reason" 1 "cannot read '$dir/adir': Is a directory" \
        build/train $tiny --steps 1 --data "$dir/adir"
    refuses "a directory as --data through --tokenizer" 1 "cannot read '$dir/adir': Is a directory" \
        build/train $tiny --steps 1 --data "$dir/adir" --tokenizer "$dir/tok.json"
    refuses "--token-cache that does not exist, before tokenizing" 1 \
        "token-cache $dir/none is no directory: make it first" \
        build/train $tiny --steps 1 --data "$dir/corpus.txt" --tokenizer "$dir/tok.json" \
        --token-cache "$dir/none"
    refuses "--token-cache naming a file" 1 "token-cache $dir/corpus.txt is a file, not a directory" \
        build/train $tiny --steps 1 --data "$dir/corpus.txt" --tokenizer "$dir/tok.json" \
        --token-cache "$dir/corpus.txt"
    check "... nothing tokenized" [ ! -e "$dir/corpus.txt.tokens.bin" ]
    ;;
readonly)
    if [ "$(id -u)" -eq 0 ]; then
        if ! command -v setpriv >/dev/null 2>&1 ||
            ! setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
            echo "SKIP: root writes into read-only directories, and setpriv cannot drop to nobody here"
            exit 77
        fi
        other() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
    else
        other() { "$@"; }
    fi
    chmod 755 "$dir"
    cp build/train build/tokenize "$dir/" # where nobody may run them
    mkdir "$dir/ro" "$dir/cache"
    cp "$dir/corpus.txt" "$dir/tok.json" "$dir/ro/"
    chmod 777 "$dir/cache"
    chmod 555 "$dir/ro"
    other "$dir/train" $tiny --steps 1 --tokenizer "$dir/ro/tok.json" --data "$dir/ro/corpus.txt" \
        >"$dir/ro1.log" 2>&1
    rc=$?
    check "a read-only data directory: trains (exit $rc), tokenized without a cache, saying so and naming --token-cache" \
        sh -c "[ $rc -eq 0 ] && grep -q '^tokenized $dir/ro/corpus.txt without a cache: $dir/ro/corpus.txt.tokens.bin cannot be written (Permission denied), so each run tokenizes it again; --token-cache DIR keeps' '$dir/ro1.log' && grep -q '^step' '$dir/ro1.log'"
    other "$dir/train" $tiny --steps 1 --tokenizer "$dir/ro/tok.json" --data "$dir/ro/corpus.txt" \
        --token-cache "$dir/cache" >"$dir/ro2.log" 2>&1
    rc=$?
    check "... --token-cache DIR keeps its tokens there (exit $rc)" \
        sh -c "[ $rc -eq 0 ] && grep -q '^tokenized $dir/ro/corpus.txt into $dir/cache/corpus.txt.tokens.bin' '$dir/ro2.log'"
    other "$dir/train" $tiny --steps 1 --tokenizer "$dir/ro/tok.json" --data "$dir/ro/corpus.txt" \
        --token-cache "$dir/cache" >"$dir/ro3.log" 2>&1
    check "... which the next run reads" grep -q "^tokens of $dir/ro/corpus.txt read from $dir/cache/" "$dir/ro3.log"
    refuses "--token-cache in a read-only directory, before tokenizing" 1 \
        "token-cache $dir/ro/corpus.txt.tokens.bin: cannot create a file there (Permission denied)" \
        other "$dir/train" $tiny --steps 1 --tokenizer "$dir/ro/tok.json" --data "$dir/ro/corpus.txt" \
        --token-cache "$dir/ro"
    refuses "--checkpoint in a read-only directory, before step 1" 1 \
        "checkpoint $dir/ro/c.safetensors: cannot create a file there (Permission denied)" \
        other "$dir/train" $tiny --steps 1 --checkpoint "$dir/ro/c.safetensors"
    check "... (no step ran)" sh -c "! grep -q '^step' '$dir/r.log'"
    refuses "tokenize --output into a read-only directory, before encoding" 1 \
        "output $dir/ro/x.bin: cannot create a file there (Permission denied): fix the path before tokenizing" \
        other "$dir/tokenize" --tokenizer "$dir/ro/tok.json" --output "$dir/ro/x.bin" "$dir/ro/corpus.txt"
    chmod 755 "$dir/ro" # so that the trap removes it
    ;;
*)
    echo "usage: tests/paths_check.sh text|train|readonly"
    exit 2
    ;;
esac
exit "$bad"
