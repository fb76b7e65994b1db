#!/usr/bin/env python3
"""Writes tests/data/multilabel/cases.json: multi-label scores, targets and the metrics scikit-learn gives for them.

tests/test_multilabel_metrics.cpp compares kernels/metrics/multilabel.{h,cpp} with these values (1e-9). Run with a
Python that has numpy and scikit-learn (the test venv: build/python-venv/bin/python, made by tools/setup_python.sh):

    build/python-venv/bin/python tools/gen_multilabel_fixtures.py [--out tests/data/multilabel]

Conventions of melforge (kernels/metrics/multilabel.h) applied on top of sklearn's per-class values:
- AP of a class without a positive, ROC-AUC of a class without a positive or a negative: null, left out of the
  macro averages (sklearn returns AP 0 with a warning and raises for AUC).
- F1: sklearn's f1_score(zero_division=0), "score >= threshold" predicts positive.
- tuned threshold: the distinct score s maximising micro F1 of "score >= s" (the largest s on a tie), found here by
  brute force over every distinct score with sklearn's f1_score.
"""
import argparse
import json
import os
import warnings

import numpy as np
from sklearn.metrics import average_precision_score, f1_score, roc_auc_score


def none_if_nan(v):
    return None if v is None or not np.isfinite(v) else float(v)


def per_class(scores, targets):
    ap, auc = [], []
    for c in range(targets.shape[1]):
        y, s = targets[:, c], scores[:, c]
        ap.append(float(average_precision_score(y, s)) if y.sum() > 0 else None)
        auc.append(float(roc_auc_score(y, s)) if 0 < y.sum() < len(y) else None)
    return ap, auc


def mean_defined(v):
    d = [x for x in v if x is not None]
    return float(np.mean(d)) if d else None


def f1s(scores, targets, threshold):
    pred = (scores >= threshold).astype(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "threshold": float(threshold),
            "micro": float(f1_score(targets, pred, average="micro", zero_division=0)),
            "macro": float(f1_score(targets, pred, average="macro", zero_division=0)),
            "per_class": [float(x) for x in f1_score(targets, pred, average=None, zero_division=0)],
        }


def tuned(scores, targets):
    best, best_t = -1.0, 0.5
    for t in sorted(set(scores.ravel().tolist()), reverse=True):
        f = f1s(scores, targets, t)["micro"]
        if f > best:
            best, best_t = f, t
    return best_t


def case(name, scores, targets, threshold=0.5):
    scores = np.asarray(scores, dtype=np.float64)
    targets = np.asarray(targets, dtype=np.uint8)
    ap, auc = per_class(scores, targets)
    t = tuned(scores, targets)
    return {
        "name": name,
        "files": int(scores.shape[0]),
        "classes": int(scores.shape[1]),
        "scores": scores.ravel().tolist(),
        "targets": targets.ravel().astype(int).tolist(),
        "threshold": threshold,
        "expected": {
            "ap": ap,
            "auc": auc,
            "map_macro": mean_defined(ap),
            "map_micro": float(average_precision_score(targets.ravel(), scores.ravel())),
            "auc_macro": mean_defined(auc),
            "f1": f1s(scores, targets, threshold),
            "tuned_threshold": t,
            "f1_tuned": f1s(scores, targets, t),
        },
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "data", "multilabel"))
    args = ap.parse_args()
    rng = np.random.default_rng(17)
    cases = []
    # Hand-made: ties within a class, a class without a positive, a class with only positives.
    cases.append(case("hand-made with ties, no-positive and all-positive classes",
                      [[0.9, 0.5, 0.1, 0.7], [0.5, 0.5, 0.2, 0.7], [0.5, 0.2, 0.3, 0.1], [0.1, 0.8, 0.3, 0.6],
                       [0.7, 0.5, 0.0, 0.7]],
                      [[1, 0, 0, 1], [0, 1, 0, 1], [1, 0, 0, 1], [0, 1, 0, 1], [0, 1, 0, 1]]))
    # Random, continuous scores.
    s = rng.random((40, 6))
    t = (rng.random((40, 6)) < np.array([0.1, 0.3, 0.5, 0.7, 0.2, 0.05])).astype(np.uint8)
    t[:, 5] = 0
    cases.append(case("random 40 x 6, class 5 without positives", s, t, 0.4))
    # Random, coarsely quantised scores (many ties), informative.
    t = (rng.random((60, 5)) < 0.3).astype(np.uint8)
    s = np.round(np.clip(0.35 * t + 0.65 * rng.random((60, 5)), 0, 1) * 8) / 8
    t[:, 4] = 1
    cases.append(case("quantised 60 x 5 (ties), class 4 all positive", s, t, 0.5))
    # One file, one class per file present.
    cases.append(case("identity 3 x 3", np.eye(3) * 0.8 + 0.1, np.eye(3), 0.5))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cases.json")
    with open(path, "w") as f:
        json.dump({"generator": "tools/gen_multilabel_fixtures.py", "cases": cases}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
