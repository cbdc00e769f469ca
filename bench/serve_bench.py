#!/usr/bin/env python3
"""Load for build/serve (bench/serve.sh starts the servers).

  serve_bench.py prefix PORT    64 requests, a common 256-token prefix (token ids < 256) and a
                                distinct 8-token tail each, 16 new tokens, 8 at a
                                time: requests/s, completion tokens/s, mean and median time to
                                the first token (streamed)
  serve_bench.py decode PORT    8 requests of 8 prompt and 64 new tokens: one at a time, then
                                all 8 at once: completion tokens/s each way
Prints one `key value` a line."""
import http.client
import json
import statistics
import sys
import threading
import time

mode, port = sys.argv[1], int(sys.argv[2])


def stream(body):
    """(seconds to the first event with text, completion tokens)"""
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)))
    r = c.getresponse()
    first, n, buf = None, 0, b""
    while True:
        b = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        if not b:
            break
        buf += b
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev == b"data: [DONE]":
                continue
            d = json.loads(ev[6:])
            if first is None:
                first = time.time() - t0
            if d.get("usage"):
                n = d["usage"]["completion_tokens"]
    c.close()
    return first, n


def pool(bodies, width):
    out = [None] * len(bodies)
    nxt = [0]
    lock = threading.Lock()

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(bodies):
                return
            out[i] = stream(bodies[i])
    t0 = time.time()
    ts = [threading.Thread(target=worker) for _ in range(width)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    return time.time() - t0, out


# token ids (< 256: any vocabulary), so the model needs no tokenizer
prefix = list(("You are a helpful assistant. Answer briefly and exactly; " * 5)[:256].encode())


def ids(s):
    return list(s.encode())



if mode == "prefix":
    stream({"prompt": ids("warm up"), "max_tokens": 2})
    bodies = [{"prompt": prefix + ids("q%06d:" % i), "max_tokens": 16, "temperature": 0, "seed": i}
              for i in range(64)]
    wall, res = pool(bodies, 8)
    ttft = [r[0] for r in res]
    toks = sum(r[1] for r in res)
    print("requests_per_s %.3f" % (64 / wall))
    print("tokens_per_s %.2f" % (toks / wall))
    print("ttft_mean_s %.4f" % statistics.mean(ttft))
    print("ttft_median_s %.4f" % statistics.median(ttft))
else:
    stream({"prompt": ids("warm up"), "max_tokens": 2})
    bodies = [{"prompt": ids("req %03d:" % i), "max_tokens": 64, "temperature": 0.8, "seed": i}
              for i in range(8)]
    wall1, r1 = pool(bodies, 1)
    wall8, r8 = pool(bodies, 8)
    print("one_at_a_time_tokens_per_s %.2f" % (sum(r[1] for r in r1) / wall1))
    print("eight_at_once_tokens_per_s %.2f" % (sum(r[1] for r in r8) / wall8))
