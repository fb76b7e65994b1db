"""melforge.Loader against the loaders a PyTorch user writes (issue 16), side by side in one run, random order, on
the same dataset built here by `melforge-build` (builder defaults but 128 mels, n_fft 1024, hop 160;
float16 and float32):

  melforge      melforge.Loader(Dataset(out, "train"), batch_size, shuffle=True): batches assembled by the C++
                thread with the chunk-aware shuffle; streamed (in_memory=False: every epoch reads the file) and in RAM
                (in_memory=True: the first epoch reads the file, later epochs copy from RAM);
  h5py          torch DataLoader(num_workers=2, batch_size, shuffle=True) over a map-style Dataset that opens h5py
                once per worker and reads one segment per __getitem__ (as users write it);
  in-RAM loop   the whole split's valid segments loaded beforehand as one float32 tensor, then per epoch
                torch.randperm and x[idx] per batch (the loading time is not counted).

Each figure is valid segments per second over a whole epoch, the median of --epochs epochs after one warm-up epoch
(the page cache is warm for every peer). The h5py DataLoader is slow enough that it is timed over --h5py-batches
batches of one shuffled epoch, from its first batch on (its workers' start is not counted).

  python tools/bench/python_loader.py [--files-per-class 150] [--classes 4] [--seconds 4] [--batch-size 64]
        [--epochs 3] [--h5py-batches 40] [--work DIR] [--melforge-build build/builder/melforge-build]
"""
import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import wave

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]


def write_corpus(root, classes, per_class, seconds, rate=16000):
    rng = np.random.default_rng(0)
    for c in range(classes):
        d = root / f"class{c}"
        d.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            n = int(rate * seconds)
            t = np.arange(n) / rate
            x = 0.3 * np.sin(2 * np.pi * (200 + 150 * c + 3 * i) * t) + 0.05 * rng.standard_normal(n)
            pcm = np.clip(np.round(x * 32767), -32768, 32767).astype("<i2")
            with wave.open(str(d / f"f{i}.wav"), "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(rate)
                w.writeframes(pcm.tobytes())


def build(binary, corpus, out, dtype):
    if (out / "train.h5").exists():
        return
    subprocess.run([str(binary), "--input", str(corpus), "--output", str(out), "--dtype", dtype, "--device", "cpu",
                    "--n-mels", "128", "--n-fft", "1024", "--hop-length", "160", "--quiet"], check=True, stdout=subprocess.DEVNULL)


class H5Segments:
    """The map-style Dataset users write: h5py opened lazily per worker, one segment per item."""

    def __init__(self, path):
        import h5py
        self.path = str(path)
        with h5py.File(self.path, "r") as f:
            valid = f["num_valid_long"][...]
            labels = f["label"][...]
            num_short = f["mel"].shape[2]
        self.index = [(i, l, s) for i in range(len(valid)) for l in range(int(valid[i])) for s in range(num_short)]
        self.labels = labels
        self.file = None

    def __len__(self):
        return len(self.index)

    def __getitem__(self, k):
        import h5py
        import torch
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        i, l, s = self.index[k]
        x = self.file["mel"][i, l, s].astype(np.float32)
        return torch.from_numpy(x), int(self.labels[i])


def timed_epochs(run_epoch, epochs):
    """Runs one warm-up epoch, then `epochs` timed ones; returns the median samples/s."""
    run_epoch()
    rates = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        n = run_epoch()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def bench_split(folder, batch_size, epochs, h5py_batches):
    import torch
    import melforge
    ds = melforge.Dataset(folder, "train")
    results = {}
    for name, in_memory in (("melforge.Loader (streamed)", False), ("melforge.Loader (in RAM)", True)):
        loader = melforge.Loader(ds, batch_size=batch_size, shuffle=True, seed=0, prefetch=4, in_memory=in_memory)

        def run(loader=loader):
            n = 0
            for x, y, f in loader:
                n += x.shape[0]
            return n
        results[name] = timed_epochs(run, epochs)

    h5 = H5Segments(ds.path)
    dl = torch.utils.data.DataLoader(h5, batch_size=batch_size, shuffle=True, num_workers=2)

    it = iter(dl)
    next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in range(h5py_batches):
        x, y = next(it)
        n += x.shape[0]
    results["h5py + DataLoader(num_workers=2)"] = n / (time.perf_counter() - t0)
    del it

    x_all = torch.cat([torch.from_numpy(b[0].copy()) for b in
                       melforge.Loader(ds, batch_size=4096, shuffle=False, as_torch=False)])
    y_all = torch.cat([torch.from_numpy(b[1].copy()) for b in
                       melforge.Loader(ds, batch_size=4096, shuffle=False, as_torch=False)])

    def run_ram():
        n = x_all.shape[0]
        perm = torch.randperm(n)
        count = 0
        for i in range(0, n, batch_size):
            idx = perm[i:i + batch_size]
            x, y = x_all[idx], y_all[idx]
            count += x.shape[0]
        return count
    results["in-RAM loop (randperm)"] = timed_epochs(run_ram, epochs)
    return len(ds), ds.info, results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--files-per-class", type=int, default=150)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--h5py-batches", type=int, default=40)
    ap.add_argument("--work", default=None, help="folder for the corpus and datasets (default: a temporary one)")
    ap.add_argument("--melforge-build", default=os.environ.get("MELFORGE_BUILD_BIN",
                                                               str(ROOT / "build" / "builder" / "melforge-build")))
    a = ap.parse_args()
    work = pathlib.Path(a.work) if a.work else pathlib.Path(tempfile.mkdtemp(prefix="melforge-loader-bench-"))
    corpus = work / "corpus"
    if not corpus.exists():
        write_corpus(corpus, a.classes, a.files_per_class, a.seconds)
    import torch
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, batch {a.batch_size}, work {work}")
    for dtype in ("float16", "float32"):
        out = work / f"ds-{dtype}"
        build(a.melforge_build, corpus, out, dtype)
        n, info, r = bench_split(out, a.batch_size, a.epochs, a.h5py_batches)
        print(f"\n{dtype}: {n} train segments of [{info['n_mels']}, {info['n_frames']}] float32 "
              f"({n * info['n_mels'] * info['n_frames'] * 4 / 2**20:.0f} MiB)")
        h5 = r["h5py + DataLoader(num_workers=2)"]
        ram = r["in-RAM loop (randperm)"]
        for name, rate in r.items():
            print(f"  {name:36s} {rate:12,.0f} samples/s   x{rate / h5:7.1f} h5py   x{rate / ram:5.2f} in-RAM")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
