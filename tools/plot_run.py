#!/usr/bin/python3
"""Plots a melforge-train run folder: RUN_DIR/loss.png (train and val loss per epoch, learning rate on a second
axis), the task's metrics per epoch: RUN_DIR/accuracy.png (--task multiclass: train and val accuracy, val
macro-F1), RUN_DIR/map.png (--task multilabel: val mAP macro and micro, ROC-AUC, micro- and macro-F1) or
RUN_DIR/eer.png (--task verification: val EER in percent and minDCF(0.01)), RUN_DIR/steps.png (the training loss and learning
rate of metrics.jsonl's step lines against the optimizer step; only when the run wrote step lines) and
RUN_DIR/confusion_<split>.png for every RUN_DIR/confusion_<split>.csv (as Metrics::confusion_csv writes: a header
"true\\pred,<names...>", one row per true class; counts, rows normalised to colour). Prints the paths it wrote, one
per line.

metrics.jsonl holds one JSON object per line: epoch lines ("type": "epoch", or no "type" in runs written before
step lines existed) with at least epoch, train_loss and lr, and the task's fields: val_loss, train_accuracy,
val_accuracy, val_macro_f1 (multiclass); val_loss, val_map (multilabel, told by val_map; val_map_micro, val_auc,
val_f1_micro, val_f1_macro plotted when present); val_eer (verification, told by val_eer; val_min_dcf_0.01 when
present). Every epoch line of a run has the same task. Step lines ("type": "step") hold step and loss (lr when
present); lines of any other type are ignored.

Needs matplotlib: Debian's /usr/bin/python3 with python3-matplotlib, or the torch venv of tools/setup_torch.sh
(which installs it), or any Python after `python -m pip install matplotlib`. Exit code 1 with a message when
matplotlib is missing, when the folder has no metrics.jsonl or when it holds no epoch.
"""
import argparse
import csv
import glob
import json
import math
import os
import sys

REQUIRED = ("epoch", "train_loss", "lr")
# Per task: the fields its epoch lines must have, and its metric plot: file name, title, y limits (None: automatic),
# (field, label, marker) per curve (curves whose field no line has are left out).
TASKS = {
    "multiclass": (("val_loss", "train_accuracy", "val_accuracy", "val_macro_f1"),
                   ("accuracy.png", "accuracy", (0, 1.02),
                    (("train_accuracy", "train accuracy", "o"), ("val_accuracy", "val accuracy", "o"),
                     ("val_macro_f1", "val macro-F1", "s")))),
    "multilabel": (("val_loss", "val_map"),
                   ("map.png", "mean average precision (val)", (0, 1.02),
                    (("val_map", "val mAP (macro)", "o"), ("val_map_micro", "val mAP (micro)", "o"),
                     ("val_auc", "val ROC-AUC (macro)", "^"), ("val_f1_micro", "val micro-F1", "s"),
                     ("val_f1_macro", "val macro-F1", "s")))),
    "verification": (("val_eer",),
                     ("eer.png", "verification (val)", None,
                      (("val_eer", "val EER (%)", "o"), ("val_min_dcf_0.01", "val minDCF(0.01) x 100", "s")))),
}
# Curves shown x 100 (minDCF beside the EER in percent).
PERCENT = ("val_min_dcf_0.01",)
REQUIRED_STEP = ("step", "loss")
plt = None


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="plot_run.py",
        description="Plots a melforge-train run folder (metrics.jsonl and the confusion CSVs) into PNG files "
                    "next to them: loss.png, accuracy.png (multilabel runs: map.png; verification: eer.png), "
                    "steps.png (when the run wrote step lines) and "
                    "confusion_<split>.png. Needs matplotlib (Debian: /usr/bin/python3 with python3-matplotlib; "
                    "the torch venv of tools/setup_torch.sh has it; else `python -m pip install matplotlib`).")
    p.add_argument("run_dir", metavar="RUN_DIR", help="run folder of melforge-train (holds metrics.jsonl)")
    return p.parse_args(argv)


def import_matplotlib():
    """Imports pyplot with the Agg backend into the module global `plt`; exits 1 naming what to install."""
    global plt
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(f"plot_run.py: matplotlib is not installed in {sys.executable}; install it with "
                         f"`{sys.executable} -m pip install matplotlib` (or run /usr/bin/python3 after "
                         "`apt-get install python3-matplotlib`; tools/setup_torch.sh installs it in the torch venv)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot
    plt = pyplot


def task_of(row):
    """The task an epoch line was written by: multilabel (val_map), verification (val_eer) or multiclass."""
    return "multilabel" if "val_map" in row else "verification" if "val_eer" in row else "multiclass"


def read_metrics(path):
    """The epoch lines, the step lines of metrics.jsonl and the run's task; other line types are skipped."""
    rows, steps, tasks = [], [], set()
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"plot_run.py: {path}:{n}: not JSON: {e}")
            kind = row.get("type", "epoch")
            if kind not in ("epoch", "step"):
                continue
            required = REQUIRED + TASKS[task_of(row)][0] if kind == "epoch" else REQUIRED_STEP
            missing = [k for k in required if k not in row]
            if missing:
                raise SystemExit(f"plot_run.py: {path}:{n}: {kind} line misses {', '.join(missing)}")
            (rows if kind == "epoch" else steps).append(row)
            if kind == "epoch":
                tasks.add(task_of(row))
    if not rows:
        raise SystemExit(f"plot_run.py: {path} holds no epoch")
    if len(tasks) > 1:
        raise SystemExit(f"plot_run.py: {path} mixes the epoch lines of tasks {', '.join(sorted(tasks))}")
    return rows, steps, tasks.pop()


def value(row, key):
    v = row.get(key)
    return float("nan") if v is None else float(v)


def plot_loss(rows, out):
    epochs = [r["epoch"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(epochs, [value(r, "train_loss") for r in rows], marker="o", label="train loss")
    if any("val_loss" in r for r in rows):
        ax.plot(epochs, [value(r, "val_loss") for r in rows], marker="o", label="val loss")
    ax.set_xlabel("epoch")
    finish_loss_plot(fig, ax, epochs, [value(r, "lr") for r in rows], "loss", out)


def finish_loss_plot(fig, ax, x, lr, title, out):
    """Adds the learning rate `lr` over `x` on a second axis, the legend and `title` to a loss plot; saves it."""
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    lr_ax = ax.twinx()
    lr_ax.plot(x, lr, color="gray", linestyle="--", label="lr")
    lr_ax.set_ylabel("learning rate")
    lines = ax.get_lines() + lr_ax.get_lines()
    ax.legend(lines, [line.get_label() for line in lines], loc="upper right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_task_metrics(rows, task, out):
    """The task's metric curves per epoch (TASKS): accuracy, mAP or EER."""
    _, title, ylim, curves = TASKS[task][1]
    epochs = [r["epoch"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, marker in curves:
        if any(key in r for r in rows):
            scale = 100.0 if key in PERCENT else 1.0
            ax.plot(epochs, [scale * value(r, key) for r in rows], marker=marker, label=label)
    ax.set_xlabel("epoch")
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right" if task == "verification" else "lower right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_steps(steps, rows, out):
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([s["step"] for s in steps], [value(s, "loss") for s in steps], linewidth=1, label="step loss")
    ax.plot([r["step"] for r in rows if "step" in r], [value(r, "train_loss") for r in rows if "step" in r],
            marker="o", linestyle="", label="epoch train loss")
    ax.set_xlabel("optimizer step")
    finish_loss_plot(fig, ax, [s["step"] for s in steps], [value(s, "lr") for s in steps], "training steps", out)


def read_confusion(path):
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    if len(table) < 2 or len(table[0]) < 2:
        raise SystemExit(f"plot_run.py: {path}: not a confusion matrix")
    names = table[0][1:]
    counts = []
    for row in table[1:]:
        if len(row) != len(names) + 1:
            raise SystemExit(f"plot_run.py: {path}: row {row[0]!r} has {len(row) - 1} counts, expected {len(names)}")
        counts.append([int(v) for v in row[1:]])
    return [row[0] for row in table[1:]], names, counts


def plot_confusion(path, out, split):
    true_names, pred_names, counts = read_confusion(path)
    norm = [[c / s if (s := sum(row)) else 0.0 for c in row] for row in counts]
    n = max(len(true_names), len(pred_names))
    size = max(4.0, 0.55 * n + 2.5)
    fig, ax = plt.subplots(figsize=(size, size))
    im = ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(pred_names)), pred_names, rotation=45, ha="right")
    ax.set_yticks(range(len(true_names)), true_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    for t, row in enumerate(counts):
        for p, c in enumerate(row):
            ax.text(p, t, str(c), ha="center", va="center", fontsize=8,
                    color="white" if norm[t][p] > 0.5 else "black")
    total = sum(map(sum, counts))
    correct = sum(counts[i][i] for i in range(min(len(counts), len(pred_names))))
    acc = correct / total if total else math.nan
    ax.set_title(f"confusion ({split}), accuracy {acc:.3f}")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv):
    run = parse_args(argv).run_dir
    metrics = os.path.join(run, "metrics.jsonl")
    if not os.path.isfile(metrics):
        raise SystemExit(f"plot_run.py: {metrics} does not exist")
    rows, steps, task = read_metrics(metrics)
    import_matplotlib()
    written = []
    out = os.path.join(run, "loss.png")
    plot_loss(rows, out)
    written.append(out)
    out = os.path.join(run, TASKS[task][1][0])
    plot_task_metrics(rows, task, out)
    written.append(out)
    if steps:
        out = os.path.join(run, "steps.png")
        plot_steps(steps, rows, out)
        written.append(out)
    for path in sorted(glob.glob(os.path.join(run, "confusion_*.csv"))):
        split = os.path.basename(path)[len("confusion_"):-len(".csv")]
        out = os.path.join(run, f"confusion_{split}.png")
        plot_confusion(path, out, split)
        written.append(out)
    for p in written:
        print(p)


if __name__ == "__main__":
    main(sys.argv[1:])
