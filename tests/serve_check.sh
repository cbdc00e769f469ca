#!/bin/sh
# build/serve: a tiny byte-level model trained here (block_size 512), served twice (KV reuse on
# and off), driven by raw sockets and http.client (tests/serve_check.py), then by the official
# openai npm client (tests/serve_openai.js; `sh tests/serve_check.sh openai`: node, npm and the
# registry are needed, else SKIP, exit 77).
# `sh tests/serve_check.sh eval`: build/eval on a task built from the model's own greedy
# continuations (build/sample --temperature 0), each against unlikely endings; duplicated endings
# must score exactly alike (the context's partial block copied, endings batched); bad lines.
# `sh tests/serve_check.sh hf`: a Hugging Face LLaMA directory (scripts/hf_llama.py --from a
# LLaMA fixture: rotary positions, one key/value head) served: the same prompt twice gives the
# same tokens, the second time with its full block from the cache.
#   sh tests/serve_check.sh [py|openai|eval|hf]
set -u
serve_model=
what=${1:-py}
tmp=$(mktemp -d)
pids=""
trap 'for p in $pids; do kill "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
if [ "$what" = openai ]; then
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
        { echo "SKIP: needs node and npm (scripts/deps.sh test installs them)"; exit 77; }
    sh scripts/serve_ref.sh >"$tmp/npm.log" 2>&1 ||
        { cat "$tmp/npm.log"; echo "SKIP: npm install openai failed (no registry?)"; exit 77; }
fi
if [ "$what" = hf ]; then
    python3 scripts/hf_llama.py --from tests/fixtures/llama/llama_mqa_tied.safetensors \
        --out "$tmp/hf" >"$tmp/hf.log" 2>&1 || { cat "$tmp/hf.log"; exit 1; }
fi
[ "$what" = hf ] || build/train --layers 2 --heads 2 --embd 64 --block-size 512 --seq 64 --batch 4 --steps 30 \
    --checkpoint "$tmp/m.safetensors" --force >"$tmp/train.log" 2>&1 ||
    { cat "$tmp/train.log"; echo "training the model failed"; exit 1; }
if [ "$what" = eval ]; then
    : >"$tmp/task.jsonl"
    for ctx in "the cat sat on the mat. the dog sat on the" "a" "the quick brown fox jumps over the"; do
        cont=$(build/sample "$tmp/m.safetensors" --prompt "$ctx " --temperature 0 --tokens 5 \
            2>/dev/null | tail -n 1 | cut -c $((${#ctx} + 2))- | tr -d '"\\?')
        [ -n "$cont" ] || { echo "no greedy continuation of '$ctx'"; exit 1; }
        printf '{"ctx": "%s", "endings": ["~~~~~", "%s", "QQ}}{"], "label": 1}\n' "$ctx" "$cont" \
            >>"$tmp/task.jsonl"
    done
    printf '{"ctx": "%s", "endings": ["same end", "same end"], "label": 0}\n' \
        "a context of forty-one bytes, 3 blocks: " >>"$tmp/task.jsonl"
    cat "$tmp/task.jsonl"
    build/eval "$tmp/m.safetensors" --task "$tmp/task.jsonl" --verbose >"$tmp/eval.out" || exit 1
    cat "$tmp/eval.out"
    grep -q '^4 questions: acc 1.0000 (4), acc_norm 1.0000 (4)$' "$tmp/eval.out" || exit 1
    printf '{"ctx": "same", "endings": ["same end", "same end"], "label": 1}\n' >"$tmp/tie.jsonl"
    build/eval "$tmp/m.safetensors" --task "$tmp/tie.jsonl" | grep -q 'acc 0.0000 (0)' ||
        { echo "a tie must go to the first ending"; exit 1; }
    printf '{"ctx": "x", "endings": ["a"], "label": 3}\n' >"$tmp/bad.jsonl"
    build/eval "$tmp/m.safetensors" --task "$tmp/bad.jsonl" 2>"$tmp/bad.err" && exit 1
    grep -q 'line 1: expected' "$tmp/bad.err" || { cat "$tmp/bad.err"; exit 1; }
    exit 0
fi
# start NAME ARGS...: a server on a free port; its port into $port
start() {
    name=$1
    shift
    ${SERVE:-build/serve} "${serve_model:-$tmp/m.safetensors}" --port 0 --timeout 2 "$@" 2>"$tmp/$name.log" &
    pids="$pids $!"
    pid=$!
    i=0
    while ! grep -q 'listening on' "$tmp/$name.log"; do
        i=$((i + 1))
        if [ $i -gt 600 ] || ! kill -0 "$pid" 2>/dev/null; then
            cat "$tmp/$name.log"
            echo "serve did not start"
            exit 1
        fi
        sleep 0.1
    done
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/$name.log")
}
if [ "$what" = hf ]; then
    serve_model=$tmp/hf
    start hf --kv-cache-mb 1
    python3 - "$port" <<'EOF'
import http.client, json, sys
def post(body):
    c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=60)
    c.request("POST", "/v1/completions", json.dumps(body))
    r = c.getresponse()
    return r.status, json.loads(r.read())
body = {"prompt": list(range(1, 19)), "max_tokens": 3, "seed": 1}
(s1, a), (s2, b) = post(body), post(body)
print(a, b, sep="\n")
ok = s1 == s2 == 200 and a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
ok = ok and len(a["choices"][0]["token_ids"]) == 3
ok = ok and [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (a, b)] == [0, 16]
s3, c = post({"prompt": list(range(1, 23)), "max_tokens": 3})
print(c)
sys.exit(0 if ok and s3 == 400 and "maximum context length is 24" in c["error"]["message"] else 1)
EOF
    exit $?
fi
start on --kv-reuse on --kv-cache-mb 8
port_on=$port pid_on=$pid
if [ "$what" = openai ]; then
    NODE_PATH=build/npm/node_modules node tests/serve_openai.js "$port_on"
    exit $?
fi
start off --kv-reuse off --kv-cache-mb 8
port_off=$port
python3 tests/serve_check.py "$port_on" "$port_off" "$pid_on"
rc=$?
kill -0 "$pid_on" || { echo "the server died"; cat "$tmp/on.log"; exit 1; }
exit $rc
