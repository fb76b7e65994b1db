"""`melforge.predict`: `melforge-train predict` from Python, with the model in PyTorch.

Input listing (kernels/inputs: FolderWalk), featurization (kernels/featurize: decode, resample, segment, log-mel,
float16 rounding as the dataset stores it) and the file-level vote (kernels/vote) are the C++ code the binary runs;
the model is `melforge.models` in torch, with the weights of a checkpoint or of an export.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, List, Union

import numpy as np

from . import _core

_VOTES = ("mean", "majority")


def _load_model_files(source: str):
    """(state dict, model config holder, mel dict, class names, positive class) of a checkpoint (`best.pt` of
    `melforge-train train`) or an export (`weights.pt` with `weights.pt.json` beside it, or the .json itself)."""
    import torch

    source = os.fspath(source)
    if source.endswith(".json"):
        meta_path, weights_path = source, source[: -len(".json")]
    else:
        meta_path, weights_path = source + ".json", source
    if not os.path.exists(weights_path):
        raise _core.IoError(f"{weights_path}: no such checkpoint or export")
    try:
        obj = torch.load(weights_path, map_location="cpu")
    except Exception as e:  # torch raises many types for a file that is not a torch archive
        raise _core.FormatError(f"{weights_path}: not a melforge checkpoint or export: {e}") from e
    if isinstance(obj, dict) and obj.get("format") == "melforge-checkpoint":
        mel = obj["mel"]
        mel = json.loads(mel) if isinstance(mel, (str, bytes)) else mel
        return obj["model"], obj, mel, list(obj["class_names"]), obj["positive_class"]
    if not os.path.exists(meta_path):
        raise _core.FormatError(f"{weights_path}: not a melforge checkpoint, and no export metadata {meta_path}")
    with open(meta_path, encoding="utf-8") as fh:
        meta = json.load(fh)
    for key in ("model_config", "class_names", "positive_class", "mel"):
        if key not in meta:
            raise _core.FormatError(f"{meta_path}: missing {key!r}")
    return obj, meta, meta["mel"], list(meta["class_names"]), meta["positive_class"]


def _resolve_device(device: str):
    import torch

    if device == "cpu":
        return torch.device("cpu")
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise _core.InvalidArgument("device cuda: no CUDA device is available")
    return torch.device("cuda:0" if cuda else "cpu")


def _score_chunk(model, feats, rows, vote, threshold, device):
    """Runs the valid long segments of `feats` ([(mel [L, S, M, T], num_valid_long)]) through the model and fills
    `rows` with the file-level vote (as trainer/predict/predict.cpp score_chunk)."""
    import torch

    mel = np.stack([f for f, _ in feats])
    F, L, S, M, T = mel.shape
    nvl = np.array([n for _, n in feats], dtype=np.int64)
    idx = np.concatenate([f * L + np.arange(n) for f, n in enumerate(nvl)])
    x = torch.from_numpy(mel.reshape(F * L, S, M, T)[idx].reshape(-1, M, T)).to(device)
    logits, detection = model(x)
    probs = torch.softmax(logits.float(), 1).reshape(len(idx), S, -1).cpu().numpy()
    det = torch.sigmoid(detection.float()).reshape(len(idx), S).cpu().numpy()
    C = probs.shape[2]
    dense = np.zeros((F * L, S, C), dtype=np.float32)
    dense[idx] = probs
    dense_det = np.zeros((F * L, S), dtype=np.float32)
    dense_det[idx] = det
    cp, pred, score, detected = _core.vote_files(dense.reshape(F, L, S, C), dense_det.reshape(F, L, S), nvl, vote,
                                                 float(threshold))
    for f, row in enumerate(rows):
        row.update(probs=cp[f], predicted=int(pred[f]), score=float(score[f]), detected=bool(detected[f]),
                   num_valid_long=int(nvl[f]))


def predict(checkpoint_or_export, paths: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]],
            vote: str = "mean", threshold: float = 0.5, threads: int = 0, device: str = "cpu",
            include_hidden: bool = False) -> List[dict]:
    """Classifies audio files as `melforge-train predict --format json` does.

    Parameters
    ----------
    checkpoint_or_export : str or path
        A checkpoint of `melforge-train train` (e.g. `run/checkpoints/best.pt`), or an export of
        `melforge-train export` (`weights.pt` with `weights.pt.json` beside it, or the `.json` path).
    paths : str, path or iterable of them
        Audio files, or folders searched recursively for the extensions melforge-build scans (hidden entries
        skipped unless `include_hidden`), sorted by path within each folder.
    vote : {"mean", "majority"}
        File-level vote over the long segments (as `--vote`).
    threshold : float
        Detection probability at or above which the detection head says positive, in (0, 1).
    threads : int
        CPU threads for the spectrograms (0: all cores).
    device : {"cpu", "cuda", "auto"}
        Where the model runs.
    include_hidden : bool
        Also read entries whose name starts with '.' inside input folders.

    Returns
    -------
    list of dict
        One per input file, in order: {"path", "predicted" (class name), "probabilities" ({class name: float}),
        "positive_class", "detection_score" (float), "detected" (bool), "num_valid_long" (int)}, or
        {"path", "error"} for a file or folder that cannot be read (the others are still scored) - the objects of
        `melforge-train predict --format json`.

    Raises
    ------
    InvalidArgument
        Bad parameters (before any work), or no audio file in the inputs.
    AudioError
        No input file could be scored.
    """
    if vote not in _VOTES:
        raise _core.InvalidArgument(f"--vote: '{vote}' is not one of mean, majority")
    if not (0 < threshold < 1):
        raise _core.InvalidArgument(f"--threshold must be in (0, 1) (got {threshold})")
    if threads < 0:
        raise _core.InvalidArgument(f"--threads must be >= 0 (got {threads})")
    if device not in ("cpu", "cuda", "auto"):
        raise _core.InvalidArgument(f"--device: '{device}' is not one of cpu, cuda, auto")
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise _core.InvalidArgument("predict needs at least one input file or folder")

    import torch

    from .models import build_model, model_config_of

    state, config, mel, class_names, positive_class = _load_model_files(checkpoint_or_export)
    task = model_config_of(config).get("task", "multiclass")
    if task != "multiclass":
        raise _core.FormatError(f"{checkpoint_or_export}: trained with --task {task}: melforge.predict supports "
                                "--task multiclass checkpoints only (melforge-train eval evaluates it)")
    model = build_model(config)
    model.load_state_dict(state, strict=True)
    if len(class_names) != model.num_classes:
        raise _core.FormatError(f"{checkpoint_or_export}: {len(class_names)} class names for a model of "
                                f"{model.num_classes} classes")
    dev = _resolve_device(device)
    model.to(dev).eval()

    inputs = _core.collect_inputs(paths, include_hidden)
    if not inputs:
        raise _core.InvalidArgument("no audio files found in the inputs")
    featurize = _core.Featurizer(json.dumps(mel), threads)
    per_file = max(1, int(mel["num_long"]) * int(mel["num_short"]))
    chunk_files = max(1, 1024 // per_file)
    rows = [{"path": p, "error": e} for p, e in inputs]
    feats, pending = [], []
    with torch.no_grad():
        for i, row in enumerate(rows):
            if not row["error"]:
                try:
                    feats.append(featurize(row["path"]))
                    pending.append(row)
                except _core.IoError as e:  # AudioError is an IoError
                    row["error"] = str(e)
            if feats and (len(feats) >= chunk_files or i + 1 == len(rows)):
                _score_chunk(model, feats, pending, vote, threshold, dev)
                feats, pending = [], []

    out = []
    for row in rows:
        if row["error"]:
            out.append({"path": row["path"], "error": row["error"]})
            continue
        out.append({"path": row["path"],
                    "predicted": class_names[row["predicted"]],
                    "probabilities": {n: float(p) for n, p in zip(class_names, row["probs"])},
                    "positive_class": positive_class,
                    "detection_score": row["score"],
                    "detected": row["detected"],
                    "num_valid_long": row["num_valid_long"]})
    if all("error" in r for r in out):
        raise _core.AudioError(f"no input file could be scored (first error: {out[0]['error']})")
    return out
