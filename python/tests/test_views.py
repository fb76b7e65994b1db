"""melforge.Dataset and melforge.Loader through the views (issue 28): schema 3 files written here with h5py (clips of
1..30 frames, known values) read as tiles, crops and whole clips against a NumPy reference (padding, lengths, masks,
targets); crops by (seed, epoch); whole clips batched by length under the budget; the committed schema 1/2 datasets
(tests/data/legacy) read as their segments, other views refused naming the schema."""
import pickle

import numpy as np
import pytest

import melforge

try:
    import h5py
except ImportError:  # the wheel's venv (tools/wheel.sh) deselects needs_h5py tests instead of skipping them
    h5py = None

pytestmark = pytest.mark.needs_h5py

CLIPS = [1, 7, 2, 13, 1, 30, 5, 4, 1, 9, 17, 3, 6]
M = 5
SILENCE = -100.0  # log db, power 2, amin 1e-10


def _write_clip_split(path, split, frames_per_clip=CLIPS, dtype=np.float32, multilabel=False, classes=3):
    """A schema 3 split (docs/FORMAT.md): 16 kHz, hop 160 (100 frames/s), default tile 0.08 s = 8 frames. Returns
    (frames [N, M] as stored, then float32; frame_offset; labels; targets or None)."""
    rng = np.random.default_rng(len(frames_per_clip))
    offset = np.concatenate([[0], np.cumsum(frames_per_clip)]).astype(np.int64)
    frames = rng.uniform(-90, 0, size=(offset[-1], M)).astype(dtype)
    labels = np.arange(len(frames_per_clip), dtype=np.int32) % classes
    targets = None
    if multilabel:
        targets = np.zeros((len(labels), classes), np.uint8)
        targets[np.arange(len(labels)), labels] = 1
        targets[::2, 0] = 1
    with h5py.File(path, "w") as f:
        attrs = {"schema_version": 3, "split": split, "melforge_version": "test", "sample_rate": 16000, "n_fft": 400,
                 "win_length": 400, "hop_length": 160, "window": "hann", "center": 1, "pad_mode": "reflect",
                 "power": 2.0, "n_mels": M, "f_min": 0.0, "f_max": 8000.0, "mel_scale": "htk", "mel_norm": "none",
                 "log": "db", "amin": 1e-10, "log_eps": 1e-6, "dtype": np.dtype(dtype).name,
                 "short_seconds": 0.08, "short_samples": 1280, "n_frames": 8, "max_seconds": 0.0, "channel": -1}
        for k, v in attrs.items():
            f.attrs[k] = np.int64(v) if isinstance(v, int) else np.float64(v) if isinstance(v, float) else v
        f.create_dataset("frames", data=frames, chunks=(4, M), maxshape=(None, M), shuffle=True, compression="gzip")
        f.create_dataset("frame_offset", data=offset)
        f.create_dataset("num_samples", data=np.maximum(1, 160 * np.array(frames_per_clip) - 80).astype(np.int64))
        f.create_dataset("clip_flags", data=(np.arange(len(labels)) % 2).astype(np.uint8))
        f.create_dataset("label", data=labels)
        f.create_dataset("path", data=[f"c{i}.wav" for i in range(len(labels))], dtype=h5py.string_dtype())
        f.create_dataset("class_names", data=[f"k{c}" for c in range(classes)], dtype=h5py.string_dtype())
        if targets is not None:
            f.create_dataset("targets", data=targets)
    return frames.astype(np.float32), offset, labels, targets


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("schema3")
    written = {}
    for split, dtype, multilabel in (("train", np.float16, True), ("val", np.float32, False),
                                     ("test", np.float32, False)):
        written[split] = _write_clip_split(folder / f"{split}.h5", split, dtype=dtype, multilabel=multilabel)
    return folder, written


def _reference(frames, offset, clip, start, length, real, repeat):
    """x [M, length] of an example by the definition: clip frames start.., repeated or padded with the silence."""
    clip_frames = offset[clip + 1] - offset[clip]
    x = np.full((M, length), SILENCE, np.float32)
    for i in range(real):
        src = (start + i) % clip_frames if repeat else start + i
        x[:, i] = frames[offset[clip] + src]
    return x


def test_dataset_tiles_default_and_metadata(clip_folder):
    folder, written = clip_folder
    frames, offset, labels, _ = written["val"]
    ds = melforge.Dataset(folder, "val")
    assert ds.schema_version == 3 and ds.view == "tiles" and ds.pad_value == SILENCE
    np.testing.assert_array_equal(ds.clip_frames, CLIPS)
    np.testing.assert_array_equal(ds.num_samples, np.maximum(1, 160 * np.array(CLIPS) - 80))
    np.testing.assert_array_equal(ds.clip_flags, np.arange(len(CLIPS)) % 2)
    assert ds.num_valid_long.size == 0 and ds.targets is None
    assert ds.info["num_long"] == 0 and ds.info["n_frames"] == 8
    expected = []
    for c, n in enumerate(CLIPS):
        for s in range(0, n, 8):
            real = min(8, n - s)
            if s == 0 or real >= 4:
                expected.append((c, s, real))
    assert len(ds) == len(expected)
    for i, (c, s, real) in enumerate(expected):
        e = ds[i]
        x, y, clip = e
        assert (clip, e.start, e.length, y) == (c, s, real, labels[c])
        np.testing.assert_array_equal(x, _reference(frames, offset, c, s, 8, real, False))
        np.testing.assert_array_equal(e.mask, np.arange(8) < real)
    covering = melforge.Dataset(folder, "val", min_real=0.0, tile_seconds=0.05, tile_hop=0.03)
    covered = np.zeros(offset[-1], int)
    for e in covering:
        assert e.x.shape == (M, 5)
        covered[offset[e.clip] + e.start: offset[e.clip] + e.start + e.length] += 1
    assert covered.min() >= 1


@pytest.mark.parametrize("short_clips", ["pad", "repeat"])
def test_dataset_crops_by_seed_and_epoch(clip_folder, short_clips):
    folder, written = clip_folder
    frames, offset, _, _ = written["test"]
    ds = melforge.Dataset(folder, "test", view="crops", crop_seconds=0.06, short_clips=short_clips, seed=4)
    assert len(ds) == len(CLIPS)

    def epoch_items(d, epoch):
        d.set_epoch(epoch)
        return [(e.clip, e.start, e.length) for e in d]

    first = epoch_items(ds, 0)
    assert first == epoch_items(melforge.Dataset(folder, "test", view="crops", crop_seconds=0.06,
                                                 short_clips=short_clips, seed=4), 0)
    assert first != epoch_items(ds, 1)
    assert first != epoch_items(melforge.Dataset(folder, "test", view="crops", crop_seconds=0.06,
                                                 short_clips=short_clips, seed=5), 0)
    ds.set_epoch(3)
    for e in ds:
        n = CLIPS[e.clip]
        repeat = short_clips == "repeat" and n < 6
        assert e.x.shape == (M, 6)
        assert e.length == (6 if n >= 6 or repeat else n)
        assert 0 <= e.start <= max(0, n - 6)
        np.testing.assert_array_equal(e.x, _reference(frames, offset, e.clip, e.start, 6, e.length, repeat))
    clone = pickle.loads(pickle.dumps(ds))
    assert [(e.clip, e.start) for e in clone] == [(e.clip, e.start) for e in ds]


@pytest.mark.parametrize("in_memory", [False, True])
@pytest.mark.parametrize("view", ["tiles", "crops"])
def test_loader_fixed_views_match_the_dataset(clip_folder, in_memory, view):
    folder, written = clip_folder
    frames, offset, labels, targets = written["train"]
    ds = melforge.Dataset(folder, "train", view=view, crop_seconds=0.06, seed=2)
    loader = melforge.Loader(ds, batch_size=4, seed=7, pool_chunks=2, in_memory=in_memory, as_torch=False)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        items = {(e.clip, e.start): e for e in ds}
        seen = []
        for b in loader:
            x, y, clip = b
            assert x.shape[1:] == (M, 6 if view == "crops" else 8)
            np.testing.assert_array_equal(b.mask, np.arange(x.shape[2]) < b.lengths[:, None])
            for r in range(len(y)):
                e = items[(int(clip[r]), int(b.start[r]))]
                seen.append((e.clip, e.start))
                assert b.lengths[r] == e.length and y[r] == labels[e.clip]
                np.testing.assert_array_equal(x[r], e.x)
                np.testing.assert_array_equal(b.targets[r], targets[e.clip].astype(np.float32))
        assert sorted(seen) == sorted(items)
        assert loader.epoch == epoch + 1


def test_loader_crops_differ_by_epoch_and_repeat_by_seed(clip_folder):
    folder, _ = clip_folder
    ds = melforge.Dataset(folder, "test", view="crops", crop_seconds=0.05, seed=1)

    def starts(epoch, loader_seed=0):
        loader = melforge.Loader(ds, batch_size=64, shuffle=False, seed=loader_seed, as_torch=False)
        loader.set_epoch(epoch)
        return [b.start.tolist() for b in loader]

    assert starts(0) == starts(0) == starts(0, loader_seed=9)
    assert starts(0) != starts(1)


@pytest.mark.parametrize("shuffle", [False, True])
def test_loader_whole_clips_by_length(clip_folder, shuffle):
    folder, written = clip_folder
    frames, offset, labels, _ = written["val"]
    ds = melforge.Dataset(folder, "val", view="clips")
    assert [e.length for e in ds] == CLIPS
    loader = melforge.Loader(ds, batch_size=3, shuffle=shuffle, as_torch=False, batch_seconds=0.4)
    seen, lengths = [], []
    for b in loader:
        assert len(b.y) <= 3 and (len(b.y) == 1 or len(b.y) * b.x.shape[2] <= 40)
        assert b.x.shape[2] == b.lengths.max()
        lengths.append(b.x.shape[2])
        for r, c in enumerate(b.clip):
            seen.append(int(c))
            assert b.lengths[r] == CLIPS[c]
            np.testing.assert_array_equal(b.x[r], _reference(frames, offset, c, 0, b.x.shape[2], CLIPS[c], False))
    assert sorted(seen) == list(range(len(CLIPS)))
    assert (lengths == sorted(lengths)) or shuffle
    with pytest.raises(melforge.InvalidArgument, match="drop_last"):
        melforge.Loader(ds, drop_last=True)


@pytest.mark.needs_torch
def test_loader_torch_batches_carry_masks(clip_folder):
    torch = pytest.importorskip("torch")
    folder, _ = clip_folder
    b = next(iter(melforge.Loader(melforge.Dataset(folder, "val", view="clips"), batch_size=4, shuffle=False)))
    assert isinstance(b.x, torch.Tensor) and b.mask.dtype == torch.bool and b.lengths.dtype == torch.int64
    assert torch.equal(b.mask, torch.arange(b.x.shape[2]) < b.lengths[:, None])


@pytest.mark.parametrize("schema", [1, 2])
def test_legacy_datasets_read_as_their_segments(repo, schema):
    folder = repo / "tests" / "data" / "legacy" / f"v{schema}"
    for split in ("train", "val", "test"):
        ds = melforge.Dataset(folder, split)
        assert ds.schema_version == schema
        with h5py.File(folder / f"{split}.h5", "r") as f:
            mel = f["mel"][...].astype(np.float32)
            valid = f["num_valid_long"][...]
        segments = [(i, mel[i, l, s]) for i in range(len(valid)) for l in range(valid[i]) for s in range(2)]
        assert len(ds) == len(segments)
        for e, (row, x) in zip(ds, segments):
            assert e.clip == row and e.length == 8
            np.testing.assert_array_equal(e.x, x)
        np.testing.assert_array_equal(ds.clip_frames, valid * 16)
        batches = list(melforge.Loader(ds, batch_size=5, shuffle=False, as_torch=False))
        np.testing.assert_array_equal(np.concatenate([b.x for b in batches]), np.stack([x for _, x in segments]))
        assert all(b.mask.all() for b in batches)
    for kwargs, named in (({"view": "crops"}, "view 'crops'"), ({"view": "clips"}, "view 'clips'"),
                          ({"tile_seconds": 0.05}, "tile length"), ({"tile_hop": 0.05}, "tile hop")):
        with pytest.raises(melforge.InvalidArgument, match=f"schema {schema}.*{named}"):
            melforge.Dataset(folder, "train", **kwargs)


def test_bad_view_arguments(clip_folder):
    folder, _ = clip_folder
    with pytest.raises(melforge.InvalidArgument, match="view"):
        melforge.Dataset(folder, "val", view="windows")
    with pytest.raises(melforge.InvalidArgument, match="short_clips"):
        melforge.Dataset(folder, "val", view="crops", short_clips="loop")
    with pytest.raises(melforge.InvalidArgument, match="tile-hop"):
        melforge.Dataset(folder, "val", tile_seconds=0.05, tile_hop=0.06)
    with pytest.raises(melforge.InvalidArgument, match="min-real"):
        melforge.Dataset(folder, "val", min_real=1.5)
