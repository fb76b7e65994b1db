#!/usr/bin/env python3
"""Writes the committed schema-1 and schema-2 datasets of tests/data/legacy/ (issue 28: v1/v2 datasets keep reading,
training and evaluating after schema 3). Deterministic: the same numpy and h5py give byte-identical files.

    python tools/gen_legacy_fixtures.py [--out tests/data/legacy]

Each folder (v1/, v2/) holds train.h5, val.h5 and test.h5 laid out exactly as melforge-build wrote them in that
schema (docs/FORMAT.md of that version; builder/h5_writer.cpp): a chunked `mel` [F, L, S, M, T] with shuffle +
deflate, `label`, `num_valid_long`, `path`, `class_names`, and the root attributes. Tiny shapes (M = 16 mels,
T = 8 frames, L = 2 long segments of S = 2 short ones) and 3 classes that a model tells apart in a few epochs: class
c puts its energy in mel bands [5c, 5c + 5), everything else is 40 dB lower; values are whole dB, so the files
compress to a few KiB. Some files have num_valid_long 1: their second long segment holds the silence value
(log of zero energy, -100 dB), as the builder pads.

- v1: schema_version 1, float16, the attribute set of the first layout (no `channel`, no `resampler*`, no
  `source_sample_rate`, no `targets`).
- v2: schema_version 2, float32, the attributes of the last schema-2 builder (`channel`, `resampler*`) and the
  `source_sample_rate` dataset; single-label, so no `targets` (as the builder writes a single-label corpus).
"""
import argparse
import os

import h5py
import numpy as np

CLASSES = ["hum", "tick", "whistle"]
FILES_PER_CLASS = {"train": 4, "val": 2, "test": 2}
SAMPLE_RATE = 8000
HOP = 128
N_MELS, N_FRAMES, NUM_LONG, NUM_SHORT = 16, 8, 2, 2
SHORT_SAMPLES = (N_FRAMES - 1) * HOP  # centred frames: 1 + short_samples // hop = n_frames
LONG_SAMPLES = NUM_SHORT * SHORT_SAMPLES
AMIN = 1e-10
SILENCE = 10.0 * np.log10(AMIN)  # log db with power 2: (20 / power) * log10(amin)
FILES_PER_CHUNK = 2


def mel_attributes(schema):
    """The root attributes as melforge-build wrote them in `schema` (ints int64, floats float64, strings UTF-8)."""
    a = {
        "sample_rate": np.int64(SAMPLE_RATE), "n_fft": np.int64(256), "win_length": np.int64(256),
        "hop_length": np.int64(HOP), "window": "hann", "center": np.int64(1), "pad_mode": "reflect",
        "power": np.float64(2.0), "n_mels": np.int64(N_MELS), "f_min": np.float64(0.0),
        "f_max": np.float64(SAMPLE_RATE / 2), "mel_scale": "htk", "mel_norm": "none", "log": "db",
        "amin": np.float64(AMIN), "log_eps": np.float64(1e-6), "dtype": "float16" if schema == 1 else "float32",
        "long_seconds": np.float64(LONG_SAMPLES / SAMPLE_RATE),
        "short_seconds": np.float64(SHORT_SAMPLES / SAMPLE_RATE),
        "long_samples": np.int64(LONG_SAMPLES), "short_samples": np.int64(SHORT_SAMPLES),
        "num_long": np.int64(NUM_LONG), "num_short": np.int64(NUM_SHORT), "n_frames": np.int64(N_FRAMES),
        "short_files": "pad",
    }
    if schema >= 2:
        a.update({"channel": np.int64(-1), "resampler": "soxr", "resampler_quality": "HQ",
                  "resampler_phase": "linear", "resampler_version": "libsoxr-0.1.3"})
    return a


def split_rows(split, seed):
    """(mel float32 [F, L, S, M, T], labels, num_valid_long, paths) of one split."""
    rng = np.random.default_rng(seed)
    rows, labels, valid, paths = [], [], [], []
    for c, name in enumerate(CLASSES):
        for i in range(FILES_PER_CLASS[split]):
            v = 1 if i % 2 == 1 else NUM_LONG
            x = np.full((NUM_LONG, NUM_SHORT, N_MELS, N_FRAMES), SILENCE, dtype=np.float32)
            body = -60.0 + rng.integers(-3, 4, size=(v, NUM_SHORT, N_MELS, N_FRAMES))
            body[:, :, 5 * c:5 * c + 5, :] += 40.0
            x[:v] = body
            rows.append(x)
            labels.append(c)
            valid.append(v)
            paths.append(f"{name}/{split}_{i:02d}.wav")
    return np.stack(rows), np.array(labels, np.int32), np.array(valid, np.int32), paths


def write_split(path, split, schema, seed):
    mel, labels, valid, paths = split_rows(split, seed)
    dtype = np.float16 if schema == 1 else np.float32
    strings = h5py.string_dtype("utf-8")
    with h5py.File(path, "w", track_order=False) as f:
        f.attrs["schema_version"] = np.int64(schema)
        f.attrs["split"] = split
        f.attrs["melforge_version"] = "0.1.0"
        for k, v in mel_attributes(schema).items():
            f.attrs[k] = v
        f.create_dataset("mel", data=mel.astype(dtype), maxshape=(None,) + mel.shape[1:],
                         chunks=(FILES_PER_CHUNK,) + mel.shape[1:], shuffle=True, compression="gzip",
                         compression_opts=4, track_times=False)
        f.create_dataset("label", data=labels, dtype="<i4", track_times=False)
        f.create_dataset("path", data=np.array(paths, dtype=object), dtype=strings, track_times=False)
        f.create_dataset("num_valid_long", data=valid, dtype="<i4", track_times=False)
        if schema >= 2:
            f.create_dataset("source_sample_rate", data=np.full(len(paths), 16000, np.int32), dtype="<i4",
                             track_times=False)
        f.create_dataset("class_names", data=np.array(CLASSES, dtype=object), dtype=strings, track_times=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "data", "legacy"))
    args = parser.parse_args()
    for schema in (1, 2):
        folder = os.path.join(args.out, f"v{schema}")
        os.makedirs(folder, exist_ok=True)
        for s, split in enumerate(("train", "val", "test")):
            write_split(os.path.join(folder, f"{split}.h5"), split, schema, seed=100 * schema + s)
    print(f"wrote {args.out}/v1 and v2")


if __name__ == "__main__":
    main()
