"""The Python builder peer (issue 4): what a good engineer writes following the Python dataset builder's own
optimisations: soundfile reading on a thread pool (libsndfile releases the GIL) one batch ahead of the compute,
torchaudio-style mels (py_common.TorchaudioMel) of each whole clip (one call per clip: clips differ in length, and
padding them to a batch would change their last frames), h5py gzip (+ shuffle) at the same level and chunking as
melforge. The output has melforge's schema 3: OUT/{train,val,test}.h5 with `frames` [N, n_mels] float16,
`frame_offset`, `num_samples`, `clip_flags`, `label`, `path`, `class_names` and the same root attributes.

  py_builder.py build --input CORPUS --output OUT [--config tools/demo_build.ini] [--threads T]
                      [--batch-files 512] [--compression-level 4] [--report report.json]
  py_builder.py h5write --input OUT/train.h5 [--compression-level 4] [--repeats R] [--out results.json]

`build` does what melforge-build does with the same parameters: scan root/<class>/**/file, stratified seeded split,
every clip whole, log-mel, float16, HDF5 (a clip too short for reflect padding is refused, not padded). It does not resample (the benchmark corpus is at
the target rate, so melforge does not either) and refuses a file at another rate. `h5write` times h5py's
single-threaded gzip write of an existing split's `frames` (same chunks, level, shuffle) and a raw uncompressed h5py
write, for the HDF5-write row of the comparison.
"""
import argparse
import collections
import concurrent.futures
import os
import sys
import time

import h5py
import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import py_common as pc  # noqa: E402

EXTENSIONS = {".wav", ".flac", ".ogg", ".oga", ".aif", ".aiff", ".aifc", ".au", ".snd", ".caf", ".w64", ".rf64",
              ".mp3", ".opus"}


def scan(root: str):
    files = []
    for dirpath, _, names in os.walk(root, followlinks=True):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir == ".":
            continue
        cls = rel_dir.split(os.sep)[0]
        for n in names:
            if os.path.splitext(n)[1].lower() in EXTENSIONS:
                files.append((os.path.join(rel_dir, n), cls))
    files.sort()
    classes = sorted({c for _, c in files})
    return files, classes


def stratified_split(labels: np.ndarray, ratios, seed: int):
    rng = np.random.default_rng(seed)
    out = {"train": [], "val": [], "test": []}
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_train = int(round(ratios[0] * len(idx)))
        n_val = int(round(ratios[1] * len(idx)))
        out["train"] += idx[:n_train].tolist()
        out["val"] += idx[n_train:n_train + n_val].tolist()
        out["test"] += idx[n_train + n_val:].tolist()
    return {k: sorted(v) for k, v in out.items()}


def read_audio(path: str, rate: int):
    x, sr = sf.read(path, dtype="float32", always_2d=True)
    if sr != rate:
        raise ValueError(f"{path}: {sr} Hz; the Python peer does not resample (target {rate} Hz)")
    return x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]


def build(a) -> int:
    t_start = time.perf_counter()
    pc.set_threads(a.threads)
    threads = torch.get_num_threads()
    cfg = pc.read_ini(a.config)
    if a.compression_level is not None:
        cfg["compression-level"] = a.compression_level
    rate = int(cfg["sample-rate"])
    S = int(round(float(cfg["short-seconds"]) * rate))
    n_fft = int(cfg["n-fft"])
    hop = int(cfg["hop-length"]) or int(cfg["win-length"] or n_fft) // 2
    level = int(cfg["compression-level"])
    times = collections.Counter()

    t = time.perf_counter()
    files, classes = scan(a.input)
    labels = np.array([classes.index(c) for _, c in files], dtype=np.int32)
    times["scan"] += time.perf_counter() - t
    splits = stratified_split(labels, [float(r) for r in cfg["split"].split(",")], int(cfg["seed"]))

    mel = pc.make_mel(cfg).eval()
    n_mels = int(cfg["n-mels"])
    frames_per_chunk = max(1, (1 << 20) // (n_mels * 2))
    attrs = {"amin": float(cfg["amin"]), "center": 1, "channel": -1, "dtype": "float16",
             "f_max": float(cfg["f-max"]) or float(rate // 2), "f_min": float(cfg["f-min"]),
             "hop_length": hop, "log": "db", "log_eps": 1e-6, "max_seconds": 0.0, "mel_norm": "none",
             "mel_scale": "htk", "melforge_version": "py_builder", "n_fft": n_fft,
             "n_frames": int(round(float(cfg["short-seconds"]) * rate / hop)), "n_mels": n_mels, "pad_mode": "reflect",
             "power": float(cfg["power"]), "sample_rate": rate, "schema_version": 3, "short_samples": S,
             "short_seconds": float(cfg["short-seconds"]), "win_length": int(cfg["win-length"]) or n_fft,
             "window": "hann"}
    os.makedirs(a.output, exist_ok=True)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads)
    written = frames_total = 0

    def read_batch(idx):
        return [pool.submit(read_audio, os.path.join(a.input, files[i][0]), rate) for i in idx]

    for split, idx in splits.items():
        path = os.path.join(a.output, f"{split}.h5")
        with h5py.File(path, "w") as h5:
            ds = h5.create_dataset("frames", shape=(0, n_mels), maxshape=(None, n_mels), dtype="f2",
                                   chunks=(frames_per_chunk, n_mels), compression="gzip", compression_opts=level,
                                   shuffle=True)
            out_labels, out_paths, offsets, samples = [], [], [0], []
            batches = [idx[i:i + a.batch_files] for i in range(0, len(idx), a.batch_files)]
            pending = read_batch(batches[0]) if batches else None
            for bi, batch in enumerate(batches):
                t = time.perf_counter()
                audio = [f.result() for f in pending]
                times["read"] += time.perf_counter() - t
                if bi + 1 < len(batches):
                    pending = read_batch(batches[bi + 1])
                t = time.perf_counter()
                clips = []
                with torch.inference_mode():
                    for i, x in zip(batch, audio):
                        if len(x) <= n_fft // 2:
                            sys.exit(f"py_builder: {files[i][0]} has {len(x)} samples, too short for reflect padding "
                                     f"(melforge pads it to one frame; py_builder does not implement that)")
                        m = mel(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None])[0]
                        clips.append(m.T.to(torch.float16))
                        out_labels.append(labels[i])
                        out_paths.append(files[i][0])
                        offsets.append(offsets[-1] + m.shape[1])
                        samples.append(len(x))
                block = torch.cat(clips).numpy()
                frames_total += block.shape[0]
                times["mel"] += time.perf_counter() - t
                t = time.perf_counter()
                n0 = ds.shape[0]
                ds.resize(n0 + block.shape[0], axis=0)
                ds[n0:] = block
                written += len(batch)
                times["write"] += time.perf_counter() - t
            t = time.perf_counter()
            h5.create_dataset("frame_offset", data=np.array(offsets, dtype=np.int64))
            h5.create_dataset("num_samples", data=np.array(samples, dtype=np.int64))
            h5.create_dataset("clip_flags", data=np.zeros(len(samples), dtype=np.uint8))
            h5.create_dataset("label", data=np.array(out_labels, dtype=np.int32))
            h5.create_dataset("path", data=out_paths, dtype=h5py.string_dtype("utf-8"))
            h5.create_dataset("class_names", data=classes, dtype=h5py.string_dtype("utf-8"))
            for k, v in attrs.items():
                h5.attrs[k] = v
            h5.attrs["split"] = split
            times["write"] += time.perf_counter() - t
    pool.shutdown()
    total = time.perf_counter() - t_start
    rep = {"files": {"written": written, "skipped": 0}, "clips": {"frames": frames_total}, "threads": threads,
           "batch_files": a.batch_files, "compression_level": level, "frames_per_chunk": frames_per_chunk,
           "times_s": dict(times), "total_s": total,
           "throughput": {"files_per_s": written / total, "frames_per_s": frames_total / total},
           "peak_rss_bytes": pc.peak_rss_bytes()["self"], "torch": torch.__version__}
    pc.write_json(a.report or os.path.join(a.output, "py_build_report.json"), rep)
    print(f"py_builder: {written} clips, {frames_total} frames in {total:.3f} s: "
          f"{written / total:.0f} files/s; " + ", ".join(f"{k} {v:.3f}" for k, v in times.items()))
    return 0


def h5write(a) -> int:
    with h5py.File(a.input, "r") as f:
        arr = f["frames"][:]
        chunks = f["frames"].chunks
    out = a.input + f".pywrite{os.getpid()}.h5"
    gz, raw = [], []
    for r in range(a.repeats + 1):
        t = time.perf_counter()
        with h5py.File(out, "w") as h5:
            h5.create_dataset("frames", data=arr, chunks=chunks, compression="gzip",
                              compression_opts=a.compression_level, shuffle=True)
        g = time.perf_counter() - t
        t = time.perf_counter()
        with h5py.File(out, "w") as h5:
            h5.create_dataset("frames", data=arr)
        w = time.perf_counter() - t
        if r > 0:
            gz.append(g)
            raw.append(w)
    os.remove(out)
    mb = arr.nbytes / 1e6
    res = {"input": a.input, "uncompressed_bytes": arr.nbytes, "chunks": chunks, "level": a.compression_level,
           "h5py": h5py.version.version, "hdf5": h5py.version.hdf5_version,
           "gzip": {"seconds": gz, "median_s": pc.median(gz), "mb_per_s": mb / pc.median(gz)},
           "raw": {"seconds": raw, "median_s": pc.median(raw), "mb_per_s": mb / pc.median(raw)}}
    print(f"h5py write of {mb:.1f} MB: gzip level {a.compression_level} + shuffle {pc.median(gz):.4f} s, "
          f"raw {pc.median(raw):.4f} s")
    pc.write_json(a.out, res)
    return 0


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--input", required=True)
    b.add_argument("--output", required=True)
    b.add_argument("--config", default=os.path.join(here, "..", "demo_build.ini"))
    b.add_argument("--threads", type=int, default=0, help="torch threads and reader threads (0: all cores)")
    b.add_argument("--batch-files", type=int, default=512)
    b.add_argument("--compression-level", type=int, default=None)
    b.add_argument("--report", default=None)
    w = sub.add_parser("h5write")
    w.add_argument("--input", required=True)
    w.add_argument("--compression-level", type=int, default=4)
    w.add_argument("--repeats", type=int, default=3)
    w.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.cmd == "build":
        if a.threads == 0:
            a.threads = os.cpu_count()
        return build(a)
    return h5write(a)


if __name__ == "__main__":
    sys.exit(main())
