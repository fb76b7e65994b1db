#!/usr/bin/python3
"""Reads a split file written by melforge's SplitWriter with h5py and checks it against expectations.

Usage: h5py_readback.py EXPECT.json

EXPECT.json (written by tests/test_h5_writer.cpp) holds:
  file             the HDF5 file to check
  expected_mel     raw little-endian float32 file with the expected `mel` values, row-major
  shape            expected shape of `mel`
  dtype            "float16" or "float32"
  chunks           expected chunk shape of `mel`
  compression_opts deflate level, 0 for none
  shuffle          whether the shuffle filter is registered
  label, num_valid_long, source_sample_rate, path, class_names   expected 1-D datasets (int32 for the first three)
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
        mel = f["mel"]
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
        expected = np.fromfile(exp["expected_mel"], dtype="<f4").reshape(exp["shape"])
        values = mel[...]
        check(values.dtype == np.dtype(exp["dtype"]), f"read dtype {values.dtype}")
        check(np.array_equal(values.astype(np.float32), expected), "mel values differ")
        if mel.shape[0] > 2:
            check(np.array_equal(mel[1:3].astype(np.float32), expected[1:3]), "mel[1:3] differs")

        for name in ("label", "num_valid_long", "source_sample_rate"):
            ds = f[name]
            check(ds.dtype == np.int32, f"{name} dtype {ds.dtype}")
            check(ds[...].tolist() == exp[name], f"{name} {ds[...].tolist()} != {exp[name]}")
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
