"""melforge.build(..., features="fbank"): the builder's --features fbank from Python (issue 31). The Dataset reports
the front-end and the Kaldi filterbank's parameters, its clips have Kaldi's frame counts, and the featurizer that
melforge.predict uses on raw audio follows the dataset's front-end: the frames the builder stored, to float32 rounding
(a clip computed alone and in the builder's batch may differ in the last bits of its weakest bands; the features of
the other front-end differ by whole log units). float32 storage, so that no float16 rounding step amplifies that."""
import json

import numpy as np
import pytest

import melforge
from melforge import _core
from melforge_run import write_wav

RATE = 8000
# 25 ms frames every 10 ms at 8 kHz: 200-sample windows, 80-sample shift, 256-point FFT; 20 bins + the energy.
FBANK = dict(features="fbank", num_mel_bins=20, frame_length=25.0, frame_shift=10.0, dither=0.0,
             window_type="hamming", use_energy=True)
FLAGS = dict(sample_rate=RATE, short_seconds=0.25, split="0.5,0.5,0", dtype="float32", device="cpu", threads=2,
             quiet=True)


def write_corpus(root, seconds=(0.5, 0.8)):
    """Two classes of one tone per length in `seconds`; returns the paths relative to root."""
    paths = []
    for c in range(2):
        for i, s in enumerate(seconds):
            t = np.arange(int(s * RATE)) / RATE
            rel = f"class{c}/tone{i}.wav"
            write_wav(root / rel, 0.5 * np.sin(2 * np.pi * (300.0 + 200.0 * c + 50.0 * i) * t), RATE)
            paths.append(rel)
    return paths


@pytest.fixture(scope="module")
def fbank_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("fbank")
    write_corpus(root / "in")
    report = melforge.build(root / "out", input=root / "in", **FLAGS, **FBANK)
    return root, report


def test_a_fbank_build_reports_its_front_end_and_the_dataset_follows_it(fbank_dataset):
    root, report = fbank_dataset
    assert report["config"]["features"] == "fbank"
    assert report["config"]["num_mel_bins"] == 20
    assert report["config"]["window_type"] == "hamming"
    assert report["config"]["n_mels"] == 21
    seen = 0
    for split in ("train", "val"):
        ds = melforge.Dataset(root / "out", split, view="clips")
        assert ds.features == "fbank"
        info = ds.info
        assert info["num_mel_bins"] == 20 and info["use_energy"] == 1 and info["frame_shift"] == 10.0
        assert (info["n_fft"], info["win_length"], info["hop_length"], info["n_mels"]) == (256, 200, 80, 21)
        samples = ds.num_samples
        assert list(ds.clip_frames) == [1 + (n - 200) // 80 for n in samples]
        featurize = _core.ClipFeaturizer(json.dumps(info), 1)
        for i in range(len(ds)):
            example = ds[i]
            assert example.x.shape == (21, ds.clip_frames[example.clip])
            frames, n = featurize(str(root / "in" / ds.paths[example.clip]))
            assert n == samples[example.clip]
            assert frames.shape == (ds.clip_frames[example.clip], 21)
            np.testing.assert_allclose(frames.T, example.x, rtol=1e-3, atol=0.02)
            seen += 1
    assert seen == report["files"]["written"] == 4


def test_mel_and_fbank_flags_are_not_mixed(tmp_path):
    write_corpus(tmp_path / "in", seconds=(0.5,))
    with pytest.raises(melforge.InvalidArgument, match="--num-mel-bins"):
        melforge.build(tmp_path / "a", input=tmp_path / "in", n_mels=40, **FLAGS, **FBANK)
    with pytest.raises(melforge.InvalidArgument, match="--features fbank"):
        melforge.build(tmp_path / "b", input=tmp_path / "in", num_mel_bins=40, **FLAGS)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.needs_h5py
def test_h5py_sees_the_fbank_attributes(fbank_dataset):
    import h5py

    root, _ = fbank_dataset
    with h5py.File(root / "out" / "train.h5", "r") as f:
        assert f.attrs["features"] == "fbank"
        assert int(f.attrs["num_mel_bins"]) == 20
        assert f.attrs["window_type"] == "hamming"
        assert int(f.attrs["snip_edges"]) == 1
        assert f["frames"].shape[1] == 21
