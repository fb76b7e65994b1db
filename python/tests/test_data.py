"""melforge.Dataset and melforge.Loader over a dataset built in the test by the C++ `melforge-build` binary
(build/builder/melforge-build of the C++ build, or MELFORGE_BUILD_BIN; schema 3, clips stored whole), read through
the default view (tiles of the dataset's n_frames, the last one padded with the silence value when at least half
real), compared with h5py's reading of the same file."""
import pickle
import subprocess

import numpy as np
import pytest

import melforge
from melforge_run import build_binary, write_wav



def _make_corpus(root, classes=3, per_class=10, rate=8000):
    rng = np.random.default_rng(5)
    for c in range(classes):
        for i in range(per_class):
            n = 4800 + (i * 3137 + c * 911) % 16000
            t = np.arange(n) / rate
            tone = 0.5 * np.sin(2 * np.pi * (300.0 * (c + 1) + 7 * i) * t) + 0.01 * rng.standard_normal(n)
            write_wav(root / f"class{c}" / f"f{i}.wav", tone, rate)


def _build(tmp, name, dtype):
    corpus = tmp / "corpus"
    if not corpus.exists():
        _make_corpus(corpus)
    out = tmp / name
    subprocess.run([str(build_binary()), "--input", str(corpus), "--output", str(out), "--sample-rate", "8000",
                    "--n-fft", "256", "--hop-length", "64", "--n-mels", "32", "--short-seconds", "0.25",
                    "--split", "0.6,0.2,0.2", "--device", "cpu", "--quiet", "--frames-per-chunk", "64",
                    "--dtype", dtype], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("data")
    return {dtype: _build(tmp, dtype, dtype) for dtype in ("float16", "float32")}


def _h5_tiles(path, pad):
    """Every tile of the default view as h5py and NumPy make it: (x float32 [N, M, T], label [N], clip [N],
    real frames [N]), in Dataset order: clip by clip, tiles of T = n_frames side by side, the last one padded with
    `pad` (the silence value) and kept when it is the clip's only one or at least half real."""
    h5py = pytest.importorskip("h5py")
    with h5py.File(path, "r") as f:
        frames = f["frames"][...].astype(np.float32)
        offset = f["frame_offset"][...]
        labels = f["label"][...]
        t = int(f.attrs["n_frames"])
        assert f.attrs["schema_version"] == 3
    xs, ys, cs, reals = [], [], [], []
    for c in range(len(labels)):
        clip = frames[offset[c]:offset[c + 1]]
        for start in range(0, len(clip), t):
            real = min(t, len(clip) - start)
            if start > 0 and real < t / 2:
                continue
            x = np.full((clip.shape[1], t), pad, np.float32)
            x[:, :real] = clip[start:start + real].T
            xs.append(x)
            ys.append(int(labels[c]))
            cs.append(c)
            reals.append(real)
    return np.stack(xs), np.array(ys, dtype=np.int64), np.array(cs, dtype=np.int64), np.array(reals, dtype=np.int64)


@pytest.mark.needs_h5py
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_dataset_equals_h5py(datasets, dtype):
    h5py = pytest.importorskip("h5py")
    ds = melforge.Dataset(datasets[dtype], "train")
    assert ds.pad_value == pytest.approx(-100.0)
    x, y, f, real = _h5_tiles(datasets[dtype] / "train.h5", ds.pad_value)
    assert len(ds) == len(x) > 20
    assert (real < x.shape[2]).any()
    for i in list(range(0, len(ds), 3)) + [-1]:
        xi, yi, fi = ds[i]
        assert xi.dtype == np.float32 and xi.shape == x.shape[1:]
        np.testing.assert_array_equal(xi, x[i])
        assert (yi, fi, ds[i].length) == (y[i], f[i], real[i])
    with pytest.raises(IndexError):
        ds[len(ds)]
    with h5py.File(datasets[dtype] / "train.h5", "r") as h:
        assert ds.class_names == [c.decode() if isinstance(c, bytes) else c for c in h["class_names"][...]]
        assert ds.paths == [p.decode() if isinstance(p, bytes) else p for p in h["path"][...]]
        np.testing.assert_array_equal(ds.labels, h["label"][...])
        np.testing.assert_array_equal(ds.clip_frames, np.diff(h["frame_offset"][...]))
        np.testing.assert_array_equal(ds.num_samples, h["num_samples"][...])
        np.testing.assert_array_equal(ds.clip_flags, h["clip_flags"][...])
        assert ds.schema_version == 3 and ds.num_valid_long.size == 0
        assert ds.info["dtype"] == dtype
        assert ds.info["n_mels"] == h.attrs["n_mels"] == 32


@pytest.mark.needs_h5py
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("in_memory", [False, True])
def test_loader_equals_h5py(datasets, dtype, shuffle, in_memory):
    ds = melforge.Dataset(datasets[dtype], "train")
    x, y, f, real = _h5_tiles(datasets[dtype] / "train.h5", ds.pad_value)
    loader = melforge.Loader(ds, batch_size=8, shuffle=shuffle, seed=3, pool_chunks=2, in_memory=in_memory,
                             as_torch=False)
    assert loader.in_memory == in_memory
    order = loader._native.order(0)
    assert sorted(order.tolist()) == list(range(len(ds)))
    if not shuffle:
        assert order.tolist() == list(range(len(ds)))
    loader.set_epoch(0)
    got_x, got_y, got_f, got_real = [], [], [], []
    for batch in loader:
        bx, by, bf = batch
        assert isinstance(bx, np.ndarray) and bx.dtype == np.float32 and bx.shape[1:] == (32, x.shape[2])
        assert by.dtype == np.int64 and bf.dtype == np.int64
        np.testing.assert_array_equal(batch.mask, np.arange(x.shape[2]) < batch.lengths[:, None])
        got_x.append(bx.copy())
        got_y.append(by.copy())
        got_f.append(bf.copy())
        got_real.append(batch.lengths.copy())
    assert len(got_x) == len(loader) == -(-len(ds) // 8)
    np.testing.assert_array_equal(np.concatenate(got_x), x[order])
    np.testing.assert_array_equal(np.concatenate(got_y), y[order])
    np.testing.assert_array_equal(np.concatenate(got_f), f[order])
    np.testing.assert_array_equal(np.concatenate(got_real), real[order])


def test_loader_epochs_seed_prefetch_drop_last(datasets):
    ds = melforge.Dataset(datasets["float32"], "train")

    def files(**kw):
        loader = melforge.Loader(ds, batch_size=6, as_torch=False, **kw)
        return [b[2].tolist() for b in loader], loader

    a, la = files(seed=1, prefetch=0)
    b, _ = files(seed=1, prefetch=5)
    c, _ = files(seed=2)
    assert a == b
    assert a != c
    second = [b[2].tolist() for b in la]
    assert second != a and la.epoch == 2
    la.set_epoch(0)
    assert [b[2].tolist() for b in la] == a
    d, ld = files(seed=1, drop_last=True)
    assert len(ld) == len(ds) // 6 and all(len(x) == 6 for x in d)
    assert sum(len(x) for x in a) == len(ds)
    kept = [x for x in a]
    assert d == kept[:len(d)]


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, True, "8", None])
def test_loader_refuses_a_batch_size_that_is_not_a_positive_integer(datasets, batch_size):
    ds = melforge.Dataset(datasets["float32"], "train")
    with pytest.raises(melforge.InvalidArgument, match="batch_size must be"):
        melforge.Loader(ds, batch_size=batch_size, as_torch=False)


def test_loader_refuses_a_batch_size_it_cannot_serve_with_drop_last(datasets):
    ds = melforge.Dataset(datasets["float32"], "val")
    n = len(ds)
    assert n > 0
    with pytest.raises(melforge.InvalidArgument, match=rf"batch_size {n + 1} is larger than the {n} examples of "
                                                       rf"split 'val' with drop_last=True"):
        melforge.Loader(ds, batch_size=n + 1, drop_last=True, as_torch=False)
    full = list(melforge.Loader(ds, batch_size=n, drop_last=True, as_torch=False))
    assert [len(b[2]) for b in full] == [n]
    partial = list(melforge.Loader(ds, batch_size=n + 1, as_torch=False))
    assert [len(b[2]) for b in partial] == [n]


def test_loader_batches_survive_the_next_ones(datasets):
    ds = melforge.Dataset(datasets["float32"], "train")
    batches = list(melforge.Loader(ds, batch_size=4, shuffle=False, as_torch=False))
    np.testing.assert_array_equal(batches[0][0][0], ds[0][0])
    np.testing.assert_array_equal(batches[-1][0][-1], ds[len(ds) - 1][0])


def test_missing_folder_or_split_names_the_path(tmp_path, datasets):
    missing = tmp_path / "nowhere"
    with pytest.raises(melforge.IoError, match=str(missing)):
        melforge.Dataset(missing, "train")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(melforge.IoError, match="test.h5"):
        melforge.Dataset(empty, "test")
    with pytest.raises(melforge.InvalidArgument):
        melforge.Dataset(datasets["float32"], "dev")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "train.h5").write_bytes(b"not hdf5")
    with pytest.raises((melforge.IoError, melforge.FormatError), match="train.h5"):
        melforge.Dataset(bad, "train")
    with pytest.raises(melforge.InvalidArgument):
        melforge.Loader(melforge.Dataset(datasets["float32"], "train"), batch_size=0)


def test_dataset_pickles_without_a_handle(datasets):
    ds = melforge.Dataset(datasets["float16"], "val")
    first = ds[0][0]
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._native is None
    np.testing.assert_array_equal(clone[0][0], first)


@pytest.mark.needs_torch
def test_torch_dataloader_workers_and_torch_batches(datasets):
    torch = pytest.importorskip("torch")
    ds = melforge.Dataset(datasets["float16"], "train")
    ds[0]
    dl = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, shuffle=False)
    xs = torch.cat([b[0] for b in dl])
    assert xs.shape == (len(ds), 32, ds[0][0].shape[1])
    np.testing.assert_array_equal(xs[7].numpy(), ds[7][0])
    batches = list(melforge.Loader(ds, batch_size=5, shuffle=False))
    assert isinstance(batches[0][0], torch.Tensor) and batches[0][0].dtype == torch.float32
    assert batches[0][1].dtype == torch.int64
    np.testing.assert_array_equal(torch.cat([b[0] for b in batches]).numpy(), xs.numpy())
