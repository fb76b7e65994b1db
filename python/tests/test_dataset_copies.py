"""melforge.Dataset and melforge.Loader over a split with build-time augmented copies (issue 32): the groups read from
`aug_copy` (a clean clip and the copies after it), the crops view's one crop per group per epoch through the same C++
view as melforge-train's --aug-prob (clean with probability 1 - aug_prob, else a copy), the same crops in the Loader,
and aug_prob refused outside [0, 1]."""
import numpy as np
import pytest

import melforge

try:
    import h5py
except ImportError:  # the wheel's venv (tools/wheel.sh) deselects needs_h5py tests instead of skipping them
    h5py = None

pytestmark = pytest.mark.needs_h5py

COPIES = [0, 1, 2, 0, 1, 2, 0, 0, 1, 2, 0, 1, 2]
GROUPS = [0, 3, 6, 7, 10, 13]
FRAMES = [12, 11, 13, 9, 8, 10, 20, 7, 6, 8, 30, 28, 31]
M = 4


def _write_split(path, split, copies):
    """A schema 3 split (16 kHz, hop 160: 100 frames/s) of FRAMES clips, copies on their clean clip's path."""
    rng = np.random.default_rng(3)
    offset = np.concatenate([[0], np.cumsum(FRAMES)]).astype(np.int64)
    paths, labels = [], []
    for i, k in enumerate(copies):
        paths.append(paths[-1] if k > 0 else f"s{i % 2}/u{i}.wav")
        labels.append(labels[-1] if k > 0 else i % 2)
    with h5py.File(path, "w") as f:
        attrs = {"schema_version": 3, "split": split, "melforge_version": "test", "sample_rate": 16000, "n_fft": 400,
                 "win_length": 400, "hop_length": 160, "window": "hann", "center": 1, "pad_mode": "reflect",
                 "power": 2.0, "n_mels": M, "f_min": 0.0, "f_max": 8000.0, "mel_scale": "htk", "mel_norm": "none",
                 "log": "db", "amin": 1e-10, "log_eps": 1e-6, "dtype": "float32",
                 "short_seconds": 0.05, "short_samples": 800, "n_frames": 5, "max_seconds": 0.0, "channel": -1}
        for k, v in attrs.items():
            f.attrs[k] = np.int64(v) if isinstance(v, int) else np.float64(v) if isinstance(v, float) else v
        f.create_dataset("frames", data=rng.uniform(-90, 0, size=(offset[-1], M)).astype(np.float32), chunks=(8, M))
        f.create_dataset("frame_offset", data=offset)
        f.create_dataset("num_samples", data=160 * np.array(FRAMES, dtype=np.int64))
        f.create_dataset("clip_flags", data=np.zeros(len(FRAMES), np.uint8))
        f.create_dataset("label", data=np.array(labels, np.int32))
        f.create_dataset("path", data=paths, dtype=h5py.string_dtype())
        f.create_dataset("class_names", data=["a", "b"], dtype=h5py.string_dtype())
        f.create_dataset("aug_copy", data=np.array(copies, np.int32))


@pytest.fixture(scope="module")
def copies_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("copies")
    _write_split(folder / "train.h5", "train", COPIES)
    _write_split(folder / "val.h5", "val", [0] * len(FRAMES))
    _write_split(folder / "test.h5", "test", [0] * len(FRAMES))
    return folder


def _group(clip):
    return int(np.searchsorted(GROUPS, clip, side="right")) - 1


@pytest.mark.parametrize("aug_prob", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("seed", [0, 11])
def test_crops_one_per_group_from_its_copies(copies_folder, aug_prob, seed):
    ds = melforge.Dataset(copies_folder, "train", view="crops", crop_seconds=0.05, aug_prob=aug_prob, seed=seed)
    assert ds.aug_copy.tolist() == COPIES
    assert ds.group_offsets.tolist() == GROUPS
    assert len(ds) == len(GROUPS) - 1
    epochs = []
    for epoch in range(4):
        ds.set_epoch(epoch)
        items = [(e.clip, e.start) for e in ds]
        assert [_group(c) for c, _ in items] == list(range(len(GROUPS) - 1))
        for clip, start in items:
            assert 0 <= start <= FRAMES[clip] - 5
            if aug_prob == 0.0:
                assert COPIES[clip] == 0
            if aug_prob == 1.0 and GROUPS[_group(clip) + 1] - GROUPS[_group(clip)] > 1:
                assert COPIES[clip] > 0
        epochs.append(items)
    again = melforge.Dataset(copies_folder, "train", view="crops", crop_seconds=0.05, aug_prob=aug_prob, seed=seed)
    again.set_epoch(3)
    assert [(e.clip, e.start) for e in again] == epochs[3]
    assert epochs[0] != epochs[1]
    loader = melforge.Loader(ds, batch_size=2, seed=5, as_torch=False)
    loader.set_epoch(2)
    assert len(loader) == 3
    got = sorted((c, s) for b in loader for c, s in zip(b.clip.tolist(), b.start.tolist()))
    assert got == sorted(epochs[2])


def test_tiles_and_splits_without_copies_are_unchanged(copies_folder):
    tiles = melforge.Dataset(copies_folder, "train", view="tiles", tile_seconds=0.05, min_real=0.0)
    assert sorted({e.clip for e in tiles}) == list(range(len(FRAMES)))
    clean = melforge.Dataset(copies_folder, "val", view="crops", crop_seconds=0.05, seed=2)
    assert len(clean) == len(FRAMES)
    assert clean.group_offsets.tolist() == list(range(len(FRAMES) + 1))
    default = [(e.clip, e.start) for e in clean]
    assert default == [(e.clip, e.start) for e in melforge.Dataset(copies_folder, "val", view="crops",
                                                                  crop_seconds=0.05, seed=2, aug_prob=1.0)]


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_bad_aug_prob(copies_folder, bad):
    with pytest.raises(melforge.InvalidArgument, match="aug-prob"):
        melforge.Dataset(copies_folder, "train", view="crops", aug_prob=bad)
