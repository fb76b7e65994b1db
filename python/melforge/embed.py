"""`melforge.embed`: `melforge-train embed` of audio files from Python, with the speaker model in PyTorch.

Input listing (kernels/inputs: FolderWalk) and whole-clip features (kernels/featurize ClipFeaturizer: decode and
resample the whole file, its log-mel or fbank frames, float16 rounding as a schema-3 dataset stores them) are the
C++ code the binary runs; the model is `melforge.models` (ResNetSE or Ecapa) with the weights of a `--task
verification` checkpoint or export. Each file is one forward pass over all its frames (every one real), as
trainer/embed/embed_command.cpp embed_frames, and its embedding is L2-normalised.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, Union

from . import _core
from ._model_files import load_model_files, resolve_device


def _verification_model(checkpoint_or_export, device):
    """(model in eval mode on its device, mel dict) of a --task verification checkpoint or export."""
    from .models import build_checked_model, model_config_of

    what = os.fspath(checkpoint_or_export)
    state, config, mel, _, _ = load_model_files(checkpoint_or_export)
    task = model_config_of(config).get("task", "multiclass")
    if task != "verification":
        raise _core.FormatError(f"embed needs a --task verification checkpoint or export; {what} was trained with "
                                f"--task {str(task)[:40]} (melforge.predict gives its class scores)")
    if not isinstance(state, dict):
        raise _core.FormatError(f"{what}: entry 'model' is not a dict of tensors")
    net = build_checked_model(config, state, what)
    dev = resolve_device(device)
    return net.to(dev).eval(), mel, dev


def embed(checkpoint_or_export, paths: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]]],
          device: str = "cpu", threads: int = 0, include_hidden: bool = False, return_paths: bool = False):
    """Speaker embeddings of whole audio files, as `melforge-train embed --checkpoint C --out F FILES...` writes
    them (within 1e-5).

    Parameters
    ----------
    checkpoint_or_export : str or path
        A `--task verification` checkpoint of `melforge-train train` (e.g. `run/checkpoints/best.pt`), or an export
        of `melforge-train export` (`weights.pt` with `weights.pt.json` beside it, or the `.json` path).
    paths : str, path or iterable of them
        Audio files, or folders searched recursively for the extensions melforge-build scans (hidden entries
        skipped unless `include_hidden`), sorted by path within each folder.
    device : {"cpu", "cuda", "auto"}
        Where the model runs.
    threads : int
        CPU threads for the features and the model (0: all cores; torch's setting is restored afterwards).
    include_hidden : bool
        Also read entries whose name starts with '.' inside input folders.
    return_paths : bool
        Also return the files the rows belong to (a folder gives one row per audio file inside it).

    Returns
    -------
    torch.Tensor or (torch.Tensor, list of str)
        float32 [N, E] on the CPU, one L2-normalised row per audio file in input order (a dot product of two rows
        is their cosine score); with `return_paths`, also the N file paths.

    Raises
    ------
    InvalidArgument
        Bad parameters (before any work), or no audio file in the inputs.
    FormatError
        The checkpoint or export is not of a --task verification model, or is damaged.
    IoError, AudioError
        A missing checkpoint; an input that cannot be listed or decoded (named; nothing is returned then).
    """
    if device not in ("cpu", "cuda", "auto"):
        raise _core.InvalidArgument(f"--device: '{device}' is not one of cpu, cuda, auto")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise _core.InvalidArgument(f"--threads must be an integer >= 0 (got {threads!r})")
    if isinstance(paths, (str, bytes, os.PathLike)):
        paths = [paths]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise _core.InvalidArgument("embed needs at least one input file or folder")
    import torch

    net, mel, dev = _verification_model(checkpoint_or_export, device)
    inputs = _core.collect_inputs(paths, include_hidden)
    if not inputs:
        raise _core.InvalidArgument("no audio files found in the inputs")
    for path, error in inputs:
        if error:
            raise _core.IoError(f"embed: {path}: {error}")
    featurize = _core.ClipFeaturizer(json.dumps(mel), threads)
    torch_threads = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        rows = _embed_files(net, featurize, [p for p, _ in inputs], dev)
    finally:
        torch.set_num_threads(torch_threads)
    out = torch.stack(rows)
    return (out, [p for p, _ in inputs]) if return_paths else out


def _embed_files(net, featurize, paths, dev):
    """The L2-normalised embedding (float32 [E], CPU) of each file: one forward pass over all its frames."""
    import torch

    rows = []
    with torch.no_grad():
        for path in paths:
            try:
                frames, _ = featurize(path)
            except _core.IoError as e:  # AudioError is an IoError
                raise type(e)(f"embed: {path}: {e}") from None
            x = torch.from_numpy(frames).t().unsqueeze(0).contiguous().to(dev)
            lengths = torch.full((1,), x.shape[-1], dtype=torch.int64, device=dev)
            e = net(x, lengths)[1].float().squeeze(0).cpu()
            rows.append(e / e.norm().clamp_min(1e-12))
    return rows
