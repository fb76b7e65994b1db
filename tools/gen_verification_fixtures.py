#!/usr/bin/env python3
"""Writes tests/data/verification/cases.json: verification scores, target flags, and the DET curve, EER and minDCF
that scikit-learn's roc_curve gives for them.

tests/test_verification.cpp compares kernels/verification/verification.h with these values (1e-6). Run with a Python
that has numpy and scikit-learn (the test venv: build/python-venv/bin/python, made by tools/setup_python.sh):

    build/python-venv/bin/python tools/gen_verification_fixtures.py [--out tests/data/verification]

Definitions (those of kernels/verification/verification.h), computed from
sklearn.metrics.roc_curve(targets, scores, drop_intermediate=False), whose points are one per distinct score in
descending order after a first point at threshold +inf (written as null):
- DET points: p_fa = fpr, p_miss = 1 - tpr.
- EER: at the first point k with p_fa >= p_miss, d = p_miss - p_fa; d_k = 0 gives p_fa[k], otherwise the segment
  from k - 1 to k is interpolated linearly where d crosses 0. eer_threshold = thresholds[k].
- minDCF(p): min over the points of p * p_miss + (1 - p) * p_fa (C_miss = C_fa = 1), divided by min(p, 1 - p); its
  threshold is that of the first point reaching the minimum.
Scores are float32 values (the C++ functions take float), stored as the doubles that represent them exactly.
"""
import argparse
import json
import os

import numpy as np
from sklearn.metrics import roc_curve


def finite_or_none(v):
    return float(v) if np.isfinite(v) else None


def eer(p_fa, p_miss, thresholds):
    d = p_miss - p_fa
    k = int(np.argmax(d <= 0))
    assert k > 0 and d[k] <= 0
    if d[k] == 0:
        return float(p_fa[k]), thresholds[k]
    t = d[k - 1] / (d[k - 1] - d[k])
    return float(p_fa[k - 1] + t * (p_fa[k] - p_fa[k - 1])), thresholds[k]


def min_dcf(p_fa, p_miss, thresholds, p):
    cost = p * p_miss + (1 - p) * p_fa
    k = int(np.argmin(cost))
    return float(cost[k] / min(p, 1 - p)), thresholds[k]


def case(name, scores, targets):
    scores = np.asarray(scores, dtype=np.float32).astype(np.float64)
    targets = np.asarray(targets, dtype=np.uint8)
    fpr, tpr, thresholds = roc_curve(targets, scores, drop_intermediate=False)
    thresholds = thresholds.astype(np.float64)
    thresholds[0] = np.inf
    p_fa, p_miss = fpr, 1 - tpr
    e, e_t = eer(p_fa, p_miss, thresholds)
    d01, d01_t = min_dcf(p_fa, p_miss, thresholds, 0.01)
    d05, d05_t = min_dcf(p_fa, p_miss, thresholds, 0.05)
    return {
        "name": name,
        "scores": scores.tolist(),
        "targets": targets.astype(int).tolist(),
        "expected": {
            "eer": e,
            "eer_threshold": finite_or_none(e_t),
            "min_dcf_01": d01,
            "min_dcf_01_threshold": finite_or_none(d01_t),
            "min_dcf_05": d05,
            "min_dcf_05_threshold": finite_or_none(d05_t),
            "det": {
                "threshold": [finite_or_none(t) for t in thresholds],
                "p_fa": p_fa.tolist(),
                "p_miss": p_miss.tolist(),
            },
        },
    }


def gaussian(rng, n_target, n_nontarget, separation):
    s = np.concatenate([rng.normal(separation, 1, n_target), rng.normal(0, 1, n_nontarget)])
    t = np.concatenate([np.ones(n_target), np.zeros(n_nontarget)])
    order = rng.permutation(len(s))
    return s[order], t[order]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "verification"))
    args = ap.parse_args()
    rng = np.random.default_rng(19)
    cases = []
    for seed, (nt, nn, sep) in enumerate([(50, 50, 1.5), (37, 211, 2.0), (150, 150, 0.5), (120, 80, 3.0)]):
        s, t = gaussian(np.random.default_rng(seed), nt, nn, sep)
        cases.append(case(f"gaussian {nt} targets, {nn} non-targets, separation {sep} (seed {seed})", s, t))
    s, t = gaussian(rng, 150, 250, 1.0)
    cases.append(case("quantised to 0.25 (many ties)", np.round(s * 4) / 4, t))
    s, t = gaussian(rng, 40, 40, 1.0)
    cases.append(case("quantised to 1 (few distinct scores)", np.round(s), t))
    cases.append(case("perfectly separable", [0.9, 0.8, 0.75, 0.3, 0.2, 0.1, 0.05], [1, 1, 1, 0, 0, 0, 0]))
    cases.append(case("perfectly wrong", [0.1, 0.2, 0.3, 0.7, 0.8], [1, 1, 0, 0, 0]))
    cases.append(case("all scores equal", [0.5] * 6, [1, 0, 1, 0, 0, 1]))
    cases.append(case("one target, one non-target", [0.2, 0.7], [1, 0]))
    cases.append(case("tie across the crossing", [0.9, 0.5, 0.5, 0.5, 0.1, 0.6], [1, 1, 0, 1, 0, 0]))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cases.json")
    with open(path, "w") as f:
        json.dump({"generator": "tools/gen_verification_fixtures.py", "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
