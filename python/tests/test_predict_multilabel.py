"""melforge.predict on a --task multilabel checkpoint and its export against `melforge-train predict --format json`
(label sets at the val-tuned threshold the checkpoint stores, or at `threshold`; mean or max over the tiles; every
tile's scores with windows=True)."""
import json
import math
import subprocess

import numpy as np
import pytest

import melforge
from melforge_run import binary, build_binary, run, write_wav

pytestmark = pytest.mark.needs_torch

TONES = {"high": 2400.0, "low": 350.0, "mid": 1100.0}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A one-epoch multilabel run on every non-empty subset of three tones (4 files each)."""
    tmp = tmp_path_factory.mktemp("predict_multilabel")
    rng = np.random.default_rng(2)
    rows, names = ["path,label,split"], sorted(TONES)
    for mask in range(1, 8):
        for i in range(4):
            labels = [n for k, n in enumerate(names) if mask & (1 << k)]
            t = np.arange(5000 + 700 * i) / 8000.0
            x = sum(0.25 * np.sin(2 * math.pi * TONES[n] * t) for n in labels) + rng.uniform(-0.02, 0.02, t.size)
            write_wav(tmp / "in" / f"m{mask}_{i}.wav", x, 8000)
            rows.append(f"in/m{mask}_{i}.wav,\"{';'.join(labels)}\",{('train', 'train', 'val', 'test')[i]}")
    (tmp / "m.csv").write_text("\n".join(rows) + "\n")
    data, out = tmp / "data", tmp / "run"
    run([build_binary(), "--manifest", tmp / "m.csv", "--output", data, "--sample-rate", 8000, "--n-fft", 256,
         "--hop-length", 64, "--n-mels", 32, "--short-seconds", 0.25, "--device", "cpu", "--quiet"])
    train_bin = binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train")
    r = run([train_bin, "train", "--data", data, "--out", out, "--task", "multilabel", "--epochs", 1, "--device",
             "cpu", "--threads", 2, "--hidden", 16, "--batch-size", 16, "--tile-hop", 0.125])
    assert "test: mAP" in r.stdout and "accuracy" not in r.stdout, r.stdout
    report = json.loads((out / "report.json").read_text())
    return {"train_bin": train_bin, "checkpoint": out / "checkpoints" / "best.pt", "inputs": [tmp / "in"],
            "tuned": report["tuned_threshold"], "tmp": tmp}


def cli(trained, checkpoint, extra=()):
    windows = trained["tmp"] / "windows.json"
    r = run([trained["train_bin"], "predict", "--checkpoint", checkpoint, "--format", "json", "--device", "cpu",
             "--windows", windows, *extra, *trained["inputs"]])
    rows = json.loads(r.stdout)
    per_file = {}
    for w in json.loads(windows.read_text()):
        per_file.setdefault(w["path"], []).append(w)
    return rows, per_file, r.stderr


def check_same(got, want, windows):
    assert [r["path"] for r in got] == [r["path"] for r in want]
    for g, w in zip(got, want):
        assert set(g) == set(w) | {"windows"}, g["path"]
        assert g["labels"] == w["labels"], g["path"]
        assert g["threshold"] == pytest.approx(w["threshold"], abs=1e-12)
        assert g["num_windows"] == w["num_windows"]
        assert list(g["probabilities"]) == list(w["probabilities"])
        for name, p in w["probabilities"].items():
            assert g["probabilities"][name] == pytest.approx(p, abs=1e-5), (g["path"], name)
        assert len(g["windows"]) == len(windows[w["path"]])
        for gw, ww in zip(g["windows"], windows[w["path"]]):
            assert gw["labels"] == ww["labels"] and gw["window"] == ww["window"]
            assert gw["start"] == pytest.approx(ww["start"]) and gw["end"] == pytest.approx(ww["end"])
            assert [gw["probabilities"][n] for n in ww["probabilities"]] == pytest.approx(
                list(ww["probabilities"].values()), abs=1e-5)


@pytest.mark.parametrize("extra, kwargs", [((), {}), (("--threshold", "0.3", "--aggregate", "max"),
                                                      dict(threshold=0.3, aggregate="max"))])
def test_checkpoint_equals_melforge_train_predict(trained, extra, kwargs):
    want, windows, log = cli(trained, trained["checkpoint"], extra)
    assert len(want) == 28 and all("labels" in r for r in want)
    if not extra:
        assert all(r["threshold"] == trained["tuned"] for r in want)
        assert "the threshold tuned on val, stored in the checkpoint" in log
    got = melforge.predict(trained["checkpoint"], trained["inputs"], threads=2, windows=True, **kwargs)
    check_same(got, want, windows)
    for row in got:
        assert row["labels"] == [n for n, s in row["probabilities"].items() if s >= row["threshold"]]
    if kwargs:
        assert any(len(r["windows"]) > 1 for r in got)
        for row in got:
            best = [max(w["probabilities"][n] for w in row["windows"]) for n in row["probabilities"]]
            assert list(row["probabilities"].values()) == pytest.approx(best, abs=1e-6)


def test_export_equals_melforge_train_predict(trained):
    weights = trained["tmp"] / "weights.pt"
    run([trained["train_bin"], "export", "--checkpoint", trained["checkpoint"], "--out", weights])
    meta = json.loads((trained["tmp"] / "weights.pt.json").read_text())
    assert (meta["task"], meta["scores"], meta["aggregate"]) == ("multilabel", "sigmoid", "mean")
    assert meta["threshold"] == trained["tuned"]
    assert meta["view"]["tile_hop"] == 0.125  # the export's files are tiled with the trained hop, as the CLI's
    want, windows, _ = cli(trained, trained["checkpoint"])
    check_same(melforge.predict(weights, trained["inputs"], windows=True), want, windows)
    model = melforge.models.build_model(meta)
    assert model.task == "multilabel"


def test_multilabel_refuses_vote_majority(trained):
    with pytest.raises(melforge.InvalidArgument, match="--aggregate"):
        melforge.predict(trained["checkpoint"], trained["inputs"], vote="majority")
    r = subprocess.run([str(trained["train_bin"]), "predict", "--checkpoint", str(trained["checkpoint"]), "--vote",
                        "majority", str(trained["inputs"][0])], capture_output=True, text=True)
    assert r.returncode == 2 and "--aggregate" in r.stderr
