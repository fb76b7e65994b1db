#!/usr/bin/python3
"""Writes the hostile corpus of issue 15 and the outcome every input must have, for tests/test_hostile_corpus.cpp.

    make_hostile_corpus.py --out DIR [--long-minutes M]

DIR/in/ is a class-folder corpus built as one user's worst day would have it: a Mac's and a Linux desktop's hidden
files, an unreadable folder, a class folder that is a symbolic link, links to folders inside a class (one a loop),
names that are not UTF-8, files whose headers claim 1,024 and 4,096 channels, and long files. DIR/elsewhere/ holds
the targets of the links. DIR/manifests/ holds two CSV manifests over the same files: one lists a file under three
spellings (refused), one has labels with stray spaces (trimmed).

DIR/expected.json:
    {"inputs": [{"path", "class", "outcome": "written" | "skipped", "reason"}],   every input of the folder build,
                                                       paths as build_report.json writes them (see below)
     "hidden": [paths of the hidden entries directly inside a scanned folder],
     "unreadable": "beta/locked",                      the folder that is only unreadable to a user other than root
     "dup_manifest": {"csv", "lines": [first line, duplicate line]},
     "trim_manifest": {"csv", "classes": [...], "files": N}}

Paths are relative to DIR/in with '/' separators; a byte that is not part of valid UTF-8 is written as the four
characters \\xNN (Python's errors="backslashreplace"), the escaping melforge documents for names in JSON and HDF5.
Deterministic; existing output is replaced. Needs Debian's python3 and numpy.
"""
import argparse
import json
import os
import shutil
import struct
import wave

import numpy as np

from make_bad_inputs import pcm16_wav_bytes

RATE = 16000


def wav_bytes(seconds, rate=RATE, channels=1, freq=440.0):
    """A 16-bit PCM WAV of a tone (every channel the same tone, a different phase), as bytes."""
    n = int(round(seconds * rate))
    t = np.arange(n) / rate
    x = np.stack([0.4 * np.sin(2 * np.pi * freq * t + c) for c in range(channels)], axis=1)
    return pcm16_wav_bytes(x.reshape(-1), rate, channels)


def claimed_channels_wav(channels, frames):
    """A WAV whose fmt chunk claims `channels` 16-bit channels, with `frames` frames of zeros."""
    data = bytes(2 * channels * frames)
    fmt = struct.pack("<HHIIHH", 1, channels, RATE, RATE * 2 * channels, 2 * channels, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def long_wav(path, minutes, freq):
    """Writes a mono 8 kHz 16-bit tone of `minutes` minutes in 1-minute pieces (the file is never whole in memory)."""
    rate = 8000
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        t = np.arange(60 * rate) / rate
        piece = np.round(0.3 * np.sin(2 * np.pi * freq * t) * 32767).astype("<i2").tobytes()
        for _ in range(minutes):
            w.writeframes(piece)


def shown(rel):
    """`rel` (bytes or str) as build_report.json shows it."""
    b = rel if isinstance(rel, bytes) else rel.encode()
    return b.decode("utf-8", "backslashreplace")


class Corpus:
    def __init__(self, root):
        self.root = root
        self.inputs = []
        self.hidden = []

    def path(self, rel):
        return os.path.join(os.fsencode(self.root), rel if isinstance(rel, bytes) else rel.encode())

    def file(self, rel, data, outcome=None, cls=None, reason=""):
        p = self.path(rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        if outcome:
            self.inputs.append({"path": shown(rel), "class": cls, "outcome": outcome, "reason": reason})
        return p

    def hide(self, rel, data=b"", folder=False):
        p = self.path(rel)
        if folder:
            os.makedirs(p, exist_ok=True)
            with open(os.path.join(p, b"inside.wav"), "wb") as f:
                f.write(wav_bytes(1.0))
        else:
            self.file(rel, data)
        self.hidden.append(shown(rel))


def make(out, long_minutes):
    shutil.rmtree(out, ignore_errors=True)
    root = os.path.join(out, "in")
    elsewhere = os.path.join(out, "elsewhere")
    c = Corpus(root)
    for i in range(6):
        c.file(f"alpha/a{i}.wav", wav_bytes(1.5 + 0.25 * i, freq=300 + 20 * i), "written", "alpha")
        c.file(f"beta/b{i}.wav", wav_bytes(1.5 + 0.25 * i, freq=900 + 20 * i), "written", "beta")
    c.file(b"alpha/caf\xe9_latin1.wav", wav_bytes(2.0, freq=350), "written", "alpha")
    c.file(b"alpha/bad\xff\xfe.wav", wav_bytes(2.0, freq=360), "written", "alpha")
    for i in range(4):
        c.file(b"delta\xff/d%d.wav" % i, wav_bytes(2.0, freq=1500 + 30 * i), "written", shown(b"delta\xff"))

    c.hide("alpha/.DS_Store", b"\x00\x00\x00\x01Bud1" + bytes(64))
    c.hide("alpha/._a0.wav", b"\x00\x05\x16\x07" + bytes(80))
    c.hide("alpha/.git", folder=True)
    c.hide("beta/.Trash-1000", folder=True)
    c.hide(".ipynb_checkpoints", folder=True)

    locked = c.path("beta/locked")
    os.makedirs(locked)
    for i in range(2):
        with open(os.path.join(locked, b"l%d.wav" % i), "wb") as f:
            f.write(wav_bytes(1.5))
    os.chmod(locked, 0)
    c.inputs.append({"path": "beta/locked", "class": "beta", "outcome": "skipped", "reason": "cannot read folder",
                     "unreadable": True})

    gamma = os.path.join(elsewhere, "gamma_data")
    for i in range(4):
        c.file(f"../elsewhere/gamma_data/g{i}.wav", wav_bytes(1.75, freq=2000 + 40 * i))
        c.inputs.append({"path": f"gamma/g{i}.wav", "class": "gamma", "outcome": "written", "reason": ""})
    os.symlink(os.path.relpath(gamma, root), os.path.join(root, "gamma"))

    extra = os.path.join(elsewhere, "beta_extra")
    os.makedirs(extra)
    for i in range(2):
        with open(os.path.join(extra, f"x{i}.wav"), "wb") as f:
            f.write(wav_bytes(1.5, freq=1100 + 50 * i))
        c.inputs.append({"path": f"beta/more/x{i}.wav", "class": "beta", "outcome": "written", "reason": ""})
    os.symlink(os.path.relpath(extra, os.path.join(root, "beta")), os.path.join(root, "beta", "more"))
    os.symlink(".", os.path.join(root, "beta", "loop"))
    c.inputs.append({"path": "beta/loop", "class": "beta", "outcome": "skipped", "reason": "loop"})

    for i in range(3):
        c.file(f"wide/w1024_{i}.wav", claimed_channels_wav(1024, 6000), "written", "wide")
    c.file("wide/w4096.wav", claimed_channels_wav(4096, 100), "skipped", "wide", "")

    os.makedirs(os.path.join(root, "long"), exist_ok=True)
    for i in range(2):
        long_wav(os.path.join(root, "long", f"long{i}.wav"), long_minutes, 500 + 200 * i)
        c.inputs.append({"path": f"long/long{i}.wav", "class": "long", "outcome": "written", "reason": ""})

    manifests = os.path.join(out, "manifests")
    os.makedirs(manifests)
    dup = os.path.join(manifests, "dup.csv")
    with open(dup, "w") as f:
        f.write("path,label\n")
        for i in range(6):
            f.write(f"../in/alpha/a{i}.wav,alpha\n../in/beta/b{i}.wav,beta\n")
        f.write(f"../in/./alpha//x/../a3.wav,alpha\n")
    trim = os.path.join(manifests, "trim.csv")
    with open(trim, "w") as f:
        f.write("path,label\n")
        for i in range(6):
            f.write(f"../in/alpha/a{i}.wav,{' alpha' if i % 2 else 'alpha '}\n../in/beta/b{i}.wav,\tbeta\n")

    expected = {
        "inputs": sorted(c.inputs, key=lambda e: e["path"]),
        "hidden": sorted(c.hidden),
        "unreadable": "beta/locked",
        "dup_manifest": {"csv": dup, "lines": [8, 14]},
        "trim_manifest": {"csv": trim, "classes": ["alpha", "beta"], "files": 12},
    }
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--long-minutes", type=int, default=40)
    a = ap.parse_args()
    make(a.out, a.long_minutes)


if __name__ == "__main__":
    main()
