"""melforge.evaluate_files: the clip vote and metrics of `melforge-train eval`, checked against the binary's own
report on a trained checkpoint (every clip's tiles, min_real 0, the last one padded and masked), its per-example form
in any order, and the dense form of schema-1/2 rows."""
import json

import numpy as np
import pytest

import melforge
from melforge_run import make_run, run




@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("evaluate"))


def tile_outputs(trained, split):
    """Softmax / sigmoid outputs [E, C] / [E] of the checkpoint's model on every tile of every clip of `split` (a
    schema-3 file read with h5py: tiles of the model's n_frames side by side, min_real 0, the last one padded with the
    silence value and masked by its length), with each tile's clip, the split's labels, class names and the
    checkpoint."""
    h5py = pytest.importorskip("h5py")
    torch = pytest.importorskip("torch")
    ck = torch.load(trained["checkpoint"], map_location="cpu")
    model = melforge.models.build_model(ck)
    model.load_state_dict(ck["model"])
    model.eval()
    tile = int(melforge.models.model_config_of(ck)["n_frames"])
    mel = ck["mel"] if isinstance(ck["mel"], (str, bytes)) else json.dumps(ck["mel"])
    pad = melforge._core.ClipFeaturizer(mel, 1).pad_value
    with h5py.File(trained["data"] / f"{split}.h5", "r") as f:
        assert int(f.attrs["schema_version"]) == 3
        frames = f["frames"][...].astype(np.float32)
        offset = f["frame_offset"][...].astype(np.int64)
        labels = f["label"][...].astype(np.int64)
        names = list(f["class_names"].asstr()[...])
    xs, lengths, clips = [], [], []
    for c in range(len(labels)):
        clip = frames[offset[c]:offset[c + 1]]
        for start in range(0, len(clip), tile):
            real = min(tile, len(clip) - start)
            x = np.full((tile, clip.shape[1]), pad, dtype=np.float32)
            x[:real] = clip[start:start + real]
            xs.append(x.T)
            lengths.append(real)
            clips.append(c)
    with torch.no_grad():
        logits, det = model(torch.from_numpy(np.stack(xs)), torch.tensor(lengths))
    return (torch.softmax(logits, 1).numpy(), torch.sigmoid(det).numpy(), np.array(clips), labels, names, ck)


def eval_report(trained, split, vote):
    out = trained["checkpoint"].parent / f"eval_{split}_{vote}.json"
    run([trained["train_bin"], "eval", "--checkpoint", trained["checkpoint"], "--data", trained["data"], "--split",
         split, "--vote", vote, "--device", "cpu", "--out", out])
    return json.loads(out.read_text())["file"]


@pytest.mark.needs_torch
@pytest.mark.needs_h5py
@pytest.mark.parametrize("vote", ["mean", "majority"])
@pytest.mark.parametrize("split", ["val", "test"])
def test_equals_melforge_train_eval(trained, split, vote):
    probs, dets, clips, labels, names, ck = tile_outputs(trained, split)
    want = eval_report(trained, split, vote)
    order = np.random.default_rng(3).permutation(len(clips))
    got = melforge.evaluate_files(probs[order], dets[order], labels=labels[clips[order]], vote=vote,
                                  file_index=clips[order], class_names=names, positive_class=ck["positive_class"])
    np.testing.assert_array_equal(got.file_index, np.arange(len(labels)))
    m = got.metrics
    assert m["count"] == want["count"] == len(labels)
    assert m["confusion"] == want["confusion"]
    assert m["detection"]["confusion"] == want["detection"]["confusion"]
    assert m["loss"] is None and want["loss"] is None
    for key in ("accuracy", "macro_f1"):
        assert m[key] == pytest.approx(want[key], abs=1e-12)
    for name in names:
        for key in ("precision", "recall", "f1", "support"):
            assert m["per_class"][name][key] == pytest.approx(want["per_class"][name][key], abs=1e-12)
    for key in ("accuracy", "precision", "recall", "f1"):
        assert m["detection"][key] == pytest.approx(want["detection"][key], abs=1e-12)
    assert got.predicted_names == [names[p] for p in got.predicted]
    assert got.class_probs.shape == (len(labels), len(names)) and got.class_probs.dtype == np.float32


def test_per_example_rows_equal_the_dense_form_with_one_segment_per_long():
    rng = np.random.default_rng(5)
    probs, nvl = rng.random((6, 3, 1, 4)).astype(np.float32), rng.integers(1, 4, size=6)
    dets = rng.random((6, 3, 1)).astype(np.float32)
    f, l = np.meshgrid(np.arange(6), np.arange(3), indexing="ij")
    valid = l < nvl[:, None]
    order = rng.permutation(int(valid.sum()))
    rows_p, rows_d, rows_f = probs[:, :, 0][valid][order], dets[:, :, 0][valid][order], f[valid][order]
    for vote in ("mean", "majority"):
        dense = melforge.evaluate_files(probs, dets, nvl, vote=vote)
        got = melforge.evaluate_files(rows_p, rows_d, vote=vote, file_index=rows_f + 10)
        np.testing.assert_array_equal(got.file_index, np.arange(6) + 10)
        np.testing.assert_array_equal(got.predicted, dense.predicted)
        np.testing.assert_array_equal(got.detected, dense.detected)
        np.testing.assert_allclose(got.class_probs, dense.class_probs, atol=1e-6)
        grouped = melforge.evaluate_files(rows_p, rows_d, vote=vote, file_index=rows_f, long_index=l[valid][order])
        np.testing.assert_array_equal(grouped.predicted, dense.predicted)


def naive_mean_vote(probs, nvl):
    out = np.zeros((probs.shape[0], probs.shape[3]))
    for f in range(probs.shape[0]):
        for l in range(nvl[f]):
            out[f] += probs[f, l].astype(np.float64).mean(0) / nvl[f]
    return out


def random_dense(seed=1):
    rng = np.random.default_rng(seed)
    return rng.random((7, 3, 2, 4)).astype(np.float32), rng.integers(1, 4, size=7)


def test_dense_vote_on_random_inputs():
    probs, nvl = random_dense()
    r = melforge.evaluate_files(probs, num_valid_long=nvl, labels=np.arange(7) % 4)
    np.testing.assert_allclose(r.class_probs, naive_mean_vote(probs, nvl), atol=1e-6)
    np.testing.assert_array_equal(r.predicted, naive_mean_vote(probs, nvl).argmax(1))
    assert r.detected is None and r.detection_score is None and r.metrics["detection"] is None
    assert r.metrics["count"] == 7
    assert sum(map(sum, r.metrics["confusion"])) == 7


@pytest.mark.needs_torch
def test_torch_tensors_in_and_out():
    import torch

    probs, nvl = random_dense()
    r = melforge.evaluate_files(probs, num_valid_long=nvl)
    t = melforge.evaluate_files(torch.from_numpy(probs), num_valid_long=torch.from_numpy(nvl))
    assert isinstance(t.class_probs, torch.Tensor)
    np.testing.assert_array_equal(t.predicted.numpy(), r.predicted)


def test_bad_inputs_are_refused():
    p = np.full((2, 2, 1, 3), 1 / 3, dtype=np.float32)
    with pytest.raises(melforge.InvalidArgument, match="num_valid_long"):
        melforge.evaluate_files(p, num_valid_long=[1, 3])
    with pytest.raises(melforge.InvalidArgument, match="vote"):
        melforge.evaluate_files(p, vote="median")
    with pytest.raises(melforge.InvalidArgument, match="threshold"):
        melforge.evaluate_files(p, threshold=1.5)
    with pytest.raises(melforge.InvalidArgument, match="F, L, S, C"):
        melforge.evaluate_files(p[0])
    with pytest.raises(melforge.InvalidArgument, match="file_index"):
        melforge.evaluate_files(p.reshape(-1, 3), file_index=[0, 0, 1], vote="majority")
    with pytest.raises(melforge.InvalidArgument, match="different labels"):
        melforge.evaluate_files(p.reshape(-1, 3), file_index=[0, 0, 1, 1], labels=[0, 1, 2, 2])
    with pytest.raises(melforge.InvalidArgument, match="class names"):
        melforge.evaluate_files(p, class_names=["a", "b"])


@pytest.mark.parametrize("bad, kind", [(np.nan, "NaN"), (np.inf, r"\+inf"), (-np.inf, "-inf")])
@pytest.mark.parametrize("form", ["dense", "rows", "det"])
def test_non_finite_probabilities_are_refused_naming_the_row(bad, kind, form):
    p = np.full((3, 2, 1, 3), 1 / 3, dtype=np.float32)
    d = np.full((3, 2, 1), 0.5, dtype=np.float32)
    if form == "dense":
        p[2, 1, 0, 1] = bad
        with pytest.raises(melforge.InvalidArgument,
                           match=rf"class_probs holds {kind} at row 2 \(index \[2, 1, 0, 1\]"):
            melforge.evaluate_files(p, d)
    elif form == "rows":
        rows = p.reshape(-1, 3).copy()
        rows[4, 0] = bad
        with pytest.raises(melforge.InvalidArgument, match=rf"class_probs holds {kind} at row 4 \(index \[4, 0\]"):
            melforge.evaluate_files(rows, file_index=[0, 0, 1, 1, 2, 2])
    else:
        d[1, 0, 0] = bad
        with pytest.raises(melforge.InvalidArgument, match=rf"det_probs holds {kind} at row 1 "):
            melforge.evaluate_files(p, d)
