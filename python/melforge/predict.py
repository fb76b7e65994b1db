"""`melforge.predict`: `melforge-train predict` from Python, with the model in PyTorch.

Input listing (kernels/inputs: FolderWalk), whole-clip features (kernels/featurize ClipFeaturizer: decode and
resample the whole file, the log-mel of the whole clip, float16 rounding as a schema-3 dataset stores it), the tiles
(data/views: the model's input width, min_real 0, so every frame of the file is scored and the last tile is padded and
masked by its length) and the clip vote over the tiles (kernels/vote) are the C++ code the binary runs; the model is
`melforge.models` in torch, with the weights of a checkpoint or of an export.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, List, Union

import numpy as np

from . import _core

_VOTES = ("mean", "majority")


def _detected_class(holder) -> "str | None":
    """The class the detection head detects, or None for a model trained with `--positive-class none`
    (`positive_index` -1: no detection head)."""
    index = holder.get("positive_index", 0)
    return None if index is not None and int(index) < 0 else holder["positive_class"]


def _load_model_files(source: str):
    """(state dict, model config holder, mel dict, class names, positive class) of a checkpoint (`best.pt` of
    `melforge-train train`) or an export (`weights.pt` with `weights.pt.json` beside it, or the .json itself), read
    as an untrusted file (melforge.models.load_torch_file: every tensor's metadata checked before its values are
    read, weights-only: no code from the file runs)."""
    from .models import load_torch_file

    source = os.fspath(source)
    if source.endswith(".json"):
        meta_path, weights_path = source, source[: -len(".json")]
    else:
        meta_path, weights_path = source + ".json", source
    if not os.path.exists(weights_path):
        raise _core.IoError(f"{weights_path}: no such checkpoint or export")
    if not os.path.isfile(weights_path):
        raise _core.InvalidArgument(f"{weights_path}: not a regular file (a checkpoint or export is read only from "
                                    "a regular file)")
    obj = load_torch_file(weights_path)
    if isinstance(obj, dict) and obj.get("format") == "melforge-checkpoint":
        mel = obj["mel"]
        mel = json.loads(mel) if isinstance(mel, (str, bytes)) else mel
        return obj["model"], obj, mel, list(obj["class_names"]), _detected_class(obj)
    if not os.path.exists(meta_path):
        raise _core.FormatError(f"{weights_path}: not a melforge checkpoint, and no export metadata {meta_path}")
    if not os.path.isfile(meta_path):
        raise _core.InvalidArgument(f"{meta_path}: not a regular file")
    with open(meta_path, encoding="utf-8") as fh:
        meta = json.load(fh)
    for key in ("model_config", "class_names", "positive_class", "mel"):
        if key not in meta:
            raise _core.FormatError(f"{meta_path}: missing {key!r}")
    return obj, meta, meta["mel"], list(meta["class_names"]), _detected_class(meta)


def _resolve_device(device: str):
    import torch

    if device == "cpu":
        return torch.device("cpu")
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise _core.InvalidArgument("device cuda: no CUDA device is available")
    return torch.device("cuda:0" if cuda else "cpu")


_BATCH_SEGMENTS = 1024  # tiles per forward pass, as kPredictBatchSegments of trainer/predict/predict.h


def _frames(seconds: float, mel) -> int:
    """FrameRate::frames of data/views: seconds * sample_rate / hop_length, rounded half away from zero."""
    x = float(seconds) * float(mel["sample_rate"]) / float(mel["hop_length"])
    return int(np.floor(x + 0.5)) if x >= 0 else -int(np.floor(-x + 0.5))


def _tiles(config, mel, hop: float):
    """(tile, hop) in frames as trainer/predict/predict.cpp's predict_tiles: the model's input width (its config's
    n_frames), every trained tile hop of a tiles-trained schema-3 model (else the tile); `hop` seconds overrides."""
    from .models import model_config_of

    tile = int(model_config_of(config).get("n_frames", mel["n_frames"]))
    step = tile
    train_config = config.get("config") if isinstance(config, dict) else None
    if isinstance(train_config, (str, bytes)):
        train_config = json.loads(train_config)
    view = train_config.get("view") if isinstance(train_config, dict) else None
    if float(mel.get("long_seconds", 0)) <= 0 and isinstance(view, dict) and view.get("view") == "tiles":
        if _frames(view.get("tile_seconds", 0), mel) == tile:
            tile_hop = float(view.get("tile_hop", 0))
            step = _frames(tile_hop if tile_hop > 0 else view["tile_seconds"], mel)
    if hop > 0:
        step = _frames(hop, mel)
    if not 1 <= step <= tile:
        raise _core.InvalidArgument(f"--hop {hop} s gives {step} frames between tiles; it must be 1 .. the tile's "
                                    f"{tile} frames")
    return tile, step


def _score_file(model, featurize, path, tile, hop, mel, vote, threshold, device, class_names, want_windows,
                has_detection=True):
    """The row of one file (as trainer/predict/predict.cpp predict_file): its whole-clip frames, their tiles through
    the model a fixed-size batch at a time (each with its real length), then the clip vote over all of them."""
    import torch

    frames, num_samples = featurize(path)
    starts, reals = _core.tile_examples(frames.shape[0], tile, hop)
    W, M = len(starts), frames.shape[1]
    probs, dets = [], []
    for first in range(0, W, _BATCH_SEGMENTS):
        n = min(_BATCH_SEGMENTS, W - first)
        x = np.full((n, M, tile), featurize.pad_value, dtype=np.float32)
        for b in range(n):
            s, r = int(starts[first + b]), int(reals[first + b])
            x[b, :, :r] = frames[s:s + r].T
        lengths = torch.from_numpy(np.ascontiguousarray(reals[first:first + n]))
        logits, detection = model(torch.from_numpy(x).to(device), lengths.to(device))
        probs.append(torch.softmax(logits.float(), 1).cpu().numpy())
        if detection is not None:
            dets.append(torch.sigmoid(detection.float()).cpu().numpy())
    probs = np.ascontiguousarray(np.concatenate(probs), dtype=np.float32)
    dets = np.ascontiguousarray(np.concatenate(dets) if dets else np.zeros(0), dtype=np.float32)
    cp, pred, score, detected = _core.vote_clips(probs, dets, np.zeros(W, dtype=np.int64), 1, vote, float(threshold))
    row = dict(probs=cp[0], predicted=int(pred[0]), score=float(score[0]), detected=bool(detected[0]),
               num_windows=W)
    if want_windows:
        wp, wpred, wscore, wdet = _core.vote_clips(probs, dets, np.arange(W, dtype=np.int64), W, "mean",
                                                   float(threshold))
        rate, step = float(mel["sample_rate"]), float(mel["hop_length"])
        row["windows"] = [{"path": path, "window": k, "start": float(starts[k]) * step / rate,
                           "end": min(float(starts[k] + reals[k]) * step, float(num_samples)) / rate,
                           "predicted": class_names[int(wpred[k])],
                           "probabilities": {n: float(p) for n, p in zip(class_names, wp[k])},
                           "detection_score": float(wscore[k]) if has_detection else None,
                           "detected": bool(wdet[k]) if has_detection else None} for k in range(W)]
    return row


def predict(checkpoint_or_export, paths: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]],
            vote: str = "mean", threshold: float = 0.5, threads: int = 0, device: str = "cpu",
            include_hidden: bool = False, hop: float = 0.0, windows: bool = False,
            strict: bool = False) -> List[dict]:
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
        File-level vote over all the tiles of a file (as `--vote`).
    threshold : float
        Detection probability at or above which the detection head says positive, in (0, 1).
    threads : int
        CPU threads for the spectrograms (0: all cores).
    device : {"cpu", "cuda", "auto"}
        Where the model runs.
    include_hidden : bool
        Also read entries whose name starts with '.' inside input folders.
    hop : float
        Seconds between tile starts, at most the tile (as `--hop`); 0: the hop the model was trained with.
    windows : bool
        Add to each scored row "windows": the objects `--windows FILE.json` writes for the file, one per tile (path,
        window, start, end, predicted, probabilities, detection_score, detected).
    strict : bool
        Raise AudioError at the first input that cannot be scored (as `--strict`) instead of an error row.

    Returns
    -------
    list of dict
        One per input file, in order: {"path", "predicted" (class name), "probabilities" ({class name: float}),
        "positive_class", "detection_score" (float), "detected" (bool) (these three None for a model trained
        with --positive-class none), "num_windows" (int: the tiles)}, or
        {"path", "error"} for a file or folder that cannot be read (the others are still scored) - the objects of
        `melforge-train predict --format json`.

    Raises
    ------
    InvalidArgument
        Bad parameters (before any work), or no audio file in the inputs.
    AudioError
        No input file could be scored, or one could not with `strict`.
    """
    if vote not in _VOTES:
        raise _core.InvalidArgument(f"--vote: '{vote}' is not one of mean, majority")
    if not (0 < threshold < 1):
        raise _core.InvalidArgument(f"--threshold must be in (0, 1) (got {threshold})")
    if threads < 0:
        raise _core.InvalidArgument(f"--threads must be >= 0 (got {threads})")
    if device not in ("cpu", "cuda", "auto"):
        raise _core.InvalidArgument(f"--device: '{device}' is not one of cpu, cuda, auto")
    if not (hop >= 0):
        raise _core.InvalidArgument(f"--hop must be a number of seconds > 0 (got {hop})")
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise _core.InvalidArgument("predict needs at least one input file or folder")

    import torch

    from .models import build_checked_model, model_config_of

    state, config, mel, class_names, positive_class = _load_model_files(checkpoint_or_export)
    task = model_config_of(config).get("task", "multiclass")
    if task != "multiclass":
        raise _core.FormatError(f"{checkpoint_or_export}: trained with --task {task}: melforge.predict supports "
                                "--task multiclass checkpoints only (melforge-train eval evaluates it)")
    if not isinstance(state, dict):
        raise _core.FormatError(f"{checkpoint_or_export}: entry 'model' is not a dict of tensors")
    model = build_checked_model(config, state, os.fspath(checkpoint_or_export))
    if len(class_names) != model.num_classes:
        raise _core.FormatError(f"{checkpoint_or_export}: {len(class_names)} class names for a model of "
                                f"{model.num_classes} classes")
    dev = _resolve_device(device)
    model.to(dev).eval()

    inputs = _core.collect_inputs(paths, include_hidden)
    if not inputs:
        raise _core.InvalidArgument("no audio files found in the inputs")
    tile, step = _tiles(config, mel, hop)
    featurize = _core.ClipFeaturizer(json.dumps(mel), threads)
    rows = [{"path": p, "error": e} for p, e in inputs]
    with torch.no_grad():
        for row in rows:
            if not row["error"]:
                try:
                    row.update(_score_file(model, featurize, row["path"], tile, step, mel, vote, threshold, dev,
                                           class_names, windows, positive_class is not None))
                except _core.IoError as e:  # AudioError is an IoError
                    row["error"] = str(e)
            if row["error"] and strict:
                raise _core.AudioError(f"predict --strict: stopped at {row['path']} ({row['error']})")

    out = []
    for row in rows:
        if row["error"]:
            out.append({"path": row["path"], "error": row["error"]})
            continue
        out.append({"path": row["path"],
                    "predicted": class_names[row["predicted"]],
                    "probabilities": {n: float(p) for n, p in zip(class_names, row["probs"])},
                    "positive_class": positive_class,
                    "detection_score": row["score"] if positive_class is not None else None,
                    "detected": row["detected"] if positive_class is not None else None,
                    "num_windows": row["num_windows"],
                    **({"windows": row["windows"]} if windows else {})})
    if all("error" in r for r in out):
        raise _core.AudioError(f"no input file could be scored (first error: {out[0]['error']})")
    return out
