#!/usr/bin/python3
"""Reads a schema-3 split file written by melforge's SplitWriter with h5py (no plugin) and checks it against
expectations, slicing every clip as docs/FORMAT.md shows.

Usage: h5py_readback.py EXPECT.json

EXPECT.json (written by tests/test_h5_writer.cpp) holds:
  file             the HDF5 file to check
  expected_frames  raw little-endian float32 file with the expected `frames` values [N, M], row-major
  shape            expected shape of `frames` ([N, M])
  dtype            "float16" or "float32"
  chunks           expected chunk shape of `frames`
  compression_opts deflate level, 0 for none
  shuffle          whether the shuffle filter is registered
  label, source_sample_rate (int32), frame_offset, num_samples (int64), clip_flags (uint8), path, class_names
                   expected 1-D datasets
  attributes       {name: value} expected root attributes (int, float or str)
  write_back       optional: path of a file this script writes with h5py for the C++ side to read
Prints "OK" and exits 0 when everything matches; prints the mismatches and exits 1 otherwise.
"""
import json
import sys

import h5py
import numpy as np


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as fh:
        exp = json.load(fh)
    errors = []

    def check(cond, what):
        if not cond:
            errors.append(what)

    with h5py.File(exp["file"], "r") as f:
        mel = f["frames"]
        check(mel.dtype == np.dtype(exp["dtype"]), f"mel dtype {mel.dtype} != {exp['dtype']}")
        check(list(mel.shape) == exp["shape"], f"mel shape {mel.shape} != {exp['shape']}")
        check(list(mel.chunks) == exp["chunks"], f"mel chunks {mel.chunks} != {exp['chunks']}")
        level = exp["compression_opts"]
        if level == 0:
            check(mel.compression is None, f"mel compression {mel.compression} != None")
            check(not mel.shuffle, "mel has shuffle without compression")
        else:
            check(mel.compression == "gzip", f"mel compression {mel.compression} != gzip")
            check(mel.compression_opts == level, f"mel level {mel.compression_opts} != {level}")
            check(mel.shuffle == exp["shuffle"], f"mel shuffle {mel.shuffle} != {exp['shuffle']}")
        expected = np.fromfile(exp["expected_frames"], dtype="<f4").reshape(exp["shape"])
        values = mel[...]
        check(values.dtype == np.dtype(exp["dtype"]), f"read dtype {values.dtype}")
        check(np.array_equal(values.astype(np.float32), expected), "mel values differ")
        if mel.shape[0] > 2:
            check(np.array_equal(mel[1:3].astype(np.float32), expected[1:3]), "mel[1:3] differs")

        check("mel" not in f and "num_valid_long" not in f, "schema-2 datasets in a schema-3 file")
        for name, dtype in (("label", np.int32), ("source_sample_rate", np.int32), ("frame_offset", np.dtype("<i8")),
                            ("num_samples", np.dtype("<i8")), ("clip_flags", np.uint8)):
            ds = f[name]
            check(ds.dtype == dtype, f"{name} dtype {ds.dtype}")
            check(ds[...].tolist() == exp[name], f"{name} {ds[...].tolist()} != {exp[name]}")
        offsets = f["frame_offset"][...]
        for clip in range(len(offsets) - 1):
            first, last = offsets[clip], offsets[clip + 1]
            part = mel[first:last]
            check(part.shape == (last - first, exp["shape"][1]), f"clip {clip} shape {part.shape}")
            check(np.array_equal(part.astype(np.float32), expected[first:last]), f"clip {clip} frames differ")
        for name in ("path", "class_names"):
            ds = f[name]
            info = h5py.check_string_dtype(ds.dtype)
            check(info is not None and info.encoding == "utf-8" and info.length is None,
                  f"{name} is not variable-length UTF-8: {info}")
            got = [s for s in ds.asstr()[...]] if ds.shape[0] else []
            check(got == exp[name], f"{name} {got} != {exp[name]}")

        for name, value in exp["attributes"].items():
            if name not in f.attrs:
                errors.append(f"attribute {name} missing")
                continue
            got = f.attrs[name]
            if isinstance(value, str):
                check(isinstance(got, str) and got == value, f"attribute {name} {got!r} != {value!r}")
            elif isinstance(value, int):
                check(isinstance(got, np.int64) and int(got) == value, f"attribute {name} {got!r} != {value!r}")
            else:
                check(isinstance(got, np.float64) and float(got) == value, f"attribute {name} {got!r} != {value!r}")

    if "write_back" in exp:
        with h5py.File(exp["write_back"], "w") as f:
            f.create_dataset("half", data=(np.arange(24, dtype=np.float32).reshape(4, 6) / 8 - 1).astype(np.float16),
                             chunks=(2, 6), compression="gzip", shuffle=True)
            f.create_dataset("single", data=np.linspace(-1, 1, 10, dtype=np.float32))
            f.create_dataset("names", data=["α", "b", ""], dtype=h5py.string_dtype())
            f.create_dataset("fixed", data=np.array([b"ab", b"cde"]))
            f.create_dataset("wide", data=np.array([-3, 9], dtype=np.int64))
            f.attrs["n"] = 42
            f.attrs["x"] = 0.25
            f.attrs["s"] = "héllo"

    if errors:
        print("\n".join(errors))
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
