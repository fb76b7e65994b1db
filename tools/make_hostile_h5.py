#!/usr/bin/env python3
"""Crafted melforge dataset folders for the untrusted-input tests of issue 29 (python/tests/test_untrusted_h5.py,
the fuzz seeds of tests/fuzz/make_seeds.py). Each case is a folder holding a small valid schema-3 train.h5, val.h5
and test.h5 (docs/FORMAT.md) with one hostile structure put into one of them; melforge's readers must refuse each
with an error naming the file and the field, quickly and without a large allocation. The C++ twin of these cases is
tests/test_untrusted_h5.cpp.

    make_hostile_h5.py OUT [CASE ...]     writes OUT/<case>/ for the named cases (default: all) and prints, one line
                                          per case, "<case>\t<file>\t<what the error must contain>"

Needs h5py (the venv of tools/setup_python.sh has it). The huge sizes are declared, never written: every file is a
few KB, but for the 64 MiB string attribute of huge_attribute (which must never be echoed in a message).
"""
import os
import pathlib
import sys

import numpy as np

try:
    import h5py
except ImportError:  # the module stays importable (its CASES listed) where h5py is absent; make() needs it
    h5py = None

CLIPS = [3, 1, 4, 2]
N_MELS = 5
CLASSES = ["a", "b", "c"]

INT_ATTRS = {"sample_rate": 16000, "n_fft": 400, "win_length": 400, "hop_length": 160, "center": 1,
             "n_mels": N_MELS, "short_samples": 1280, "n_frames": 8, "channel": -1}
FLOAT_ATTRS = {"power": 2.0, "f_min": 0.0, "f_max": 8000.0, "amin": 1e-10, "log_eps": 1e-6,
               "short_seconds": 0.08, "max_seconds": 0.0}
STR_ATTRS = {"window": "hann", "pad_mode": "reflect", "mel_scale": "htk", "mel_norm": "none", "log": "db",
             "dtype": "float32", "melforge_version": "hostile"}


def write_split(path, split, build_id=None):
    """A valid schema-3 split file of CLIPS clips (float32 frames, chunked and deflated as melforge-build writes)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    offsets = np.concatenate([[0], np.cumsum(CLIPS)]).astype("<i8")
    rows = int(offsets[-1])
    rng = np.random.default_rng(len(split))
    with h5py.File(path, "w") as f:
        f.attrs["schema_version"] = np.int64(3)
        f.attrs["split"] = split
        for k, v in INT_ATTRS.items():
            f.attrs[k] = np.int64(v)
        for k, v in FLOAT_ATTRS.items():
            f.attrs[k] = np.float64(v)
        for k, v in STR_ATTRS.items():
            f.attrs[k] = v
        if build_id is not None:
            f.attrs["build_id"] = build_id
        f.create_dataset("frames", data=rng.uniform(-80, 0, (rows, N_MELS)).astype("<f4"), chunks=(2, N_MELS),
                         maxshape=(None, N_MELS), compression="gzip", compression_opts=1, shuffle=True)
        f.create_dataset("frame_offset", data=offsets)
        f.create_dataset("num_samples", data=np.array([160 * c for c in CLIPS], "<i8"))
        f.create_dataset("clip_flags", data=np.zeros(len(CLIPS), "u1"))
        f.create_dataset("label", data=np.arange(len(CLIPS), dtype="<i4") % len(CLASSES))
        f.create_dataset("path", data=[f"clips/{i}.wav" for i in range(len(CLIPS))], dtype=h5py.string_dtype())
        f.create_dataset("class_names", data=CLASSES, dtype=h5py.string_dtype())


def write_folder(folder, build_id="0123456789abcdef0123456789abcdef"):
    for split in ("train", "val", "test"):
        write_split(folder / f"{split}.h5", split, build_id)


def _replace(path, name, make):
    with h5py.File(path, "r+") as f:
        del f[name]
        make(f)


def _external(folder, target, field):
    def make(f):
        f.create_dataset(field, shape=(3,), dtype="S16", external=[(str(target), 0, 48)])
    _replace(folder / "train.h5", field, make)


def _virtual_frames(path, source, dataset="frames"):
    rows = sum(CLIPS)
    layout = h5py.VirtualLayout(shape=(rows, N_MELS), dtype="<f4")
    layout[:] = h5py.VirtualSource(str(source), dataset, shape=(rows, N_MELS))
    _replace(path, "frames", lambda f: f.create_virtual_dataset("frames", layout, fillvalue=0))


def external_file(folder):
    secret = folder.parent / (folder.name + "-secret.txt")
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    _external(folder, secret, "class_names")
    return "train.h5", "class_names"


def external_fifo(folder):
    fifo = folder.parent / (folder.name + "-fifo")
    os.mkfifo(fifo)
    _external(folder, fifo, "path")
    return "train.h5", "path"


def vds_outside(folder):
    write_split(folder.parent / (folder.name + "-outside") / "src.h5", "train")
    _virtual_frames(folder / "train.h5", f"../{folder.name}-outside/src.h5")
    return "train.h5", "frames"


def vds_absolute(folder):
    src = folder.parent / (folder.name + "-outside") / "src.h5"
    write_split(src, "train")
    _virtual_frames(folder / "train.h5", src.resolve())
    return "train.h5", "frames"


def vds_self_loop(folder):
    _virtual_frames(folder / "train.h5", ".")
    return "train.h5", "frames"


def vds_mutual_loop(folder):
    _virtual_frames(folder / "train.h5", "val.h5")
    _virtual_frames(folder / "val.h5", "train.h5")
    return "train.h5", "frames"


def huge_fixed_strings(folder):
    _replace(folder / "train.h5", "class_names", lambda f: f.create_dataset("class_names", shape=(3,),
                                                                          dtype=f"S{1 << 30}"))
    return "train.h5", "class_names"


def long_stored_strings(folder):
    _replace(folder / "train.h5", "path",
             lambda f: f.create_dataset("path", data=[b"x" * (100 << 10)] * len(CLIPS), dtype=f"S{100 << 10}"))
    return "train.h5", "path"


def huge_chunk(folder):
    rows = sum(CLIPS)
    _replace(folder / "train.h5", "frames",
             lambda f: f.create_dataset("frames", shape=(rows, N_MELS), maxshape=(None, N_MELS), dtype="<f4",
                                        chunks=(1 << 27, N_MELS)))
    return "train.h5", "frames"


def fill_value_targets(folder):
    with h5py.File(folder / "train.h5", "r+") as f:
        f.create_dataset("targets", shape=(len(CLIPS), 1 << 36), dtype="u1", chunks=(1, 1 << 16))
    return "train.h5", "targets"


def dims_disagree(folder):
    with h5py.File(folder / "train.h5", "r+") as f:
        f.create_dataset("targets", data=np.eye(2, len(CLASSES), dtype="u1"))
    return "train.h5", "targets"


def label_too_short(folder):
    _replace(folder / "train.h5", "label", lambda f: f.create_dataset("label", data=np.zeros(2, "<i4")))
    return "train.h5", "label"


def mixed_build_ids(folder):
    with h5py.File(folder / "val.h5", "r+") as f:
        f.attrs["build_id"] = "fedcba9876543210fedcba9876543210"
    return "train.h5", "build_id"


def huge_attribute(folder):
    with h5py.File(folder / "train.h5", "r+") as f:
        f.attrs["split"] = "\x1b[31m" * ((64 << 20) // 5)
    return "train.h5", "split"


CASES = {f.__name__: f for f in (external_file, external_fifo, vds_outside, vds_absolute, vds_self_loop,
                                 vds_mutual_loop, huge_fixed_strings, long_stored_strings, huge_chunk,
                                 fill_value_targets, dims_disagree, label_too_short, mixed_build_ids,
                                 huge_attribute)}


def make(out, name):
    """Writes case `name` into out/<name>/; returns (file, field) the error must name."""
    if h5py is None:
        raise RuntimeError("tools/make_hostile_h5.py needs h5py (the venv of tools/setup_python.sh has it)")
    folder = pathlib.Path(out) / name
    write_folder(folder)
    return CASES[name](folder)


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    out = pathlib.Path(argv[0])
    names = argv[1:] or list(CASES)
    for name in names:
        if name not in CASES:
            print(f"unknown case {name!r} (cases: {', '.join(CASES)})", file=sys.stderr)
            return 2
        file, field = make(out, name)
        print(f"{name}\t{out / name / file}\t{field}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
