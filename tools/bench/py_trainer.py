"""The Python trainer peer (issue 4), written with the Python trainer's own optimisations: an h5py Dataset with one
open file per DataLoader worker (opened lazily in the worker, with a chunk cache that holds the split), DataLoader
workers with persistent_workers, pin_memory + non_blocking copies on CUDA, torch's fused AdamW, metrics accumulated
on the device and `.item()` once per epoch, autocast (AMP) when asked. The model is python/melforge/models.py's, the
same module tree as melforge-train's; the hyperparameters are melforge-train's defaults (batch 64, lr 1e-3 with 5%
linear warmup then cosine to 0, AdamW wd 0.01, clip-norm 1, CE + BCE detection head with pos_weight
negatives/positives, dropout 0.3, input normalised by the training split's mean and std). Reads melforge-build's
(or py_builder.py's) OUT/{train,val,test}.h5.

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
valid segments); batched: whole files packed into forward passes of --eval-batch-size segments. File decision: per
long segment the mean of its short segments' softmax, then the mean over the valid long segments (melforge's vote
mean). Both modes compute the confusion matrices inside the timer, as melforge's evaluation computes its metrics.
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


class SegmentDataset(Dataset):
    """Valid short segments of one split file; item = (float32 [n_mels, n_frames], label)."""

    def __init__(self, path: str, cache_bytes: int = 256 << 20):
        self.path, self.cache_bytes = path, cache_bytes
        with h5py.File(path, "r") as f:
            self.shape = f["mel"].shape
            self.labels = f["label"][:].astype(np.int64)
            nvl = f["num_valid_long"][:]
            self.class_names = [c.decode() if isinstance(c, bytes) else c for c in f["class_names"][:]]
        S = self.shape[2]
        self.index = np.array([(fi, li, si) for fi in range(self.shape[0]) for li in range(nvl[fi])
                               for si in range(S)], dtype=np.int64).reshape(-1, 3)
        self.file = None

    def __len__(self):
        return len(self.index)

    def __getitem__(self, i):
        if self.file is None:
            self.file = h5py.File(self.path, "r", rdcc_nbytes=self.cache_bytes, rdcc_nslots=100003)
            self.mel = self.file["mel"]
        fi, li, si = self.index[i]
        return torch.from_numpy(self.mel[fi, li, si].astype(np.float32)), self.labels[fi]


def read_split(path: str):
    with h5py.File(path, "r") as f:
        names = [c.decode() if isinstance(c, bytes) else c for c in f["class_names"][:]]
        return (torch.from_numpy(f["mel"][:].astype(np.float32)), torch.from_numpy(f["label"][:].astype(np.int64)),
                torch.from_numpy(f["num_valid_long"][:].astype(np.int64)), names)


def input_statistics(path: str):
    with h5py.File(path, "r") as f:
        nvl = f["num_valid_long"][:]
        mel = f["mel"]
        s = s2 = n = 0.0
        for fi in range(0, mel.shape[0], 256):
            block = mel[fi:fi + 256].astype(np.float64)
            for j in range(block.shape[0]):
                v = block[j, :nvl[fi + j]]
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


def file_scores(probs, det, nvl):
    """probs [F, L, S, C], det [F, L, S], nvl [F] -> (class probs [F, C], det prob [F]): vote mean."""
    Lmax = probs.shape[1]
    w = (torch.arange(Lmax, device=nvl.device)[None, :] < nvl[:, None]).float()
    p_long, d_long = probs.mean(2), det.mean(2)
    fp = (p_long * w[:, :, None]).sum(1) / w.sum(1, keepdim=True)
    fd = (d_long * w).sum(1) / w.sum(1)
    return fp, fd


def eval_batched(model, mel, labels, nvl, batch, device, amp):
    """Whole files packed into forward passes of `batch` segments; returns (seg acc, seg conf, file acc, file conf)."""
    Fn, Lmax, S = mel.shape[:3]
    C = model.num_classes
    files_per_pass = max(1, batch // (Lmax * S))
    probs = torch.empty(Fn, Lmax, S, C)
    det = torch.empty(Fn, Lmax, S)
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        for f0 in range(0, Fn, files_per_pass):
            x = mel[f0:f0 + files_per_pass].to(device, non_blocking=True)
            lg, dt = model(x.reshape(-1, *x.shape[3:]))
            n = x.shape[0]
            probs[f0:f0 + n] = lg.float().softmax(1).view(n, Lmax, S, C).cpu()
            det[f0:f0 + n] = dt.float().sigmoid().view(n, Lmax, S).cpu()
    valid = torch.arange(Lmax)[None, :] < nvl[:, None]
    seg_pred = probs.argmax(-1)[valid].reshape(-1)
    seg_true = labels[:, None, None].expand(Fn, Lmax, S)[valid].reshape(-1)
    fp, _ = file_scores(probs, det, nvl)
    return confusions(seg_true, seg_pred, C), confusions(labels, fp.argmax(1), C)


def eval_sequential(model, mel, labels, nvl, device, amp):
    """One forward per file (its valid long segments) from the split in RAM; returns (seg conf, file conf)."""
    C = model.num_classes
    preds, seg_true, seg_pred = [], [], []
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        for fi in range(mel.shape[0]):
            x = mel[fi, :int(nvl[fi])].to(device)
            lg, dt = model(x.reshape(-1, *x.shape[2:]))
            p = lg.float().softmax(1).view(x.shape[0], x.shape[1], C)
            preds.append(int(p.mean(1).mean(0).argmax()))
            seg_pred.append(p.argmax(-1).reshape(-1).cpu())
            seg_true.append(torch.full((p.shape[0] * p.shape[1],), int(labels[fi])))
    return confusions(torch.cat(seg_true), torch.cat(seg_pred), C), confusions(labels, torch.tensor(preds), C)


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
    ds = SegmentDataset(train_path)
    C = len(ds.class_names)
    positive = ds.class_names.index(a.positive_class) if a.positive_class else (
        ds.class_names.index("leak") if "leak" in ds.class_names else 0)
    seg_labels = torch.from_numpy(ds.labels[ds.index[:, 0]])
    pos = float((seg_labels == positive).sum())
    pos_weight = torch.tensor([(len(ds) - pos) / pos if pos > 0 else 1.0], device=device)
    mean, std = input_statistics(train_path)
    val_mel, val_y, val_nvl, _ = read_split(os.path.join(a.data, "val.h5"))
    t_load = time.perf_counter() - t_start

    torch.manual_seed(a.seed)
    model = melforge_models.Cnn(ds.shape[3], ds.shape[4], C, hidden=a.hidden, dropout=a.dropout)
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
        seg_conf, file_conf = eval_batched(model, val_mel, val_y, val_nvl, a.eval_batch_size, device, amp)
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
    test_mel, test_y, test_nvl, _ = read_split(os.path.join(a.data, "test.h5"))
    seg_conf, file_conf = eval_batched(model, test_mel, test_y, test_nvl, a.eval_batch_size, device, amp)
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
    mel, y, nvl, _ = read_split(path)
    load_s = time.perf_counter() - t0
    Fn = mel.shape[0]
    pass_s = []
    for _ in range(a.passes):
        t0 = time.perf_counter()
        if a.mode == "batched":
            seg_conf, file_conf = eval_batched(model, mel, y, nvl, a.eval_batch_size, device, amp)
        else:
            seg_conf, file_conf = eval_sequential(model, mel, y, nvl, device, amp)
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
    mel, y, nvl, names = read_split(os.path.join(a.data, "train.h5"))
    x = mel[:, 0].reshape(-1, *mel.shape[3:])[:a.batch_size].contiguous().to(device)
    yb = y.repeat_interleave(mel.shape[2])[:a.batch_size].to(device)
    torch.manual_seed(a.seed)
    model = melforge_models.Cnn(mel.shape[3], mel.shape[4], len(names), hidden=a.hidden, dropout=a.dropout).to(device)
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
