#!/usr/bin/python3
"""Writes a small set of hostile and odd input files into one class folder of a corpus, for end-to-end tests.

    make_bad_inputs.py --out CORPUS [--class NAME] [--manifest FILE.json]

Files written into CORPUS/<class>/ (the class folder is created if needed; by default the first existing
sub-folder of CORPUS in sorted order):

    name                      what it is                                   what melforge's decoder does
    bad_empty.wav             zero bytes                                   AudioError "empty file"
    bad_text.wav              a text file named .wav                       AudioError "not an audio file: ..."
    bad_truncated_header.wav  the first 30 bytes of a valid WAV            AudioError "not an audio file: ..."
    bad_nan.wav               32-bit float WAV, NaN at sample 1234         AudioError "NaN sample at frame 1234 ..."
                              and +Inf at sample 4000
    bad_dir.wav/              an empty directory named like a WAV          AudioError "is a directory" (if scanned)
    ok_short_0.05s.wav        valid 16 kHz mono 16-bit, 0.05 s (800        decodes; shorter than a segment, so the
                              frames)                                      builder pads or skips it per its options
    ok_stereo_44k.wav         valid 44.1 kHz stereo 16-bit, 1 s, two       decodes: mixed down to mono and resampled
                              different tones                              to 16 kHz (16000 frames)

--manifest writes the same table as JSON: {"class": ..., "files": [{"name", "path", "kind", "expect",
"reason"}, ...]} where expect is "error" (with the substring of the error message in "reason") or "ok".
Everything is deterministic; existing files of these names are replaced. Needs only Debian's python3 and numpy.
"""
import argparse
import io
import json
import os
import shutil
import struct
import sys
import wave

import numpy as np


def pcm16_wav_bytes(samples, rate, channels):
    """A 16-bit PCM WAV of interleaved float samples in [-1, 1), as bytes (Python's wave module)."""
    pcm = np.clip(np.round(np.asarray(samples) * 32767.0), -32768, 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def float32_wav_bytes(samples, rate):
    """A mono WAVE_FORMAT_IEEE_FLOAT (format tag 3) WAV, written with struct since `wave` only writes PCM."""
    data = np.asarray(samples, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    fact = struct.pack("<I", len(samples))
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"fact" + struct.pack("<I", len(fact)) + fact
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def tone(freq, seconds, rate, amp=0.5):
    t = np.arange(int(round(seconds * rate))) / rate
    return amp * np.sin(2 * np.pi * freq * t)


def write(path, data):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
    with open(path, "wb") as f:
        f.write(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="corpus root holding one folder per class")
    ap.add_argument("--class", dest="cls", default=None,
                    help="class folder to write into (default: the first existing sub-folder of --out)")
    ap.add_argument("--manifest", default=None, help="also write what was written, and the expected outcome, as JSON")
    args = ap.parse_args()

    root = os.path.abspath(args.out)
    cls = args.cls
    if cls is None:
        subdirs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))) if os.path.isdir(
            root) else []
        if not subdirs:
            sys.exit(f"make_bad_inputs: {root} has no class folder; pass --class NAME")
        cls = subdirs[0]
    folder = os.path.join(root, cls)
    os.makedirs(folder, exist_ok=True)

    rate = 16000
    files = []

    def add(name, kind, expect, reason, data=None, directory=False):
        path = os.path.join(folder, name)
        if directory:
            if os.path.lexists(path) and not os.path.isdir(path):
                os.remove(path)
            os.makedirs(path, exist_ok=True)
        else:
            write(path, data)
        files.append({"name": name, "path": path, "kind": kind, "expect": expect, "reason": reason})

    add("bad_empty.wav", "zero-byte file", "error", "empty file", b"")
    add("bad_text.wav", "text file named .wav", "error", "not an audio file",
        b"This is a text file, not audio. melforge must skip it with a clear message.\n" * 4)
    valid = pcm16_wav_bytes(tone(440.0, 0.5, rate), rate, 1)
    add("bad_truncated_header.wav", "WAV cut after 30 bytes, inside its fmt chunk", "error", "not an audio file",
        valid[:30])
    bad = tone(330.0, 0.5, rate).astype(np.float32)
    bad[1234] = np.nan
    bad[4000] = np.inf
    add("bad_nan.wav", "float WAV with NaN (sample 1234) and Inf (sample 4000)", "error",
        "NaN sample at frame 1234", float32_wav_bytes(bad, rate))
    add("bad_dir.wav", "directory named like a WAV file", "error", "is a directory", directory=True)
    add("ok_short_0.05s.wav", "valid 16 kHz mono, 0.05 s (800 frames)", "ok", "",
        pcm16_wav_bytes(tone(500.0, 0.05, rate), rate, 1))
    stereo = np.stack([tone(300.0, 1.0, 44100), tone(600.0, 1.0, 44100, 0.3)], axis=1).ravel()
    add("ok_stereo_44k.wav", "valid 44.1 kHz stereo, 1 s (44100 frames; 16000 after resampling)", "ok", "",
        pcm16_wav_bytes(stereo, 44100, 2))

    if args.manifest:
        with open(args.manifest, "w") as f:
            json.dump({"class": cls, "folder": folder, "files": files}, f, indent=1)
    print(f"make_bad_inputs: wrote {len(files)} entries into {folder}")
    for e in files:
        outcome = "ok" if e["expect"] == "ok" else f"error '{e['reason']}'"
        print(f"  {e['name']:<26} {e['kind']} -> {outcome}")


if __name__ == "__main__":
    main()
