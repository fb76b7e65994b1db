"""melforge.predict(model=..., featurizer=...): a model of one's own through the same whole-clip features, tiles and
vote (or multi-label aggregate) as `melforge-train predict`. The reference here is the dataset melforge.build wrote
for the same files (its tiles of every frame, read through melforge.Dataset) and the model applied to them by hand."""
import numpy as np
import pytest

import melforge
from melforge_run import write_tone

pytestmark = pytest.mark.needs_torch
try:  # the module imports without torch (a venv without it deselects needs_torch); its tests then fail below
    import torch
    _Module = torch.nn.Module
except ImportError:  # pragma: no cover
    torch, _Module = None, object


@pytest.fixture(autouse=True)
def _torch():
    assert torch is not None, "torch is not installed: run tools/setup_python.sh (it adds the torch venv)"

TILE = 0.25  # seconds: 31 frames at 8 kHz, hop 64
HOP = 0.125


class MeanPool(_Module):
    """A linear layer over the mean of a tile's mel frames (over the real ones when given lengths)."""

    def __init__(self, n_mels, classes):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(n_mels, classes)

    def forward(self, x, lengths=None):
        if lengths is None:
            return self.linear(x.mean(-1))
        mask = (torch.arange(x.shape[-1])[None, :] < lengths[:, None]).to(x.dtype)
        return self.linear((x * mask[:, None, :]).sum(-1) / lengths[:, None].to(x.dtype))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own_model")
    corpus = tmp / "corpus"
    for c, hz in enumerate((400.0, 1200.0)):
        for i in range(3):
            write_tone(corpus / f"c{c}" / f"f{i}.wav", hz + 20 * i, 0.6 + 0.23 * i, 8000, seed=10 * c + i)
    out = tmp / "data"
    melforge.build(out, input=corpus, sample_rate=8000, n_fft=256, hop_length=64, n_mels=32, short_seconds=TILE,
                   split="1,0,0", device="cpu", threads=2, quiet=True)
    ds = melforge.Dataset(out, "train", tile_seconds=TILE, tile_hop=HOP, min_real=0)
    return {"corpus": corpus, "ds": ds, "paths": [str(corpus / p) for p in ds.paths]}


def tiles_by_hand(ds, model, clip, pass_lengths):
    """The dataset's tiles of one clip (every frame, as predict tiles a file) through `model`: logits [W, C]."""
    xs, lengths = [], []
    for i in range(len(ds)):
        ex = ds[i]
        if ex.clip == clip:
            xs.append(torch.from_numpy(np.asarray(ex.x, dtype=np.float32)))
            lengths.append(ex.length)
    x, lengths = torch.stack(xs), torch.tensor(lengths, dtype=torch.int64)
    with torch.no_grad():
        return model(x, lengths) if pass_lengths else model(x)


@pytest.mark.parametrize("pass_lengths", [False, True])
def test_windows_are_the_model_on_each_tile_and_the_file_is_their_vote(data, pass_lengths):
    ds = data["ds"]
    model = MeanPool(32, 2).train()
    rows = melforge.predict(model=model, featurizer=ds, paths=data["paths"], windows=True, threads=2,
                            pass_lengths=pass_lengths)
    assert model.training  # the mode is restored
    assert [r["path"] for r in rows] == data["paths"]
    for clip, row in enumerate(rows):
        want = torch.softmax(tiles_by_hand(ds, model, clip, pass_lengths), 1).numpy()
        assert row["num_windows"] == len(want) == len(row["windows"]) >= 2
        got = np.array([[w["probabilities"][n] for n in ds.class_names] for w in row["windows"]])
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert [w["predicted"] for w in row["windows"]] == [ds.class_names[k] for k in want.argmax(1)]
        assert [w["window"] for w in row["windows"]] == list(range(len(want)))
        assert row["windows"][1]["start"] == pytest.approx(HOP, abs=64 / 8000)
        mean = want.astype(np.float64).mean(0)
        assert [row["probabilities"][n] for n in ds.class_names] == pytest.approx(mean, abs=1e-6)
        assert row["predicted"] == ds.class_names[int(mean.argmax())]
        assert row["positive_class"] is None and row["detection_score"] is None and row["detected"] is None
    majority = melforge.predict(model=model, featurizer=ds, paths=data["paths"], vote="majority",
                                pass_lengths=pass_lengths)
    for clip, row in enumerate(majority):
        votes = np.bincount(tiles_by_hand(ds, model, clip, pass_lengths).argmax(1).numpy(), minlength=2)
        assert [row["probabilities"][n] for n in ds.class_names] == pytest.approx(votes / votes.sum())


@pytest.mark.parametrize("aggregate", ["mean", "max"])
def test_multilabel_scores_are_sigmoids_aggregated_and_thresholded(data, aggregate):
    ds = data["ds"]
    model = MeanPool(32, 2)
    rows = melforge.predict(model=model, featurizer=ds, paths=data["paths"], task="multilabel", aggregate=aggregate,
                            threshold=0.4, windows=True, class_names=["x", "y"])
    for clip, row in enumerate(rows):
        want = torch.sigmoid(tiles_by_hand(ds, model, clip, False)).numpy().astype(np.float64)
        got = np.array([[w["probabilities"][n] for n in ("x", "y")] for w in row["windows"]])
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert [w["labels"] for w in row["windows"]] == [[n for n, s in zip("xy", r) if s >= 0.4] for r in got]
        file = want.max(0) if aggregate == "max" else want.mean(0)
        scores = [row["probabilities"][n] for n in ("x", "y")]
        assert scores == pytest.approx(file, abs=1e-6)
        assert row["labels"] == [n for n, s in zip("xy", scores) if s >= 0.4]
        assert row["threshold"] == 0.4 and set(row) == {"path", "labels", "probabilities", "threshold",
                                                          "num_windows", "windows"}


def test_mel_parameters_and_a_tile_in_seconds(data):
    ds = data["ds"]
    model = MeanPool(32, 3)
    rows = melforge.predict(model=model, featurizer=ds.info, paths=data["paths"][:2], tile=TILE, hop=HOP)
    by_dataset = melforge.predict(model=model, featurizer=ds, paths=data["paths"][:2], class_names=["0", "1", "2"])
    assert [r["probabilities"] for r in rows] == [r["probabilities"] for r in by_dataset]
    assert list(rows[0]["probabilities"]) == ["0", "1", "2"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(), "featurizer= is required"),
    (dict(featurizer="mel.json"), "featurizer: a melforge.Dataset"),
    (dict(featurizer={}, task="regression"), "task"),
    (dict(featurizer={}, aggregate="max"), "aggregate applies to task='multilabel'"),
    (dict(featurizer={}, task="multilabel", vote="majority"), "vote 'majority'"),
])
def test_bad_own_model_parameters(data, kwargs, message):
    with pytest.raises(melforge.InvalidArgument, match=message):
        melforge.predict(model=MeanPool(32, 2), paths=data["paths"], **kwargs)


def test_checkpoint_and_model_are_exclusive(data, tmp_path):
    with pytest.raises(melforge.InvalidArgument, match="not both"):
        melforge.predict(tmp_path / "x.pt", data["paths"], model=MeanPool(32, 2), featurizer=data["ds"])
