"""The builder's waveform augmentation read back with h5py: the per-row recipe datasets and the augment_* attributes
of a build with --augment-copies (docs/FORMAT.md, "Waveform augmentation"), and the flags in melforge-build --help."""
import json
import math

import numpy as np
import pytest

from melforge_run import binary, run, write_tone, write_wav

pytestmark = pytest.mark.needs_h5py

FLAGS = ("--augment-copies", "--augment-splits", "--noise", "--noise-weights", "--snr-db", "--noise-prob", "--rir",
         "--rir-prob", "--speed", "--gain-db")


def test_help_lists_every_augmentation_flag_with_its_default():
    build_bin = binary("MELFORGE_BUILD_BIN", "builder/melforge-build")
    text = run([build_bin, "--help"]).stdout
    assert "Waveform augmentation" in text
    for flag in FLAGS:
        line = next((l for l in text.splitlines() if l.strip().startswith(flag + " ")), None)
        assert line is not None, flag
    for flag, default in (("--augment-copies", "0"), ("--augment-splits", "train"), ("--snr-db", "5,20"),
                          ("--speed", "1.0"), ("--gain-db", "0,0")):
        assert f"{flag} arg (={default})" in text, flag


def test_recipe_datasets_and_attributes(tmp_path):
    h5py = pytest.importorskip("h5py")
    build_bin = binary("MELFORGE_BUILD_BIN", "builder/melforge-build")
    for c in range(2):
        for i in range(5):
            write_tone(tmp_path / "in" / f"c{c}" / f"f{i}.wav", 400 + 300 * c + 11 * i, 1.1 + 0.1 * i, 8000, seed=i)
    rng = np.random.default_rng(7)
    write_wav(tmp_path / "noise" / "babble" / "n0.wav", rng.uniform(-0.3, 0.3, 4000), 8000)
    write_wav(tmp_path / "noise" / "n1.wav", rng.uniform(-0.3, 0.3, 12000), 8000)
    h = np.exp(-np.arange(300) / 50.0) * rng.uniform(-0.5, 0.5, 300)
    h[3] = 1.0
    write_wav(tmp_path / "rir" / "room.wav", h, 8000)
    run([build_bin, "--input", tmp_path / "in", "--output", tmp_path / "out", "--sample-rate", 8000, "--n-fft", 256,
         "--hop-length", 64, "--n-mels", 32, "--short-seconds", 0.25, "--split", "0.6,0.2,0.2",
         "--device", "cpu", "--quiet", "--augment-copies", 2, "--augment-splits", "train,val", "--noise",
         tmp_path / "noise", "--rir", tmp_path / "rir", "--rir-prob", 0.5, "--speed", "0.9,1.0,1.1", "--gain-db",
         "-3,3"])
    report = json.loads((tmp_path / "out" / "build_report.json").read_text())
    seen = {}
    for split in ("train", "val", "test"):
        with h5py.File(tmp_path / "out" / f"{split}.h5", "r") as f:
            rows = f["label"].shape[0]
            assert f["frame_offset"].shape[0] == rows + 1 and f["frames"].shape[0] == f["frame_offset"][-1]
            assert f.attrs["augment_copies"] == 2
            assert f.attrs["augment_splits"] == "train,val"
            copy = f["aug_copy"][...]
            assert copy.dtype == np.int32 and copy.shape == (rows,)
            for name in ("aug_speed", "aug_snr_db", "aug_gain_db"):
                assert f[name].dtype == np.float32 and f[name].shape == (rows,)
            rir = f["aug_rir"].asstr()[...].tolist()
            noise = f["aug_noise"].asstr()[...].tolist()
            snr = f["aug_snr_db"][...]
            speed = f["aug_speed"][...]
            gain = f["aug_gain_db"][...]
            paths = f["path"].asstr()[...].tolist()
            k = 0 if split == "test" else 2
            assert copy.tolist() == list(range(k + 1)) * (rows // (k + 1))
            assert report["augmentation"]["copies"][split]["augmented"] == rows // (k + 1) * k
            clean = copy == 0
            assert (speed[clean] == 1).all() and (gain[clean] == 0).all() and np.isnan(snr[clean]).all()
            assert all(r == "" for r, c in zip(rir, clean) if c) and all(n == "" for n, c in zip(noise, clean) if c)
            for i in np.flatnonzero(~clean):
                assert paths[i] == paths[i - copy[i]]
                assert noise[i] in ("babble/n0.wav", "n1.wav")
                assert 5 <= snr[i] <= 20
                assert rir[i] in ("", "room.wav")
                assert math.isclose(speed[i], 0.9, rel_tol=1e-6) or speed[i] in (1.0, np.float32(1.1))
                assert -3 <= gain[i] <= 3
            for p in paths:
                assert seen.setdefault(p, split) == split
    assert len(seen) == 10
