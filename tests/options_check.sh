#!/bin/sh
# Every option of build/train takes effect or is refused, naming the
# combination. The option list comes from the program's own table (its
# --help): an option this test does not name in a case fails it, so a new
# option cannot be added without one. A case is either a run whose output
# shows the option's effect, or a combination refused with its message.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad=0
covered=" "
ok() { echo "ok: $1"; }
no() { echo "FAIL: $1"; bad=1; }
# effect OPTS LOG PATTERN: the run's LOG shows PATTERN (for the options OPTS)
effect() {
    covered="$covered$1 "
    if grep -q -- "$3" "$2"; then ok "--${1% *}...: '$3'"; else no "$1: no '$3' in $(basename "$2")"; fi
}
# refused OPTS CODE PATTERN ARGS...: build/train ARGS exits CODE with PATTERN
refused() {
    opts=$1 code=$2 pattern=$3
    shift 3
    covered="$covered$opts "
    build/train "$@" >"$dir/r.log" 2>&1
    rc=$?
    if [ $rc -eq "$code" ] && grep -q -- "$pattern" "$dir/r.log"; then ok "refused: $*"
    else no "$* (exit $rc, wanted $code and '$pattern')"; tail -n 3 "$dir/r.log"; fi
}
q="--peak-gflops 100 --sample-tokens 0"
cat README.md docs/*.md | head -c 20000 >"$dir/text.bin" # .bin: llm.c tokens unless --data-format bytes
tail -c 8000 README.md >"$dir/val.txt"

# A: a model of its own shape, the optimizer's settings, validation and saves
build/train --layers 3 --heads 2 --embd 32 --block-size 24 --seq 16 --batch 6 --steps 4 \
    --lr 0.002 --min-lr 0.0001 --warmup 1 --weight-decay 0.2 --grad-clip 0.5 --val-fraction 0.2 \
    --eval-every 2 --eval-batches 3 --log-every 2 --checkpoint "$dir/a.safetensors" \
    --checkpoint-every 1 --keep 2 --max-bad-steps 3 --seed 9 --threads 1 --recompute full \
    --grad-accum 2 --schedule gpipe --stop-after 3 $q >"$dir/a.log" 2>&1
effect "layers heads embd block-size" "$dir/a.log" "^model: GPT-2 (LayerNorm, GELU, learned positions), 3 layers, 2 heads, 32 wide, vocabulary 256, context 24"
effect "steps seq batch lr min-lr warmup weight-decay grad-clip seed max-bad-steps" "$dir/a.log" \
    "^training 4 steps of 6 x 16 tokens, lr 0.002 -> 0.0001 (warm-up 1), weight decay 0.2, clip 0.5, seed 9; 3 non-finite"
effect "val-fraction eval-every eval-batches" "$dir/a.log" \
    "^validation: 419430 tokens (held out), every 2 steps on 3 batches"
effect "log-every" "$dir/a.log" "^step     2/4 | loss [0-9.]* | val [0-9]"
effect "threads" "$dir/a.log" "^threads 1;"
effect "peak-gflops" "$dir/a.log" "fp32 peak 100.0 GFLOP/s (--peak-gflops)"
effect "grad-accum schedule recompute" "$dir/a.log" "schedule gpipe, 1 chunk per stage, 2 micro-batches of 3 rows per rank and step, recompute full"
effect "stop-after" "$dir/a.log" "^stopped after step 3 of 4"
ls "$dir" >"$dir/ls.log"
effect "checkpoint checkpoint-every keep" "$dir/ls.log" "^a-step00000002.safetensors"
effect "keep" "$dir/ls.log" "^a-step00000003.safetensors"
grep -q "^a-step00000001" "$dir/ls.log" && no "--keep 2 kept step 1 too"

# B: data files, a preset, the sample
build/train --preset tiny --data "$dir/text.bin" --data-format bytes --val-data "$dir/val.txt" \
    --steps 2 --batch 4 --seq 16 --sample-tokens 5 --temperature 0.5 --top-k 3 \
    --peak-gflops 100 >"$dir/b.log" 2>&1
effect "data data-format" "$dir/b.log" "^data: $dir/text.bin, 20000 tokens, vocabulary 256"
effect "val-data" "$dir/b.log" "^validation: 8000 tokens ($dir/val.txt)"
effect "preset" "$dir/b.log" "^model: GPT-2 (.*), 2 layers, 4 heads, 64 wide"
effect "sample-tokens temperature top-k" "$dir/b.log" "^--- sample (temperature 0.5, top-k 3) ---"

# C: every kind of parallelism at once, and a trace
build/train --layers 4 --heads 4 --embd 32 --tp 2 --sp --dp 2 --pp 2 --chunks 2 --schedule interleaved \
    --zero 1 --overlap off --bucket-mb 0.05 --batch 8 --seq 16 --steps 2 --trace "$dir/t.json" \
    --trace-step 1 $q --precision bf16 >"$dir/c.log" 2>&1
effect "tp sp dp pp zero chunks" "$dir/c.log" "^layout: tp 2 (sequence parallel) x dp 2 x pp 2 = 8 ranks (threads), ZeRO 1, schedule interleaved, 2 chunks per stage"
effect "overlap" "$dir/c.log" "recompute none; dp gradients reduced after backward$"
effect "bucket-mb" "$dir/c.log" "^dp gradient buckets: at least 0.05 MiB (--bucket-mb)$"
effect "trace trace-step" "$dir/c.log" "^trace of step 1: $dir/t.json"
effect "precision" "$dir/c.log" "; GEMM [a-z0-9-]*; bf16 peak 100.0 GFLOP/s (--peak-gflops)"

# D: the model from a file
build/train --resume "$dir/a-step00000003.safetensors" --steps 4 --seq 16 --batch 6 $q \
    >"$dir/d.log" 2>&1
effect "resume" "$dir/d.log" "^resumed from $dir/a-step00000003.safetensors at step 3"
build/train --init-from "$dir/a-step00000003.safetensors" --eval-only --seq 16 --batch 6 \
    >"$dir/e.log" 2>&1
effect "init-from eval-only" "$dir/e.log" "^eval: .*a-step00000003.safetensors on .*perplexity"
cp "$dir/a-step00000003.safetensors" "$dir/f.safetensors"
build/train --preset tiny --steps 1 --batch 4 --seq 16 --checkpoint "$dir/f.safetensors" --force \
    $q >"$dir/f.log" 2>&1
effect "force" "$dir/f.log" "^checkpoint: $dir/f.safetensors (step 1)"

# G: the peak measured anew and kept (in a cache of this test's own); text's tokens kept elsewhere
PTRAIN_CACHE_DIR="$dir/peak" build/train --preset tiny --steps 1 --batch 4 --seq 16 --sample-tokens 0 \
    --measure-peak >"$dir/g.log" 2>&1
effect "measure-peak" "$dir/g.log" "fp32 peak [0-9.]* GFLOP/s (FMA instructions, measured on this machine's cores: now, kept for later runs)"
mkdir "$dir/tokens"
build/bpe_train --vocab-size 300 --output "$dir/tok.json" "$dir/val.txt" >/dev/null 2>&1
build/train --preset tiny --steps 1 --batch 4 --seq 16 --tokenizer "$dir/tok.json" --data "$dir/val.txt" \
    --token-cache "$dir/tokens" $q >"$dir/h.log" 2>&1
effect "token-cache" "$dir/h.log" "^tokenized $dir/val.txt into $dir/tokens/val.txt.tokens.bin"

# combinations refused, each naming itself
t="--preset tiny --steps 2 --batch 4 --seq 16"
refused "data-format" 2 "data-format says how --data and --val-data are read" $t --data-format bytes
refused "val-fraction val-data" 2 "val-fraction with --val-data" $t --val-data "$dir/val.txt" --val-fraction 0.2
refused "resume init-from" 2 "resume with --init-from" --resume "$dir/f.safetensors" --init-from "$dir/f.safetensors"
refused "eval-only" 2 "eval-only needs a model" --eval-only
refused "precision" 2 "error: --precision: unknown precision 'fp16' (known: fp32, bf16)" $t \
    --precision fp16
refused "overlap" 2 "overlap with one data-parallel rank: there is no gradient reduction" $t --overlap on
refused "bucket-mb" 2 "bucket-mb with one data-parallel rank" $t --bucket-mb 1
refused "bucket-mb 0" 2 "bucket-mb 0 must be more than 0" $t --dp 2 --bucket-mb 0
refused "bucket-mb -1" 2 "bucket-mb -1 must be more than 0" $t --dp 2 --bucket-mb -1
refused "bucket-mb zero" 2 "bucket-mb with --zero 2: ZeRO 2 holds one layer" $t --dp 2 --zero 2 --bucket-mb 1
refused "bucket-mb model" 2 "bucket-mb 64 is more than the model's 0.4" $t --dp 2 --bucket-mb 64
refused "eval-only steps" 2 "steps with --eval-only: nothing is trained" --eval-only --init-from "$dir/f.safetensors" --steps 3
refused "eval-only data" 2 "data with --eval-only --val-data" --eval-only --init-from "$dir/f.safetensors" --val-data "$dir/val.txt" --data "$dir/val.txt"
refused "checkpoint-every" 2 "checkpoint-every needs --checkpoint" $t --checkpoint-every 1
refused "tokenizer" 2 "tokenizer reads --data and --val-data as text" $t --tokenizer "$dir/tok.json"
refused "token-cache" 2 "token-cache keeps the tokens of text read through --tokenizer" $t --token-cache "$dir"
refused "measure-peak peak-gflops" 2 "measure-peak with --peak-gflops" $t --measure-peak --peak-gflops 10
refused "measure-peak eval-only" 2 "measure-peak with --eval-only" --eval-only --init-from "$dir/f.safetensors" --measure-peak
refused "tokenizer data-format" 2 "data-format with --tokenizer" $t --tokenizer "$dir/tok.json" --data "$dir/val.txt" --data-format bytes
refused "force" 2 "force needs --checkpoint" $t --force
refused "force resume" 2 "force with --resume" $t --force --checkpoint "$dir/f.safetensors" --resume "$dir/f.safetensors"
refused "force keep" 2 "force with --keep" $t --force --keep 2 --checkpoint "$dir/g.safetensors"
refused "keep" 2 "keep needs --checkpoint" $t --keep 2
refused "comm-timeout" 2 "comm-timeout -1 is outside \[0, 1e+06\]" $t --comm-timeout -1
refused "stop-after" 2 "stop-after 2 is not before --steps 2" $t --stop-after 2
refused "trace-step" 2 "trace-step needs --trace" $t --trace-step 1
refused "trace trace-step" 2 "trace-step 3 is after the last step" $t --trace "$dir/x.json" --trace-step 3
refused "temperature sample-tokens" 2 "temperature with --sample-tokens 0" $t --sample-tokens 0 --temperature 0.5
refused "top-k sample-tokens" 2 "top-k with --sample-tokens 0" $t --sample-tokens 0 --top-k 5
refused "schedule" 2 "schedule zb-h1 with one stage and one micro-batch" $t --schedule zb-h1
refused "threads dp" 2 "threads 1 with 2 thread ranks" $t --threads 1 --dp 2
refused "chunks" 1 "chunks=2 needs a pipeline" $t --chunks 2 $q
refused "sp" 1 "sequence_parallel=1 needs tensor parallelism (tp=1" $t --sp $q
refused "sp tp seq" 1 "sequence_parallel=1: seq=15 is not a multiple of tp=2" --preset tiny --steps 2 --batch 4 --seq 15 --tp 2 --sp $q
refused "cp seq" 1 "context_parallel=3: seq=16 is not a multiple of 2\*cp=6" --preset tiny --steps 2 --batch 4 --seq 16 --cp 3 $q
refused "chunks schedule" 1 "1f1b runs one chunk per stage" $t --layers 4 --pp 2 --chunks 2 --schedule 1f1b $q
refused "preset resume" 1 "preset mini (GPT-2 (.*), 4 layers, 4 heads, 128 wide, norm eps 1e-05) is not the model of" --preset mini --steps 9 --resume "$dir/f.safetensors"
refused "preset resume" 1 "preset llama-tiny (LLaMA (.*), 2 layers, 4 heads, 64 wide, .*) is not the model of .*(GPT-2 (" \
    --preset llama-tiny --steps 1 --resume "$dir/f.safetensors"
refused "layers init-from" 1 "layers 5: .* has 2 layers" --layers 5 --init-from "$dir/f.safetensors"

# --help shows the program's defaults whatever comes before it
build/train --steps 7 --lr 0.5 --help | grep -q -- '--steps N .*(default 1600)' ||
    no "--steps 7 --help: the usage shows the parsed value as the default"
build/train --lr 0.5 --help | grep -q -- '--lr X .*(default 0.006)' ||
    no "--lr 0.5 --help: the usage shows the parsed value as the default"

# the walk: every option in the table has a case above
for opt in $(build/train --help | sed -n 's/^  --\([a-z0-9-]*\).*/\1/p'); do
    [ "$opt" = help ] && continue
    case "$covered" in
    *" $opt "*) ;;
    *) no "--$opt has no case in tests/options_check.sh: show its effect or refuse it" ;;
    esac
done
exit $bad
