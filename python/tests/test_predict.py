"""melforge.predict against `melforge-train predict --format json` on the same files (a folder walked by the C++
FolderWalk, an unreadable file, a missing one), from a checkpoint and from an export."""
import json
import subprocess

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
    """The rows of `melforge-train predict --format json`, which exits 3 when some inputs could not be scored."""
    cmd = [trained["train_bin"], "predict", "--checkpoint", checkpoint, "--format", "json", "--vote", vote,
           "--device", "cpu", *extra, *trained["inputs"]]
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    rows = json.loads(out.stdout)
    assert out.returncode == (3 if any("error" in r for r in rows) else 0), out.stderr
    return rows


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
        assert g["num_windows"] == w["num_windows"]
        if w["detection_score"] is None:
            assert g["detection_score"] is None, g["path"]
        else:
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


@pytest.mark.parametrize("hop", ["0", "0.1"])
def test_windows_equal_melforge_train_predict(trained, tmp_path, hop):
    out = tmp_path / "w.json"
    want = binary_predict(trained, trained["checkpoint"], "mean", ["--hop", hop, "--windows", out])
    got = melforge.predict(trained["checkpoint"], trained["inputs"], hop=float(hop), windows=True)
    check_same([{k: v for k, v in r.items() if k != "windows"} for r in got], want)
    want_windows = json.loads(out.read_text())
    got_windows = [w for r in got if "windows" in r for w in r["windows"]]
    assert len(got_windows) == len(want_windows) == sum(r.get("num_windows", 0) for r in want)
    for g, w in zip(got_windows, want_windows):
        assert set(g) == set(w)
        assert (g["path"], g["window"], g["predicted"], g["detected"]) == (w["path"], w["window"], w["predicted"],
                                                                           w["detected"])
        assert g["start"] == pytest.approx(w["start"], abs=1e-9) and g["end"] == pytest.approx(w["end"], abs=1e-9)
        if w["detection_score"] is None:
            assert g["detection_score"] is None, g["path"]
        else:
            assert g["detection_score"] == pytest.approx(w["detection_score"], abs=1e-5)
        for name, p in w["probabilities"].items():
            assert g["probabilities"][name] == pytest.approx(p, abs=1e-5)


def test_strict_stops_at_the_first_failure(trained):
    with pytest.raises(melforge.AudioError, match="--strict.*broken.wav"):
        melforge.predict(trained["checkpoint"], trained["inputs"], strict=True)
    with pytest.raises(melforge.InvalidArgument, match="--hop"):
        melforge.predict(trained["checkpoint"], trained["inputs"], hop=100.0)


def test_without_detection_head_equals_melforge_train_predict(trained, tmp_path):
    """A model trained with --positive-class none has no detection head: both predicts give null detection fields."""
    out = tmp_path / "run-none"
    run([trained["train_bin"], "train", "--data", trained["data"], "--out", out, "--epochs", 1, "--positive-class",
         "none", "--device", "cpu", "--threads", 2, "--hidden", 16, "--batch-size", 16])
    checkpoint = out / "checkpoints" / "best.pt"
    want = binary_predict(trained, checkpoint, "mean")
    scored = [r for r in want if "error" not in r]
    assert scored
    for r in scored:
        assert r["positive_class"] is None and r["detection_score"] is None and r["detected"] is None, r
    check_same(melforge.predict(checkpoint, trained["inputs"], threads=2), want)


class _Payload:
    """A pickled object whose loading would run code: it would create the file `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_holding_code_is_refused_and_never_run(trained, tmp_path, monkeypatch):
    import torch

    # torch >= 2.6 loads weights-only by default, and this variable turns that default off: the refusal must not
    # depend on the default.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.pt"
    torch.save({"format": "melforge-checkpoint", "model": _Payload(marker)}, evil)
    with pytest.raises(melforge.FormatError, match="weights-only") as e:
        melforge.predict(evil, [trained["corpus"] / "c0" / "f03.wav"])
    assert "weights_only=False" not in str(e.value)
    assert not marker.exists()


def test_crafted_checkpoints_are_refused_naming_the_field(trained, tmp_path, repo):
    """tools/make_hostile_checkpoints.py: each crafted file (huge model_config, stride 0, negative stride, a view
    past its storage, a record shorter than declared, wrong dtype, NaN, a pickle payload) is a FormatError naming
    the file and the field, raised from the metadata before anything of the declared size is allocated."""
    import sys

    out = tmp_path / "hostile"
    subprocess.run([sys.executable, str(repo / "tools" / "make_hostile_checkpoints.py"), str(trained["checkpoint"]),
                    str(out)], check=True, capture_output=True)
    cases = json.loads((out / "cases.json").read_text())
    assert len(cases["cases"]) >= 9
    for case in cases["cases"]:
        with pytest.raises(melforge.FormatError) as e:
            melforge.predict(case["file"], [trained["corpus"] / "c0" / "f03.wav"])
        assert case["field"] in str(e.value), (case["name"], str(e.value))
        assert case["file"] in str(e.value), case["name"]
    assert not (out / "payload-ran").exists()
