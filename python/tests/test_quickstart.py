"""The README's quick start runs as written on a user's own corpus: the four commands between the quickstart markers,
with `build/` replaced by the C++ build's folder, in a folder holding a corpus of three tones (`corpus/<class>/`) and
a `recordings/` folder. Each command must succeed, eval must report the test split, and predict must give a row for
every recording, naming the right tone for most of them."""
import csv
import os
import re
import subprocess

import numpy as np

from melforge_run import binary, build_binary, write_wav

RATE = 16000
TONES = {"low": 300.0, "mid": 1100.0, "high": 3200.0}
FILES_PER_CLASS = 16


def quickstart_commands(repo):
    """The shell lines between <!-- quickstart:begin --> and <!-- quickstart:end --> of README.md."""
    text = (repo / "README.md").read_text()
    m = re.search(r"<!-- quickstart:begin -->\s*```sh\n(.*?)```\s*<!-- quickstart:end -->", text, re.S)
    assert m, "README.md has no quick start between <!-- quickstart:begin --> and <!-- quickstart:end -->"
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in m.group(1).splitlines()]
    return [line for line in lines if line]


def write_tone(path, freq, seed, seconds=2.0):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.3 * np.sin(2 * np.pi * freq * (1 + 0.02 * rng.standard_normal()) * t) + 0.05 * rng.standard_normal(t.size)
    write_wav(path, np.clip(x, -1, 1), RATE)


def test_readme_quickstart_runs_as_written(repo, tmp_path):
    commands = quickstart_commands(repo)
    assert len(commands) == 4, commands
    tools = {"build/builder/melforge-build": str(build_binary()),
             "build/trainer/melforge-train": str(binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train"))}
    for c, (name, freq) in enumerate(TONES.items()):
        for i in range(FILES_PER_CLASS):
            write_tone(tmp_path / "corpus" / name / f"{i:02d}.wav", freq, 1000 * c + i)
        write_tone(tmp_path / "recordings" / f"{name}.wav", freq, 9000 + c, seconds=3.0)
    outputs = []
    for line in commands:
        for prefix, path in tools.items():
            line = line.replace(prefix, path)
        r = subprocess.run(["bash", "-c", "set -euo pipefail; " + line], cwd=tmp_path, capture_output=True, text=True,
                           timeout=900, env={**os.environ, "MELFORGE_LOG_LEVEL": "warn"})
        assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"
        outputs.append(r.stdout)
    assert (tmp_path / "dataset" / "train.h5").is_file() and (tmp_path / "run" / "checkpoints" / "best.pt").is_file()
    assert re.search(r"accuracy", outputs[2]), outputs[2]
    with open(tmp_path / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted(os.path.basename(r["path"]) for r in rows) == sorted(f"{n}.wav" for n in TONES), rows
    right = sum(r["predicted"] == os.path.basename(r["path"])[:-4] for r in rows)
    assert right >= 2, rows
