"""melforge.Loader against the loaders a PyTorch user writes (issues 16 and 28), side by side in one run, random
order, on datasets of whole clips (schema 3) built here by `melforge-build` (builder defaults but 128 mels, n_fft
1024, hop 160; float16 and float32), over two views:

  tiles         the default tile (the dataset's short_seconds) side by side over each clip, min_real 0.5;
  crops         one random window per clip per epoch (view="crops", the same length as a tile, short clips padded).

Peers, each over both views:

  melforge      melforge.Loader(Dataset(out, "train", view=...), batch_size, shuffle=True): batches assembled by the
                C++ thread with the chunk-aware shuffle; streamed (in_memory=False: every epoch reads the file) and in
                RAM (in_memory=True: the first epoch reads the file, later epochs copy from RAM);
  h5py          torch DataLoader(num_workers=2, batch_size) over the map-style Dataset users write for variable-length
                clips: h5py opened once per worker, `frame_offset` read at the start, one example per __getitem__
                (tiles: a (clip, start) index; crops: a random start drawn in __getitem__), sliced from `frames`,
                padded with the silence value;
  in-RAM loop   the split's frames loaded beforehand as one float32 tensor [N, M] (the loading time is not counted),
                then per epoch torch.randperm and one index gather per batch (tiles: the tiles' first frames; crops:
                random starts drawn per epoch with torch).

Corpora (--corpus): `fixed` is issue 16's (600 files of --seconds 4 s, 4 classes: 16 tiles per clip); `varlen` is
tools/make_varlen_corpus.py's FSD50K-like corpus (240 clips of 0.3-30 s, 8 classes).

Each figure is examples per second, the median of --epochs timed units after one warm-up epoch (the page cache is
warm for every peer); a unit is as many epochs as make at least --min-examples examples (a crops epoch holds one
example per clip). The h5py DataLoader is slow enough that it is timed over --h5py-batches batches from its first on
(its workers' start is not counted), drawing clips with replacement for crops.

  python tools/bench/python_loader.py [--corpus fixed|varlen] [--files-per-class 150] [--classes 4] [--seconds 4]
        [--batch-size 64] [--epochs 3] [--h5py-batches 40] [--dtypes float16,float32] [--work DIR]
        [--melforge-build build/builder/melforge-build]
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
H5PY = "h5py + DataLoader(num_workers=2)"
RAM = "in-RAM loop (randperm)"


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


def make_corpus(a, work):
    """Returns the melforge-build input flags of the corpus."""
    if a.corpus == "fixed":
        corpus = work / "corpus"
        if not corpus.exists():
            write_corpus(corpus, a.classes, a.files_per_class, a.seconds)
        return ["--input", str(corpus)]
    corpus = work / "varlen"
    subprocess.run(["/usr/bin/python3", str(ROOT / "tools/make_varlen_corpus.py"), "--out", str(corpus)], check=True,
                   stdout=subprocess.DEVNULL)
    return ["--manifest", str(corpus / "manifest.csv")]


def build(binary, corpus_flags, out, dtype):
    if (out / "train.h5").exists():
        return
    subprocess.run([str(binary)] + corpus_flags + ["--output", str(out), "--dtype", dtype, "--device", "cpu",
                    "--n-mels", "128", "--n-fft", "1024", "--hop-length", "160", "--quiet"], check=True,
                   stdout=subprocess.DEVNULL)


def tile_starts(clip_frames, length, min_real=0.5):
    """(clip, first frame) of each tile of `length` frames side by side: a tile with fewer than min_real * length real
    frames is not made unless it is its clip's first."""
    return [(c, s) for c in range(len(clip_frames)) for s in range(0, int(clip_frames[c]), length)
            if s == 0 or clip_frames[c] - s >= min_real * length]


class H5Clips:
    """The map-style Dataset users write for clips of any length: h5py opened lazily per worker, `frame_offset` and
    `label` read once; item k is tile k (tiles: a precomputed (clip, start) list) or clip k with a random start
    (crops); the window is sliced from `frames`, transposed to [n_mels, T] and padded with `pad`."""

    def __init__(self, path, length, pad, crops, min_real=0.5):
        import h5py
        self.path, self.length, self.pad, self.crops = str(path), length, pad, crops
        with h5py.File(self.path, "r") as f:
            self.offset = f["frame_offset"][...]
            self.labels = f["label"][...].astype(np.int64)
        frames = np.diff(self.offset)
        self.index = None if crops else tile_starts(frames, length, min_real)
        self.file = None

    def __len__(self):
        return len(self.labels) if self.crops else len(self.index)

    def __getitem__(self, k):
        import h5py
        import torch
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        if self.crops:
            clip = k
            n = int(self.offset[clip + 1] - self.offset[clip])
            start = int(torch.randint(0, max(1, n - self.length + 1), ()).item())
        else:
            clip, start = self.index[k]
            n = int(self.offset[clip + 1] - self.offset[clip])
        real = min(self.length, n - start)
        first = int(self.offset[clip]) + start
        x = np.full((self.length, self.file["frames"].shape[1]), self.pad, dtype=np.float32)
        x[:real] = self.file["frames"][first:first + real]
        return torch.from_numpy(x.T.copy()), int(self.labels[clip]), real


def timed_units(run_epoch, units, min_examples):
    """Runs one warm-up epoch, then `units` timed units of epochs (each at least min_examples examples); returns the
    median examples/s."""
    run_epoch()
    rates = []
    for _ in range(units):
        t0 = time.perf_counter()
        n = 0
        while n < min_examples:
            n += run_epoch()
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def bench_melforge(folder, view, a):
    import melforge
    ds = melforge.Dataset(folder, "train", view=view)
    out = {}
    for mode, in_memory in (("streamed", False), ("in RAM", True)):
        loader = melforge.Loader(ds, batch_size=a.batch_size, shuffle=True, seed=0, prefetch=4, in_memory=in_memory)

        def run(loader=loader):
            n = 0
            for x, y, f in loader:
                n += x.shape[0]
            return n
        out[f"melforge.Loader ({mode})"] = timed_units(run, a.epochs, a.min_examples)
    return ds, out


def bench_h5py(ds, view, a):
    import torch
    h5 = H5Clips(ds.path, ds.info["n_frames"], ds.pad_value, crops=view == "crops")
    sampler = torch.utils.data.RandomSampler(h5, replacement=True, num_samples=(a.h5py_batches + 1) * a.batch_size)
    dl = torch.utils.data.DataLoader(h5, batch_size=a.batch_size, sampler=sampler, num_workers=2)
    it = iter(dl)
    next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in range(a.h5py_batches):
        x, y, length = next(it)
        n += x.shape[0]
    rate = n / (time.perf_counter() - t0)
    del it
    return rate


def bench_ram(ds, view, a):
    """The in-RAM loop: frames [N, M] in one tensor, an index gather per batch."""
    import torch
    import melforge
    clips = melforge.Dataset(ds.folder, "train", view="clips")
    frames = torch.cat([b.x[i, :, :int(b.lengths[i])].T for b in
                        melforge.Loader(clips, batch_size=64, shuffle=False, in_memory=False) for i in range(len(b.x))])
    order = torch.cat([b.clip for b in melforge.Loader(clips, batch_size=64, shuffle=False, in_memory=False)])
    counts = torch.as_tensor(np.asarray(ds.clip_frames), dtype=torch.int64)
    offset = torch.zeros(len(counts) + 1, dtype=torch.int64)
    offset[1:] = torch.cumsum(counts[order], 0)
    first = torch.empty_like(counts)
    first[order] = offset[:-1]
    frames = torch.cat([frames, torch.full((1, frames.shape[1]), float(ds.pad_value))])
    pad_row = frames.shape[0] - 1
    labels = torch.as_tensor(np.asarray(ds.labels), dtype=torch.int64)
    length = int(ds.info["n_frames"])
    steps = torch.arange(length)
    tiles = tile_starts(counts.tolist(), length)
    if view == "tiles" and len(tiles) != len(ds):
        raise SystemExit(f"the peers' tiles ({len(tiles)}) are not melforge's ({len(ds)})")
    tile_clip = torch.as_tensor([c for c, s in tiles], dtype=torch.int64)
    tile_start = torch.as_tensor([s for c, s in tiles], dtype=torch.int64)

    def run():
        if view == "tiles":
            clip_of, start = tile_clip, tile_start
        else:
            clip_of = torch.arange(len(counts))
            start = (torch.rand(len(counts)) * (counts - length + 1).clamp(min=1)).long()
        perm = torch.randperm(len(clip_of))
        n = 0
        for i in range(0, len(perm), a.batch_size):
            idx = perm[i:i + a.batch_size]
            c = clip_of[idx]
            pos = start[idx, None] + steps
            rows = torch.where(pos < counts[c, None], first[c, None] + pos, pad_row)
            x = frames[rows].transpose(1, 2).contiguous()
            y = labels[c]
            n += x.shape[0]
        return n
    return timed_units(run, a.epochs, a.min_examples)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", choices=["fixed", "varlen"], default="fixed")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--files-per-class", type=int, default=150)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3, help="timed units per figure (median)")
    ap.add_argument("--min-examples", type=int, default=4096, help="examples per timed unit, at least")
    ap.add_argument("--h5py-batches", type=int, default=40)
    ap.add_argument("--dtypes", default="float16,float32")
    ap.add_argument("--work", default=None, help="folder for the corpus and datasets (default: a temporary one)")
    ap.add_argument("--melforge-build", default=os.environ.get("MELFORGE_BUILD_BIN",
                                                               str(ROOT / "build" / "builder" / "melforge-build")))
    a = ap.parse_args()
    work = pathlib.Path(a.work) if a.work else pathlib.Path(tempfile.mkdtemp(prefix="melforge-loader-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus_flags = make_corpus(a, work)
    import torch
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, batch {a.batch_size}, corpus {a.corpus}, work {work}, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for dtype in a.dtypes.split(","):
        out = work / f"ds-{a.corpus}-{dtype}"
        build(a.melforge_build, corpus_flags, out, dtype)
        rates = {}
        for view in ("tiles", "crops"):
            ds, r = bench_melforge(out, view, a)
            r[H5PY] = bench_h5py(ds, view, a)
            r[RAM] = bench_ram(ds, view, a)
            rates[view] = (len(ds), r)
        info = ds.info
        print(f"\n{dtype}: {len(ds.clip_frames)} train clips, {int(np.sum(ds.clip_frames))} frames of {info['n_mels']} "
              f"mels; examples of [{info['n_mels']}, {info['n_frames']}] float32")
        tiles_stream = rates["tiles"][1]["melforge.Loader (streamed)"]
        tiles_ram = rates["tiles"][1]["melforge.Loader (in RAM)"]
        for view, (n, r) in rates.items():
            print(f" {view} ({n} examples an epoch)")
            for name, rate in r.items():
                same_mode = tiles_ram if "in RAM" in name else tiles_stream
                print(f"  {name:36s} {rate:12,.0f} samples/s   x{rate / r[H5PY]:7.1f} h5py   "
                      f"x{rate / r[RAM]:5.2f} in-RAM   x{rate / same_mode:5.2f} Loader tiles"
                      + (" (same mode)" if name.startswith("melforge") else " (streamed)"))
        sys.stdout.flush()
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
