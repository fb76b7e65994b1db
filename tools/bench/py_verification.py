"""The Python peer of `melforge-train train --task verification` (issue 19), written in the style of the public
VoxCeleb trainer's optimised training loop (voxceleb_trainer: SpeakerNet + AAMSoftmax, DataLoader workers, AMP,
gradient clipping): the h5py segment Dataset of py_trainer.py (one open file per DataLoader worker, persistent
workers, prefetch), pin_memory + non_blocking copies on CUDA, torch's fused AdamW, metrics accumulated on the device
and `.item()` once per epoch, autocast when asked (bf16 on CPU). The model is python/melforge/models.py's ResNetSE
(`--model resnet-se`, half width by default) or Ecapa (`--model ecapa`), the module trees of melforge-train's
speaker models, which return (cosine logits, embedding); the loss is voxceleb_trainer's AAMSoftmax on those cosines
(phi = cos cos_m - sin sin_m where cos > cos(pi - m), else cos - m sin(pi - m); easy margin off; times the scale;
cross-entropy), with melforge-train's optional margin warm-up (margin x min(1, step / round(EPOCHS x steps per
epoch))). Hyperparameters are melforge-train's defaults (batch 64, AdamW lr 1e-3, wd 0.01, 5% linear warmup then
cosine to 0, clip-norm 1, margin 0.2, scale 30, input normalised by the training split's mean and std). Reads
melforge-build's OUT/{train,val,test}.h5 built with `--split-by class` (speakers of val and test unseen in
training); the AAM head has one row per speaker present in train.h5.

  py_verification.py train --data DIR --out RUN [--model resnet-se|ecapa] [--width half|quarter] [--channels 512]
                           [--embedding-dim 192] [--epochs 8] [--batch-size 64] [--workers 2] [--threads 0]
                           [--amp off|bf16|fp16] [--margin 0.2] [--scale 30] [--margin-warmup EPOCHS]
                           [--trial-count 10000] [--no-eval] [--device cpu|cuda]

Every epoch trains on every valid segment of train.h5 once (shuffled) and times it; unless --no-eval, it then scores
the val split (EER, not timed) and keeps the weights of the lowest val EER, which score the test split at the end.
Scoring: an embedding per file, the L2-normalised mean of its valid segments' embeddings; cosine scores on all pairs
of files (--trial-count 0) or on N seeded trials (default 10000 as melforge-train's), half targets and half
non-targets, N clamped to twice the smaller number of pairs; EER (percent) from sklearn.metrics.roc_curve as
voxceleb_trainer's tuneThresholdfromScore computes it. Writes RUN/py_report.json (per-epoch lines, `samples_per_s`:
the median over the epochs after the first, all epochs when there is one) and RUN/best.pt ({"model",
"model_config"}, loadable by melforge.models.build_model).
"""
import argparse
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
import py_common as pc  # noqa: E402
import py_trainer as pt  # noqa: E402

AMP = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class AAMSoftmax(torch.nn.Module):
    """voxceleb_trainer's loss/aamsoftmax.py on cosine logits [B, C] (the model's AAM head has already normalised
    the embedding and the class weights): returns (mean cross-entropy of the scaled margin logits, correct count)."""

    def __init__(self, margin: float, scale: float):
        super().__init__()
        self.scale = scale
        self.set_margin(margin)

    def set_margin(self, m: float):
        self.m = m
        self.cos_m, self.sin_m = math.cos(m), math.sin(m)
        self.th, self.mm = math.cos(math.pi - m), math.sin(math.pi - m) * m

    def forward(self, cosine: torch.Tensor, label: torch.Tensor):
        cosine = cosine.float()
        sine = torch.sqrt((1.0 - cosine * cosine).clamp(0, 1))
        phi = cosine * self.cos_m - sine * self.sin_m
        phi = torch.where(cosine - self.th > 0, phi, cosine - self.mm)
        one_hot = F.one_hot(label, cosine.shape[1]).to(cosine.dtype)
        output = self.scale * (one_hot * phi + (1.0 - one_hot) * cosine)
        return F.cross_entropy(output, label), (output.detach().argmax(1) == label).sum()


def build_model(kind: str, n_mels: int, n_frames: int, classes: int, a) -> torch.nn.Module:
    mm = pt.melforge_models
    if kind == "resnet-se":
        return mm.ResNetSE(n_mels, n_frames, classes, width=a.width, embedding_dim=a.embedding_dim)
    return mm.Ecapa(n_mels, n_frames, classes, channels=a.channels, embedding_dim=a.embedding_dim)


def file_embeddings(model, mel, nvl, device, amp, batch=256) -> torch.Tensor:
    """mel [F, L, S, M, T], nvl [F] -> [F, D]: per file the L2-normalised mean of its valid segments' embeddings."""
    Fn, Lmax, S = mel.shape[:3]
    valid = (torch.arange(Lmax)[None, :] < nvl[:, None])[:, :, None].expand(Fn, Lmax, S)
    segs = mel[valid]
    owner = torch.arange(Fn)[:, None, None].expand(Fn, Lmax, S)[valid]
    parts = []
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp, enabled=amp is not None):
        for i in range(0, segs.shape[0], batch):
            parts.append(model(segs[i:i + batch].to(device, non_blocking=True))[1].float().cpu())
    emb = torch.cat(parts)
    sums = torch.zeros(Fn, emb.shape[1]).index_add_(0, owner, emb)
    return F.normalize(sums / (valid.reshape(Fn, -1).sum(1, keepdim=True)), p=2, dim=1)


def trials(labels: np.ndarray, count: int, seed: int):
    """(index a, index b, target) arrays: all pairs a < b for count 0, else min(count, 2 min(targets, non-targets))
    pairs drawn without replacement, half of them same-speaker (melforge-train's --trial-count rule)."""
    a, b = np.triu_indices(len(labels), 1)
    target = labels[a] == labels[b]
    if count <= 0:
        return a, b, target
    pos, neg = np.flatnonzero(target), np.flatnonzero(~target)
    if len(pos) == 0 or len(neg) == 0:
        raise SystemExit("py_verification: trials need a speaker with two files and two speakers")
    half = min(count // 2, len(pos), len(neg))
    rng = np.random.default_rng(seed)
    pick = np.sort(np.concatenate([rng.choice(pos, half, replace=False), rng.choice(neg, half, replace=False)]))
    return a[pick], b[pick], target[pick]


def equal_error_rate(scores: np.ndarray, target: np.ndarray) -> float:
    """EER in percent, as voxceleb_trainer's tuneThresholdfromScore: max(fpr, fnr) where |fnr - fpr| is least."""
    from sklearn.metrics import roc_curve  # noqa: PLC0415  (only the scoring needs scikit-learn)

    fpr, tpr, _ = roc_curve(target.astype(np.int64), scores, pos_label=1)
    fnr = 1.0 - tpr
    i = int(np.nanargmin(np.abs(fnr - fpr)))
    return 100.0 * max(fpr[i], fnr[i])


def score_split(model, path: str, device, amp, trial_count: int, seed: int) -> dict:
    mel, labels, nvl, _ = pt.read_split(path)
    t0 = time.perf_counter()
    emb = file_embeddings(model, mel, nvl, device, amp)
    a, b, target = trials(labels.numpy(), trial_count, seed)
    scores = (emb[a] * emb[b]).sum(1).numpy()
    return {"eer_percent": equal_error_rate(scores, target), "trials": int(len(a)),
            "targets": int(target.sum()), "files": int(mel.shape[0]), "speakers": int(labels.unique().numel()),
            "seconds": time.perf_counter() - t0}


def make_loader(ds, a, cuda):
    gen = torch.Generator().manual_seed(a.seed)
    return DataLoader(ds, batch_size=a.batch_size, shuffle=True, generator=gen, num_workers=a.workers,
                      pin_memory=cuda, persistent_workers=a.workers > 0,
                      prefetch_factor=4 if a.workers > 0 else None, drop_last=False)


def train_epoch(model, loader, remap, loss_fn, opt, sched, scaler, a, device, amp, margin_of_step, step):
    """One pass over the loader; returns (loss sum, correct, seconds, data wait seconds, next step)."""
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    t0 = time.perf_counter()
    batches = pt.TimedBatches(loader)
    for x, y in batches:
        x, y = x.to(device, non_blocking=True), remap[y].to(device, non_blocking=True)
        loss_fn.set_margin(margin_of_step(step))
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            cosine, _ = model(x)
            loss, ok = loss_fn(cosine, y)
        pt.optimizer_step(loss, model, opt, sched, scaler, a.clip_norm)
        loss_sum += loss.detach() * y.shape[0]
        correct += ok
        step += 1
    return loss_sum.item(), correct.item(), time.perf_counter() - t0, batches.wait, step


def train(a) -> int:
    t_start = time.perf_counter()
    pc.set_threads(a.threads)
    device = torch.device(a.device)
    amp = AMP[a.amp]
    train_path = os.path.join(a.data, "train.h5")
    ds = pt.SegmentDataset(train_path)
    present = np.unique(ds.labels)
    remap = torch.full((len(ds.class_names),), -1, dtype=torch.int64)
    remap[torch.from_numpy(present)] = torch.arange(len(present))
    mean, std = pt.input_statistics(train_path)
    t_load = time.perf_counter() - t_start

    torch.manual_seed(a.seed)
    model = build_model(a.model, ds.shape[3], ds.shape[4], len(present), a)
    model.input_mean.fill_(mean)
    model.input_std.fill_(std)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay,
                            fused=True)
    steps_per_epoch = math.ceil(len(ds) / a.batch_size)
    sched = pt.warmup_cosine(opt, a.epochs * steps_per_epoch, a.warmup)
    warm_steps = round(a.margin_warmup * steps_per_epoch)
    loss_fn = AAMSoftmax(a.margin, a.scale)

    def margin_of_step(step):
        return a.margin * min(1.0, step / warm_steps) if warm_steps > 0 else a.margin

    loader = make_loader(ds, a, device.type == "cuda")
    scaler = torch.amp.GradScaler(device.type, enabled=a.amp == "fp16")
    os.makedirs(a.out, exist_ok=True)
    epochs, best, best_state, step = [], math.inf, None, 0
    for epoch in range(a.epochs):
        model.train()
        tl, tc, train_s, wait, step = train_epoch(model, loader, remap, loss_fn, opt, sched, scaler, a, device,
                                                  amp, margin_of_step, step)
        n = len(ds)
        line = {"epoch": epoch + 1, "train_loss": tl / n, "train_accuracy": tc / n, "samples_per_s": n / train_s,
                "train_s": train_s, "data_wait_fraction": wait / train_s, "margin": loss_fn.m}
        model.eval()
        if not a.no_eval:
            val = score_split(model, os.path.join(a.data, "val.h5"), device, amp, a.trial_count, a.seed)
            line.update(val_eer=val["eer_percent"], val_s=val["seconds"])
            if val["eer_percent"] < best:
                best = val["eer_percent"]
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        epochs.append(line)
        pc.log(f"epoch {epoch + 1}: loss {tl / n:.4f} acc {tc / n:.4f} {n / train_s:.1f} samples/s wait "
               f"{100 * wait / train_s:.1f}%" + (f" val EER {line['val_eer']:.2f} %" if not a.no_eval else ""))
    del loader
    if best_state is not None:
        model.load_state_dict(best_state)
    torch.save({"model": model.state_dict(), "model_config": model.config()}, os.path.join(a.out, "best.pt"))
    test = None if a.no_eval else score_split(model, os.path.join(a.data, "test.h5"), device, amp, a.trial_count,
                                              a.seed)
    rates = [e["samples_per_s"] for e in epochs]
    train_total = sum(e["train_s"] for e in epochs)
    rep = {"model": a.model, "epochs": epochs, "batch_size": a.batch_size, "workers": a.workers,
           "threads": torch.get_num_threads(), "amp": a.amp, "device": str(device), "margin": a.margin,
           "scale": a.scale, "speakers": int(len(present)), "segments": len(ds), "load_s": t_load,
           "train_s": train_total, "samples_per_s": pc.median(rates[1:] or rates),
           "samples_per_s_all": len(ds) * len(epochs) / train_total,
           "data_wait_fraction": sum(e["data_wait_fraction"] * e["train_s"] for e in epochs) / train_total,
           "test": {"verification": test}, "total_s": time.perf_counter() - t_start,
           "peak_rss_bytes": pc.peak_rss_bytes(), "torch": torch.__version__}
    pc.write_json(os.path.join(a.out, "py_report.json"), rep)
    eer = f", test EER {test['eer_percent']:.2f} % ({test['trials']} trials)" if test else ""
    print(f"py_verification: {a.model}, {a.epochs} epochs, {rep['samples_per_s']:.1f} samples/s, data wait "
          f"{100 * rep['data_wait_fraction']:.1f}%{eer}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--model", choices=["resnet-se", "ecapa"], default="resnet-se")
    t.add_argument("--width", choices=["half", "quarter"], default="half", help="resnet-se width")
    t.add_argument("--channels", type=int, default=512, help="ecapa channels")
    t.add_argument("--embedding-dim", type=int, default=192)
    t.add_argument("--epochs", type=int, default=8)
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--workers", type=int, default=2)
    t.add_argument("--threads", type=int, default=0)
    t.add_argument("--device", default="cpu")
    t.add_argument("--amp", choices=sorted(AMP), default="off")
    t.add_argument("--seed", type=int, default=42)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--warmup", type=float, default=0.05, help="fraction of the steps with a linear lr warmup")
    t.add_argument("--clip-norm", type=float, default=1.0)
    t.add_argument("--margin", type=float, default=0.2)
    t.add_argument("--scale", type=float, default=30.0)
    t.add_argument("--margin-warmup", type=float, default=0.0,
                   help="epochs over which the margin grows linearly from 0 (melforge-train's warmup_margin)")
    t.add_argument("--trial-count", type=int, default=10000,
                   help="seeded balanced trials, as melforge-train's default (0: all pairs of files)")
    t.add_argument("--no-eval", action="store_true", help="no val or test scoring (timing only)")
    a = ap.parse_args()
    if a.epochs < 1 or a.batch_size < 1 or a.workers < 0 or a.margin_warmup < 0 or not 0 <= a.margin < math.pi / 2:
        ap.error("--epochs and --batch-size must be >= 1, --workers and --margin-warmup >= 0, 0 <= --margin < pi/2")
    return {"train": train}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
