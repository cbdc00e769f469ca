#!/usr/bin/env python3
"""build/serve against raw sockets and http.client (tests/serve_check.sh starts the servers).

  serve_check.py PORT_ON PORT_OFF PID_ON

PORT_ON serves with --kv-reuse on, PORT_OFF the same model with --kv-reuse off; both with
--timeout 2 and --max-batch 8; PID_ON is the reuse-on server's process (its memory is read from
/proc). Checks: completions, streams, stop strings; outputs with reuse equal those without, and
a request's tokens equal alone and among 7 concurrent others; cached_tokens on a repeated
prefix; hostile clients (malformed JSON, wrong types, missing prompt, too long a prompt,
max_tokens 1e9, a body over the limit, a slow client, 500 connections, a client leaving
mid-stream), each a 4xx or dropped at the timeout, with /health answering after each."""
import http.client
import json
import socket
import sys
import threading
import time

PORT_ON, PORT_OFF, PID = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    else:
        print("ok:", what, flush=True)


def post(port, body, raw=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    c.request("POST", "/v1/completions", data, {"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read()
    c.close()
    return r.status, (text if raw else json.loads(text))


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    out = r.status, json.loads(r.read())
    c.close()
    return out


def healthy(what):
    st, h = get(PORT_ON, "/health")
    check(st == 200 and h["status"] == "ok", "/health answers after " + what)


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def basics():
    st, m = get(PORT_ON, "/v1/models")
    check(st == 200 and m["object"] == "list" and m["data"][0]["context_length"] == 512, "/v1/models")
    st, r = post(PORT_ON, {"prompt": "the cat ", "max_tokens": 12, "seed": 1})
    check(st == 200 and r["usage"]["completion_tokens"] == 12 and r["choices"][0]["finish_reason"] == "length"
          and len(r["choices"][0]["text"]) == 12, "a completion: 12 tokens, 12 bytes of text")
    st2, r2 = post(PORT_ON, {"prompt": "the cat ", "max_tokens": 12, "seed": 1})
    check(r2["choices"][0]["token_ids"] == r["choices"][0]["token_ids"], "same seed, same tokens")
    st, r3 = post(PORT_ON, {"prompt": list(b"the cat "), "max_tokens": 12, "seed": 1})
    check(r3["choices"][0]["token_ids"] == r["choices"][0]["token_ids"], "a prompt as token ids")
    st, g = post(PORT_ON, {"prompt": "the cat ", "max_tokens": 40, "temperature": 0})
    text = g["choices"][0]["text"]
    stop = text[5:7]
    st, s = post(PORT_ON, {"prompt": "the cat ", "max_tokens": 40, "temperature": 0, "stop": [stop]})
    check(s["choices"][0]["finish_reason"] == "stop" and s["choices"][0]["text"] == text[:text.index(stop)],
          "stop: the text ends before the stop string (%r in %r)" % (stop, text))
    st, z = post(PORT_ON, {"prompt": "x", "max_tokens": 0})
    check(st == 200 and z["choices"][0]["text"] == "" and z["usage"]["completion_tokens"] == 0, "max_tokens 0")


def stream_text(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)))
    r = c.getresponse()
    events = [e for e in r.read().decode().split("\n\n") if e]
    c.close()
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    return r.status, events, chunks


def streams():
    body = {"prompt": "the dog ", "max_tokens": 30, "seed": 5}
    st, events, chunks = stream_text(PORT_ON, body)
    _, whole = post(PORT_ON, body)
    joined = "".join(c["choices"][0]["text"] for c in chunks)
    check(st == 200 and events[-1] == "data: [DONE]" and len(chunks) > 1, "a stream: events, then [DONE]")
    check(joined == whole["choices"][0]["text"], "a stream's text is the completion's")
    check(chunks[-1]["choices"][0]["finish_reason"] == "length", "the last event has the finish reason")


def reuse_and_batching():
    prefix = "the quick brown fox jumps over the lazy dog; " * 3  # 135 bytes: 8 full blocks
    asks = [{"prompt": prefix + tail, "max_tokens": 20, "seed": 7 + i, "temperature": 0.9}
            for i, tail in enumerate(["and then", "or else", "but why", "a cat"])]
    on = [post(PORT_ON, a)[1] for a in asks]
    off = [post(PORT_OFF, a)[1] for a in asks]
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in on]
    check(all(c >= 128 for c in cached[1:]), "cached_tokens on a repeated prefix: %s" % cached)
    check(all(r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for r in off),
          "--kv-reuse off caches nothing")
    check([r["choices"][0]["token_ids"] for r in on] == [r["choices"][0]["token_ids"] for r in off],
          "outputs with reuse equal outputs without")
    alone = post(PORT_OFF, asks[0])[1]["choices"][0]["token_ids"]
    results = [None] * 8

    def run(i):
        results[i] = post(PORT_OFF, dict(asks[i % 4], seed=7 if i == 0 else 100 + i, max_tokens=20 + i))[1]
    ts = [threading.Thread(target=run, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    check(results[0]["choices"][0]["token_ids"] == alone,
          "a request's tokens alone equal its tokens among 7 concurrent others")


def raw(data, read=True, timeout=10):
    s = socket.create_connection(("127.0.0.1", PORT_ON), timeout=timeout)
    s.sendall(data)
    out = b""
    if read:
        try:
            while True:
                b = s.recv(65536)
                if not b:
                    break
                out += b
        except socket.timeout:
            out += b"<timeout>"
    s.close()
    return out


def req(body, extra=b""):
    b = body if isinstance(body, bytes) else body.encode()
    return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n%s\r\n"
            % (len(b), extra)) + b


def status(out):
    try:
        return int(out.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0


def hostile():
    cases = [
        ("malformed JSON", '{"prompt": "a", "max_tokens": 3', 400, None),
        ("not an object", '[1, 2]', 400, None),
        ("wrong type: max_tokens a string", '{"prompt": "a", "max_tokens": "3"}', 400, "max_tokens"),
        ("wrong type: prompt a number", '{"prompt": 5}', 400, "prompt"),
        ("wrong type: stream a string", '{"prompt": "a", "stream": "yes"}', 400, "stream"),
        ("temperature out of range", '{"prompt": "a", "temperature": 7}', 400, "temperature"),
        ("token id out of the vocabulary", '{"prompt": [1, 256]}', 400, "prompt"),
        ("missing prompt", '{"max_tokens": 3}', 400, "prompt"),
        ("empty prompt", '{"prompt": ""}', 400, "prompt"),
        ("prompt longer than the context", json.dumps({"prompt": "a" * 600}), 400, "prompt"),
        ("max_tokens 1e9", '{"prompt": "a", "max_tokens": 1000000000}', 400, "prompt"),
        ("max_tokens 1e300", '{"prompt": "a", "max_tokens": 1e300}', 400, "max_tokens"),
        ("invalid UTF-16 escape", '{"prompt": "\\ud800"}', 400, "prompt"),
    ]
    for name, body, code, param in cases:
        out = raw(req(body))
        st = status(out)
        err = json.loads(out.split(b"\r\n\r\n", 1)[1]) if b"\r\n\r\n" in out else {}
        ok = st == code and "error" in err and "message" in err["error"]
        if param:
            ok = ok and err["error"]["param"] == param
        check(ok, "%s: %d with an error object (got %d %s)" % (name, code, st, out[-160:]))
    check(status(raw(req("x" * (1 << 20 | 5)))) == 413, "a body over the limit: 413")
    check(status(raw(b"GET /nowhere HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 404, "unknown path: 404")
    check(status(raw(b"DELETE /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 405,
          "wrong method: 405")
    healthy("the bad requests")
    t0 = time.time()  # a slow client: headers promise a body that never comes
    out = raw(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro", timeout=20)
    check(time.time() - t0 < 15 and b"<timeout>" not in out, "a slow client is dropped at --timeout")
    healthy("a slow client")


def crowd():
    base = rss_kb(PID)
    socks = []
    for _ in range(500):
        s = socket.create_connection(("127.0.0.1", PORT_ON), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
        socks.append(s)
    time.sleep(0.5)
    peak = rss_kb(PID)
    healthy("500 connections held open")
    for s in socks:
        s.close()
    print("rss: %d kB before, %d kB with 500 connections" % (base, peak))
    check(peak - base < 200 * 1024, "500 connections cost under 200 MiB (%d kB)" % (peak - base))
    # a client that leaves mid-stream
    s = socket.create_connection(("127.0.0.1", PORT_ON), timeout=10)
    s.sendall(req(json.dumps({"prompt": "a", "max_tokens": 400, "stream": True})))
    first = s.recv(200)
    s.close()
    check(status(first) == 200, "a stream starts")
    time.sleep(0.5)
    healthy("a client left mid-stream")
    deadline = time.time() + 30
    while time.time() < deadline and get(PORT_ON, "/health")[1]["running"]:
        time.sleep(0.2)
    check(get(PORT_ON, "/health")[1]["running"] == 0, "the abandoned stream's request is dropped")


basics()
streams()
reuse_and_batching()
hostile()
crowd()
healthy("everything")
print("%d failed" % len(failures))
sys.exit(1 if failures else 0)
