"""A measured step's trace with data parallelism (train --dp 2 --zero 1 --trace):
every rank has a communication lane (thread ntracks + rank, named "rank R comm")
holding its buckets' dp reductions and parameter gathers; with overlap on some
reduction starts inside that rank's last backward (started as backward finishes
its layer), with overlap off every one starts after it.   python3
trace_lanes_check.py ON.json OFF.json

Order, not time: a transfer's "started_in" is the ordinal of the rank's action
begun last when it started, an action's "index" its own ordinal (ptrain.h,
pt_trace_event.at). Timestamps are measured: a reduction started right after
backward can share backward's end to the clock's resolution, so comparing them
would make the check depend on the load."""
import json
import sys


def lanes(path):
    d = json.load(open(path))
    names = {e["tid"]: e["args"]["name"] for e in d["traceEvents"] if e.get("name") == "thread_name"}
    ev = [e for e in d["traceEvents"] if e["ph"] == "X"]
    out = {}
    for rank in (0, 1):
        comm = 2 + rank
        assert names.get(comm) == "rank %d comm" % rank, (path, names)
        acts = [e for e in ev if e["tid"] == rank]
        assert sorted(e["args"]["index"] for e in acts) == list(range(len(acts))), (path, rank)
        last_b = max(e["args"]["index"] for e in acts if e["cat"] == "backward")
        red = [e for e in ev if e["tid"] == comm and e["cat"] == "dp reduction"]
        gat = [e for e in ev if e["tid"] == comm and e["cat"] == "parameter gather"]
        assert red and gat, (path, rank, len(red), len(gat))
        assert all(e["dur"] >= 0 and e["args"]["bucket"] >= 0 for e in red + gat), path
        assert all(-1 <= e["args"]["started_in"] < len(acts) for e in red + gat), path
        # reductions: [started inside the last backward, after it, in all]
        out[rank] = [sum(e["args"]["started_in"] == last_b for e in red),
                     sum(e["args"]["started_in"] > last_b for e in red), len(red)]
    return out


on, off = lanes(sys.argv[1]), lanes(sys.argv[2])
assert all(on[r][0] > 0 for r in on), ("overlap on: no reduction started inside the last backward", on)
assert all(off[r][1] == off[r][2] for r in off), ("overlap off: a reduction started before backward ended", off)
print("ok: reductions [inside the last backward, after it, in all] with overlap", on, "and without", off)
