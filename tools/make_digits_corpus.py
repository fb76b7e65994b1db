#!/usr/bin/python3
"""Generates the demo spoken-digit corpus with espeak-ng.

Every digit "zero".."nine" is spoken by several espeak-ng voices (an English accent plus a voice variant such as
+m3 or +f2) at several speeds (-s, words per minute) and pitches (-p, 0..99). Each espeak-ng WAV (22050 Hz, 16-bit
mono) is trimmed of silence, resampled to 16 kHz (FFT resampling in numpy), given a seeded random gain, seeded random
leading and trailing silence (each file lasts 0.4 to 1.5 s) and seeded white noise at 25..40 dB SNR, and written as
16 kHz mono 16-bit PCM to

    OUT/<digit>/<voice>_<speed>_<pitch>.wav      e.g. OUT/seven/en-us-f2_160_35.wav   ('+' in a voice becomes '-')

--size small: 5 voices x 2 speeds x 1 pitch = 100 files, for tests.
--size full:  25 voices x 4 speeds x 2 pitches = 2000 files, enough variety to train a digit classifier.

The output depends only on --size and --seed (and the installed espeak-ng): each file's randomness comes from a
generator seeded with (seed, digit, voice, speed, pitch), so the order in which parallel workers finish does not
matter. A marker file, OUT/.melforge_corpus.json, is written last; when it names the same size, seed and generator
version and every listed file exists, the run does nothing (idempotent). Any other state is regenerated: the marker is
removed first, so an interrupted run is never mistaken for a complete corpus.

Needs only Debian's python3 and python3-numpy, and the espeak-ng binary. Run with /usr/bin/python3.
"""
import argparse
import concurrent.futures
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import wave
import zlib

import numpy as np

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
TARGET_RATE = 16000
MIN_SECONDS = 0.4
MAX_SECONDS = 1.5
MARKER = ".melforge_corpus.json"
# Bump when the output for a given (size, seed) changes, so that old corpora are regenerated.
GENERATOR_VERSION = 1

ACCENTS_FULL = ["en", "en-us", "en-gb-x-rp", "en-gb-scotland", "en-029"]
VARIANTS_FULL = ["m1", "m3", "m7", "f2", "f4"]
SIZES = {
    "small": {
        "voices": ["en+m1", "en-us+f2", "en-gb-x-rp+m3", "en-gb-scotland+f4", "en-029+m7"],
        "speeds": [140, 200],
        "pitches": [50],
    },
    "full": {
        "voices": [f"{a}+{v}" for a in ACCENTS_FULL for v in VARIANTS_FULL],
        "speeds": [130, 160, 190, 220],
        "pitches": [35, 65],
    },
}


def voice_tag(voice):
    """File-name form of an espeak-ng voice: '+' becomes '-'."""
    return voice.replace("+", "-")


def plan(size):
    """Every file of a corpus of `size`: list of (digit_index, voice, speed, pitch, relative path), sorted."""
    spec = SIZES[size]
    jobs = []
    for d, digit in enumerate(DIGITS):
        for voice in spec["voices"]:
            for speed in spec["speeds"]:
                for pitch in spec["pitches"]:
                    rel = os.path.join(digit, f"{voice_tag(voice)}_{speed}_{pitch}.wav")
                    jobs.append((d, voice, speed, pitch, rel))
    return sorted(jobs, key=lambda j: j[4])


def read_wav_int16(data):
    """Samples (float64 in [-1, 1)) and rate of a 16-bit mono WAV given as bytes."""
    with wave.open(io.BytesIO(data), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise RuntimeError(f"espeak-ng wrote {w.getnchannels()} channels of {8 * w.getsampwidth()} bits")
        rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float64) / 32768.0, rate


def trim_silence(x, rate):
    """Drops leading and trailing 10 ms blocks whose RMS is below 2% of the loudest block's."""
    block = max(1, rate // 100)
    n = len(x) // block
    if n == 0:
        return x
    rms = np.sqrt(np.mean(x[: n * block].reshape(n, block) ** 2, axis=1))
    loud = np.nonzero(rms >= 0.02 * rms.max())[0]
    if len(loud) == 0:
        return x
    return x[loud[0] * block : min(len(x), (loud[-1] + 1) * block)]


def resample_fft(x, rate_in, rate_out):
    """Band-limited resampling by truncating or zero-padding the spectrum (an ideal low-pass at the lower Nyquist).
    The signal is zero-padded to a whole number of rate_in/g input blocks (g = gcd of the rates), with at least 50 ms
    on each side, so that the output grid falls exactly on the input's time axis (no fractional shift) and the FFT's
    periodic wrap-around does not fold the end into the start."""
    g = math.gcd(rate_in, rate_out)
    step_in, step_out = rate_in // g, rate_out // g
    lead_blocks = -(-(rate_in // 20) // step_in)
    lead = lead_blocks * step_in
    total = -(-(len(x) + 2 * lead) // step_in) * step_in
    xp = np.zeros(total)
    xp[lead : lead + len(x)] = x
    n_out = total // step_in * step_out
    spec = np.fft.rfft(xp)
    keep = min(len(spec), n_out // 2 + 1)
    out_spec = np.zeros(n_out // 2 + 1, dtype=complex)
    out_spec[:keep] = spec[:keep]
    y = np.fft.irfft(out_spec, n_out) * (n_out / total)
    start = lead_blocks * step_out
    return y[start : start + int(round(len(x) * rate_out / rate_in))]


def espeak(voice, speed, pitch, text, tmp_wav):
    """Speaks `text` with espeak-ng (voice, -s words per minute, -p pitch 0..99) through the temporary file
    `tmp_wav` (removed); returns (samples float64 in [-1, 1), rate). Raises RuntimeError when espeak-ng fails."""
    cmd = ["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", tmp_wav, text]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    if res.returncode != 0 or not os.path.exists(tmp_wav):
        raise RuntimeError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.decode(errors='replace')}")
    with open(tmp_wav, "rb") as f:
        raw = f.read()
    os.remove(tmp_wav)
    return read_wav_int16(raw)


def write_pcm16(path, pcm):
    """Writes int16 samples as a 16 kHz mono 16-bit WAV, through `path`.part renamed at the end."""
    tmp_out = path + ".part"
    with wave.open(tmp_out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(TARGET_RATE)
        w.writeframes(pcm.tobytes())
    os.replace(tmp_out, path)


def synthesize(job, seed, out_dir, tmp_dir):
    """Makes one corpus file. Returns (relative path, seconds, clipped_speech)."""
    d, voice, speed, pitch, rel = job
    x, rate = espeak(voice, speed, pitch, DIGITS[d], os.path.join(tmp_dir, rel.replace(os.sep, "__")))

    rng = np.random.default_rng(np.random.SeedSequence([seed, d, zlib.crc32(voice.encode()), speed, pitch]))
    speech = resample_fft(trim_silence(x, rate), rate, TARGET_RATE)
    speech *= rng.uniform(0.3, 0.9) / max(1e-9, np.abs(speech).max())

    max_len = int(MAX_SECONDS * TARGET_RATE)
    min_len = int(MIN_SECONDS * TARGET_RATE)
    clipped = False
    if len(speech) > max_len:
        clipped = True
        speech = speech[:max_len].copy()
        fade = TARGET_RATE // 50
        speech[-fade:] *= np.linspace(1.0, 0.0, fade)
    room = max_len - len(speech)
    lead = min(int(rng.uniform(0.03, 0.20) * TARGET_RATE), room)
    trail = min(int(rng.uniform(0.03, 0.20) * TARGET_RATE), room - lead)
    short = min_len - (lead + len(speech) + trail)
    if short > 0:
        lead += short // 2
        trail += short - short // 2
    y = np.concatenate([np.zeros(lead), speech, np.zeros(trail)])

    speech_rms = np.sqrt(np.mean(speech**2))
    snr_db = rng.uniform(25.0, 40.0)
    y += rng.standard_normal(len(y)) * speech_rms * 10.0 ** (-snr_db / 20.0)
    pcm = np.clip(np.round(y * 32767.0), -32768, 32767).astype("<i2")

    write_pcm16(os.path.join(out_dir, rel), pcm)
    return rel, len(pcm) / TARGET_RATE, clipped


def read_marker(out_dir):
    try:
        with open(os.path.join(out_dir, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def corpus_complete(out_dir, size, seed, jobs):
    marker = read_marker(out_dir)
    if not marker:
        return False
    if (marker.get("size"), marker.get("seed"), marker.get("version")) != (size, seed, GENERATOR_VERSION):
        return False
    files = marker.get("files", [])
    if sorted(files) != sorted(j[4] for j in jobs):
        return False
    return all(os.path.isfile(os.path.join(out_dir, rel)) for rel in files)


def remove_old(out_dir):
    """Removes the marker and every WAV (and leftover .part file) in the digit folders."""
    try:
        os.remove(os.path.join(out_dir, MARKER))
    except FileNotFoundError:
        pass
    for digit in DIGITS:
        folder = os.path.join(out_dir, digit)
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if name.endswith(".wav") or name.endswith(".wav.part"):
                os.remove(os.path.join(folder, name))


def parse_common_args(ap, name, seed_help):
    """Adds --seed, --jobs and --force (the options every corpus generator has) to `ap`, parses the command line and
    checks it: a negative seed is a usage error, a missing espeak-ng binary exits naming `name`."""
    ap.add_argument("--seed", type=int, default=0, help=seed_help)
    ap.add_argument("--jobs", type=int, default=0, help="parallel workers, each running espeak-ng then numpy (0: two "
                    "per core, since a worker waits on process start-up and file I/O)")
    ap.add_argument("--force", action="store_true", help="regenerate even when a complete corpus is present")
    args = ap.parse_args()
    if args.seed < 0:
        ap.error("--seed must be >= 0")
    if shutil.which("espeak-ng") is None:
        sys.exit(f"{name}: espeak-ng not found (Debian package espeak-ng; see tools/setup.sh)")
    return args


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created); gets one sub-folder per digit")
    ap.add_argument("--size", choices=sorted(SIZES), default="small", help="small: 100 files; full: 2000 files")
    args = parse_common_args(ap, "make_digits_corpus", "seed of the gains, silences and noise (>= 0)")

    out_dir = os.path.abspath(args.out)
    jobs = plan(args.size)
    if not args.force and corpus_complete(out_dir, args.size, args.seed, jobs):
        print(f"make_digits_corpus: {out_dir} already holds the complete '{args.size}' corpus for seed {args.seed} "
              f"({len(jobs)} files); nothing to do")
        return

    start = time.monotonic()
    os.makedirs(out_dir, exist_ok=True)
    remove_old(out_dir)
    for digit in DIGITS:
        os.makedirs(os.path.join(out_dir, digit), exist_ok=True)
    workers = args.jobs if args.jobs > 0 else 2 * (os.cpu_count() or 1)
    results = []
    with tempfile.TemporaryDirectory(prefix="melforge_espeak_") as tmp_dir:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(synthesize, job, args.seed, out_dir, tmp_dir) for job in jobs]
            for fut in futures:
                results.append(fut.result())

    seconds = np.array([r[1] for r in results])
    clipped = [r[0] for r in results if r[2]]
    marker = {
        "generator": "tools/make_digits_corpus.py",
        "version": GENERATOR_VERSION,
        "size": args.size,
        "seed": args.seed,
        "sample_rate": TARGET_RATE,
        "classes": DIGITS,
        "files": [r[0] for r in results],
    }
    tmp_marker = os.path.join(out_dir, MARKER + ".part")
    with open(tmp_marker, "w") as f:
        json.dump(marker, f, indent=1)
    os.replace(tmp_marker, os.path.join(out_dir, MARKER))

    spec = SIZES[args.size]
    elapsed = time.monotonic() - start
    print(f"make_digits_corpus: wrote {len(results)} files to {out_dir} in {elapsed:.1f} s ({workers} workers)")
    print(f"  size {args.size}, seed {args.seed}: {len(DIGITS)} digits x {len(spec['voices'])} voices x "
          f"{len(spec['speeds'])} speeds x {len(spec['pitches'])} pitches")
    print(f"  {len(results) // len(DIGITS)} files per digit, 16 kHz mono 16-bit; duration min {seconds.min():.2f} s, "
          f"mean {seconds.mean():.2f} s, max {seconds.max():.2f} s, total {seconds.sum() / 60:.1f} min")
    if clipped:
        print(f"  warning: speech longer than {MAX_SECONDS} s was cut in {len(clipped)} files, e.g. {clipped[0]}")


if __name__ == "__main__":
    main()
