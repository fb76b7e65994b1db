"""PyTorch definitions of melforge-train's models (trainer/models/*.{h,cpp}).

Each class has exactly the modules, parameter names and forward pass of its C++ counterpart, so a state dict saved
by the trainer loads here unchanged (and back). `build_model(config)` takes the dict `Classifier::config_json()`
writes, or the whole `weights.pt.json` of `melforge-train export` / a loaded checkpoint that holds it under
"model_config", and returns the module. `forward(x)` takes `[B, n_mels, n_frames]` or `[B, 1, n_mels, n_frames]`
float spectrograms and returns `(logits [B, num_classes], detection [B])`.

This module needs torch and imports it on import; `import melforge` does not import it (melforge.models is loaded
on first use of `melforge.models`). It depends on nothing else of the package, so tools that have torch but not
melforge installed (tools/check_export.py) load this file by path.
"""

from __future__ import annotations

import torch
from torch import nn


class _Classifier(nn.Module):
    """The common part of every model (trainer/models/model.h `Classifier`): the input normalisation buffers
    `input_mean` (0) and `input_std` (1), float32 scalars in the state dict, applied first as (x - mean) / std."""

    def __init__(self):
        super().__init__()
        self.register_buffer("input_mean", torch.zeros((), dtype=torch.float32))
        self.register_buffer("input_std", torch.ones((), dtype=torch.float32))

    def normalize_input(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.input_mean.to(x.dtype)) / self.input_std.to(x.dtype)


def _check_input(x: torch.Tensor, n_mels: int, n_frames: int, name: str) -> torch.Tensor:
    """Returns x as [B, 1, n_mels, n_frames]; raises ValueError for another shape."""
    ok = (x.dim() == 3 or (x.dim() == 4 and x.shape[1] == 1)) and x.shape[-2] == n_mels and x.shape[-1] == n_frames
    if not ok:
        raise ValueError(f"{name}: input of shape {list(x.shape)}, expected [B, {n_mels}, {n_frames}] or "
                         f"[B, 1, {n_mels}, {n_frames}]")
    return x.unsqueeze(1) if x.dim() == 3 else x


class Cnn(_Classifier):
    """`--model cnn` (trainer/models/cnn.cpp): input normalisation, three 3x3 convolutions with in-place ReLU, a 2x2 max-pool after the
    first two, a hidden fully connected layer with dropout, a multi-class head and a binary detection head."""

    def __init__(self, n_mels: int, n_frames: int, num_classes: int, channels=(16, 32, 64), hidden: int = 128,
                 dropout: float = 0.3):
        super().__init__()
        if n_mels < 4 or n_frames < 4:
            raise ValueError(f"cnn needs spectrograms of at least 4 x 4, got {n_mels} x {n_frames}")
        if num_classes < 2:
            raise ValueError(f"cnn needs at least 2 classes, got {num_classes}")
        channels = [int(c) for c in channels]
        if len(channels) != 3 or min(channels) < 1:
            raise ValueError(f"cnn needs 3 positive channel counts, got {channels}")
        self.n_mels, self.n_frames, self.num_classes = int(n_mels), int(n_frames), int(num_classes)
        self.channels, self.hidden, self.dropout_p = channels, int(hidden), float(dropout)
        self.conv1 = nn.Conv2d(1, channels[0], 3, padding=1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        self.conv3 = nn.Conv2d(channels[1], channels[2], 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.relu = nn.ReLU(inplace=True)
        flat = channels[2] * (self.n_mels // 2 // 2) * (self.n_frames // 2 // 2)
        self.fc = nn.Linear(flat, self.hidden)
        self.dropout = nn.Dropout(self.dropout_p)
        self.class_head = nn.Linear(self.hidden, self.num_classes)
        self.detect_head = nn.Linear(self.hidden, 1)

    def forward(self, x: torch.Tensor):
        h = self.normalize_input(_check_input(x, self.n_mels, self.n_frames, "cnn"))
        h = self.pool(self.relu(self.conv1(h)))
        h = self.pool(self.relu(self.conv2(h)))
        h = self.relu(self.conv3(h))
        h = self.dropout(self.relu(self.fc(h.flatten(1))))
        return self.class_head(h), self.detect_head(h).squeeze(1)

    def config(self) -> dict:
        """The same dict as CnnNetImpl::config_json()."""
        return {"model": "cnn", "n_mels": self.n_mels, "n_frames": self.n_frames, "num_classes": self.num_classes,
                "channels": list(self.channels), "hidden": self.hidden, "dropout": self.dropout_p}


class Crnn(_Classifier):
    """`--model crnn` (trainer/models/crnn.cpp): input normalisation, conv3x3(1->c0) ReLU maxpool 2x2 over (mel, time), conv3x3(c0->c1)
    ReLU maxpool (2,1) over mel only; the [B, c1, M/4, T/2] map becomes T/2 steps of c1*(M/4) features (channel
    major) for a one-layer batch-first GRU or LSTM from a zero initial state; the outputs are averaged over time,
    then linear(rnn_hidden -> hidden) ReLU dropout and the two heads of Cnn."""

    def __init__(self, n_mels: int, n_frames: int, num_classes: int, channels=(16, 32), rnn: str = "gru",
                 rnn_hidden: int = 64, hidden: int = 128, dropout: float = 0.3):
        super().__init__()
        if n_mels < 4 or n_frames < 2:
            raise ValueError(f"crnn needs spectrograms of at least 4 mel bands x 2 frames, got {n_mels} x {n_frames}")
        if num_classes < 2:
            raise ValueError(f"crnn needs at least 2 classes, got {num_classes}")
        channels = [int(c) for c in channels]
        if len(channels) != 2 or min(channels) < 1:
            raise ValueError(f"crnn needs 2 positive channel counts, got {channels}")
        if rnn not in ("gru", "lstm"):
            raise ValueError(f"crnn: unknown rnn '{rnn}' (gru or lstm)")
        self.n_mels, self.n_frames, self.num_classes = int(n_mels), int(n_frames), int(num_classes)
        self.channels, self.rnn_kind, self.rnn_hidden = channels, rnn, int(rnn_hidden)
        self.hidden, self.dropout_p = int(hidden), float(dropout)
        self.conv1 = nn.Conv2d(1, channels[0], 3, padding=1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.pool_mel = nn.MaxPool2d((2, 1))
        self.relu = nn.ReLU(inplace=True)
        rnn_cls = nn.GRU if rnn == "gru" else nn.LSTM
        self.rnn = rnn_cls(channels[1] * (self.n_mels // 2 // 2), self.rnn_hidden, num_layers=1, batch_first=True)
        self.fc = nn.Linear(self.rnn_hidden, self.hidden)
        self.dropout = nn.Dropout(self.dropout_p)
        self.class_head = nn.Linear(self.hidden, self.num_classes)
        self.detect_head = nn.Linear(self.hidden, 1)

    def forward(self, x: torch.Tensor):
        h = self.normalize_input(_check_input(x, self.n_mels, self.n_frames, "crnn"))
        h = self.pool(self.relu(self.conv1(h)))
        h = self.pool_mel(self.relu(self.conv2(h)))
        h = h.permute(0, 3, 1, 2).flatten(2)
        h, _ = self.rnn(h)
        h = self.dropout(self.relu(self.fc(h.mean(1))))
        return self.class_head(h), self.detect_head(h).squeeze(1)

    def config(self) -> dict:
        """The same dict as CrnnNetImpl::config_json()."""
        return {"model": "crnn", "n_mels": self.n_mels, "n_frames": self.n_frames, "num_classes": self.num_classes,
                "channels": list(self.channels), "rnn": self.rnn_kind, "rnn_hidden": self.rnn_hidden,
                "hidden": self.hidden, "dropout": self.dropout_p}


def model_config_of(config) -> dict:
    """The model configuration held by `config`: the dict `Classifier::config_json()` writes (returned as is), a
    dict that holds it under "model_config" (a `weights.pt.json` of `melforge-train export`, or a checkpoint loaded
    with `torch.load`), or either as JSON text. A "model_config" that is itself JSON text (checkpoints of format
    version 1) is parsed. Raises ValueError when no model configuration is found."""
    import json

    if isinstance(config, (str, bytes)):
        config = json.loads(config)
    if isinstance(config, dict) and "model_config" in config:
        config = config["model_config"]
        if isinstance(config, (str, bytes)):
            config = json.loads(config)
    if not isinstance(config, dict) or "model" not in config:
        raise ValueError("build_model: expected a model configuration (a dict with 'model', or one holding it under "
                         f"'model_config'), got {type(config).__name__}")
    return config


def build_model(config) -> nn.Module:
    """The module a model configuration describes.

    Parameters
    ----------
    config : dict or str
        `Classifier::config_json()` ({"model": "cnn" | "crnn", "n_mels", "n_frames", "num_classes", ...}), or the
        whole `weights.pt.json` / checkpoint dict that holds it under "model_config", or either as JSON text
        (see `model_config_of`).

    Returns
    -------
    torch.nn.Module
        `Cnn` or `Crnn` with freshly initialised parameters; `forward(x [B, n_mels, n_frames])` returns
        `(logits [B, num_classes], detection logits [B])`.

    Raises ValueError for an unknown model and KeyError for a missing field.
    """
    config = model_config_of(config)
    kind = config.get("model")
    if kind not in ("cnn", "crnn"):
        raise ValueError(f"unknown model '{kind}'")
    common = dict(n_mels=config["n_mels"], n_frames=config["n_frames"], num_classes=config["num_classes"],
                  channels=config["channels"], hidden=config["hidden"], dropout=config["dropout"])
    if kind == "cnn":
        return Cnn(**common)
    return Crnn(rnn=config["rnn"], rnn_hidden=config["rnn_hidden"], **common)
