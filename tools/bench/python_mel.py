#!/usr/bin/env python3
"""melforge.MelSpectrogram against torchaudio.transforms.MelSpectrogram, side by side in one run.

Same float32 input, same parameters, on 1 and 2 threads (torch.set_num_threads for torchaudio, threads= for
melforge); median wall time of --repeats calls after --warmup calls; prints both, the ratio, and the largest
relative difference of the outputs (|a - b| / max|b| over the whole output, and per element above 1e-6 of the peak).

Workloads: a batch of 64 clips of 2 s at 16 kHz ([64, 32000]) and one 60 s signal ([960000]).
Parameters: sample_rate 16000, n_fft 512, hop_length 160, n_mels 64, hann, power 2, center, reflect, htk, no norm,
log none (torchaudio's output: mel power).

Usage (torchaudio 2.11 from PyPI in the venv):
    MELFORGE_BUILD_DIR=$PWD/build MELFORGE_PY_EXTRAS="torchaudio==2.11.0" bash tools/setup_python.sh
    build/python-venv/bin/python tools/bench/python_mel.py [--repeats 7] [--warmup 2] [--threads 1,2] [--json OUT]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch
import torchaudio

import melforge

PARAMS = dict(sample_rate=16000, n_fft=512, hop_length=160, n_mels=64)


def median_seconds(fn, repeats, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def workloads():
    rng = np.random.default_rng(0)
    batch = (0.1 * rng.standard_normal((64, 32000))).astype(np.float32)
    t = np.arange(60 * 16000) / 16000.0
    long = (0.3 * np.sin(2 * np.pi * (200 + 30 * t) * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    return [("64 x 2 s", batch), ("1 x 60 s", long)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--json", help="also write the rows as JSON to this file")
    args = parser.parse_args()

    print(f"torch {torch.__version__}, torchaudio {torchaudio.__version__}, melforge {melforge.__version__}; "
          f"{PARAMS}, log none; median of {args.repeats} after {args.warmup} warm-up calls")
    peer = torchaudio.transforms.MelSpectrogram(**PARAMS)
    rows = []
    header = f"{'input':<10} {'threads':>7} {'torchaudio ms':>14} {'melforge ms':>12} {'speed-up':>9} " \
             f"{'max rel diff':>13} {'max elem rel':>13}"
    print(header)
    for name, x in workloads():
        xt = torch.from_numpy(x)
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            ours = melforge.MelSpectrogram(**PARAMS, threads=threads)
            with torch.inference_mode():
                want = peer(xt).numpy()
                t_peer = median_seconds(lambda: peer(xt), args.repeats, args.warmup)
            got = ours(x)
            t_ours = median_seconds(lambda: ours(x), args.repeats, args.warmup)
            diff = np.abs(got.astype(np.float64) - want)
            peak = np.abs(want).max()
            rel = float(diff.max() / peak)
            big = np.abs(want) > 1e-6 * peak
            elem = float((diff[big] / np.abs(want[big])).max())
            row = dict(input=name, shape=list(x.shape), threads=threads, torchaudio_ms=1e3 * t_peer,
                       melforge_ms=1e3 * t_ours, speedup=t_peer / t_ours, max_rel_diff=rel, max_elem_rel=elem)
            rows.append(row)
            print(f"{name:<10} {threads:>7} {row['torchaudio_ms']:>14.2f} {row['melforge_ms']:>12.2f} "
                  f"{row['speedup']:>8.2f}x {rel:>13.2e} {elem:>13.2e}")
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(params=PARAMS, torch=torch.__version__, torchaudio=torchaudio.__version__,
                           repeats=args.repeats, warmup=args.warmup, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
