"""melforge.predict against `melforge-train predict --format json` on the same files (a folder walked by the C++
FolderWalk, an unreadable file, a missing one), from a checkpoint and from an export."""
import json

import pytest

import melforge
from melforge_run import make_run, run

pytestmark = pytest.mark.needs_torch


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    r = make_run(tmp_path_factory.mktemp("predict"))
    bad = r["corpus"] / "c2" / "broken.wav"
    bad.write_text("this is not audio, just text in a .wav file\n")
    (r["corpus"] / "c0" / ".hidden.wav").write_bytes((r["corpus"] / "c0" / "f03.wav").read_bytes())
    (r["corpus"] / "c0" / "notes.txt").write_text("not an audio extension")
    r["inputs"] = [r["corpus"] / "c0", r["corpus"] / "c2", r["corpus"] / "c1" / "f05.wav",
                   r["corpus"] / "missing.wav"]
    return r


def binary_predict(trained, checkpoint, vote, extra=()):
    out = run([trained["train_bin"], "predict", "--checkpoint", checkpoint, "--format", "json", "--vote", vote,
               "--device", "cpu", *extra, *trained["inputs"]])
    return json.loads(out.stdout)


def check_same(got, want):
    assert [r["path"] for r in got] == [r["path"] for r in want]
    for g, w in zip(got, want):
        assert set(g) == set(w), g["path"]
        if "error" in w:
            assert g["error"] == w["error"]
            continue
        assert g["predicted"] == w["predicted"], g["path"]
        assert g["positive_class"] == w["positive_class"]
        assert g["detected"] == w["detected"], g["path"]
        assert g["num_valid_long"] == w["num_valid_long"]
        assert g["detection_score"] == pytest.approx(w["detection_score"], abs=1e-5)
        assert list(g["probabilities"]) == list(w["probabilities"])
        for name, p in w["probabilities"].items():
            assert g["probabilities"][name] == pytest.approx(p, abs=1e-5), (g["path"], name)


@pytest.mark.parametrize("vote", ["mean", "majority"])
def test_checkpoint_equals_melforge_train_predict(trained, vote):
    want = binary_predict(trained, trained["checkpoint"], vote)
    assert sum("error" in r for r in want) == 2  # broken.wav and missing.wav
    assert not any(".hidden" in r["path"] or "notes.txt" in r["path"] for r in want)
    got = melforge.predict(trained["checkpoint"], trained["inputs"], vote=vote, threads=2)
    check_same(got, want)


def test_export_equals_melforge_train_predict(trained, tmp_path):
    weights = tmp_path / "weights.pt"
    run([trained["train_bin"], "export", "--checkpoint", trained["checkpoint"], "--out", weights])
    want = binary_predict(trained, trained["checkpoint"], "mean", ["--threshold", "0.3"])
    check_same(melforge.predict(weights, trained["inputs"], threshold=0.3), want)
    check_same(melforge.predict(str(weights) + ".json", trained["inputs"], threshold=0.3), want)


def test_include_hidden_reads_dot_files(trained):
    got = melforge.predict(trained["checkpoint"], [trained["corpus"] / "c0"], include_hidden=True)
    assert any(r["path"].endswith(".hidden.wav") and "predicted" in r for r in got)


def test_bad_parameters_fail_before_any_work(trained, tmp_path):
    with pytest.raises(melforge.InvalidArgument, match="--vote"):
        melforge.predict(tmp_path / "nothing.pt", [tmp_path], vote="median")
    with pytest.raises(melforge.InvalidArgument, match="--threshold"):
        melforge.predict(tmp_path / "nothing.pt", [tmp_path], threshold=1.0)
    with pytest.raises(melforge.IoError, match="nothing.pt"):
        melforge.predict(tmp_path / "nothing.pt", [tmp_path])
    with pytest.raises(melforge.InvalidArgument, match="no audio files"):
        melforge.predict(trained["checkpoint"], [tmp_path])
    (tmp_path / "x.wav").write_text("not audio")
    with pytest.raises(melforge.AudioError, match="no input file could be scored"):
        melforge.predict(trained["checkpoint"], [tmp_path / "x.wav"])
