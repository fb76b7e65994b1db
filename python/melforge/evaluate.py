"""Clip-level (file-level) evaluation: the vote of `melforge-train eval` over a clip's examples (the tiles of a view,
any number per clip), and its file-level metrics.

Both run in C++ (kernels/vote and kernels/metrics, the code melforge-train itself runs), so the per-file decisions
and the accuracy / confusion are the ones `melforge-train eval` reports for the same segment probabilities.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from . import _core


@dataclass
class FileEvaluation:
    """Per-file decisions of `evaluate_files` (NumPy arrays, or torch tensors when the inputs were tensors).

    Attributes
    ----------
    file_index : int64 [F]
        The file (clip) each row is about: `arange(F)` for [F, L, S, C] inputs, the sorted distinct `file_index`
        values for per-example inputs.
    class_probs : float32 [F, C]
        Mean vote: the mean class probabilities over the clip's examples (dense form: its valid long segments);
        majority: vote fractions.
    predicted : int64 [F]
        Predicted class per file.
    detection_score : float32 [F] or None
        Mean vote: mean detection probability; majority: fraction of positive examples (long segments). None
        without `det_probs`.
    detected : bool [F] or None
        The detection decision per file; None without `det_probs`.
    predicted_names : list of str or None
        `class_names[predicted]` when class names were given.
    labels : int64 [F] or None
        The label per file when labels were given.
    metrics : dict or None
        With labels: the file-level metrics exactly as the "file" part of `melforge-train eval --out` writes them
        ({"count", "loss": None, "accuracy", "macro_f1", "per_class", "confusion", "detection"}; "detection" only
        with `det_probs` and `positive_class`).
    """

    file_index: object
    class_probs: object
    predicted: object
    detection_score: object = None
    detected: object = None
    predicted_names: Optional[list] = None
    labels: object = None
    metrics: Optional[dict] = None


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _numpy(x, dtype, name: str) -> np.ndarray:
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if dtype is np.int64 and a.size and not np.issubdtype(a.dtype, np.integer):
        raise _core.InvalidArgument(f"evaluate_files: {name} must hold integers, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=dtype)


def _require_finite(a: np.ndarray, name: str) -> None:
    """Raises InvalidArgument naming the first row of `a` (and its index) that holds NaN or an infinity."""
    bad = ~np.isfinite(a)
    if not bad.any():
        return
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    value = a[where]
    kind = "NaN" if np.isnan(value) else ("+inf" if value > 0 else "-inf")
    raise _core.InvalidArgument(f"evaluate_files: {name} holds {kind} at row {where[0]} (index {list(where)}, "
                                f"{int(bad.sum())} non-finite values in all); probabilities must be finite "
                                f"(a diverged model or a bad softmax?)")


def _dense_from_segments(probs, det, file_index, long_index):
    """Per-segment rows (probs [N, C], det [N], file_index [N], long_index [N] or None) as dense
    [F, L, S, C], [F, L, S] arrays, num_valid_long [F] and the sorted distinct files [F]."""
    n, c = probs.shape
    if file_index.shape != (n,):
        raise _core.InvalidArgument(f"evaluate_files: file_index must be [N] = [{n}], got {list(file_index.shape)}")
    files, fpos = np.unique(file_index, return_inverse=True)
    F = len(files)
    if long_index is None:
        counts = np.bincount(fpos, minlength=F)
        L, S = int(counts.max()) if n else 1, 1
        order = np.argsort(fpos, kind="stable")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        slot = np.empty(n, dtype=np.int64)
        slot[order] = np.arange(n) - np.repeat(starts, counts)
        lpos, spos, nvl = slot, np.zeros(n, dtype=np.int64), counts.astype(np.int64)
    else:
        if long_index.shape != (n,) or (n and long_index.min() < 0):
            raise _core.InvalidArgument("evaluate_files: long_index must be [N] of values >= 0")
        L = int(long_index.max()) + 1 if n else 1
        key = fpos * L + long_index
        per_long = np.bincount(key, minlength=F * L).reshape(F, L)
        S = int(per_long.max()) if n else 1
        nvl = (per_long > 0).sum(1).astype(np.int64)
        ok = np.all((per_long == S) | (per_long == 0)) and np.all(per_long[np.arange(L)[None, :] < nvl[:, None]] == S)
        if not ok:
            raise _core.InvalidArgument(
                "evaluate_files: every file needs long segments 0 .. n-1, each with the same number of short "
                f"segments (the most is {S})")
        order = np.argsort(key, kind="stable")
        starts = np.concatenate([[0], np.cumsum(per_long.ravel())[:-1]])
        spos = np.empty(n, dtype=np.int64)
        spos[order] = np.arange(n) - np.repeat(starts, per_long.ravel())
        lpos = long_index
    dense = np.zeros((F, L, S, c), dtype=np.float32)
    dense[fpos, lpos, spos] = probs
    dense_det = np.zeros((F, L, S), dtype=np.float32)
    if det is not None:
        dense_det[fpos, lpos, spos] = det
    return dense, dense_det, nvl, files, fpos


def evaluate_files(class_probs, det_probs=None, num_valid_long=None, labels=None, vote: str = "mean",
                   threshold: float = 0.5, class_names: Optional[Sequence[str]] = None, *, file_index=None,
                   long_index=None, positive_class=None) -> FileEvaluation:
    """The clip-level (file-level) vote and metrics of `melforge-train eval`.

    Two input forms:

    - Per example, as a loop over `melforge.Loader` batches of any view collects them (tiles, crops or whole clips;
      `melforge-train eval` votes over the tiles of every clip): `class_probs` [N, C], `det_probs` [N],
      `file_index` int [N] (the clip of each example), `labels` int [N] (all examples of a clip share it). Rows may
      come in any order (a shuffled Loader). Each example is one unit of the vote: the mean vote averages a clip's
      examples, the majority vote counts their argmax classes (ties by the mean probability) - exactly eval's vote
      over the clip's tiles. Padding is not an example: a padded tile is one example, scored by the model over its
      real frames (the Loader's mask / lengths).
    - Per segment of a schema-1/2 dataset with `long_index` (the long segment of each row): eval's old grouping,
      the S short segments of a long segment averaged first, then the vote over the long segments.
    - Dense: `class_probs` float [F, L, S, C] (softmax probabilities of every short segment of every long segment),
      `det_probs` [F, L, S] (sigmoid of the detection logits), `num_valid_long` int [F] in [1, L] (default L;
      long segments >= it are ignored, as a dataset's padding), `labels` int [F].

    Example, with a model returning (logits [B, C], detection logits [B])::

        probs, dets, files, ys = [], [], [], []
        for x, y, f in melforge.Loader(melforge.Dataset(folder, "test"), batch_size=256, shuffle=False):
            logits, det = model(x)  # with a padded view: model(x, lengths), pooling over real frames
            probs.append(logits.softmax(1)); dets.append(det.sigmoid()); files.append(f); ys.append(y)
        r = melforge.evaluate_files(torch.cat(probs), torch.cat(dets), labels=torch.cat(ys),
                                    file_index=torch.cat(files), class_names=names, positive_class=1)
        print(r.metrics["accuracy"])

    Parameters
    ----------
    class_probs : array or torch.Tensor, float32 [N, C] (per example) or [F, L, S, C] (dense)
    det_probs : array or torch.Tensor, float32 [F, L, S] or [N], optional
        Without it the detection outputs (and metrics["detection"]) are None.
    num_valid_long : int [F], optional (dense form only)
    labels : int [N] (per example) or [F] (dense), optional
        With labels, `metrics` holds eval's file-level report.
    vote : {"mean", "majority"}
        As `melforge-train eval --vote` (see FileEvaluation).
    threshold : float
        Detection probability at or above which a segment is positive, in (0, 1).
    class_names : sequence of str, optional
        Names of the C classes (metrics' per-class keys, `predicted_names`).
    file_index : int [N], optional (per-example form): the clip of each example.
    long_index : int [N], optional: with file_index, schema-1/2 rows grouped by long segment as eval did.
    positive_class : int or str, optional
        The detection head's class (index or name) for metrics["detection"], as the checkpoint's positive class.

    Returns
    -------
    FileEvaluation
        NumPy arrays, or torch tensors (on the CPU) when `class_probs` is a tensor.
    """
    as_torch = _is_torch(class_probs)
    if not (0 < threshold < 1):
        raise _core.InvalidArgument(f"evaluate_files: threshold must be in (0, 1), got {threshold}")
    probs = _numpy(class_probs, np.float32, "class_probs")
    det = None if det_probs is None else _numpy(det_probs, np.float32, "det_probs")
    _require_finite(probs, "class_probs")
    if det is not None:
        _require_finite(det, "det_probs")
    if file_index is not None:
        if probs.ndim != 2:
            raise _core.InvalidArgument(f"evaluate_files: with file_index, class_probs must be [N, C], got "
                                        f"{list(probs.shape)}")
        if num_valid_long is not None:
            raise _core.InvalidArgument("evaluate_files: num_valid_long is for the dense form; per segment it "
                                        "follows from file_index / long_index")
        if det is not None and det.shape != probs.shape[:1]:
            raise _core.InvalidArgument(f"evaluate_files: det_probs must be [N] = [{probs.shape[0]}]")
        fi = _numpy(file_index, np.int64, "file_index")
        li = None if long_index is None else _numpy(long_index, np.int64, "long_index")
        if li is None:
            if fi.shape != probs.shape[:1]:
                raise _core.InvalidArgument(f"evaluate_files: file_index must be [N] = [{probs.shape[0]}], got "
                                            f"{list(fi.shape)}")
            files, fpos = np.unique(fi, return_inverse=True)
            fpos = np.ascontiguousarray(fpos.reshape(-1), dtype=np.int64)
            clip_det = det if det is not None else np.zeros(0, dtype=np.float32)
            voted = _core.vote_clips(probs, clip_det, fpos, len(files), vote, float(threshold))
        else:
            dense, dense_det, nvl, files, fpos = _dense_from_segments(probs, det, fi, li)
        file_labels = None
        if labels is not None:
            y = _numpy(labels, np.int64, "labels")
            if y.shape != fi.shape:
                raise _core.InvalidArgument(f"evaluate_files: labels must be [N] = [{len(fi)}] per segment")
            file_labels = np.full(len(files), -1, dtype=np.int64)
            file_labels[fpos] = y
            if np.any(file_labels[fpos] != y):
                raise _core.InvalidArgument("evaluate_files: the segments of a file have different labels")
    else:
        if probs.ndim != 4:
            raise _core.InvalidArgument(f"evaluate_files: class_probs must be [F, L, S, C] (or [N, C] with "
                                        f"file_index), got {list(probs.shape)}")
        if long_index is not None:
            raise _core.InvalidArgument("evaluate_files: long_index needs file_index")
        dense = probs
        F, L = probs.shape[:2]
        dense_det = det if det is not None else np.zeros(probs.shape[:3], dtype=np.float32)
        nvl = (np.full(F, L, dtype=np.int64) if num_valid_long is None
               else _numpy(num_valid_long, np.int64, "num_valid_long"))
        files = np.arange(F, dtype=np.int64)
        file_labels = None if labels is None else _numpy(labels, np.int64, "labels")
        if file_labels is not None and file_labels.shape != (F,):
            raise _core.InvalidArgument(f"evaluate_files: labels must be [F] = [{F}]")
    if file_index is None or long_index is not None:
        voted = _core.vote_files(dense, dense_det, nvl, vote, float(threshold))
    cp, pred, score, detected = voted
    C = probs.shape[-1]
    names = None if class_names is None else [str(n) for n in class_names]
    if names is not None and len(names) != C:
        raise _core.InvalidArgument(f"evaluate_files: {len(names)} class names for {C} classes")
    pos = positive_class
    if isinstance(pos, str):
        if names is None or pos not in names:
            raise _core.InvalidArgument(f"evaluate_files: positive class '{pos}' is not one of the class names")
        pos = names.index(pos)
    result = FileEvaluation(file_index=files, class_probs=cp, predicted=pred,
                            detection_score=None if det is None else score,
                            detected=None if det is None else detected.astype(bool),
                            predicted_names=None if names is None else [names[p] for p in pred],
                            labels=file_labels)
    if file_labels is not None:
        m = json.loads(_core.file_metrics_json(file_labels, pred, detected, C, -1 if pos is None else int(pos),
                                               names or []))
        if det is None or pos is None:
            m["detection"] = None
        result.metrics = m
    if as_torch:
        import torch

        for field in ("file_index", "class_probs", "predicted", "detection_score", "detected", "labels"):
            v = getattr(result, field)
            if v is not None:
                setattr(result, field, torch.from_numpy(np.ascontiguousarray(v)))
    return result
