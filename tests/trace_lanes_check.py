"""A measured step's trace with data parallelism (train --dp 2 --zero 1 --trace):
every rank has a communication lane (thread ntracks + rank, named "rank R comm")
holding its buckets' dp reductions and parameter gathers; with overlap on some
reduction starts before that rank's backward ends (started as backward finishes
its layer), with overlap off none does.   python3 trace_lanes_check.py ON.json OFF.json"""
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
        b_end = max(e["ts"] + e["dur"] for e in ev if e["tid"] == rank and e["cat"] == "backward")
        red = [e for e in ev if e["tid"] == comm and e["cat"] == "dp reduction"]
        gat = [e for e in ev if e["tid"] == comm and e["cat"] == "parameter gather"]
        assert red and gat, (path, rank, len(red), len(gat))
        assert all(e["dur"] >= 0 and e["args"]["bucket"] >= 0 for e in red + gat), path
        out[rank] = sum(e["ts"] < b_end for e in red)
    return out


on, off = lanes(sys.argv[1]), lanes(sys.argv[2])
assert all(on[r] > 0 for r in on), ("overlap on: no reduction started inside backward", on)
assert all(off[r] == 0 for r in off), ("overlap off: a reduction inside backward", off)
print("ok: reductions started inside backward with overlap", on, "and none without")
