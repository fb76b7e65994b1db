#!/usr/bin/python3
"""Generates a corpus of clips of any length, laid out like the public tagging datasets (issue 28).

Each clip is white noise at a seeded level with its class's evidence mixed in: a band of noise centred on the class's
frequency (class k of K at 300 * 2^(k * 4 / K) Hz, a third of an octave wide), 12 dB above the background. Clip lengths
are drawn log-uniform in [--min-seconds, --max-seconds] (FSD50K-like: 0.3 to 30 s). Written as 16 kHz mono 16-bit
PCM to

    OUT/audio/<class>/<class>_<index>.wav     and     OUT/manifest.csv  (path,label,split: 80/10/10 per class)

--evidence all     the class band sounds over the whole clip (the default);
--evidence late    only after --late-after seconds (default 10): every clip then lasts at least late-after + 1 s, and
                   a build that keeps the first seconds of each clip sees noise only, at chance.

The output depends only on the arguments: each clip's randomness comes from a generator seeded with (seed, class,
index). A marker file, OUT/.melforge_corpus.json, is written last; when it names the same arguments the run does
nothing (idempotent). Needs only Debian's python3 and python3-numpy: run with /usr/bin/python3.
"""
import argparse
import json
import os
import sys
import wave

import numpy as np

RATE = 16000


def band_noise(rng, n, centre_hz):
    """White noise filtered to a third of an octave around centre_hz (FFT mask), unit RMS."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1.0 / RATE)
    lo, hi = centre_hz * 2 ** (-1 / 6), centre_hz * 2 ** (1 / 6)
    spec[(f < lo) | (f > hi)] = 0
    x = np.fft.irfft(spec, n)
    return x / max(np.sqrt(np.mean(x * x)), 1e-12)


def clip(rng, seconds, centre_hz, evidence_from):
    n = max(1, int(round(seconds * RATE)))
    x = rng.standard_normal(n) * 0.02
    start = min(n, int(round(evidence_from * RATE)))
    if start < n:
        x[start:] += band_noise(rng, n - start, centre_hz) * 0.02 * 10 ** (12 / 20)
    x *= 10 ** (rng.uniform(-6, 6) / 20)
    return np.clip(x, -1, 1)


def write_wav(path, x):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes((x * 32767).astype("<i2").tobytes())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--per-class", type=int, default=30)
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--evidence", choices=["all", "late"], default="all")
    ap.add_argument("--late-after", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.classes < 2 or a.per_class < 1 or not 0 < a.min_seconds <= a.max_seconds:
        sys.exit("make_varlen_corpus: need --classes >= 2, --per-class >= 1, 0 < --min-seconds <= --max-seconds")
    args = vars(a).copy()
    args.pop("out")
    marker = os.path.join(a.out, ".melforge_corpus.json")
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == args:
                return
        os.remove(marker)
    lo = a.min_seconds if a.evidence == "all" else max(a.min_seconds, a.late_after + 1)
    hi = max(lo, a.max_seconds)
    rows = ["path,label,split"]
    total = 0.0
    for k in range(a.classes):
        name = f"class{k:02d}"
        centre = 300.0 * 2 ** (k * 4.0 / a.classes)
        for i in range(a.per_class):
            rng = np.random.default_rng([a.seed, k, i])
            seconds = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
            x = clip(rng, seconds, centre, a.late_after if a.evidence == "late" else 0.0)
            rel = f"audio/{name}/{name}_{i:03d}.wav"
            write_wav(os.path.join(a.out, rel), x)
            total += len(x) / RATE
            split = "train" if i % 10 < 8 else ("val" if i % 10 == 8 else "test")
            rows.append(f"{rel},{name},{split}")
    with open(os.path.join(a.out, "manifest.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    with open(marker, "w") as f:
        json.dump(args, f)
    print(f"make_varlen_corpus: {a.classes * a.per_class} clips, {total:.1f} s of audio in {a.out}")


if __name__ == "__main__":
    main()
