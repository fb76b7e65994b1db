"""PyTorch definitions of melforge-train's models (trainer/models/*.{h,cpp}).

Each class has exactly the modules, parameter names and forward pass of its C++ counterpart, so a state dict saved
by the trainer loads here unchanged (and back). `build_model(config)` takes the dict `Classifier::config_json()`
writes, or the whole `weights.pt.json` of `melforge-train export` / a loaded checkpoint that holds it under
"model_config", and returns the module. `forward(x, lengths=None)` takes `[B, n_mels, T]` or `[B, 1, n_mels, T]`
float spectrograms of any T >= 1 (a Cnn of `time_pool` "flatten", from a checkpoint older than inputs of any length:
exactly `n_frames`) and optionally `lengths` (int64 [B], real frames per row, 1 <= lengths[b] <= T: row b is its real
frames, then padding; None: every frame real; `lengths_of(mask)` turns a bool [B, T] mask into it). Every model pools
over the real frames only, so in eval mode a padded row gives the output of the row alone, whatever the padding
holds. It returns `(logits [B, num_classes], detection [B])` for the classifiers (Cnn, Crnn), and
`(cosine logits [B, num_classes], embedding [B, embedding_dim])` for the speaker models (ResNetSE, Ecapa): the
cosines between the L2-normalised embedding and the L2-normalised rows of `aam.weight`, without scale or margin.
Each class names its two outputs in `output_names`.

This module needs torch and imports it on import; `import melforge` does not import it (melforge.models is loaded
on first use of `melforge.models`). It depends on nothing else of the package, so tools that have torch but not
melforge installed (tools/check_export.py) load this file by path.
"""

from __future__ import annotations

import io

import torch
from torch import nn


class _Classifier(nn.Module):
    """The common part of every model (trainer/models/model.h `Classifier`): the input normalisation buffers
    `input_mean` (0) and `input_std` (1), float32 scalars in the state dict, applied first as (x - mean) / std; or,
    with `cmn` on, per-utterance cepstral mean normalisation instead (`cepstral_mean_normalize`)."""

    output_names = ("logits", "detection")
    #: The task the model was trained for (its configuration's "task"; build_model sets it): "multiclass",
    #: "multilabel" or "verification".
    task = "multiclass"
    #: Per-utterance cepstral mean normalisation (the configuration's "cmn", absent: off; build_model sets it).
    cmn = False

    def __init__(self):
        super().__init__()
        self.register_buffer("input_mean", torch.zeros((), dtype=torch.float32))
        self.register_buffer("input_std", torch.ones((), dtype=torch.float32))

    def class_scores(self, logits: torch.Tensor) -> torch.Tensor:
        """Class scores from the first output, as melforge-train predict computes them: softmax over the classes
        (multiclass: they sum to 1), or the sigmoid of each logit (multilabel: one independent probability per
        class). Raises ValueError for a verification model (its outputs are cosines, not class scores)."""
        if self.task == "multilabel":
            return torch.sigmoid(logits.float())
        if self.task == "verification":
            raise ValueError("class_scores: a --task verification model has no class scores (use its embedding)")
        return torch.softmax(logits.float(), -1)

    def normalize_input(self, x: torch.Tensor, lengths=None) -> torch.Tensor:
        """Classifier::normalize_input: cepstral_mean_normalize(x, lengths) with `cmn` on, else
        (x - input_mean) / input_std."""
        if self.cmn:
            return cepstral_mean_normalize(x, lengths)
        return (x - self.input_mean.to(x.dtype)) / self.input_std.to(x.dtype)


def cepstral_mean_normalize(x: torch.Tensor, lengths=None) -> torch.Tensor:
    """trainer/models/model.h cepstral_mean_normalize: x [B, ..., n_mels, T] minus each row's mean of each mel bin
    over its real frames (t < lengths[b]; None: every frame), the padding frames set to 0."""
    if lengths is None:
        return x - x.mean(-1, keepdim=True)
    mask = _time_mask(x, lengths)
    n = lengths.view(x.shape[0], *([1] * (x.dim() - 1))).to(x.dtype)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    mean = torch.where(mask, x, zero).sum(-1, keepdim=True) / n
    return torch.where(mask, x - mean, zero)


def _check_input(x: torch.Tensor, n_mels: int, name: str, min_frames: int = 1, max_frames: int | None = None):
    """Returns x as [B, 1, n_mels, T] (min_frames <= T <= max_frames, None: no maximum); raises ValueError for
    another shape (trainer/models/model.h spectrogram_input)."""
    t = x.shape[-1] if x.dim() >= 1 else 0
    ok = ((x.dim() == 3 or (x.dim() == 4 and x.shape[1] == 1)) and x.shape[-2] == n_mels and t >= min_frames
          and (max_frames is None or t <= max_frames))
    if not ok:
        fixed = max_frames == min_frames
        w = str(min_frames) if fixed else "T"
        where = "" if fixed else f" with T >= {min_frames}"
        raise ValueError(f"{name}: input of shape {list(x.shape)}, expected [B, {n_mels}, {w}] or "
                         f"[B, 1, {n_mels}, {w}]{where}")
    return x.unsqueeze(1) if x.dim() == 3 else x


def lengths_of(mask: torch.Tensor) -> torch.Tensor:
    """Real frames per row, int64 [B], of a bool mask [B, T] whose rows are real frames first, then padding (the
    `mask` of melforge.Dataset's batches)."""
    return mask.to(torch.int64).sum(1)


def _check_lengths(lengths, batch: int, frames: int, device, name: str):
    """trainer/models/time_mask.h check_lengths: None, or int64 [batch] within [1, frames], moved to `device`."""
    if lengths is None:
        return None
    if not isinstance(lengths, torch.Tensor) or lengths.dtype != torch.int64 or lengths.shape != (batch,):
        got = f"{lengths.dtype} {list(lengths.shape)}" if isinstance(lengths, torch.Tensor) else type(lengths).__name__
        raise ValueError(f"{name}: lengths must be an int64 tensor of shape [{batch}] (real frames per row), got {got}")
    if torch.compiler.is_compiling():  # torch.export / ONNX: a graph cannot branch on values (no check there)
        return lengths.to(device)
    bad = (lengths < 1) | (lengths > frames)
    if batch > 0 and bool(bad.any()):
        row = int(bad.to(torch.int64).argmax())
        raise ValueError(f"{name}: lengths[{row}] = {int(lengths[row])} real frames, outside [1, {frames}] "
                         "(the input's frames)")
    return lengths.to(device)


def _downsampled(lengths, k: int, t_out: int):
    """Real steps after a time downsampling by k to t_out steps: max(1, min(ceil(lengths / k), t_out))."""
    return None if lengths is None else torch.div(lengths + (k - 1), k, rounding_mode="floor").clamp(1, t_out)


def _time_mask(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """bool [B, 1, ..., 1, T] for x [B, ..., T], true at the real steps."""
    mask = torch.arange(x.shape[-1], device=lengths.device)[None, :] < lengths[:, None]
    return mask.view(x.shape[0], *([1] * (x.dim() - 2)), x.shape[-1])


def _mask_time(x: torch.Tensor, lengths):
    """x with the steps after each row's real ones set to 0 (x itself for lengths None)."""
    return x if lengths is None else torch.where(_time_mask(x, lengths), x, torch.zeros((), dtype=x.dtype,
                                                                                        device=x.device))


def _pad_time(x: torch.Tensor, k: int) -> torch.Tensor:
    """x padded with zeros at the end of the time axis to a multiple of k steps."""
    extra = (k - x.shape[-1] % k) % k
    return nn.functional.pad(x, (0, extra)) if extra else x


def _masked_mean(x: torch.Tensor, lengths) -> torch.Tensor:
    """The mean of x [B, ..., T] over the real steps: [B, ...]."""
    if lengths is None:
        return x.mean(-1)
    return _mask_time(x, lengths).sum(-1) / lengths.view(-1, *([1] * (x.dim() - 2))).to(x.dtype)


def _masked_max(x: torch.Tensor, lengths) -> torch.Tensor:
    """The maximum of x [B, ..., T] over the real steps: [B, ...]."""
    if lengths is None:
        return x.amax(-1)
    return torch.where(_time_mask(x, lengths), x, torch.full((), float("-inf"), dtype=x.dtype,
                                                             device=x.device)).amax(-1)


class Cnn(_Classifier):
    """`--model cnn` (trainer/models/cnn.cpp): input normalisation, three 3x3 convolutions with in-place ReLU, a 2x2
    max-pool after the first two, a pooling over time, a hidden fully connected layer with dropout, a multi-class head
    and a binary detection head. `time_pool` "mean_max" (the default): the time axis is padded with zeros to a
    multiple of 4, the padding is zeros before each convolution, and the last map's mean and maximum over the real
    steps (ceil(lengths / 4)), each flattened channel-major, are concatenated; any T. "flatten" (checkpoints from
    before the field): the whole map flattened; T must be n_frames and every row full."""

    TIME_POOLS = ("mean_max", "flatten")

    def __init__(self, n_mels: int, n_frames: int, num_classes: int, channels=(16, 32, 64), hidden: int = 128,
                 dropout: float = 0.3, time_pool: str = "mean_max"):
        super().__init__()
        if time_pool not in self.TIME_POOLS:
            raise ValueError(f"cnn: unknown time_pool {time_pool!r} (mean_max or flatten)")
        min_frames = 4 if time_pool == "flatten" else 1
        if n_mels < 4 or n_frames < min_frames:
            raise ValueError(f"cnn needs spectrograms of at least 4 x {min_frames}, got {n_mels} x {n_frames}")
        if num_classes < 2:
            raise ValueError(f"cnn needs at least 2 classes, got {num_classes}")
        channels = [int(c) for c in channels]
        if len(channels) != 3 or min(channels) < 1:
            raise ValueError(f"cnn needs 3 positive channel counts, got {channels}")
        self.n_mels, self.n_frames, self.num_classes = int(n_mels), int(n_frames), int(num_classes)
        self.channels, self.hidden, self.dropout_p = channels, int(hidden), float(dropout)
        self.time_pool = time_pool
        self.conv1 = nn.Conv2d(1, channels[0], 3, padding=1)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 3, padding=1)
        self.conv3 = nn.Conv2d(channels[1], channels[2], 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.relu = nn.ReLU(inplace=True)
        if time_pool == "flatten":
            flat = channels[2] * (self.n_mels // 2 // 2) * (self.n_frames // 2 // 2)
        else:
            flat = 2 * channels[2] * (self.n_mels // 2 // 2)
        self.fc = nn.Linear(flat, self.hidden)
        self.dropout = nn.Dropout(self.dropout_p)
        self.class_head = nn.Linear(self.hidden, self.num_classes)
        self.detect_head = nn.Linear(self.hidden, 1)

    def _flatten_features(self, x: torch.Tensor, lengths) -> torch.Tensor:
        if lengths is not None and bool((lengths < x.shape[-1]).any()):
            raise ValueError(f"cnn: this model (time_pool flatten: a checkpoint from before inputs of any length) "
                             f"reads every frame of its {self.n_frames}-frame input and cannot leave padding out; "
                             "give it full rows only")
        h = self.normalize_input(x, lengths)
        h = self.pool(self.relu(self.conv1(h)))
        h = self.pool(self.relu(self.conv2(h)))
        return self.relu(self.conv3(h)).flatten(1)

    def _mean_max_features(self, x: torch.Tensor, lengths) -> torch.Tensor:
        if lengths is None and x.shape[-1] % 4:
            lengths = torch.full((x.shape[0],), x.shape[-1], dtype=torch.int64, device=x.device)
        h = _mask_time(_pad_time(self.normalize_input(x, lengths), 4), lengths)
        h = self.pool(self.relu(self.conv1(h)))
        half = _downsampled(lengths, 2, h.shape[-1])
        h = self.pool(self.relu(self.conv2(_mask_time(h, half))))
        quarter = _downsampled(lengths, 4, h.shape[-1])
        h = self.relu(self.conv3(_mask_time(h, quarter)))
        return torch.cat((_masked_mean(h, quarter).flatten(1), _masked_max(h, quarter).flatten(1)), 1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None):
        flatten = self.time_pool == "flatten"
        x = _check_input(x, self.n_mels, "cnn", self.n_frames if flatten else 1, self.n_frames if flatten else None)
        lengths = _check_lengths(lengths, x.shape[0], x.shape[-1], x.device, "cnn")
        h = self._flatten_features(x, lengths) if flatten else self._mean_max_features(x, lengths)
        h = self.dropout(self.relu(self.fc(h)))
        return self.class_head(h), self.detect_head(h).squeeze(1)

    def config(self) -> dict:
        """The same dict as CnnNetImpl::config_json()."""
        return {"model": "cnn", "n_mels": self.n_mels, "n_frames": self.n_frames, "num_classes": self.num_classes,
                "channels": list(self.channels), "hidden": self.hidden, "dropout": self.dropout_p,
                "time_pool": self.time_pool, "cmn": self.cmn}


class Crnn(_Classifier):
    """`--model crnn` (trainer/models/crnn.cpp): input normalisation, the time axis padded with zeros to an even T,
    conv3x3(1->c0) ReLU maxpool 2x2 over (mel, time), conv3x3(c0->c1) ReLU maxpool (2,1) over mel only; the
    [B, c1, M/4, T/2] map becomes T/2 steps of c1*(M/4) features (channel major) for a one-layer batch-first GRU or
    LSTM from a zero initial state; the outputs are averaged over the real steps (ceil(lengths / 2); the padding is
    zeros before each convolution, and the forward-only recurrence's outputs at the real steps do not see the steps
    after them), then linear(rnn_hidden -> hidden) ReLU dropout and the two heads of Cnn."""

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

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None):
        x = _check_input(x, self.n_mels, "crnn")
        lengths = _check_lengths(lengths, x.shape[0], x.shape[-1], x.device, "crnn")
        if lengths is None and x.shape[-1] % 2:
            lengths = torch.full((x.shape[0],), x.shape[-1], dtype=torch.int64, device=x.device)
        h = _mask_time(_pad_time(self.normalize_input(x, lengths), 2), lengths)
        h = self.pool(self.relu(self.conv1(h)))
        steps = _downsampled(lengths, 2, h.shape[-1])
        h = self.pool_mel(self.relu(self.conv2(_mask_time(h, steps))))
        h = h.permute(0, 3, 1, 2).flatten(2)
        h, _ = self.rnn(h)
        h = self.dropout(self.relu(self.fc(_masked_mean(h.transpose(1, 2), steps))))
        return self.class_head(h), self.detect_head(h).squeeze(1)

    def config(self) -> dict:
        """The same dict as CrnnNetImpl::config_json()."""
        return {"model": "crnn", "n_mels": self.n_mels, "n_frames": self.n_frames, "num_classes": self.num_classes,
                "channels": list(self.channels), "rnn": self.rnn_kind, "rnn_hidden": self.rnn_hidden,
                "hidden": self.hidden, "dropout": self.dropout_p, "cmn": self.cmn}


class _SqueezeExcite(nn.Module):
    """trainer/models/speaker.h `SqueezeExcite`: x * sigmoid(fc2(relu(fc1(mean of x over the axes after the
    channels)))), the last axis (time) over its real steps only."""

    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.fc1 = nn.Linear(channels, bottleneck)
        self.fc2 = nn.Linear(bottleneck, channels)

    def forward(self, x: torch.Tensor, lengths=None) -> torch.Tensor:
        if lengths is None:
            s = x.mean(dim=tuple(range(2, x.dim())))
        else:
            s = _masked_mean(x, lengths)
            s = s.flatten(2).mean(2) if s.dim() > 2 else s
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

    def forward(self, x: torch.Tensor, lengths=None) -> torch.Tensor:
        if lengths is None and x.shape[2] == 1:
            lengths = torch.ones(x.shape[0], dtype=torch.int64, device=x.device)
        if lengths is None:
            return self._pool(x, None)
        mask = _time_mask(x, lengths)
        return self._pool(torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)), mask)

    def _pool(self, x: torch.Tensor, mask) -> torch.Tensor:
        a = x
        if self.global_context:
            if mask is None:
                mean = x.mean(2, keepdim=True)
                var = torch.var(x, 2, unbiased=True, keepdim=True)
            else:
                n = mask.sum(2, keepdim=True).to(x.dtype)
                mean = x.sum(2, keepdim=True) / n
                var = torch.where(mask, (x - mean).square(), torch.zeros((), dtype=x.dtype, device=x.device))
                var = var.sum(2, keepdim=True) / (n - 1).clamp_min(1)
            std = torch.sqrt(var.clamp_min(self.eps))
            a = torch.cat((x, mean.expand_as(x), std.expand_as(x)), 1)
        a = self.bn(torch.relu(self.conv1(a)))
        if self.global_context:
            a = torch.tanh(a)
        logits = self.conv2(a)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        w = torch.softmax(logits, 2)
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

    def input(self, x: torch.Tensor, lengths, name: str):
        """(x normalised as [B, n_mels, T] with zeros at the padding, lengths checked)."""
        x = _check_input(x, self.n_mels, name).squeeze(1)
        lengths = _check_lengths(lengths, x.shape[0], x.shape[-1], x.device, name)
        return _mask_time(self.normalize_input(x, lengths), lengths), lengths


class _SEBasicBlock(nn.Module):
    """trainer/models/resnet_se.h `SEBasicBlock`."""

    def __init__(self, inplanes: int, planes: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.se = _SqueezeExcite(planes, planes // ResNetSE.REDUCTION)
        self.stride = stride
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor, lengths=None):
        """(output, its real steps) for x [B, in, H, W] with `lengths` real steps of W."""
        out = self.bn1(torch.relu(self.conv1(_mask_time(x, lengths))))
        lengths = _downsampled(lengths, self.stride, out.shape[-1])
        out = self.se(self.bn2(self.conv2(_mask_time(out, lengths))), lengths)
        return torch.relu(out + (self.downsample(x) if self.downsample is not None else x)), lengths


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

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None):
        h, lengths = self.input(x, lengths, "resnet-se")
        h = self.bn1(torch.relu(self.conv1(h.unsqueeze(1))))
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            for block in layer:
                h, lengths = block(h, lengths)
        h = h.reshape(h.shape[0], -1, h.shape[-1])
        return self.speaker_output(self.fc(self.pool(h, lengths)))

    def config(self) -> dict:
        """The same dict as ResNetSEImpl::config_json()."""
        return {"model": "resnet-se", "n_mels": self.n_mels, "n_frames": self.n_frames,
                "num_classes": self.num_classes, "width": self.width, "embedding_dim": self.embedding_dim,
                "cmn": self.cmn}


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

    def forward(self, x: torch.Tensor, lengths=None) -> torch.Tensor:
        groups = torch.split(self.bn1(torch.relu(self.conv1(x))), self.width, 1)
        parts, y = [], None
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            y = groups[0] if i == 0 else y + groups[i]
            y = bn(torch.relu(conv(_mask_time(y, lengths))))
            parts.append(y)
        parts.append(groups[-1])
        return self.se(self.bn3(torch.relu(self.conv3(torch.cat(parts, 1)))), lengths) + x


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

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None):
        h, lengths = self.input(x, lengths, "ecapa")
        h = self.bn1(torch.relu(self.conv1(h)))
        x1 = self.layer1(h, lengths)
        x2 = self.layer2(h + x1, lengths)
        x3 = self.layer3(h + x1 + x2, lengths)
        pooled = self.pool(torch.relu(self.layer4(torch.cat((x1, x2, x3), 1))), lengths)
        return self.speaker_output(self.embedding_bn(self.fc(self.pool_bn(pooled))))

    def config(self) -> dict:
        """The same dict as EcapaImpl::config_json()."""
        return {"model": "ecapa", "n_mels": self.n_mels, "n_frames": self.n_frames, "num_classes": self.num_classes,
                "channels": self.channels, "embedding_dim": self.embedding_dim, "cmn": self.cmn}


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
        `Cnn`, `Crnn`, `ResNetSE` or `Ecapa` with freshly initialised parameters (a "cnn" configuration without
        "time_pool" is the "flatten" Cnn of older checkpoints). `forward(x [B, n_mels, T], lengths=None)` returns `(logits [B, num_classes], detection logits [B])` for Cnn and Crnn, and `(cosine logits
        [B, num_classes], embedding [B, embedding_dim])` for the speaker models (their `output_names`). Its
        `task` is the configuration's "task" (default "multiclass"); `class_scores(logits)` turns the logits into
        the class scores of that task (softmax, or sigmoid for multilabel).

    Raises ValueError for an unknown model and KeyError for a missing field.
    """
    config = model_config_of(config)
    model = _build_module(config)
    task = config.get("task", "multiclass")
    if task not in ("multiclass", "multilabel", "verification"):
        raise ValueError(f"unknown task '{task}'")
    model.task = task
    cmn = config.get("cmn", False)
    if not isinstance(cmn, bool):
        raise ValueError(f"model configuration: 'cmn' is {str(cmn)[:60]}, not true or false")
    model.cmn = cmn
    return model


def _build_module(config: dict) -> nn.Module:
    """The module of a model configuration (build_model without the task)."""
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
        return Cnn(time_pool=config.get("time_pool", "flatten"), **common)
    return Crnn(rnn=config["rnn"], rnn_hidden=config["rnn_hidden"], **common)


# ---------------------------------------------------------------------------------------------------------------
# Reading checkpoints and exports as untrusted files (issue 29): the same checks as trainer/train/checkpoint.cpp.

try:  # melforge.FormatError / InvalidArgument inside the package; tools that load this file by path get ValueError
    from ._core import FormatError as _FormatError
    from ._core import InvalidArgument as _InvalidArgument
except ImportError:  # pragma: no cover - loaded by path without the package
    _FormatError = _InvalidArgument = ValueError

#: Largest width, class count or input dimension a model configuration read from a file may hold (as the trainer's
#: kMaxModelWidth).
MAX_MODEL_WIDTH = 1 << 20

_STORAGE_ITEM_BYTES = {"FloatStorage": 4, "DoubleStorage": 8, "HalfStorage": 2, "BFloat16Storage": 2,
                       "LongStorage": 8, "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1,
                       "BoolStorage": 1}


class _StorageRef:
    """A storage named by the pickle: its dtype's name and item size, its record key and declared element count."""

    def __init__(self, kind, key, numel):
        self.kind, self.key, self.numel = kind, str(key), numel


class _TensorRef:
    """A tensor the pickle rebuilds, as metadata only: its storage, storage offset, size and stride."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, tuple(size), tuple(stride)


def _archive_metadata(path: str):
    """(the unpickled value with tensors as _TensorRef, {record key: bytes stored}) of the torch.save zip `path`,
    read with an unpickler that resolves nothing but tensors, storages and OrderedDict: nothing is allocated from
    the declared sizes and no code runs. Raises FormatError for anything else."""
    import collections
    import pickle
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            pickles = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pickles) != 1:
                raise _FormatError(f"{path}: not a torch archive (no single data.pkl)")
            prefix = pickles[0][: -len("data.pkl")] + "data/"
            records = {i.filename[len(prefix):]: i.file_size for i in z.infolist() if i.filename.startswith(prefix)}
            data = z.read(pickles[0])
    except (zipfile.BadZipFile, OSError, KeyError, ValueError) as e:
        if isinstance(e, _FormatError):
            raise
        raise _FormatError(f"{path}: not a readable torch archive (truncated or corrupt?): {e}") from None

    def rebuild(storage, offset, size, stride, *rest):
        return _TensorRef(storage, offset, size, stride)

    class Reader(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
                return rebuild
            if (module, name) == ("collections", "OrderedDict"):
                return collections.OrderedDict
            if module == "torch" and name in _STORAGE_ITEM_BYTES:
                return name
            raise _FormatError(f"{path}: holds Python objects other than tensors and plain values ({module}.{name});"
                               " melforge loads checkpoints weights-only and never runs code from a file")

        def persistent_load(self, pid):
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
                raise _FormatError(f"{path}: an unknown persistent reference in the pickle")
            kind = pid[1] if isinstance(pid[1], str) else getattr(pid[1], "__name__", str(pid[1]))
            if kind not in _STORAGE_ITEM_BYTES:
                raise _FormatError(f"{path}: a storage of type {kind!r}, not a real number type")
            return _StorageRef(kind, pid[2], pid[4])

    try:
        return Reader(io.BytesIO(data)).load(), records
    except _FormatError:
        raise
    except Exception as e:  # a malformed pickle raises many types
        raise _FormatError(f"{path}: not a readable torch archive (truncated or corrupt?): {e}") from None


def _check_tensor_ref(t: _TensorRef, where: str, records: dict):
    """Raises FormatError naming `where` unless the tensor's shape, strides and offset stay within its storage, and
    the storage's declared bytes within the bytes the file stores for it (the C++ reader's check_stored_tensor)."""
    ints = all(isinstance(v, int) for v in (t.offset, t.storage.numel, *t.size, *t.stride))
    if not ints or len(t.size) != len(t.stride) or len(t.size) > 8:
        raise _FormatError(f"{where} has a malformed shape or stride")
    for d, (n, s) in enumerate(zip(t.size, t.stride)):
        if n < 0:
            raise _FormatError(f"{where} has a negative size in dimension {d}")
        if n > 1 and s <= 0:
            raise _FormatError(f"{where} has stride {s} in dimension {d} (shape {list(t.size)}): a stride of 0 or "
                               "below repeats or reverses stored values")
    numel = 1
    for n in t.size:
        numel *= n
    if numel == 0:
        return
    expected, step = [], 1
    for n in reversed(t.size):
        expected.append(step)
        step *= n
    if any(n > 1 and s != e for n, s, e in zip(t.size, t.stride, reversed(expected))):
        raise _FormatError(f"{where} has strides {list(t.stride)} for shape {list(t.size)}: overlapping or permuted "
                           "views are refused (checkpoints store contiguous tensors)")
    item = _STORAGE_ITEM_BYTES[t.storage.kind]
    needed, declared = (t.offset + numel) * item, t.storage.numel * item
    stored = records.get(t.storage.key, 0)
    if t.offset < 0 or needed > declared or declared > stored:
        raise _FormatError(f"{where} of shape {list(t.size)} (storage offset {t.offset}) needs {needed} bytes, its "
                           f"storage declares {declared} and the file stores {stored}: the file is truncated or "
                           "crafted")


def _check_refs(value, path: str, records: dict, name: str = "", depth: int = 0):
    """_check_tensor_ref on every tensor inside `value` (dicts, lists, tuples), named as "entry 'model.fc.weight'"."""
    if depth > 64:
        raise _FormatError(f"{path}: entry '{name}' nests more than 64 levels deep")
    if isinstance(value, _TensorRef):
        _check_tensor_ref(value, f"{path}: entry '{name}'", records)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_refs(v, path, records, f"{name}.{k}" if name else str(k), depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_refs(v, path, records, f"{name}[{i}]", depth + 1)


def load_torch_file(path) -> object:
    """`torch.load(path, weights_only=True)` of an untrusted checkpoint or export, after checking every tensor's
    metadata in the archive (dtype, shape, strides, storage offset, declared and stored bytes) without reading its
    values. Raises melforge.FormatError (ValueError when this file is loaded by path) naming the file and the entry,
    melforge.InvalidArgument when `path` is not a regular file; never runs code from the file."""
    import os

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise _InvalidArgument(f"{path}: not a regular file (a checkpoint is read only from a regular file; a FIFO, "
                               "a device or a folder is refused before reading)")
    value, records = _archive_metadata(path)
    _check_refs(value, path, records)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a file that is not a torch archive
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise _FormatError(
                f"{path}: holds Python objects other than tensors and plain values; melforge loads checkpoints "
                "weights-only and never runs code from a file") from None
        raise _FormatError(f"{path}: not a readable torch archive: {str(e).splitlines()[0] if str(e) else e}") from None
    return obj


def check_model_config(config: dict, what: str) -> dict:
    """`config` (Classifier::config_json) after checking its widths, class count and input dimensions are integers
    from 1 to MAX_MODEL_WIDTH and dropout is in [0, 1): FormatError naming `what` and the field otherwise."""
    if not isinstance(config, dict):
        raise _FormatError(f"{what}: entry 'model_config' is not a dict")
    for field in ("n_mels", "n_frames", "num_classes", "hidden", "rnn_hidden", "embedding_dim", "channels"):
        if field not in config:
            continue
        values = config[field] if isinstance(config[field], (list, tuple)) else [config[field]]
        if len(values) > 8 or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_MODEL_WIDTH
                                      for v in values):
            raise _FormatError(f"{what}: entry 'model_config': '{field}' is {str(config[field])[:60]}, not an "
                               f"integer from 1 to {MAX_MODEL_WIDTH}")
    dropout = config.get("dropout", 0.0)
    if not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise _FormatError(f"{what}: entry 'model_config': 'dropout' is {str(dropout)[:60]}, not a number in [0, 1)")
    return config


def _available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo in bytes, or -1 when it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return -1


def build_checked_model(config, state: dict, what: str) -> nn.Module:
    """The model of `config` with the weights of `state` (a state dict read from `what`, a file we did not write):
    the configuration is bounded (check_model_config), the model is first built on the meta device (nothing
    allocated) to count its parameters, which must not exceed what `state` stores nor the available memory, and
    every entry of `state` must have the model's shape and dtype and finite values. Raises FormatError naming `what`
    and the field or entry (InvalidArgument when the model does not fit in MemAvailable)."""
    config = check_model_config(model_config_of(config), what)
    try:
        with torch.device("meta"):
            shell = build_model(config)
    except (KeyError, ValueError, TypeError) as e:
        raise _FormatError(f"{what}: entry 'model_config': {e}") from None
    parameters = sum(t.numel() for t in shell.state_dict().values())
    stored = sum(t.numel() for t in state.values() if isinstance(t, torch.Tensor))
    if parameters > 1.5 * stored + 65536:
        raise _FormatError(f"{what}: entry 'model_config' describes a model of {parameters:.3g} parameters, but "
                           f"entry 'model' stores {stored:.3g} values: the file is corrupt or crafted")
    available = _available_memory_bytes()
    if available >= 0 and parameters * 8 > available:
        raise _InvalidArgument(f"{what}: its model of {parameters:.3g} parameters needs about "
                           f"{parameters * 8 / 2**30:.1f} GiB, more than the {available / 2**30:.1f} GiB available "
                           "(MemAvailable)")
    for name, target in shell.state_dict().items():
        t = state.get(name)
        if not isinstance(t, torch.Tensor):
            raise _FormatError(f"{what}: missing entry '{name}' of the model")
        if t.shape != target.shape:
            raise _FormatError(f"{what}: entry '{name}' has shape {list(t.shape)} but the model's is "
                               f"{list(target.shape)}")
        if t.dtype != target.dtype:
            raise _FormatError(f"{what}: entry '{name}' has dtype {t.dtype} but the model's is {target.dtype}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise _FormatError(f"{what}: entry '{name}' holds NaN or infinite values (the file is corrupt, or was "
                               "saved from a diverged run)")
    for name in state:
        if name not in shell.state_dict():
            raise _FormatError(f"{what}: unexpected entry '{name}' (not in the model)")
    model = build_model(config)
    model.load_state_dict(state, strict=True)
    return model
