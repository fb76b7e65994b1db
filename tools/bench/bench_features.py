#!/usr/bin/env python3
"""melforge's Python front-ends against torchaudio on 1 thread, side by side in one run (issue 31).

Rows: melforge.MelSpectrogram vs torchaudio.transforms.MelSpectrogram at torchaudio's defaults (16 kHz, n_fft 400,
hop 200, 128 mels) and at two recipe settings (16 kHz n_fft 512 win 400 hop 160 80 mels; 32 kHz n_fft 1024 hop 320
64 mels 50-14000 Hz, PANNs/AST-like), and, when the package has melforge.compliance.kaldi, its fbank vs
torchaudio.compliance.kaldi.fbank (80 bins, 16 kHz, torchaudio's defaults otherwise: povey window, dither 0). Each on
one utterance (a float32 torch tensor, [time] for the modules and [1, time] for fbank) of 4, 8 and 12 s.

Both on 1 thread (torch.set_num_threads(1), melforge threads=1; both compute on the calling thread). The two sides
are called alternately, `--repeats` rounds after `--warmup` (so the engines/plans of melforge and torch's caches are
built before timing). Printed per side: the median wall time, and the least CPU time of the calling thread
(time.thread_time; both compute on it, so this is all their work). On a loaded machine a call of a few ms is often
descheduled and its wall time grows with the load, not with the work: the CPU-time ratio (torchaudio / melforge) is
the figure to quote there. The last column is the largest |melforge - torchaudio| / max|torchaudio| over the output,
a check that both computed the same thing.

Usage (torchaudio 2.11 from PyPI in the project venv; tools/setup_python.sh's header):
    MELFORGE_BUILD_DIR=$PWD/build MELFORGE_PY_EXTRAS="torchaudio==2.11.0" bash tools/setup_python.sh
    build/python-venv/bin/python tools/bench/bench_features.py [--repeats 15] [--warmup 3] [--seconds 4,8,12]
"""
import argparse
import importlib
import statistics
import time
import warnings

import numpy as np
import torch
import torchaudio

import melforge

MEL_SETTINGS = [
    ("torchaudio defaults", dict(sample_rate=16000)),
    ("recipe 16 kHz", dict(sample_rate=16000, n_fft=512, win_length=400, hop_length=160, n_mels=80)),
    ("recipe 32 kHz", dict(sample_rate=32000, n_fft=1024, hop_length=320, n_mels=64, f_min=50.0, f_max=14000.0)),
]
FBANK = dict(num_mel_bins=80, sample_frequency=16000.0)


def utterance(seconds, rate, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    x = 0.3 * np.sin(2 * np.pi * (180 + 40 * t) * t) + 0.05 * rng.standard_normal(t.size)
    return torch.from_numpy(x.astype(np.float32))


def timed(fn):
    wall, cpu = time.perf_counter(), time.thread_time()
    out = fn()
    return out, time.perf_counter() - wall, time.thread_time() - cpu


def side_by_side(ours, peer, repeats, warmup):
    """(median wall, least CPU) seconds of ours and peer, called alternately, and the largest relative difference of
    their last outputs."""
    for _ in range(warmup):
        ours()
        peer()
    t = {"ours": ([], []), "peer": ([], [])}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("peer", peer)):
            out, wall, cpu = timed(fn)
            t[name][0].append(wall)
            t[name][1].append(cpu)
            if name == "ours":
                a = out
            else:
                b = out
    med = {k: (statistics.median(v[0]), min(v[1])) for k, v in t.items()}
    diff = float((a.double() - b.double()).abs().max() / b.double().abs().max())
    return med, diff


def row(label, seconds, med, diff):
    ow, oc = med["ours"]
    pw, pc = med["peer"]
    print(f"{label:<22} {seconds:>4.0f} s | {ow * 1e3:9.3f} {pw * 1e3:9.3f} {pw / ow:8.2f}x{'':<7} | "
          f"{oc * 1e3:9.3f} {pc * 1e3:9.3f} {pc / oc:8.2f}x{'':<7} | {diff:.1e}")
    return pc / oc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seconds", default="4,8,12")
    args = parser.parse_args()
    seconds = [float(s) for s in args.seconds.split(",")]
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, torchaudio {torchaudio.__version__}, melforge {melforge.__version__}; "
          f"1 thread; median of {args.repeats} alternate calls after {args.warmup}; ratio = torchaudio / melforge")
    print(f"{'':<29} | {'median wall ms: melforge, torchaudio':<36} | {'least cpu ms: melforge, torchaudio':<36} "
          f"| max rel diff")
    ratios = {}
    for label, params in MEL_SETTINGS:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torchaudio's defaults leave mel bands without an FFT bin; both warn
            ours = melforge.MelSpectrogram(**params, threads=1)
            peer = torchaudio.transforms.MelSpectrogram(**params)
        for i, s in enumerate(seconds):
            x = utterance(s, params["sample_rate"], i)
            med, diff = side_by_side(lambda: ours(x), lambda: peer(x), args.repeats, args.warmup)
            ratios.setdefault(f"MelSpectrogram, {label}", []).append(row(label, s, med, diff))
    try:
        kaldi = importlib.import_module("melforge.compliance.kaldi")
    except ImportError:
        kaldi = None
    if kaldi is None or not hasattr(kaldi, "fbank"):
        print("fbank: melforge.compliance.kaldi.fbank is not in this build; rows left out")
    else:
        for i, s in enumerate(seconds):
            x = utterance(s, 16000, 10 + i)[None, :]
            med, diff = side_by_side(lambda: kaldi.fbank(x, **FBANK),
                                     lambda: torchaudio.compliance.kaldi.fbank(x, **FBANK), args.repeats, args.warmup)
            ratios.setdefault("fbank 80 bins 16 kHz", []).append(row("fbank 80 bins", s, med, diff))
    for name, r in ratios.items():
        print(f"{name}: cpu-time ratio {min(r):.2f}x to {max(r):.2f}x (geometric mean "
              f"{float(np.exp(np.mean(np.log(r)))):.2f}x)")


if __name__ == "__main__":
    main()
