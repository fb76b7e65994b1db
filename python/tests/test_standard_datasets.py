"""README's "Standard datasets" commands run as written on stand-ins laid out exactly like each public dataset
(tools/make_standin_datasets.py): from the dataset's root to its protocol's metric in at most three commands, with no
conversion script. The only changes to the README's lines: `build/` is the C++ build's folder, each dataset root is
the stand-in's, and `--epochs 30` becomes `--epochs EPOCHS` (below) so that the whole file costs seconds, not hours.
Each dataset is one test; the metric each prints is checked to be a number in range, and for the tone stand-ins
(learnable within a few epochs) above chance where the stand-in is large enough for that to be reliable."""
import json
import os
import re
import subprocess
import sys

import pytest

from melforge_run import binary, build_binary

EPOCHS = 4
ROOTS = {"esc50": "ESC-50-master/", "urbansound8k": "UrbanSound8K/", "speechcommands": "speech_commands_v0.02/",
         "fsd50k": "FSD50K/", "voxceleb1": "VoxCeleb1/", "librispeech": "LibriSpeech/"}


def readme_blocks(repo):
    """{layout name: [command lines]} of the sh block under README's "## Standard datasets": each group of lines
    after a `# Dataset (...)` comment, keyed by the --layout value its build line names."""
    text = (repo / "README.md").read_text()
    section = text.split("## Standard datasets", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    groups = {}
    for chunk in re.split(r"\n\s*\n", block.strip()):
        lines = [l.strip() for l in chunk.splitlines() if l.strip() and not l.strip().startswith("#")]
        name = re.search(r"--layout (\w+)", lines[0]).group(1)
        groups[name] = lines
    return groups


def run_dataset(repo, tmp_path, name):
    lines = readme_blocks(repo)[name]
    assert 1 <= len(lines) <= 3, lines
    subprocess.run([sys.executable, str(repo / "tools" / "make_standin_datasets.py"), name, str(tmp_path / "standin")],
                   check=True, capture_output=True, text=True, timeout=300)
    root = tmp_path / "standin" / name
    assert root.is_dir(), sorted(p.name for p in (tmp_path / "standin").iterdir())
    tools = {"build/builder/melforge-build": str(build_binary()),
             "build/trainer/melforge-train": str(binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train"))}
    outputs = []
    for line in lines:
        for prefix, path in tools.items():
            line = line.replace(prefix, path)
        line = line.replace("--input " + ROOTS[name], f"--input {root}/").replace("--epochs 30", f"--epochs {EPOCHS}")
        r = subprocess.run(["bash", "-c", "set -euo pipefail; " + line], cwd=tmp_path, capture_output=True, text=True,
                           timeout=900, env={**os.environ, "MELFORGE_LOG_LEVEL": "warn"})
        assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"
        outputs.append(r.stdout + r.stderr)
    return lines, outputs


def read_json(path):
    with open(path) as f:
        return json.load(f)


CV_LINE = re.compile(r"cv: mean file accuracy (\d+\.\d+) ± (\d+\.\d+) over (\d+) folds")


def check_cv(tmp_path, output, data, out, folds, groups):
    m = CV_LINE.search(output)
    assert m, output
    mean, std, n = float(m.group(1)), float(m.group(2)), int(m.group(3))
    assert n == folds and 0 <= mean <= 1 and 0 <= std <= 1, m.group(0)
    protocol = read_json(tmp_path / data / "build_report.json")["protocol"]
    assert protocol["folds"] == folds and protocol["groups"] == groups, protocol
    report = read_json(tmp_path / out / "cv_report.json")
    assert json.dumps(report).count('"fold"') >= folds, report
    return mean


def test_esc50_five_fold_cv_from_the_dataset_root(repo, tmp_path):
    lines, outputs = run_dataset(repo, tmp_path, "esc50")
    assert len(lines) == 2
    mean = check_cv(tmp_path, outputs[-1], "esc50", "esc50-cv", 5, 20)
    assert mean > 0.25, outputs[-1]  # 4 tone classes: chance is 0.25


def test_urbansound8k_ten_fold_cv_from_the_dataset_root(repo, tmp_path):
    lines, outputs = run_dataset(repo, tmp_path, "urbansound8k")
    assert len(lines) == 2
    mean = check_cv(tmp_path, outputs[-1], "us8k", "us8k-cv", 10, 30)
    assert mean > 1 / 3, outputs[-1]  # 3 tone classes


def test_speechcommands_lists_and_noise_bank_from_the_dataset_root(repo, tmp_path):
    lines, outputs = run_dataset(repo, tmp_path, "speechcommands")
    report = read_json(tmp_path / "sc" / "build_report.json")
    assert report["protocol"]["noise_bank"], report["protocol"]
    noise = [s for s in report["skipped"] if s["path"].startswith("_background_noise_/") and s["path"].endswith(".wav")]
    assert len(noise) == 2 and all("noise bank" in s["reason"] for s in noise), report["skipped"]
    assert "_background_noise_" not in report["classes"], report["classes"]
    assert re.search(r"accuracy \d\.\d+", outputs[-1]), outputs[-1]


def test_fsd50k_vocabulary_order_and_map_from_the_dataset_root(repo, tmp_path):
    lines, outputs = run_dataset(repo, tmp_path, "fsd50k")
    vocabulary = (tmp_path / "standin" / "fsd50k" / "FSD50K.ground_truth" / "vocabulary.csv").read_text()
    names = [row.split(",")[1] for row in vocabulary.splitlines() if row.strip()]
    assert read_json(tmp_path / "fsd50k" / "build_report.json")["classes"] == names
    assert re.search(r"mAP \d\.\d+", outputs[1]), outputs[1]
    assert "accuracy 0.0000" not in outputs[1], outputs[1]
    assert re.search(r"mAP", outputs[-1]), outputs[-1]


def test_voxceleb1_official_trial_list_from_the_dataset_root(repo, tmp_path):
    lines, outputs = run_dataset(repo, tmp_path, "voxceleb1")
    root = tmp_path / "standin" / "voxceleb1"
    assert (tmp_path / "vox1" / "trials.txt").read_bytes() == (root / "veri_test2.txt").read_bytes()
    assert not [w for w in read_json(tmp_path / "vox1" / "build_report.json")["warnings"] if "no training file" in w]
    assert re.search(r"test: EER \d+\.\d+ %", outputs[1]), outputs[1]
    assert re.search(r"EER", outputs[-1]), outputs[-1]


def test_librispeech_subsets_as_splits_from_the_dataset_root(repo, tmp_path):
    lines, outputs = run_dataset(repo, tmp_path, "librispeech")
    report = read_json(tmp_path / "libri" / "build_report.json")
    assert report["protocol"]["group_by"], report["protocol"]
    assert re.search(r"test: EER \d+\.\d+ %", outputs[1]), outputs[1]
    assert re.search(r"EER", outputs[-1]), outputs[-1]
