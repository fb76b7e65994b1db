"""A small trained run for the tests of melforge.evaluate_files / melforge.predict: a tone corpus written here,
built with the C++ build's melforge-build and trained for two epochs with its melforge-train (env
MELFORGE_BUILD_BIN / MELFORGE_TRAIN_BIN, else builder/melforge-build and trainer/melforge-train of
MELFORGE_BUILD_DIR, default <repo>/build). The tests skip, naming the missing binary, when the C++ build is absent."""
import json
import math
import os
import pathlib
import subprocess
import wave

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def binary(env: str, default: str) -> pathlib.Path:
    """The binary named by `env`, else `default` under MELFORGE_BUILD_DIR (default <repo>/build). Fails the test,
    naming it, when it is not built (tools/test.sh builds the C++ project before pytest)."""
    build_dir = pathlib.Path(os.environ.get("MELFORGE_BUILD_DIR") or REPO / "build")
    path = pathlib.Path(os.environ.get(env) or build_dir / default)
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{path} not built (set {env} or build the C++ project with MELFORGE_TRAINER=ON)")
    return path


def build_binary() -> pathlib.Path:
    """melforge-build of the C++ build ($MELFORGE_BUILD_BIN)."""
    return binary("MELFORGE_BUILD_BIN", "builder/melforge-build")


def write_wav(path: pathlib.Path, data, rate: int) -> np.ndarray:
    """Writes a 16-bit PCM WAV with the standard wave module: `data` [frames] or [frames, channels], floats in
    [-1, 1] (scaled by 32767 and rounded) or integers (taken as int16). Returns the int16 samples [frames, channels]."""
    a = np.asarray(data)
    if np.issubdtype(a.dtype, np.floating):
        a = np.clip(np.round(a * 32767.0), -32768, 32767)
    pcm = a.astype("<i2")
    if pcm.ndim == 1:
        pcm = pcm[:, None]
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return pcm


def write_tone(path: pathlib.Path, hz: float, seconds: float, rate: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    write_wav(path, 0.4 * np.sin(2 * math.pi * hz * t) + rng.uniform(-0.05, 0.05, t.size), rate)


def write_corpus(root: pathlib.Path) -> None:
    """Three classes of tones, 12 files each (0.5 to 2.9 s, one at 16 kHz per class, resampled by the build)."""
    for c, hz in enumerate((300.0, 700.0, 1500.0)):
        for i in range(12):
            rate = 16000 if i == 0 else 8000
            write_tone(root / f"c{c}" / f"f{i:02d}.wav", hz + 13 * i, 0.5 + 0.2 * i, rate, seed=c * 100 + i)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise AssertionError(f"{cmd[0]} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def make_run(tmp: pathlib.Path) -> dict:
    """Builds and trains; returns {"corpus", "data", "checkpoint", "train_bin", "build_bin"}."""
    build_bin = build_binary()
    train_bin = binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train")
    corpus, data, out = tmp / "corpus", tmp / "data", tmp / "run"
    write_corpus(corpus)
    run([build_bin, "--input", corpus, "--output", data, "--sample-rate", 8000, "--n-fft", 256, "--hop-length", 64,
         "--n-mels", 32, "--short-seconds", 0.25, "--split", "0.5,0.25,0.25", "--seed", 3,
         "--device", "cpu", "--quiet"])
    run([train_bin, "train", "--data", data, "--out", out, "--epochs", 2, "--positive-class", "c1", "--device", "cpu",
         "--threads", 2, "--hidden", 16, "--batch-size", 16])
    return {"corpus": corpus, "data": data, "checkpoint": out / "checkpoints" / "best.pt", "train_bin": train_bin,
            "build_bin": build_bin}


def write_export(tmp_path: pathlib.Path, config: dict):
    """An export as `melforge-train export` writes it (a state dict of seeded weights, with non-trivial
    BatchNorm statistics, and its JSON), read back through melforge.models' untrusted-file loader."""
    import torch

    import melforge.models as models
    torch.manual_seed(3)
    net = models.build_model(config)
    with torch.no_grad():
        for name, t in net.state_dict().items():
            if name.endswith("running_var"):
                t.uniform_(0.5, 2.0)
            elif name.endswith("running_mean"):
                t.uniform_(-0.5, 0.5)
    torch.save(net.state_dict(), tmp_path / "weights.pt")
    meta = {"model_config": config, "class_names": ["a", "b", "c", "d"], "task": "verification", "scores": "cosine"}
    (tmp_path / "weights.pt.json").write_text(json.dumps(meta))
    state = models.load_torch_file(str(tmp_path / "weights.pt"))
    return models.build_checked_model(json.loads((tmp_path / "weights.pt.json").read_text()), state, "weights.pt")
