"""README's "Speaker verification" recipe (four commands: build with the trial list's speakers as test, Kaldi fbank and
speed-perturbed speakers; train with the verification defaults; eval with a score file; embed) run as written on the
VoxCeleb1 stand-in (tools/make_standin_datasets.py), whose `wav/` folder and `veri_test2.txt` are laid out as
VoxCeleb1's. The only changes to the README's lines: `build/` is the C++ build's folder, `voxceleb/` the stand-in's
root, `--epochs 30` becomes `--epochs 1` (the stand-in is not learnable; the commands and their outputs are what is
checked), and the build gets `--split 0.6,0.4,0`: the stand-in has 6 speakers outside the list, which the default
ratios would split 5/1, and a validation split of one speaker gives no non-target trial."""
import json
import os
import re
import subprocess
import sys

import pytest

from melforge_run import binary, build_binary

pytestmark = pytest.mark.needs_h5py


def readme_recipe(repo):
    """The command lines of the first sh block after README's "**Speaker verification**", continuation lines joined."""
    text = (repo / "README.md").read_text()
    section = text.split("**Speaker verification**", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    return [l.strip() for l in block.replace("\\\n", " ").splitlines() if l.strip() and not l.startswith("#")]


def test_readme_speaker_verification_recipe_runs_on_the_voxceleb1_standin(repo, tmp_path):
    import h5py

    lines = readme_recipe(repo)
    assert len(lines) == 4, lines
    subprocess.run([sys.executable, str(repo / "tools" / "make_standin_datasets.py"), "voxceleb1",
                    str(tmp_path / "standin")], check=True, capture_output=True, text=True, timeout=300)
    root = tmp_path / "standin" / "voxceleb1"
    tools = {"build/builder/melforge-build": str(build_binary()),
             "build/trainer/melforge-train": str(binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train"))}
    outputs = []
    for line in lines:
        for prefix, path in tools.items():
            line = line.replace(prefix, path)
        line = line.replace("voxceleb/", f"{root}/").replace("--epochs 30", "--epochs 1")
        line = line.replace("--split-by class", "--split-by class --split 0.6,0.4,0")
        r = subprocess.run(["bash", "-c", "set -euo pipefail; " + line], cwd=tmp_path, capture_output=True, text=True,
                           timeout=900, env={**os.environ, "MELFORGE_LOG_LEVEL": "warn"})
        assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"
        outputs.append(r.stdout + r.stderr)

    report = json.loads((tmp_path / "vox" / "build_report.json").read_text())
    listed = {p.split("/")[0] for row in (root / "veri_test2.txt").read_text().split("\n") if row.strip()
              for p in row.split()[1:]}
    with h5py.File(tmp_path / "vox" / "test.h5") as f:
        names = [n.decode() if isinstance(n, bytes) else n for n in f["class_names"][()]]
        test_speakers = {names[i] for i in f["label"][()]}
    assert test_speakers == listed, (test_speakers, listed)
    assert report["speed_speakers"]["classes_added"] > 0, report["speed_speakers"]
    assert re.search(r"test: EER \d+\.\d+ %, minDCF\(0\.01\)", outputs[1]), outputs[1]
    assert "accuracy 0.0000" not in outputs[1], outputs[1]

    trials = [row.split() for row in (root / "veri_test2.txt").read_text().splitlines() if row.strip()]
    scores = [row.split() for row in (tmp_path / "vrun" / "scores.txt").read_text().splitlines()]
    assert [s[1:] for s in scores] == trials
    assert all(-1.0001 <= float(s[0]) <= 1.0001 for s in scores)
    with h5py.File(tmp_path / "emb.h5") as f:
        assert f["embedding"].shape[0] == len(f["path"])

    # The checkpoint scores another dataset of other clips (the voxceleb1 layout's build of the same root, whose
    # splits and clip table differ), on that dataset's own copy of the list.
    fbank = lines[0][lines[0].index("--features"):].split(" --speed-speakers")[0]
    subprocess.run(f"{build_binary()} --layout voxceleb1 --input {root}/ --output vox1 {fbank}", shell=True,
                   cwd=tmp_path, check=True, capture_output=True, text=True, timeout=300)
    r = subprocess.run([str(binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train")), "eval", "--checkpoint",
                        "vrun/checkpoints/best.pt", "--data", "vox1", "--trials", "vox1/trials.txt"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"EER \d+\.\d+ %", r.stdout), r.stdout
