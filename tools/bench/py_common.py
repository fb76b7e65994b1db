"""Shared parts of the Python peers (issue 4): torchaudio's MelSpectrogram + AmplitudeToDB written with plain torch
ops, the build configuration of tools/demo_build.ini, and small helpers.

torchaudio had no release for torch 2.14.1, the pin when this was written (`pip download torchaudio==2.14.1` finds
only 2.0.0 .. 2.11.0; the pin is now 2.11.0, and issue 16 moves the peers to the real torchaudio). `TorchaudioMel` is
written as torchaudio's own source
computes it (torchaudio/functional/functional.py: spectrogram, melscale_fbanks, _create_triangular_filterbank,
amplitude_to_DB; torchaudio/transforms/_transforms.py: MelSpectrogram, MelScale, AmplitudeToDB), the same op
sequence: torch.stft(center, reflect pad, periodic Hann) -> abs().pow(power) -> matmul with the [n_freqs, n_mels]
triangular filter bank -> multiplier * log10(clamp(x, amin)). When run with an interpreter that has torchaudio
(Debian's /usr/bin/python3: torchaudio 0.13 on torch 1.13), `make_mel(..., impl="torchaudio")` uses the real
transforms instead.
"""
from __future__ import annotations

import json
import math
import os
import resource
import statistics
import sys

import torch
from torch import nn

DEFAULTS = {  # melforge-build's defaults (builder --help), overridden by the INI file and the command line
    "sample-rate": 16000, "n-fft": 512, "win-length": 0, "hop-length": 0, "n-mels": 64, "f-min": 0.0, "f-max": 0.0,
    "power": 2.0, "amin": 1e-10, "short-seconds": 0.25, "max-seconds": 0.0, "split": "0.8,0.1,0.1", "seed": 42,
    "compression-level": 4,
}


def read_ini(path: str | None) -> dict:
    """melforge-build's `--config` format: `key = value` lines, `#` comments; returns DEFAULTS updated by it."""
    cfg = dict(DEFAULTS)
    if path:
        with open(path) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    k, v = (s.strip() for s in line.split("=", 1))
                    cfg[k] = v
    return cfg


def _hz_to_mel_htk(f: float) -> float:
    return 2595.0 * math.log10(1.0 + f / 700.0)


def _mel_to_hz_htk(m: torch.Tensor) -> torch.Tensor:
    return 700.0 * (10.0 ** (m / 2595.0) - 1.0)


def melscale_fbanks(n_freqs: int, f_min: float, f_max: float, n_mels: int, sample_rate: int) -> torch.Tensor:
    """torchaudio.functional.melscale_fbanks(..., norm=None, mel_scale="htk"): [n_freqs, n_mels]."""
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(_hz_to_mel_htk(f_min), _hz_to_mel_htk(f_max), n_mels + 2)
    f_pts = _mel_to_hz_htk(m_pts)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return torch.max(torch.zeros(1), torch.min(down, up))


class TorchaudioMel(nn.Module):
    """torchaudio.transforms.MelSpectrogram followed by AmplitudeToDB("power", top_db=None), op for op.
    forward: waveforms [B, samples] float32 -> [B, n_mels, n_frames] dB."""

    def __init__(self, sample_rate=16000, n_fft=512, win_length=None, hop_length=None, f_min=0.0, f_max=None,
                 n_mels=64, power=2.0, amin=1e-10):
        super().__init__()
        self.n_fft = n_fft
        self.win_length = win_length or n_fft
        self.hop_length = hop_length or self.win_length // 2
        self.power = power
        self.amin = amin
        self.multiplier = 10.0 if power == 2.0 else 20.0
        self.register_buffer("window", torch.hann_window(self.win_length))
        f_max = f_max or float(sample_rate // 2)
        self.register_buffer("fb", melscale_fbanks(n_fft // 2 + 1, f_min, f_max, n_mels, sample_rate))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(x, n_fft=self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                          window=self.window, center=True, pad_mode="reflect", normalized=False, onesided=True,
                          return_complex=True)
        spec = spec.abs().pow(self.power)
        mel = torch.matmul(spec.transpose(-1, -2), self.fb).transpose(-1, -2)
        return self.multiplier * torch.log10(torch.clamp(mel, min=self.amin))


def make_mel(cfg: dict, impl: str = "torch") -> nn.Module:
    """The mel transform of a build configuration (read_ini); impl "torch" (TorchaudioMel) or "torchaudio"."""
    kw = dict(sample_rate=int(cfg["sample-rate"]), n_fft=int(cfg["n-fft"]),
              win_length=int(cfg["win-length"]) or None, hop_length=int(cfg["hop-length"]) or None,
              f_min=float(cfg["f-min"]), f_max=float(cfg["f-max"]) or None, n_mels=int(cfg["n-mels"]),
              power=float(cfg["power"]))
    if impl == "torch":
        return TorchaudioMel(amin=float(cfg["amin"]), **kw)
    import torchaudio  # noqa: PLC0415  (only Debian's interpreter has it)
    return nn.Sequential(torchaudio.transforms.MelSpectrogram(center=True, pad_mode="reflect", norm=None,
                                                              mel_scale="htk", **kw),
                         torchaudio.transforms.AmplitudeToDB("power", top_db=None))


def peak_rss_bytes() -> dict:
    """Peak RSS of this process and of its largest reaped child (DataLoader workers), bytes."""
    return {"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def write_json(path: str | None, obj: dict) -> None:
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2)
        os.replace(tmp, path)


def set_threads(threads: int) -> None:
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
