"""Reading a checkpoint or an export for the package's model runners (melforge.predict, melforge.embed): the files
as untrusted input, and the device the model runs on."""
from __future__ import annotations

import json
import os

from . import _core


def _detected_class(holder) -> "str | None":
    """The class the detection head detects, or None for a model trained with `--positive-class none`
    (`positive_index` -1: no detection head)."""
    index = holder.get("positive_index", 0)
    return None if index is not None and int(index) < 0 else holder["positive_class"]


def load_model_files(source: str):
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


def resolve_device(device: str):
    import torch

    if device == "cpu":
        return torch.device("cpu")
    cuda = torch.cuda.is_available()
    if device == "cuda" and not cuda:
        raise _core.InvalidArgument("device cuda: no CUDA device is available")
    return torch.device("cuda:0" if cuda else "cpu")
