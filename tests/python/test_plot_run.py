"""tools/plot_run.py: --help without matplotlib, the message naming what to install when matplotlib is missing, and
the plots of a metrics.jsonl with epoch lines (with and without "type"), step lines and an unknown line type, of a
--task multilabel run (map.png with the mAP curves) and of a verification run (eer.png)."""
import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PLOT = str(REPO / "tools" / "plot_run.py")
MPL_PYTHON = "/usr/bin/python3"  # Debian's, with python3-matplotlib


def epoch(e, typed=True):
    line = {"epoch": e, "step": 5 * e, "lr": 1e-3 / e, "train_loss": 2.0 / e, "val_loss": 1.5 / e,
            "train_accuracy": 0.5 + 0.1 * e, "val_accuracy": 0.6, "val_macro_f1": 0.55}
    return {"type": "epoch", **line} if typed else line


def write_run(run, lines, confusion=True):
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    if confusion:
        (run / "confusion_val.csv").write_text("true\\pred,a,b\na,3,1\nb,0,4\n", encoding="utf-8")


@pytest.fixture
def no_matplotlib(tmp_path):
    """An environment whose `import matplotlib` fails, for any Python."""
    blocked = tmp_path / "blocked" / "matplotlib"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('matplotlib blocked by the test')\n")
    return {"PYTHONPATH": str(blocked.parent), "PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def mpl_python():
    if subprocess.run([MPL_PYTHON, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        pytest.fail(f"{MPL_PYTHON} has no matplotlib (apt-get install python3-matplotlib)")
    return MPL_PYTHON


def test_help_needs_no_matplotlib(no_matplotlib):
    r = subprocess.run([sys.executable, PLOT, "--help"], capture_output=True, text=True, env=no_matplotlib)
    assert r.returncode == 0, r.stderr
    assert "usage: plot_run.py" in r.stdout and "RUN_DIR" in r.stdout and "matplotlib" in r.stdout


def test_missing_matplotlib_names_what_to_install(tmp_path, no_matplotlib):
    write_run(tmp_path / "run", [epoch(1)])
    r = subprocess.run([sys.executable, PLOT, str(tmp_path / "run")], capture_output=True, text=True,
                       env=no_matplotlib)
    assert r.returncode == 1
    assert f"{sys.executable} -m pip install matplotlib" in r.stderr
    assert list((tmp_path / "run").glob("*.png")) == []


def test_epoch_and_step_lines_are_plotted_and_unknown_types_skipped(tmp_path, mpl_python):
    run = tmp_path / "run"
    steps = [{"type": "step", "epoch": 1 + (s - 1) // 5, "step": s, "loss": 2.0 / s, "lr": 1e-3, "samples_per_s": 9.0,
              "data_wait_fraction": 0.0} for s in range(2, 11, 2)]
    write_run(run, [steps[0], steps[1], epoch(1), {"type": "future", "x": 1}, *steps[2:], epoch(2)])
    r = subprocess.run([mpl_python, PLOT, str(run)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(run / n) for n in ("loss.png", "accuracy.png", "steps.png", "confusion_val.png")]
    for n in r.stdout.split():
        assert pathlib.Path(n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_old_runs_without_type_plot_without_steps(tmp_path, mpl_python):
    run = tmp_path / "run"
    write_run(run, [epoch(1, typed=False), epoch(2, typed=False)], confusion=False)
    r = subprocess.run([mpl_python, PLOT, str(run)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(run / "loss.png"), str(run / "accuracy.png")]


def multilabel_epoch(e):
    """An epoch line as --task multilabel writes it (run_task.cpp task_fields: no accuracy fields)."""
    return {"type": "epoch", "epoch": e, "step": 5 * e, "lr": 1e-3, "train_loss": 0.7 / e, "val_loss": 0.6 / e,
            "val_map": 0.5 + 0.1 * e, "val_map_micro": 0.55, "val_auc": 0.8, "val_f1_micro": 0.4, "val_f1_macro": 0.35,
            "val_tuned_threshold": 0.42, "samples_per_s": 100.0}


def test_multilabel_runs_plot_map_curves(tmp_path, mpl_python):
    run = tmp_path / "run"
    write_run(run, [multilabel_epoch(1), multilabel_epoch(2)], confusion=False)
    r = subprocess.run([mpl_python, PLOT, str(run)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(run / "loss.png"), str(run / "map.png")]
    assert (run / "map.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (run / "accuracy.png").exists()


def test_verification_runs_plot_eer(tmp_path, mpl_python):
    run = tmp_path / "run"
    lines = [{"type": "epoch", "epoch": e, "lr": 1e-3, "train_loss": 3.0 / e, "train_accuracy": 0.2, "val_eer": 20.0 / e,
              "val_min_dcf_0.01": 0.9, "margin": 0.2} for e in (1, 2)]
    write_run(run, lines, confusion=False)
    r = subprocess.run([mpl_python, PLOT, str(run)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(run / "loss.png"), str(run / "eer.png")]


@pytest.mark.parametrize("lines, message", [
    ([], "holds no epoch"),
    ([{"type": "step", "step": 2, "loss": 1.0}], "holds no epoch"),
    ([{"type": "epoch", "epoch": 1}], "epoch line misses train_loss"),
    ([epoch(1), {"type": "step", "step": 2}], "step line misses loss"),
    ([{"type": "epoch", "epoch": 1, "lr": 1e-3, "train_loss": 1.0, "val_map": 0.5}], "epoch line misses val_loss"),
    ([epoch(1), multilabel_epoch(2)], "mixes the epoch lines of tasks multiclass, multilabel"),
])
def test_bad_metrics_are_refused_with_the_line(tmp_path, mpl_python, lines, message):
    write_run(tmp_path / "run", lines, confusion=False)
    r = subprocess.run([mpl_python, PLOT, str(tmp_path / "run")], capture_output=True, text=True)
    assert r.returncode == 1
    assert message in r.stderr
