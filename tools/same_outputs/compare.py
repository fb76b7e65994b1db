#!/usr/bin/env python3
"""Compares two make_outputs.sh output folders (run with the torch venv's python: ~/.cache/melforge/torch-*/bin/python): HDF5 datasets byte-for-byte (and by dataset values), checkpoints
tensor-by-tensor (bitwise), JSON/JSONL/CSV with timing/throughput fields removed. Prints a line per file; exit 1 on
any difference."""
import json, os, sys, re, torch
a, b = sys.argv[1], sys.argv[2]
TIMING = re.compile(r"(_s$|_ms$|seconds|per_s|fraction|time|elapsed|started|finished|date|host|pid|wall|timings|stages|throughput|rss|ram_peak|duration)")
bad = 0
def norm(s):
    for p in sorted([os.path.abspath(a), os.path.abspath(b)], key=len, reverse=True):
        s = s.replace(p, "<OUT>")
    return s
def strip(o):
    if isinstance(o, str):
        return norm(o)
    if isinstance(o, dict):
        return {k: strip(v) for k, v in o.items() if not TIMING.search(k)}
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o
def cmp_tensors(x, y, path=""):
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and set(x) == set(y) and all(cmp_tensors(x[k], y[k], path + '/' + str(k)) for k in x)
    if isinstance(x, (list, tuple)):
        return len(x) == len(y) and all(cmp_tensors(p, q) for p, q in zip(x, y))
    if isinstance(x, str) and isinstance(y, str):
        return norm(x) == norm(y)
    if x != y: print("   differs:", path, repr(x)[:200], repr(y)[:200])
    return x == y
for root, _, files in os.walk(a):
    for f in sorted(files):
        pa = os.path.join(root, f); rel = os.path.relpath(pa, a); pb = os.path.join(b, rel)
        if not os.path.exists(pb):
            print("MISSING", rel); bad += 1; continue
        if f == "timings.json":
            continue
        if f.endswith(".h5"):
            same = open(pa, "rb").read() == open(pb, "rb").read()
            print("h5 bytes", "same" if same else "DIFFER", rel); bad += not same
        elif f.endswith(".pt"):
            x = torch.load(pa, weights_only=False); y = torch.load(pb, weights_only=False)
            if isinstance(x, dict):
                x = {k: v for k, v in x.items() if not TIMING.search(k)}; y = {k: v for k, v in y.items() if not TIMING.search(k)}
            same = cmp_tensors(x, y)
            print("checkpoint tensors", "same" if same else "DIFFER", rel); bad += not same
        elif f.endswith(".jsonl"):
            la = [strip(json.loads(l)) for l in open(pa)]; lb = [strip(json.loads(l)) for l in open(pb)]
            same = la == lb; print("jsonl minus timings", "same" if same else "DIFFER", rel); bad += not same
        elif f.endswith(".json"):
            ja, jb = strip(json.load(open(pa))), strip(json.load(open(pb)))
            same = ja == jb
            if not same:
                for k in ja:
                    if ja.get(k) != jb.get(k): print("   key", k, str(ja.get(k))[:150], "|", str(jb.get(k))[:150])
            print("json minus timings", "same" if same else "DIFFER", rel); bad += not same
        else:
            same = open(pa, "rb").read() == open(pb, "rb").read()
            print("bytes", "same" if same else "DIFFER", rel); bad += not same
print("differences:", bad); sys.exit(1 if bad else 0)
