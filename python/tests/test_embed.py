"""melforge.embed against `melforge-train embed` of the same audio files (its HDF5 file read with h5py): the same
rows within 1e-5, from the checkpoint and from its export; what it refuses."""
import json
import math

import numpy as np
import pytest

import melforge
from melforge_run import binary, build_binary, run, write_wav

pytestmark = [pytest.mark.needs_h5py, pytest.mark.needs_torch]
try:
    import h5py
except ImportError as e:  # reported by the fixture below, as a failure, in an environment that selects these tests
    h5py = None
    _missing = str(e)


@pytest.fixture(autouse=True)
def _references():
    assert h5py is not None, f"{_missing}: run tools/setup_python.sh"


def write_speakers(root):
    """8 "speakers" (a harmonic tone each), 4 utterances of 0.6 to 1.5 s each, in VoxCeleb's layout."""
    rng = np.random.default_rng(11)
    for s in range(8):
        f0 = 170.0 + 60.0 * s
        for u in range(4):
            t = np.arange(int(8000 * (0.6 + 0.3 * u))) / 8000.0
            x = sum(0.3 / k * np.sin(2 * math.pi * f0 * k * t) for k in (1, 2, 3))
            write_wav(root / "in" / f"spk{s}" / f"s{u % 2}" / f"u{u}.wav", x + rng.uniform(-0.02, 0.02, t.size), 8000)


@pytest.fixture(scope="module")
def speaker_model(tmp_path_factory):
    """A one-epoch ResNetSE (quarter width, embedding 8) checkpoint, its export and the CLI's embeddings of every
    utterance of the corpus (audio inputs: the folder)."""
    tmp = tmp_path_factory.mktemp("embed")
    write_speakers(tmp)
    data, out = tmp / "data", tmp / "run"
    run([build_binary(), "--input", tmp / "in", "--output", data, "--split-by", "class", "--split", "0.5,0.25,0.25",
         "--sample-rate", 8000, "--n-fft", 256, "--hop-length", 64, "--n-mels", 24, "--short-seconds", 0.25,
         "--device", "cpu", "--quiet"])
    train_bin = binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train")
    run([train_bin, "train", "--data", data, "--out", out, "--task", "verification", "--model", "resnet-se",
         "--width", "quarter", "--embedding-dim", 8, "--epochs", 1, "--device", "cpu", "--threads", 1,
         "--batch-size", 8, "--trial-count", 10, "--seed", 5, "--no-tensorboard"])
    checkpoint = out / "checkpoints" / "best.pt"
    run([train_bin, "embed", "--checkpoint", checkpoint, "--out", tmp / "emb.h5", "--device", "cpu", "--threads", 1,
         tmp / "in"])
    run([train_bin, "export", "--checkpoint", checkpoint, "--out", tmp / "weights.pt"])
    with h5py.File(tmp / "emb.h5", "r") as f:
        emb, paths = f["embedding"][...], list(f["path"].asstr()[...])
    return {"tmp": tmp, "checkpoint": checkpoint, "export": tmp / "weights.pt", "emb": emb, "paths": paths}


def test_embed_equals_the_cli_from_a_checkpoint_and_an_export(speaker_model):
    m = speaker_model
    assert len(m["paths"]) == 32 and m["emb"].shape == (32, 8)
    got, paths = melforge.embed(m["checkpoint"], m["tmp"] / "in", threads=1, return_paths=True)
    assert paths == m["paths"]
    assert got.dtype == melforge.models.torch.float32 and tuple(got.shape) == (32, 8)
    np.testing.assert_allclose(got.numpy(), m["emb"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got.numpy().astype(np.float64), axis=1), 1.0, atol=1e-6)
    for source in (m["export"], str(m["export"]) + ".json"):
        got = melforge.embed(source, m["paths"][9:11], threads=1)
        np.testing.assert_allclose(got.numpy(), m["emb"][9:11], atol=1e-5, rtol=0)
    # Files in the order given; the rows can differ (another model gives other rows: the comparison can fail).
    two = [m["paths"][5], m["paths"][0]]
    got = melforge.embed(m["checkpoint"], two, threads=1)
    np.testing.assert_allclose(got.numpy(), m["emb"][[5, 0]], atol=1e-5, rtol=0)
    assert np.abs(got.numpy()[0] - m["emb"][0]).max() > 1e-3


def test_embed_refuses_a_classifier_and_names_bad_inputs(speaker_model, tmp_path):
    torch = melforge.models.torch
    net = melforge.models.build_model({"model": "cnn", "n_mels": 24, "n_frames": 20, "num_classes": 2,
                                       "channels": [4, 4, 4], "hidden": 8, "dropout": 0.0, "time_pool": "mean_max"})
    torch.save(net.state_dict(), tmp_path / "cnn.pt")
    with open(speaker_model["export"].as_posix() + ".json", encoding="utf-8") as fh:
        meta = json.load(fh)
    meta.update(model_config=net.config(), class_names=["a", "b"], positive_class="b", task="multiclass")
    (tmp_path / "cnn.pt.json").write_text(json.dumps(meta))
    with pytest.raises(melforge.FormatError, match="predict"):
        melforge.embed(tmp_path / "cnn.pt", speaker_model["paths"][0])
    with pytest.raises(melforge.IoError, match="nowhere.pt"):
        melforge.embed(tmp_path / "nowhere.pt", speaker_model["paths"][0])
    missing = tmp_path / "missing.wav"
    with pytest.raises(melforge.IoError, match="missing.wav"):
        melforge.embed(speaker_model["checkpoint"], [speaker_model["paths"][0], missing])
    (tmp_path / "bad.wav").write_bytes(b"RIFF not a wave file")
    with pytest.raises(melforge.IoError, match="bad.wav"):
        melforge.embed(speaker_model["checkpoint"], [tmp_path / "bad.wav"])
    with pytest.raises(melforge.InvalidArgument, match="--device"):
        melforge.embed(speaker_model["checkpoint"], speaker_model["paths"][0], device="tpu")
    with pytest.raises(melforge.InvalidArgument, match="at least one"):
        melforge.embed(speaker_model["checkpoint"], [])
