"""The Python trainer peer (issue 4), written with the Python trainer's own optimisations: an h5py Dataset with one
open file per DataLoader worker (opened lazily in the worker, with a chunk cache that holds the split), DataLoader
workers with persistent_workers, pin_memory + non_blocking copies on CUDA, torch's fused AdamW, metrics accumulated
on the device and `.item()` once per epoch, autocast (AMP) when asked. The model is python/melforge/models.py's, the
same module tree as melforge-train's; the hyperparameters are melforge-train's defaults (batch 64, lr 1e-3 with 5%
linear warmup then cosine to 0, AdamW wd 0.01, clip-norm 1, CE + BCE detection head with pos_weight
negatives/positives, dropout 0.3, input normalised by the training split's mean and std). Reads melforge-build's
(or py_builder.py's) OUT/{train,val,test}.h5 of schema 3 (each clip whole: `frames` [N, n_mels] and `frame_offset`),
through the tiles melforge-train uses by default (data/views/tiles.cpp): tile = the file's n_frames (short_seconds),
hop = tile, min_real 0.5 for training and 0 for evaluation (every frame of every clip in a tile; the last tile of a
clip padded with the silence value), the file vote the mean of the clip's tiles' probabilities.

  py_trainer.py train --data DIR --out RUN [--epochs 8] [--batch-size 64] [--workers 2] [--threads 0]
                      [--amp off|bf16|fp16] [--positive-class NAME] [--device cpu|cuda]
  py_trainer.py eval --checkpoint CKPT --data DIR [--split test] [--mode sequential|batched] [--passes 1]
                     [--eval-batch-size 1024] [--out r.json]
  py_trainer.py bench-step --data DIR [--steps 50] [--warmup-steps 5] [--batch-size 64] [--out r.json]

`eval` loads melforge-train checkpoints (best.pt: "model" state dict + "model_config" JSON) as well as this script's.
It reads the split into RAM first, outside the timer (load_s), as `melforge-train eval` does before its timed
evaluation; then it evaluates the split --passes times from RAM and times each pass. files_per_s is the first pass
(cold, like `melforge-train eval`'s single pass), files_per_s_warm the last one when --passes >= 2 (warm, like the
second of the two passes `melforge-train bench` makes, which it times). sequential: one forward per file (the file's
tiles); batched: every tile of the split in forward passes of --eval-batch-size tiles. File decision: the mean of its
tiles' softmax (melforge's vote mean). Both modes compute the confusion matrices inside the timer, as melforge's evaluation computes its metrics.
`bench-step` times forward + backward + clip + AdamW step on one batch already in place (melforge-train bench's
"training step").
"""
import argparse
import json
import math
import os
import sys
import time

import h5py
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, ".."))
import importlib.util  # noqa: E402

# python/melforge/models.py by path: the torch venv running this has no melforge package installed.
_models_spec = importlib.util.spec_from_file_location(
    "melforge_models", os.path.join(here, "..", "..", "python", "melforge", "models.py"))
melforge_models = importlib.util.module_from_spec(_models_spec)
_models_spec.loader.exec_module(melforge_models)
import py_common as pc  # noqa: E402


def silence_value(attrs) -> float:
    """The value of a padded frame: the log of zero energy under the file's parameters (mel::silence_value)."""
    log = attrs["log"].decode() if isinstance(attrs["log"], bytes) else str(attrs["log"])
    if log == "db":
        return float(np.float32(20.0 / float(attrs["power"]) * math.log10(float(attrs["amin"]))))
    if log == "ln":
        return float(np.float32(math.log(float(attrs["log_eps"]))))
    return 0.0


def tile_table(frame_offset: np.ndarray, tile: int, hop: int, min_real: float):
    """melforge's tiles view (data/views/tiles.cpp): windows of `tile` frames every `hop` frames over each clip, up to
    the first that reaches the clip's end; one with fewer than min_real * tile real frames is not made unless it is
    the clip's first. Returns int64 arrays (clip, start, real) [K], clip by clip."""
    clips, starts, reals = [], [], []
    for c, n in enumerate(np.diff(frame_offset).tolist()):
        start = 0
        while True:
            real = min(tile, n - start)
            if start == 0 or real / tile >= min_real:
                clips.append(c)
                starts.append(start)
                reals.append(real)
            if start + tile >= n:
                break
            start += hop
    return np.array(clips, np.int64), np.array(starts, np.int64), np.array(reals, np.int64)


def check_schema3(f, path: str) -> None:
    if int(f.attrs.get("schema_version", 0)) != 3 or "frames" not in f:
        raise SystemExit(f"py_trainer: {path} is not a schema-3 melforge dataset (frames + frame_offset)")


class TileDataset(Dataset):
    """Training tiles of one split file (tile = n_frames, hop = tile, min_real 0.5: melforge-train's default view);
    item = (float32 [n_mels, n_frames], label), padded with the silence value."""

    def __init__(self, path: str, cache_bytes: int = 256 << 20, min_real: float = 0.5):
        self.path, self.cache_bytes = path, cache_bytes
        with h5py.File(path, "r") as f:
            check_schema3(f, path)
            self.n_mels, self.n_frames = int(f["frames"].shape[1]), int(f.attrs["n_frames"])
            self.offset = f["frame_offset"][:].astype(np.int64)
            self.labels = f["label"][:].astype(np.int64)
            self.pad = silence_value(f.attrs)
            self.class_names = [c.decode() if isinstance(c, bytes) else c for c in f["class_names"][:]]
        self.clip, self.start, self.real = tile_table(self.offset, self.n_frames, self.n_frames, min_real)
        self.file = None

    def __len__(self):
        return len(self.clip)

    def __getitem__(self, i):
        if self.file is None:
            self.file = h5py.File(self.path, "r", rdcc_nbytes=self.cache_bytes, rdcc_nslots=100003)
            self.frames = self.file["frames"]
        c, real = int(self.clip[i]), int(self.real[i])
        first = int(self.offset[c] + self.start[i])
        x = np.full((self.n_frames, self.n_mels), self.pad, dtype=np.float32)
        x[:real] = self.frames[first:first + real]
        return torch.from_numpy(np.ascontiguousarray(x.T)), self.labels[c]


class Clips:
    """A split in RAM: frames float32 [N + 1, M] (the last row the silence value), frame_offset [F + 1], labels [F],
    and its evaluation tiles (min_real 0: every frame of every clip in a tile)."""

    def __init__(self, path: str, min_real: float = 0.0):
        with h5py.File(path, "r") as f:
            check_schema3(f, path)
            self.names = [c.decode() if isinstance(c, bytes) else c for c in f["class_names"][:]]
            self.n_frames = int(f.attrs["n_frames"])
            pad = silence_value(f.attrs)
            frames = torch.from_numpy(f["frames"][:].astype(np.float32))
            self.offset = f["frame_offset"][:].astype(np.int64)
            self.labels = torch.from_numpy(f["label"][:].astype(np.int64))
        self.frames = torch.cat([frames, torch.full((1, frames.shape[1]), pad)])
        clip, start, real = tile_table(self.offset, self.n_frames, self.n_frames, min_real)
        self.tile_clip = torch.from_numpy(clip)
        self.tile_first = torch.from_numpy(self.offset[clip] + start)
        self.tile_real = torch.from_numpy(real)

    @property
    def files(self) -> int:
        return len(self.labels)

    def gather(self, tiles: torch.Tensor) -> torch.Tensor:
        """x float32 [len(tiles), n_mels, n_frames] of those tiles, padded frames holding the silence value."""
        steps = torch.arange(self.n_frames)
        rows = torch.where(steps < self.tile_real[tiles, None], self.tile_first[tiles, None] + steps,
                           self.frames.shape[0] - 1)
        return self.frames[rows].transpose(1, 2).contiguous()


def input_statistics(path: str):
    """Mean and std of the training split's frames (schema 3: every stored frame is real)."""
    with h5py.File(path, "r") as f:
        frames = f["frames"]
        s = s2 = n = 0.0
        step = frames.chunks[0] if frames.chunks else 8192
        for r in range(0, frames.shape[0], step):
            v = frames[r:r + step].astype(np.float64)
            s += v.sum()
            s2 += np.square(v).sum()
            n += v.size
    mean = s / n
    var = max(0.0, s2 / n - mean * mean)
    return mean, math.sqrt(var) if var > 0 else 1.0


def combined_loss(logits, det, y, positive, bce_weight, pos_weight):
    ce = F.cross_entropy(logits.float(), y)
    bce = F.binary_cross_entropy_with_logits(det.float(), (y == positive).float(), pos_weight=pos_weight)
    return ce + bce_weight * bce


def macro_f1(conf: torch.Tensor) -> float:
    tp = conf.diag().double()
    prec = tp / conf.sum(0).clamp(min=1)
    rec = tp / conf.sum(1).clamp(min=1)
    f1 = torch.where(prec + rec > 0, 2 * prec * rec / (prec + rec), torch.zeros_like(prec))
    support = conf.sum(1) > 0
    return float(f1[support].mean())


def clip_vote(probs: torch.Tensor, clip: torch.Tensor, files: int) -> torch.Tensor:
    """probs [K, C] of tiles of clips `clip` [K] -> [files, C]: the mean over each clip's tiles (melforge's vote)."""
    total = torch.zeros(files, probs.shape[1]).index_add_(0, clip, probs)
    count = torch.zeros(files).index_add_(0, clip, torch.ones(len(clip)))
    return total / count.clamp(min=1)[:, None]


def eval_batched(model, clips: Clips, batch, device, amp):
    """Every tile of every clip in forward passes of `batch` tiles, voted per clip; returns (tile conf, file conf)."""
    C = model.num_classes
    K = len(clips.tile_clip)
    probs = torch.empty(K, C)
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        for k0 in range(0, K, batch):
            x = clips.gather(torch.arange(k0, min(K, k0 + batch))).to(device, non_blocking=True)
            lg, _ = model(x)
            probs[k0:k0 + x.shape[0]] = lg.float().softmax(1).cpu()
    tile_true = clips.labels[clips.tile_clip]
    fp = clip_vote(probs, clips.tile_clip, clips.files)
    return confusions(tile_true, probs.argmax(1), C), confusions(clips.labels, fp.argmax(1), C)


def eval_sequential(model, clips: Clips, device, amp):
    """One forward per file (its tiles) from the split in RAM; returns (tile conf, file conf)."""
    C = model.num_classes
    preds, tile_true, tile_pred = [], [], []
    bounds = torch.searchsorted(clips.tile_clip, torch.arange(clips.files + 1))
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        for fi in range(clips.files):
            x = clips.gather(torch.arange(int(bounds[fi]), int(bounds[fi + 1]))).to(device)
            lg, _ = model(x)
            p = lg.float().softmax(1)
            preds.append(int(p.mean(0).argmax()))
            tile_pred.append(p.argmax(-1).cpu())
            tile_true.append(torch.full((p.shape[0],), int(clips.labels[fi])))
    return confusions(torch.cat(tile_true), torch.cat(tile_pred), C), confusions(clips.labels, torch.tensor(preds), C)


def confusions(t, p, C):
    return torch.bincount(t * C + p, minlength=C * C).view(C, C)


class TimedBatches:
    """Iterates `loader`, adding the seconds spent waiting for each batch to `wait`."""

    def __init__(self, loader):
        self.loader, self.wait = loader, 0.0

    def __iter__(self):
        it = iter(self.loader)
        while True:
            tw = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            self.wait += time.perf_counter() - tw
            yield batch


def optimizer_step(loss, model, opt, sched, scaler, clip_norm: float) -> None:
    """backward (scaled for fp16), clip the gradient norm, AdamW and scheduler steps, gradients set to None."""
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    scaler.step(opt)
    scaler.update()
    sched.step()
    opt.zero_grad(set_to_none=True)


def warmup_cosine(opt, total_steps: int, warmup_fraction: float):
    """melforge-train's schedule: linear warmup over warmup_fraction of total_steps, then cosine to 0."""
    total = max(1, total_steps)
    warmup = min(round(warmup_fraction * total), total)

    def lr_factor(step):
        if step < warmup:
            return (step + 1) / warmup
        if step >= total:
            return 0.0
        return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    return torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)


def train(a) -> int:
    t_start = time.perf_counter()
    pc.set_threads(a.threads)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    amp = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.amp]
    train_path = os.path.join(a.data, "train.h5")
    ds = TileDataset(train_path)
    C = len(ds.class_names)
    positive = ds.class_names.index(a.positive_class) if a.positive_class else (
        ds.class_names.index("leak") if "leak" in ds.class_names else 0)
    seg_labels = torch.from_numpy(ds.labels[ds.clip])
    pos = float((seg_labels == positive).sum())
    pos_weight = torch.tensor([(len(ds) - pos) / pos if pos > 0 else 1.0], device=device)
    mean, std = input_statistics(train_path)
    val = Clips(os.path.join(a.data, "val.h5"))
    t_load = time.perf_counter() - t_start

    torch.manual_seed(a.seed)
    model = melforge_models.Cnn(ds.n_mels, ds.n_frames, C, hidden=a.hidden, dropout=a.dropout)
    model.input_mean.fill_(mean)
    model.input_std.fill_(std)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay,
                            fused=True)
    sched = warmup_cosine(opt, a.epochs * math.ceil(len(ds) / a.batch_size), a.warmup)
    scaler = torch.amp.GradScaler(device.type, enabled=a.amp == "fp16")
    gen = torch.Generator().manual_seed(a.seed)
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, generator=gen, num_workers=a.workers,
                        pin_memory=cuda, persistent_workers=a.workers > 0,
                        prefetch_factor=4 if a.workers > 0 else None, drop_last=False)
    os.makedirs(a.out, exist_ok=True)
    epochs, best, best_state = [], -1.0, None
    train_total = wait_total = 0.0
    samples_total = 0
    for epoch in range(a.epochs):
        model.train()
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), dtype=torch.int64, device=device)
        t0 = time.perf_counter()
        batches = TimedBatches(loader)
        for x, y in batches:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                logits, det = model(x)
                loss = combined_loss(logits, det, y, positive, a.bce_weight, pos_weight)
            optimizer_step(loss, model, opt, sched, scaler, a.clip_norm)
            loss_sum += loss.detach() * y.shape[0]
            correct += (logits.detach().argmax(1) == y).sum()
        train_s = time.perf_counter() - t0
        wait = batches.wait
        n = len(ds)
        tl, tc = loss_sum.item(), correct.item()
        tv = time.perf_counter()
        model.eval()
        seg_conf, file_conf = eval_batched(model, val, a.eval_batch_size, device, amp)
        val_s = time.perf_counter() - tv
        f1 = macro_f1(seg_conf)
        line = {"epoch": epoch + 1, "train_loss": tl / n, "train_accuracy": tc / n,
                "val_accuracy": float(seg_conf.diag().sum() / seg_conf.sum()), "val_macro_f1": f1,
                "val_file_accuracy": float(file_conf.diag().sum() / file_conf.sum()),
                "samples_per_s": n / train_s, "train_s": train_s, "val_s": val_s,
                "data_wait_fraction": wait / train_s}
        epochs.append(line)
        train_total += train_s
        wait_total += wait
        samples_total += n
        if f1 > best:
            best = f1
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        pc.log(f"epoch {epoch + 1}: loss {tl / n:.4f} acc {tc / n:.4f} val acc {line['val_accuracy']:.4f} "
               f"val file acc {line['val_file_accuracy']:.4f} {n / train_s:.0f} samples/s wait "
               f"{100 * wait / train_s:.1f}%")
    del loader
    model.load_state_dict(best_state)
    ckpt = os.path.join(a.out, "best.pt")
    torch.save({"model": best_state, "model_config": model.config()}, ckpt)
    test = Clips(os.path.join(a.data, "test.h5"))
    seg_conf, file_conf = eval_batched(model, test, a.eval_batch_size, device, amp)
    rss = pc.peak_rss_bytes()
    rep = {"epochs": epochs, "batch_size": a.batch_size, "workers": a.workers, "threads": torch.get_num_threads(),
           "amp": a.amp, "device": str(device), "load_s": t_load, "train_s": train_total,
           "samples_per_s": samples_total / train_total, "data_wait_fraction": wait_total / train_total,
           "test_accuracy": float(seg_conf.diag().sum() / seg_conf.sum()),
           "test_file_accuracy": float(file_conf.diag().sum() / file_conf.sum()),
           "total_s": time.perf_counter() - t_start, "peak_rss_bytes": rss, "torch": torch.__version__}
    pc.write_json(os.path.join(a.out, "py_report.json"), rep)
    print(f"py_trainer: {a.epochs} epochs, {rep['samples_per_s']:.0f} samples/s, data wait "
          f"{100 * rep['data_wait_fraction']:.1f}%, test accuracy {rep['test_accuracy']:.4f} "
          f"(files {rep['test_file_accuracy']:.4f})")
    return 0


def load_model(path: str):
    ck = torch.load(path, map_location="cpu")
    model = melforge_models.build_model(ck)
    model.load_state_dict(ck["model"])
    return model.eval()


def evaluate(a) -> int:
    if a.passes < 1:
        raise SystemExit(f"py_trainer eval: --passes must be >= 1, got {a.passes}")
    t_start = time.perf_counter()
    pc.set_threads(a.threads)
    device = torch.device(a.device)
    amp = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.amp]
    model = load_model(a.checkpoint).to(device)
    path = os.path.join(a.data, f"{a.split}.h5")
    t0 = time.perf_counter()
    clips = Clips(path)
    load_s = time.perf_counter() - t0
    Fn = clips.files
    pass_s = []
    for _ in range(a.passes):
        t0 = time.perf_counter()
        if a.mode == "batched":
            seg_conf, file_conf = eval_batched(model, clips, a.eval_batch_size, device, amp)
        else:
            seg_conf, file_conf = eval_sequential(model, clips, device, amp)
        if device.type == "cuda":
            torch.cuda.synchronize()
        pass_s.append(time.perf_counter() - t0)
    eval_s = pass_s[0]
    res = {"mode": a.mode, "split": a.split, "files": Fn, "load_s": load_s, "eval_s": eval_s, "pass_s": pass_s,
           "files_per_s": Fn / eval_s, "files_per_s_with_load": Fn / (load_s + eval_s),
           "files_per_s_warm": Fn / pass_s[-1] if len(pass_s) > 1 else None,
           "segment_accuracy": float(seg_conf.diag().sum() / seg_conf.sum()),
           "file_accuracy": float(file_conf.diag().sum() / file_conf.sum()),
           "threads": torch.get_num_threads(), "total_s": time.perf_counter() - t_start,
           "peak_rss_bytes": pc.peak_rss_bytes()["self"]}
    warm = f", {res['files_per_s_warm']:.0f} warm" if res["files_per_s_warm"] else ""
    print(f"py_trainer eval ({a.mode}): {Fn} files, {res['files_per_s']:.0f} files/s cold{warm} "
          f"({res['files_per_s_with_load']:.0f} with load), file accuracy {res['file_accuracy']:.4f}, "
          f"segment accuracy {res['segment_accuracy']:.4f}")
    pc.write_json(a.out, res)
    return 0


def bench_step(a) -> int:
    pc.set_threads(a.threads)
    device = torch.device(a.device)
    amp = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.amp]
    clips = Clips(os.path.join(a.data, "train.h5"), min_real=0.5)
    first = torch.arange(min(a.batch_size, len(clips.tile_clip)))
    x = clips.gather(first).to(device)
    yb = clips.labels[clips.tile_clip[first]].to(device)
    torch.manual_seed(a.seed)
    model = melforge_models.Cnn(x.shape[1], x.shape[2], len(clips.names), hidden=a.hidden,
                                dropout=a.dropout).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=a.weight_decay, fused=True)
    pw = torch.ones(1, device=device)
    for i in range(a.warmup_steps + a.steps):
        if i == a.warmup_steps:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            lg, dt = model(x)
            loss = combined_loss(lg, dt, yb, 0, a.bce_weight, pw)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    s = time.perf_counter() - t0
    res = {"steps": a.steps, "batch_size": int(x.shape[0]), "seconds": s, "samples_per_s": a.steps * x.shape[0] / s,
           "threads": torch.get_num_threads(), "amp": a.amp}
    print(f"py_trainer bench-step: {res['samples_per_s']:.0f} samples/s ({a.steps} steps of {x.shape[0]})")
    pc.write_json(a.out, res)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    e = sub.add_parser("eval")
    b = sub.add_parser("bench-step")
    for p in (t, e, b):
        p.add_argument("--data", required=True)
        p.add_argument("--threads", type=int, default=0)
        p.add_argument("--device", default="cpu")
        p.add_argument("--amp", choices=["off", "bf16", "fp16"], default="off")
        p.add_argument("--eval-batch-size", type=int, default=1024)
    for p in (t, b):
        p.add_argument("--batch-size", type=int, default=64)
        p.add_argument("--seed", type=int, default=42)
        p.add_argument("--hidden", type=int, default=128)
        p.add_argument("--dropout", type=float, default=0.3)
        p.add_argument("--lr", type=float, default=1e-3)
        p.add_argument("--weight-decay", type=float, default=0.01)
        p.add_argument("--clip-norm", type=float, default=1.0)
        p.add_argument("--bce-weight", type=float, default=1.0)
    t.add_argument("--out", required=True)
    t.add_argument("--epochs", type=int, default=30)
    t.add_argument("--warmup", type=float, default=0.05)
    t.add_argument("--workers", type=int, default=2)
    t.add_argument("--positive-class", default=None)
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--split", default="test")
    e.add_argument("--mode", choices=["sequential", "batched"], default="sequential")
    e.add_argument("--passes", type=int, default=1, help="timed passes over the split (the first is cold)")
    e.add_argument("--out", default=None)
    b.add_argument("--steps", type=int, default=50)
    b.add_argument("--warmup-steps", type=int, default=5)
    b.add_argument("--out", default=None)
    a = ap.parse_args()
    return {"train": train, "eval": evaluate, "bench-step": bench_step}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
