"""PyTorch definitions of melforge-train's models (trainer/models/*.{h,cpp}).

Each class has exactly the modules, parameter names and forward pass of its C++ counterpart, so a state dict saved
by the trainer loads here unchanged (and back). `build_model(config)` takes the dict `Classifier::config_json()`
writes, or the whole `weights.pt.json` of `melforge-train export` / a loaded checkpoint that holds it under
"model_config", and returns the module. `forward(x)` takes `[B, n_mels, n_frames]` or `[B, 1, n_mels, n_frames]`
float spectrograms and returns `(logits [B, num_classes], detection [B])` for the classifiers (Cnn, Crnn), and
`(cosine logits [B, num_classes], embedding [B, embedding_dim])` for the speaker models (ResNetSE, Ecapa): the
cosines between the L2-normalised embedding and the L2-normalised rows of `aam.weight`, without scale or margin.
Each class names its two outputs in `output_names`.

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

    output_names = ("logits", "detection")

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


class _SqueezeExcite(nn.Module):
    """trainer/models/speaker.h `SqueezeExcite`: x * sigmoid(fc2(relu(fc1(mean of x over the axes after the
    channels))))."""

    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.fc1 = nn.Linear(channels, bottleneck)
        self.fc2 = nn.Linear(bottleneck, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=tuple(range(2, x.dim())))
        s = torch.sigmoid(self.fc2(torch.relu(self.fc1(s))))
        return x * s.view(x.shape[0], x.shape[1], *([1] * (x.dim() - 2)))


class _AttentiveStatsPool(nn.Module):
    """trainer/models/speaker.h `AttentiveStatsPool`: channel-wise attention over time, [B, D, T] -> [mu; sigma]
    [B, 2 D]; with global context the attention sees [x; mean_t x; std_t x] and has a tanh (ECAPA-TDNN)."""

    def __init__(self, channels: int, hidden: int, global_context: bool, eps: float):
        super().__init__()
        self.global_context, self.eps = bool(global_context), float(eps)
        self.conv1 = nn.Conv1d((3 if global_context else 1) * channels, hidden, 1)
        self.bn = nn.BatchNorm1d(hidden)
        self.conv2 = nn.Conv1d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x
        if self.global_context:
            mean = x.mean(2, keepdim=True).expand_as(x)
            std = torch.sqrt(torch.var(x, 2, unbiased=True, keepdim=True).clamp_min(self.eps)).expand_as(x)
            a = torch.cat((x, mean, std), 1)
        a = self.bn(torch.relu(self.conv1(a)))
        if self.global_context:
            a = torch.tanh(a)
        w = torch.softmax(self.conv2(a), 2)
        mu = (x * w).sum(2)
        sigma = torch.sqrt((((x * x) * w).sum(2) - mu * mu).clamp_min(self.eps))
        return torch.cat((mu, sigma), 1)


class _SpeakerModel(_Classifier):
    """trainer/models/speaker.h `SpeakerModel`: the AAM head `aam` (linear without bias, weight [num_classes,
    embedding_dim]). `forward` returns `(cosine logits [B, num_classes], embedding [B, embedding_dim])`: the cosine
    similarities between the L2-normalised embedding and the L2-normalised rows of `aam.weight` (no scale, no
    margin), and the raw embedding."""

    output_names = ("logits", "embedding")

    def __init__(self, name: str, n_mels: int, n_frames: int, num_classes: int, embedding_dim: int):
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"{name} needs at least 2 classes (speakers), got {num_classes}")
        if embedding_dim < 1:
            raise ValueError(f"{name}: embedding_dim must be >= 1, got {embedding_dim}")
        self.n_mels, self.n_frames, self.num_classes = int(n_mels), int(n_frames), int(num_classes)
        self.embedding_dim = int(embedding_dim)
        self.aam = nn.Linear(self.embedding_dim, self.num_classes, bias=False)
        nn.init.xavier_normal_(self.aam.weight)

    def speaker_output(self, embedding: torch.Tensor):
        cosine = nn.functional.linear(nn.functional.normalize(embedding, p=2, dim=1),
                                      nn.functional.normalize(self.aam.weight, p=2, dim=1))
        return cosine, embedding

    def input(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x normalised, as [B, n_mels, n_frames]."""
        return self.normalize_input(_check_input(x, self.n_mels, self.n_frames, name).squeeze(1))


class _SEBasicBlock(nn.Module):
    """trainer/models/resnet_se.h `SEBasicBlock`."""

    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.se = _SqueezeExcite(planes, planes // ResNetSE.REDUCTION)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn1(torch.relu(self.conv1(x)))
        out = self.se(self.bn2(self.conv2(out)))
        return torch.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNetSE(_SpeakerModel):
    """`--model resnet-se` (trainer/models/resnet_se.cpp): ResNetSE34V2 layout; input normalisation, conv1 (3x3,
    1 -> f0) ReLU bn1, four stages of SE basic blocks (3, 4, 6, 3; stride 2 on both axes at stages 2-4), the map
    reshaped channel-major to [B, f3 * ceil(M/8), ceil(T/8)], attentive statistics pooling, `fc` to the embedding,
    and the AAM head. `forward` returns `(cosine logits, embedding)`."""

    BLOCKS = (3, 4, 6, 3)
    FILTERS = {"half": (32, 64, 128, 256), "quarter": (16, 32, 64, 128)}
    ATTENTION, REDUCTION, EPS = 128, 8, 1e-5

    def __init__(self, n_mels: int, n_frames: int, num_classes: int, width: str = "half", embedding_dim: int = 192):
        super().__init__("resnet-se", n_mels, n_frames, num_classes, embedding_dim)
        if n_mels < 8 or n_frames < 8:
            raise ValueError(f"resnet-se needs spectrograms of at least 8 x 8, got {n_mels} x {n_frames}")
        if width not in self.FILTERS:
            raise ValueError(f"resnet-se: width must be half or quarter, got {width!r}")
        self.width = width
        f = self.FILTERS[width]
        self.conv1 = nn.Conv2d(1, f[0], 3, padding=1)
        self.bn1 = nn.BatchNorm2d(f[0])
        inplanes = f[0]
        for stage, blocks in enumerate(self.BLOCKS):
            layer = nn.ModuleList()
            for b in range(blocks):
                layer.append(_SEBasicBlock(inplanes, f[stage], 2 if b == 0 and stage > 0 else 1))
                inplanes = f[stage]
            setattr(self, f"layer{stage + 1}", layer)
        out_mels = self.n_mels
        for _ in range(3):
            out_mels = (out_mels + 1) // 2
        features = f[3] * out_mels
        self.pool = _AttentiveStatsPool(features, self.ATTENTION, False, self.EPS)
        self.fc = nn.Linear(2 * features, self.embedding_dim)

    def forward(self, x: torch.Tensor):
        h = self.bn1(torch.relu(self.conv1(self.input(x, "resnet-se").unsqueeze(1))))
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in layer:
                h = block(h)
        h = h.reshape(h.shape[0], -1, h.shape[-1])
        return self.speaker_output(self.fc(self.pool(h)))

    def config(self) -> dict:
        """The same dict as ResNetSEImpl::config_json()."""
        return {"model": "resnet-se", "n_mels": self.n_mels, "n_frames": self.n_frames,
                "num_classes": self.num_classes, "width": self.width, "embedding_dim": self.embedding_dim}


class _SERes2Block(nn.Module):
    """trainer/models/ecapa.h `SERes2Block`."""

    def __init__(self, channels: int, dilation: int):
        super().__init__()
        self.width = channels // Ecapa.SCALE
        self.conv1 = nn.Conv1d(channels, channels, 1)
        self.bn1 = nn.BatchNorm1d(channels)
        self.convs = nn.ModuleList(nn.Conv1d(self.width, self.width, 3, dilation=dilation, padding=dilation)
                                   for _ in range(Ecapa.SCALE - 1))
        self.bns = nn.ModuleList(nn.BatchNorm1d(self.width) for _ in range(Ecapa.SCALE - 1))
        self.conv3 = nn.Conv1d(channels, channels, 1)
        self.bn3 = nn.BatchNorm1d(channels)
        self.se = _SqueezeExcite(channels, Ecapa.SE_BOTTLENECK)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        groups = torch.split(self.bn1(torch.relu(self.conv1(x))), self.width, 1)
        parts, y = [], None
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            y = groups[0] if i == 0 else y + groups[i]
            y = bn(torch.relu(conv(y)))
            parts.append(y)
        parts.append(groups[-1])
        return self.se(self.bn3(torch.relu(self.conv3(torch.cat(parts, 1))))) + x


class Ecapa(_SpeakerModel):
    """`--model ecapa` (trainer/models/ecapa.cpp): ECAPA-TDNN; input normalisation, conv1 (5 taps, M -> C) ReLU bn1,
    three SE-Res2Net blocks (dilations 2, 3, 4) with summed inputs, layer4 (1x1, 3 C -> 3 C) ReLU over the three
    outputs, attentive statistics pooling with global context, pool_bn, `fc` to the embedding, embedding_bn, and the
    AAM head. `forward` returns `(cosine logits, embedding)`."""

    SCALE, DILATIONS, SE_BOTTLENECK, ATTENTION, EPS = 8, (2, 3, 4), 128, 256, 1e-4

    def __init__(self, n_mels: int, n_frames: int, num_classes: int, channels: int = 512, embedding_dim: int = 192):
        super().__init__("ecapa", n_mels, n_frames, num_classes, embedding_dim)
        if n_mels < 1 or n_frames < 2:
            raise ValueError(f"ecapa needs spectrograms of at least 1 x 2, got {n_mels} x {n_frames}")
        if channels < self.SCALE or channels % self.SCALE:
            raise ValueError(f"ecapa: channels must be a positive multiple of {self.SCALE}, got {channels}")
        self.channels = c = int(channels)
        self.conv1 = nn.Conv1d(self.n_mels, c, 5, padding=2)
        self.bn1 = nn.BatchNorm1d(c)
        self.layer1, self.layer2, self.layer3 = (_SERes2Block(c, d) for d in self.DILATIONS)
        self.layer4 = nn.Conv1d(3 * c, 3 * c, 1)
        self.pool = _AttentiveStatsPool(3 * c, self.ATTENTION, True, self.EPS)
        self.pool_bn = nn.BatchNorm1d(6 * c)
        self.fc = nn.Linear(6 * c, self.embedding_dim)
        self.embedding_bn = nn.BatchNorm1d(self.embedding_dim)

    def forward(self, x: torch.Tensor):
        h = self.bn1(torch.relu(self.conv1(self.input(x, "ecapa"))))
        x1 = self.layer1(h)
        x2 = self.layer2(h + x1)
        x3 = self.layer3(h + x1 + x2)
        pooled = self.pool(torch.relu(self.layer4(torch.cat((x1, x2, x3), 1))))
        return self.speaker_output(self.embedding_bn(self.fc(self.pool_bn(pooled))))

    def config(self) -> dict:
        """The same dict as EcapaImpl::config_json()."""
        return {"model": "ecapa", "n_mels": self.n_mels, "n_frames": self.n_frames, "num_classes": self.num_classes,
                "channels": self.channels, "embedding_dim": self.embedding_dim}


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
        `Cnn`, `Crnn`, `ResNetSE` or `Ecapa` with freshly initialised parameters. `forward(x [B, n_mels,
        n_frames])` returns `(logits [B, num_classes], detection logits [B])` for Cnn and Crnn, and `(cosine logits
        [B, num_classes], embedding [B, embedding_dim])` for the speaker models (their `output_names`).

    Raises ValueError for an unknown model and KeyError for a missing field.
    """
    config = model_config_of(config)
    kind = config.get("model")
    shape = dict(n_mels=config.get("n_mels"), n_frames=config.get("n_frames"), num_classes=config.get("num_classes"))
    if kind == "resnet-se":
        return ResNetSE(width=config["width"], embedding_dim=config["embedding_dim"], **shape)
    if kind == "ecapa":
        return Ecapa(channels=config["channels"], embedding_dim=config["embedding_dim"], **shape)
    if kind not in ("cnn", "crnn"):
        raise ValueError(f"unknown model '{kind}'")
    common = dict(n_mels=config["n_mels"], n_frames=config["n_frames"], num_classes=config["num_classes"],
                  channels=config["channels"], hidden=config["hidden"], dropout=config["dropout"])
    if kind == "cnn":
        return Cnn(**common)
    return Crnn(rnn=config["rnn"], rnn_hidden=config["rnn_hidden"], **common)
