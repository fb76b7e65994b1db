"""`melforge.predict`: `melforge-train predict` from Python, with the model in PyTorch.

Input listing (kernels/inputs: FolderWalk), whole-clip features (kernels/featurize ClipFeaturizer: decode and
resample the whole file, the log-mel of the whole clip, float16 rounding as a schema-3 dataset stores it), the tiles
(data/views: the model's input width, min_real 0, so every frame of the file is scored and the last tile is padded and
masked by its length) and the clip vote over the tiles (kernels/vote) are the C++ code the binary runs; the model is
`melforge.models` in torch, with the weights of a checkpoint or of an export, or a model of the user's own
(`predict(model=..., featurizer=...)`: any torch.nn.Module that maps [B, n_mels, T] spectrograms to class logits).
A `--task multilabel` checkpoint gives each class's sigmoid score (the mean or max over the tiles: kernels/vote
multilabel_clips) and the label set at the threshold tuned on val that the checkpoint stores (or `threshold`).
"""
from __future__ import annotations

import json
import os
from typing import Iterable, List, Optional, Union

import numpy as np

from . import _core
from ._model_files import load_model_files as _load_model_files, resolve_device as _resolve_device

_VOTES = ("mean", "majority")


_AGGREGATES = ("mean", "max")


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
    if view is None and isinstance(config, dict):
        view = config.get("view")  # an export's metadata: the run's view options
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


class _Rule:
    """How tile outputs become a file's decision (trainer/predict/predict.cpp Rule): multiclass (softmax, `vote`, the
    detection head at `threshold` when `has_detection`) or multilabel (sigmoid, `aggregate`, labels at `threshold`)."""

    def __init__(self, multilabel, vote, aggregate, threshold, has_detection):
        self.multilabel, self.vote, self.aggregate = multilabel, vote, aggregate
        self.threshold, self.has_detection = float(threshold), has_detection


def _score_file(forward, featurize, path, tile, hop, mel, rule, class_names, want_windows):
    """The row of one file (as trainer/predict/predict.cpp predict_file): its whole-clip frames, their tiles through
    `forward` (x float32 tensor [n, n_mels, tile], lengths int64 [n] -> class scores [n, C] and detection
    probabilities [n] or None, NumPy float32) a fixed-size batch at a time, then the clip vote (multiclass) or the
    multi-label aggregate over all of them."""
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
        p, d = forward(torch.from_numpy(x), lengths)
        probs.append(p)
        if d is not None:
            dets.append(d)
    probs = np.ascontiguousarray(np.concatenate(probs), dtype=np.float32)
    if class_names is None or len(class_names) != probs.shape[1]:
        raise _core.FormatError(f"the model gave {probs.shape[1]} class scores per tile for "
                                f"{'no' if class_names is None else len(class_names)} class names")
    rate, step = float(mel["sample_rate"]), float(mel["hop_length"])

    def window(k, **fields):
        return {"path": path, "window": k, "start": float(starts[k]) * step / rate,
                "end": min(float(starts[k] + reals[k]) * step, float(num_samples)) / rate, **fields}

    if rule.multilabel:
        scores, labels = _core.multilabel_clips(probs, np.zeros(W, dtype=np.int64), 1, rule.aggregate, rule.threshold)
        row = dict(probs=scores[0], labels=labels[0], num_windows=W)
        if want_windows:
            ws, wl = _core.multilabel_clips(probs, np.arange(W, dtype=np.int64), W, rule.aggregate, rule.threshold)
            row["windows"] = [window(k, labels=[n for n, on in zip(class_names, wl[k]) if on],
                                     probabilities={n: float(p) for n, p in zip(class_names, ws[k])})
                              for k in range(W)]
        return row
    dets = np.ascontiguousarray(np.concatenate(dets) if dets else np.zeros(0), dtype=np.float32)
    cp, pred, score, detected = _core.vote_clips(probs, dets, np.zeros(W, dtype=np.int64), 1, rule.vote,
                                                 rule.threshold)
    row = dict(probs=cp[0], predicted=int(pred[0]), score=float(score[0]), detected=bool(detected[0]),
               num_windows=W)
    if want_windows:
        wp, wpred, wscore, wdet = _core.vote_clips(probs, dets, np.arange(W, dtype=np.int64), W, "mean",
                                                   rule.threshold)
        has = rule.has_detection
        row["windows"] = [window(k, predicted=class_names[int(wpred[k])],
                                 probabilities={n: float(p) for n, p in zip(class_names, wp[k])},
                                 detection_score=float(wscore[k]) if has else None,
                                 detected=bool(wdet[k]) if has else None) for k in range(W)]
    return row


def _task_of(config) -> str:
    """The task a checkpoint's or export's model configuration records ("multiclass" when absent)."""
    from .models import model_config_of

    return model_config_of(config).get("task", "multiclass")


def _stored_threshold(config, what: str):
    """The threshold tuned on val that a checkpoint's `state` ("tuned_threshold") or an export's metadata
    ("threshold") stores, or None (trainer/eval/multilabel.h stored_threshold). FormatError when it is not a number
    in [0, 1]."""
    if "state" in config:
        state = config["state"]
        state = json.loads(state) if isinstance(state, (str, bytes)) else state
        t, key = (state.get("tuned_threshold") if isinstance(state, dict) else None), "state: 'tuned_threshold'"
    else:
        t, key = config.get("threshold"), "'threshold'"
    if t is None:
        return None
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 1:
        raise _core.FormatError(f"{what}: entry {key} is {str(t)[:40]}, not a threshold in [0, 1]")
    return float(t)


def _trained_aggregate(config) -> str:
    """The --aggregate of the run (a checkpoint's config eval.aggregate, an export's "aggregate"); "mean"."""
    if "aggregate" in config and config["aggregate"] in _AGGREGATES:
        return config["aggregate"]
    train_config = config.get("config")
    if isinstance(train_config, (str, bytes)):
        train_config = json.loads(train_config)
    agg = train_config.get("eval", {}).get("aggregate") if isinstance(train_config, dict) else None
    return agg if agg in _AGGREGATES else "mean"


def _checkpoint_rule(config, what, vote, aggregate, threshold, has_detection) -> _Rule:
    """The rule for a checkpoint or export (predict.cpp predict_rule)."""
    task = _task_of(config)
    if task == "verification":
        raise _core.FormatError(f"{what}: trained with --task verification: it has no classes to predict "
                                "(melforge-train embed gives its embeddings)")
    if task not in ("multiclass", "multilabel"):
        raise _core.FormatError(f"{what}: trained with --task {task}, which this melforge does not know")
    if task == "multiclass":
        if aggregate is not None:
            raise _core.InvalidArgument(f"--aggregate applies to a --task multilabel checkpoint; {what} is --task "
                                        "multiclass (its tiles are combined by --vote)")
        return _Rule(False, vote, None, 0.5 if threshold is None else threshold, has_detection)
    if vote != "mean":
        raise _core.InvalidArgument(f"--vote {vote}: {what} is --task multilabel; its tiles are combined by "
                                    "--aggregate mean|max (default: the run's)")
    stored = _stored_threshold(config, what)
    t = threshold if threshold is not None else stored if stored is not None else 0.5
    return _Rule(True, vote, aggregate or _trained_aggregate(config), t, False)


def _own_model_setup(model, featurizer, class_names, task, tile, vote, aggregate, threshold):
    """(mel dict, tile seconds or None, tile hop seconds or 0, rule, class names) for predict(model=...)."""
    from .data import Dataset

    if task not in ("multiclass", "multilabel"):
        raise _core.InvalidArgument(f"task: '{task}' is not one of multiclass, multilabel")
    if task == "multiclass" and aggregate is not None:
        raise _core.InvalidArgument("aggregate applies to task='multilabel'; task='multiclass' combines tiles by vote")
    if task == "multilabel" and vote != "mean":
        raise _core.InvalidArgument(f"vote '{vote}' applies to task='multiclass'; task='multilabel' combines tiles by "
                                    "aggregate mean|max")
    tile_hop = 0.0
    if isinstance(featurizer, Dataset):
        view = featurizer.view_args
        if tile is None and view.get("view") == "tiles" and view.get("tile_seconds"):
            tile, tile_hop = view["tile_seconds"], view.get("tile_hop") or 0.0
        if class_names is None:
            class_names = list(featurizer.class_names)
        mel = featurizer.info
    elif isinstance(featurizer, dict):
        mel = dict(featurizer.get("mel", featurizer))
    else:
        raise _core.InvalidArgument("featurizer: a melforge.Dataset or a dict of mel parameters (a Dataset's `info`, "
                                    f"a checkpoint's or export's \"mel\"), got {type(featurizer).__name__}")
    if tile is not None and not (float(tile) > 0):
        raise _core.InvalidArgument(f"tile must be a number of seconds > 0 (got {tile})")
    rule = _Rule(task == "multilabel", vote, aggregate or "mean", 0.5 if threshold is None else threshold, False)
    return mel, tile, tile_hop, rule, None if class_names is None else [str(n) for n in class_names]


def _module_forward(model, dev, multilabel, pass_lengths, detection):
    """forward(x, lengths) for _score_file: the module's logits (its output, or the first of a tuple) through softmax
    or sigmoid; with `detection`, the sigmoid of its second output (melforge.models' detection head)."""
    import torch

    def forward(x, lengths):
        out = model(x.to(dev), lengths.to(dev)) if pass_lengths else model(x.to(dev))
        logits = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != x.shape[0]:
            raise _core.FormatError(f"the model's output for a batch of {x.shape[0]} tiles is not logits "
                                    f"[{x.shape[0]}, classes] (got {getattr(logits, 'shape', type(logits).__name__)})")
        logits = logits.float()
        scores = (torch.sigmoid(logits) if multilabel else torch.softmax(logits, 1)).cpu().numpy()
        det = None
        if detection and isinstance(out, (tuple, list)) and len(out) > 1 and out[1] is not None:
            det = torch.sigmoid(out[1].float()).cpu().numpy()
        return scores, det

    return forward


def _tile_frames(seconds, mel) -> int:
    """A tile of `seconds` in frames (at least one: InvalidArgument otherwise)."""
    tile = _frames(seconds, mel)
    if tile < 1:
        raise _core.InvalidArgument(f"tile {seconds} s is less than one frame")
    return tile


def predict(checkpoint_or_export=None, paths: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]], None] = None,
            vote: str = "mean", threshold: Optional[float] = None, threads: int = 0, device: str = "cpu",
            include_hidden: bool = False, hop: float = 0.0, windows: bool = False, strict: bool = False, *,
            aggregate: Optional[str] = None, model=None, featurizer=None, class_names=None,
            task: str = "multiclass", tile: Optional[float] = None, pass_lengths: bool = False) -> List[dict]:
    """Classifies audio files as `melforge-train predict --format json` does, with a checkpoint or export, or with a
    model of your own (`model=`, `featurizer=`).

    Parameters
    ----------
    checkpoint_or_export : str or path
        A checkpoint of `melforge-train train` (e.g. `run/checkpoints/best.pt`), or an export of
        `melforge-train export` (`weights.pt` with `weights.pt.json` beside it, or the `.json` path). Leave it out
        when giving `model`.
    paths : str, path or iterable of them
        Audio files, or folders searched recursively for the extensions melforge-build scans (hidden entries
        skipped unless `include_hidden`), sorted by path within each folder.
    vote : {"mean", "majority"}
        File-level vote over all the tiles of a file (as `--vote`; multiclass only).
    threshold : float or None
        In (0, 1). Multiclass: the detection probability at or above which the detection head says positive
        (None: 0.5). Multilabel: the class score at or above which a class is in a file's labels (None: the
        threshold tuned on val that the checkpoint or export stores, else 0.5; an own model: 0.5).
    threads : int
        CPU threads for the spectrograms (0: all cores).
    device : {"cpu", "cuda", "auto"}
        Where the model runs (an own model with parameters: the device of its parameters).
    include_hidden : bool
        Also read entries whose name starts with '.' inside input folders.
    hop : float
        Seconds between tile starts, at most the tile (as `--hop`); 0: the hop the model was trained with (an own
        model: the Dataset's tile_hop, else the tile).
    windows : bool
        Add to each scored row "windows": the objects `--windows FILE.json` writes for the file, one per tile.
    strict : bool
        Raise AudioError at the first input that cannot be scored (as `--strict`) instead of an error row.
    aggregate : {"mean", "max"} or None
        Multilabel: a file's class score is the mean or max of its tiles' (None: the run's --aggregate; an own
        model: mean).
    model : torch.nn.Module or None
        Your own model: called as ``model(x)`` (``model(x, lengths)`` with `pass_lengths`) on float32 tiles
        x [B, n_mels, tile] on its device, in eval mode (its mode is restored afterwards), without gradients. It
        returns class logits [B, C], or a tuple whose first element they are. Padded positions of a file's last tile
        hold the silence value (`lengths` gives each tile's real frames).
    featurizer : melforge.Dataset or dict
        With `model`: the spectrogram parameters the model was trained on, as the dataset it read (a
        `melforge.Dataset`: its `info`, its tile_seconds / tile_hop and class names) or a dict of mel parameters
        (a Dataset's `info`, a checkpoint's or export's "mel", or an export's whole metadata). Files are featurized
        by melforge's C++ ClipFeaturizer exactly as melforge-build stores them.
    class_names : list of str or None
        With `model`: the names of its C outputs (default: the Dataset's; else "0" .. "C-1").
    task : {"multiclass", "multilabel"}
        With `model`: softmax + vote, or sigmoid + aggregate and label sets.
    tile : float or None
        With `model`: the tile length in seconds (the model's input width; default: the Dataset's tile_seconds,
        else the dataset's n_frames frames).
    pass_lengths : bool
        With `model`: also pass each tile's real frames, int64 [B] (melforge.models take them).

    Returns
    -------
    list of dict
        One per input file, in order, or {"path", "error"} for a file or folder that cannot be read (the others are
        still scored). Multiclass: {"path", "predicted" (class name), "probabilities" ({class name: float}),
        "positive_class", "detection_score" (float), "detected" (bool) (these three None for a model trained
        with --positive-class none, and for an own model), "num_windows" (int: the tiles)}. Multilabel: {"path",
        "labels" (class names, in class order), "probabilities" ({class name: score}), "threshold", "num_windows"}
        - the objects of `melforge-train predict --format json`.

    Raises
    ------
    InvalidArgument
        Bad parameters (before any work), or no audio file in the inputs.
    AudioError
        No input file could be scored, or one could not with `strict`.
    """
    if vote not in _VOTES:
        raise _core.InvalidArgument(f"--vote: '{vote}' is not one of mean, majority")
    if aggregate is not None and aggregate not in _AGGREGATES:
        raise _core.InvalidArgument(f"--aggregate: '{aggregate}' is not one of mean, max")
    if threshold is not None and not (0 < threshold < 1):
        raise _core.InvalidArgument(f"--threshold must be in (0, 1) (got {threshold})")
    if threads < 0:
        raise _core.InvalidArgument(f"--threads must be >= 0 (got {threads})")
    if device not in ("cpu", "cuda", "auto"):
        raise _core.InvalidArgument(f"--device: '{device}' is not one of cpu, cuda, auto")
    if not (hop >= 0):
        raise _core.InvalidArgument(f"--hop must be a number of seconds > 0 (got {hop})")
    if (model is None) == (checkpoint_or_export is None):
        raise _core.InvalidArgument("predict: give a checkpoint or export, or model= (with featurizer=), not both")
    if model is not None and featurizer is None:
        raise _core.InvalidArgument("predict(model=...): featurizer= is required (a melforge.Dataset or its mel "
                                    "parameters)")
    if paths is None:
        paths = []
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise _core.InvalidArgument("predict needs at least one input file or folder")

    import torch

    if model is not None:
        mel, tile_seconds, tile_hop, rule, class_names = _own_model_setup(model, featurizer, class_names, task, tile,
                                                                          vote, aggregate, threshold)
        if not isinstance(model, torch.nn.Module):
            raise _core.InvalidArgument(f"model: a torch.nn.Module, got {type(model).__name__}")
        params = next(iter(model.parameters()), None)
        dev = params.device if params is not None else _resolve_device(device)
        tile_frames = _tile_frames(tile_seconds, mel) if tile_seconds is not None else int(mel["n_frames"])
        step = _frames(hop if hop > 0 else tile_hop, mel) if (hop > 0 or tile_hop > 0) else tile_frames
        if not 1 <= step <= tile_frames:
            raise _core.InvalidArgument(f"--hop {hop} s gives {step} frames between tiles; it must be 1 .. the "
                                        f"tile's {tile_frames} frames")
        forward = _module_forward(model, dev, rule.multilabel, pass_lengths, detection=False)
        positive_class, was_training = None, model.training
        model.eval()
        try:
            rows = _predict_rows(forward, mel, paths, include_hidden, threads, tile_frames, step, rule, class_names,
                                 windows, strict)
        finally:
            model.train(was_training)
    else:
        from .models import build_checked_model

        what = os.fspath(checkpoint_or_export)
        state, config, mel, class_names, positive_class = _load_model_files(checkpoint_or_export)
        rule = _checkpoint_rule(config, what, vote, aggregate, threshold, positive_class is not None)
        if not isinstance(state, dict):
            raise _core.FormatError(f"{what}: entry 'model' is not a dict of tensors")
        net = build_checked_model(config, state, what)
        if len(class_names) != net.num_classes:
            raise _core.FormatError(f"{what}: {len(class_names)} class names for a model of {net.num_classes} "
                                    "classes")
        dev = _resolve_device(device)
        net.to(dev).eval()
        tile_frames, step = _tiles(config, mel, hop)
        forward = _module_forward(net, dev, rule.multilabel, pass_lengths=True, detection=not rule.multilabel)
        rows = _predict_rows(forward, mel, paths, include_hidden, threads, tile_frames, step, rule, class_names,
                             windows, strict)
    return _output_rows(rows, rule, positive_class, windows)


def _predict_rows(forward, mel, paths, include_hidden, threads, tile, step, rule, class_names, windows, strict):
    """The internal rows of every input (predict.cpp run_predict's loop): scored, or with their error."""
    import torch

    inputs = _core.collect_inputs(paths, include_hidden)
    if not inputs:
        raise _core.InvalidArgument("no audio files found in the inputs")
    featurize = _core.ClipFeaturizer(json.dumps(mel), threads)
    rows = [{"path": p, "error": e} for p, e in inputs]
    with torch.no_grad():
        for row in rows:
            if not row["error"]:
                try:
                    names = class_names
                    if names is None:
                        names = _default_names(forward, featurize, mel, tile)
                        class_names = names
                    row.update(_score_file(forward, featurize, row["path"], tile, step, mel, rule, names, windows))
                    row["class_names"] = names
                except _core.IoError as e:  # AudioError is an IoError
                    row["error"] = str(e)
            if row["error"] and strict:
                raise _core.AudioError(f"predict --strict: stopped at {row['path']} ({row['error']})")
    return rows


def _default_names(forward, featurize, mel, tile):
    """"0" .. "C-1" for an own model without class names: C from its output on one tile of silence."""
    import torch

    x = torch.full((1, int(mel["n_mels"]), tile), featurize.pad_value, dtype=torch.float32)
    scores, _ = forward(x, torch.tensor([tile], dtype=torch.int64))
    return [str(c) for c in range(scores.shape[1])]


def _output_rows(rows, rule, positive_class, windows) -> List[dict]:
    """The JSON objects of `melforge-train predict --format json` from the internal rows."""
    out = []
    for row in rows:
        if row["error"]:
            out.append({"path": row["path"], "error": row["error"]})
            continue
        names = row["class_names"]
        probabilities = {n: float(p) for n, p in zip(names, row["probs"])}
        extra = {"windows": row["windows"]} if windows else {}
        if rule.multilabel:
            out.append({"path": row["path"], "labels": [n for n, on in zip(names, row["labels"]) if on],
                        "probabilities": probabilities, "threshold": rule.threshold,
                        "num_windows": row["num_windows"], **extra})
            continue
        out.append({"path": row["path"],
                    "predicted": names[row["predicted"]],
                    "probabilities": probabilities,
                    "positive_class": positive_class,
                    "detection_score": row["score"] if positive_class is not None else None,
                    "detected": row["detected"] if positive_class is not None else None,
                    "num_windows": row["num_windows"],
                    **extra})
    if all("error" in r for r in out):
        raise _core.AudioError(f"no input file could be scored (first error: {out[0]['error']})")
    return out
