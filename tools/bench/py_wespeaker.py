"""A WeSpeaker-style Python peer of `melforge-train train --task verification` (issue 32): what a careful PyTorch
user of the public recipes writes for the same corpus, read from the WAV files on the fly.

Data (WeSpeaker's raw-list pipeline, wespeaker/dataset/processor.py): a list of `<path> <speaker>` lines relative to
the corpus root; per epoch every utterance gives one random crop of --crop-frames (200) fbank frames, i.e.
(frames - 1) * 160 + 400 samples, at a start drawn from a generator seeded with (seed, epoch, utterance) (the
same crops whatever the worker count; an utterance shorter than the crop is repeated to length, as WeSpeaker
does); the crop is read from the file with the stdlib `wave` module (seek + read of the crop only), scaled to the
16-bit range (WeSpeaker multiplies by 1 << 15), then torchaudio.compliance.kaldi.fbank (80 bins, 25/10 ms,
hamming window, dither 1.0 in training and 0 at test time, energy_floor 0: WeSpeaker's compute_fbank) and
per-utterance cepstral mean normalisation (each bin minus its mean over the crop: apply_cmvn, norm_var false). A
torch DataLoader with --workers processes (persistent, prefetch 4) does all of this in parallel with training; the
shuffle order of each epoch comes from a generator seeded with (seed, epoch).

Model and loss: python/melforge/models.py's ResNetSE (the module tree of melforge-train's `--model resnet-se`, at
--width) with its input normalisation left at mean 0, std 1 (CMN replaces it), and AAM-softmax on its cosine logits
(WeSpeaker's ArcMarginProduct with easy_margin false = melforge's train/aam.cpp: phi = cos(theta + m) where
cos > cos(pi - m), else cos - m sin(pi - m); times --scale; cross-entropy). The AAM head has one row per training
speaker. Optimizer and schedule are melforge-train's defaults (WeSpeaker's own are SGD with an exponential decay):
torch's fused AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01 on every parameter), per-step learning
rate base * (step + 1) / warmup for the first round(0.05 * total) steps, then a cosine to 0 over the rest, gradient
norm clipped to 1; batches of --batch-size, the last smaller batch kept, so an epoch has ceil(utterances / batch)
updates, as melforge-train's.

Test embeddings (WeSpeaker's extract.py): each utterance of the trial list whole, fbank with dither 0, CMN over the
whole utterance, one forward per utterance in eval mode; cosine of the L2-normalised embeddings. EER and minDCF
(p_target 0.01 and 0.05, C_miss = C_fa = 1, normalised) with kernels/verification's conventions: the DET points of
sklearn.metrics.roc_curve(drop_intermediate=False); EER where p_miss and p_fa cross, linearly interpolated between
the two DET points around the crossing.

  py_wespeaker.py lists --data DS --out DIR
      from a melforge-build dataset DS (its train.h5 and test.h5 `path` and `label`): DIR/train.lst and
      DIR/trials.txt (every unordered pair of the test split's utterances, `1|0 enroll test` as VoxCeleb's lists,
      paths as stored, i.e. relative to the corpus root), so that the peer and melforge train on the same speakers
      and score the same trials.
  py_wespeaker.py train --corpus DIR --train-list FILE --trials FILE --out RUN [--width quarter|half]
      [--embedding-dim 192] [--epochs 4] [--batch-size 32] [--workers 2] [--threads 2] [--seed 1] [--lr 1e-3]
      [--crop-frames 200] [--dither 1.0] [--margin 0.2] [--scale 30]

  py_wespeaker.py bench-data --corpus DIR --train-list FILE [--epochs 2] [--batch-size 32] [--workers 2]
      the data path alone: the same DataLoader iterated without a model; prints samples/s (to set beside
      `melforge-train bench`'s "data pipeline" line: the rate above which the peer cannot train on any device).

`train` writes RUN/py_report.json: `samples_per_s` (training examples / wall seconds of the training loops, data
loading included, every epoch), per-epoch lines (seconds, samples/s, loss, accuracy, the fraction of the time spent
waiting for the DataLoader), `updates`, `eer_percent`, `min_dcf_0.01`, `min_dcf_0.05`, `trials`, `embed_s`; and
RUN/model.pt ({"model", "model_config"}, loadable by melforge.models.build_model). Run it with the interpreter of
tools/setup_python.sh (MELFORGE_PY_EXTRAS="torchaudio==2.11.0"), which has torch, torchaudio, melforge and sklearn.
"""
import argparse
import json
import math
import os
import sys
import time
import wave

import numpy as np
import torch
import torch.nn.functional as F
import torchaudio
from torch.utils.data import DataLoader, Dataset, Sampler

from melforge.models import ResNetSE

RATE = 16000
FRAME_LENGTH, FRAME_SHIFT = 400, 160  # samples at 16 kHz: 25 ms, 10 ms


def fbank_cmn(pcm: np.ndarray, dither: float) -> torch.Tensor:
    """int16-range samples [n] -> [80, frames] Kaldi fbank (WeSpeaker's compute_fbank) minus its mean per bin."""
    wav = torch.from_numpy(pcm.astype(np.float32)).unsqueeze(0)
    feats = torchaudio.compliance.kaldi.fbank(wav, num_mel_bins=80, frame_length=25, frame_shift=10, dither=dither,
                                              energy_floor=0.0, window_type="hamming", sample_frequency=RATE)
    return (feats - feats.mean(0, keepdim=True)).t().contiguous()


def read_pcm(path: str, start: int = 0, count: int = -1) -> np.ndarray:
    """Samples [start, start + count) (count -1: to the end) of a 16 kHz mono 16-bit WAV, as int16."""
    with wave.open(path, "rb") as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (RATE, 1, 2):
            raise SystemExit(f"py_wespeaker: {path}: need 16 kHz mono 16-bit PCM")
        n = w.getnframes()
        w.setpos(min(start, n))
        return np.frombuffer(w.readframes(n if count < 0 else count), dtype="<i2")


def wav_frames(path: str) -> int:
    with wave.open(path, "rb") as w:
        return w.getnframes()


class CropDataset(Dataset):
    """Item (epoch, i) -> (fbank [80, crop_frames] of a random crop of utterance i, speaker index)."""

    def __init__(self, corpus: str, entries, seed: int, crop_frames: int, dither: float):
        self.paths = [os.path.join(corpus, p) for p, _ in entries]
        speakers = sorted({s for _, s in entries})
        self.speakers = speakers
        index = {s: k for k, s in enumerate(speakers)}
        self.labels = [index[s] for _, s in entries]
        self.lengths = [wav_frames(p) for p in self.paths]
        self.seed, self.dither = seed, dither
        self.crop = (crop_frames - 1) * FRAME_SHIFT + FRAME_LENGTH

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, item):
        epoch, i = item
        n = self.lengths[i]
        rng = np.random.default_rng([self.seed, epoch, i])
        if n >= self.crop:
            pcm = read_pcm(self.paths[i], int(rng.integers(0, n - self.crop + 1)), self.crop)
        else:
            pcm = np.resize(read_pcm(self.paths[i]), self.crop)
        return fbank_cmn(pcm, self.dither), self.labels[i]


class EpochSampler(Sampler):
    """Yields (epoch, index) over a permutation seeded with (seed, epoch); set_epoch before each epoch."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter([(self.epoch, int(i)) for i in torch.randperm(self.n, generator=g)])


def aam_softmax(cosine: torch.Tensor, labels: torch.Tensor, margin: float, scale: float) -> torch.Tensor:
    """Cross-entropy of the additive-angular-margin logits (train/aam.cpp's aam_softmax_loss)."""
    index = labels.unsqueeze(1)
    target = cosine.gather(1, index)
    sin = torch.sqrt((1.0 - target * target).clamp(1e-12, 1.0))
    phi = target * math.cos(margin) - sin * math.sin(margin)
    margined = torch.where(target > math.cos(math.pi - margin), phi, target - math.sin(math.pi - margin) * margin)
    return F.cross_entropy(cosine.scatter(1, index, margined) * scale, labels)


def warmup_cosine(step: int, total: int, warmup: int) -> float:
    """melforge's CosineSchedule::lr / base lr (min_lr_ratio 0)."""
    if step < warmup:
        return (step + 1) / warmup
    if step >= total:
        return 0.0
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def det_points(scores: np.ndarray, target: np.ndarray):
    """(p_fa, p_miss) per distinct score, descending, after the reject-all point (kernels/verification)."""
    from sklearn.metrics import roc_curve  # noqa: PLC0415

    fpr, tpr, _ = roc_curve(target.astype(np.int64), scores, pos_label=1, drop_intermediate=False)
    return fpr, 1.0 - tpr


def eer_and_min_dcf(scores: np.ndarray, target: np.ndarray) -> dict:
    p_fa, p_miss = det_points(scores, target)
    k = int(np.flatnonzero(p_fa >= p_miss)[0])
    d = p_miss - p_fa
    if d[k] == 0 or k == 0:
        eer = p_fa[k]
    else:
        t = d[k - 1] / (d[k - 1] - d[k])
        eer = p_fa[k - 1] + t * (p_fa[k] - p_fa[k - 1])
    out = {"eer_percent": 100.0 * float(eer)}
    for p in (0.01, 0.05):
        out[f"min_dcf_{p}"] = float(np.min(p * p_miss + (1 - p) * p_fa) / min(p, 1 - p))
    return out


def read_trials(path: str):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                label, a, b = line.split()
                rows.append((int(label), a, b))
    return rows


def score_trials(model, corpus: str, trials) -> dict:
    """Whole-utterance embeddings of every path of the trial list, cosine scores, EER and minDCF."""
    t0 = time.perf_counter()
    paths = sorted({p for _, a, b in trials for p in (a, b)})
    emb = {}
    model.eval()
    with torch.inference_mode():
        for p in paths:
            x = fbank_cmn(read_pcm(os.path.join(corpus, p)), 0.0).unsqueeze(0)
            emb[p] = F.normalize(model(x)[1], dim=1)[0]
    scores = np.array([float(emb[a] @ emb[b]) for _, a, b in trials])
    target = np.array([lab == 1 for lab, _, _ in trials])
    out = eer_and_min_dcf(scores, target)
    out.update(trials=len(trials), targets=int(target.sum()), test_utterances=len(paths),
               embed_s=time.perf_counter() - t0)
    return out


def train_epoch(model, loader, opt, sched, a):
    """One pass; returns (loss sum, correct, seconds, data wait seconds, updates)."""
    loss_sum, correct, wait, updates = torch.zeros(()), torch.zeros((), dtype=torch.int64), 0.0, 0
    t0 = time.perf_counter()
    it = iter(loader)
    while True:
        w0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        wait += time.perf_counter() - w0
        cosine, _ = model(x)
        loss = aam_softmax(cosine, y, a.margin, a.scale)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip_norm)
        opt.step()
        sched.step()
        loss_sum += loss.detach() * y.shape[0]
        correct += (cosine.detach().argmax(1) == y).sum()
        updates += 1
    return loss_sum.item(), correct.item(), time.perf_counter() - t0, wait, updates


def read_list(path: str):
    with open(path) as f:
        return [tuple(line.split()) for line in f if line.strip()]


def make_loader(a):
    """(dataset, its epoch sampler, the DataLoader) of `train` and `bench-data`."""
    ds = CropDataset(a.corpus, read_list(a.train_list), a.seed, a.crop_frames, a.dither)
    sampler = EpochSampler(len(ds), a.seed)
    loader = DataLoader(ds, batch_size=a.batch_size, sampler=sampler, num_workers=a.workers,
                        persistent_workers=a.workers > 0, prefetch_factor=4 if a.workers > 0 else None)
    return ds, sampler, loader


def bench_data(a) -> int:
    torch.set_num_threads(a.threads)
    ds, sampler, loader = make_loader(a)
    rates = []
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        n = sum(x.shape[0] for x, _ in loader)
        rates.append(n / (time.perf_counter() - t0))
    print(f"py_wespeaker bench-data: {len(ds)} utterances, {a.workers} workers, batch {a.batch_size}: "
          + ", ".join(f"epoch {i + 1} {r:.1f}" for i, r in enumerate(rates)) + " samples/s")
    return 0


def train(a) -> int:
    torch.set_num_threads(a.threads)
    ds, sampler, loader = make_loader(a)
    torch.manual_seed(a.seed)
    model = ResNetSE(80, a.crop_frames, len(ds.speakers), width=a.width, embedding_dim=a.embedding_dim)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay,
                            fused=True)
    steps_per_epoch = math.ceil(len(ds) / a.batch_size)
    total = a.epochs * steps_per_epoch
    warmup = min(total, int(math.floor(a.warmup * total + 0.5)))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, total, warmup))
    os.makedirs(a.out, exist_ok=True)
    epochs, updates = [], 0
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        model.train()
        loss, correct, secs, wait, n_up = train_epoch(model, loader, opt, sched, a)
        updates += n_up
        n = len(ds)
        epochs.append({"epoch": epoch + 1, "train_s": secs, "samples_per_s": n / secs, "train_loss": loss / n,
                       "train_accuracy": correct / n, "data_wait_fraction": wait / secs})
        print(f"py_wespeaker: epoch {epoch + 1}: loss {loss / n:.4f} acc {correct / n:.4f} {n / secs:.2f} samples/s, "
              f"data wait {100 * wait / secs:.1f}%", file=sys.stderr, flush=True)
    del loader
    torch.save({"model": model.state_dict(), "model_config": model.config()}, os.path.join(a.out, "model.pt"))
    test = score_trials(model, a.corpus, read_trials(a.trials))
    train_s = sum(e["train_s"] for e in epochs)
    rep = {"peer": "py_wespeaker", "width": a.width, "epochs": a.epochs, "batch_size": a.batch_size,
           "workers": a.workers, "threads": torch.get_num_threads(), "seed": a.seed, "utterances": len(ds),
           "speakers": len(ds.speakers), "updates": updates, "train_s": train_s,
           "samples_per_s": len(ds) * a.epochs / train_s,
           "data_wait_fraction": sum(e["data_wait_fraction"] * e["train_s"] for e in epochs) / train_s,
           "epochs_detail": epochs, "dither": a.dither, "crop_frames": a.crop_frames, **test,
           "torch": torch.__version__, "torchaudio": torchaudio.__version__}
    with open(os.path.join(a.out, "py_report.json"), "w") as f:
        json.dump(rep, f, indent=1)
    print(f"py_wespeaker: {a.epochs} epochs, {updates} updates, {rep['samples_per_s']:.2f} samples/s (data wait "
          f"{100 * rep['data_wait_fraction']:.1f}%), EER {test['eer_percent']:.2f} %, minDCF(0.01) "
          f"{test['min_dcf_0.01']:.4f} ({test['trials']} trials)")
    return 0


def lists(a) -> int:
    import h5py  # noqa: PLC0415  (only this subcommand reads the melforge dataset)

    def split(name):
        with h5py.File(os.path.join(a.data, f"{name}.h5"), "r") as f:
            names = f["class_names"].asstr()[:]
            return list(zip(f["path"].asstr()[:], names[f["label"][:]]))

    os.makedirs(a.out, exist_ok=True)
    train_rows = split("train")
    with open(os.path.join(a.out, "train.lst"), "w") as f:
        f.writelines(f"{p} {s}\n" for p, s in train_rows)
    test = sorted(split("test"))
    with open(os.path.join(a.out, "trials.txt"), "w") as f:
        for i in range(len(test)):
            for j in range(i + 1, len(test)):
                f.write(f"{int(test[i][1] == test[j][1])} {test[i][0]} {test[j][0]}\n")
    pairs = len(test) * (len(test) - 1) // 2
    print(f"py_wespeaker: {len(train_rows)} training utterances, {pairs} trials over {len(test)} test utterances")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    li = sub.add_parser("lists")
    li.add_argument("--data", required=True)
    li.add_argument("--out", required=True)
    t = sub.add_parser("train")
    t.add_argument("--trials", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--width", choices=["half", "quarter"], default="quarter")
    t.add_argument("--embedding-dim", type=int, default=192)
    bd = sub.add_parser("bench-data")
    for p in (t, bd):
        p.add_argument("--corpus", required=True)
        p.add_argument("--train-list", required=True)
        p.add_argument("--epochs", type=int, default=4 if p is t else 2)
        p.add_argument("--batch-size", type=int, default=32)
        p.add_argument("--workers", type=int, default=2)
        p.add_argument("--threads", type=int, default=2)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--crop-frames", type=int, default=200)
        p.add_argument("--dither", type=float, default=1.0)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--warmup", type=float, default=0.05)
    t.add_argument("--clip-norm", type=float, default=1.0)
    t.add_argument("--margin", type=float, default=0.2)
    t.add_argument("--scale", type=float, default=30.0)
    a = ap.parse_args()
    if a.cmd != "lists" and (a.epochs < 1 or a.batch_size < 1 or a.workers < 0 or a.threads < 1
                             or a.crop_frames < 8 or a.dither < 0):
        ap.error("--epochs, --batch-size and --threads must be >= 1, --workers >= 0, --crop-frames >= 8, "
                 "--dither >= 0")
    return {"train": train, "lists": lists, "bench-data": bench_data}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
