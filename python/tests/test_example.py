"""docs/PYTHON.md's example (a user's own nn.Module trained on a melforge dataset with melforge.Loader and evaluated
per file with melforge.evaluate_files) runs as written, from the page itself, and learns: the file accuracy it prints
on a corpus of three tones must reach the bar."""
import re
import subprocess
import sys

import numpy as np
import pytest

import melforge
from melforge_run import write_wav

pytestmark = pytest.mark.needs_torch

RATE = 16000
TONES = {"low": 300.0, "mid": 1100.0, "high": 3200.0}
FILES_PER_CLASS = 20
BAR = 0.8


def example_code(repo):
    """The block between the example markers of docs/PYTHON.md."""
    text = (repo / "docs" / "PYTHON.md").read_text()
    m = re.search(r"<!-- example:begin -->\s*```python\n(.*?)```\s*<!-- example:end -->", text, re.S)
    assert m, "docs/PYTHON.md has no example block between <!-- example:begin --> and <!-- example:end -->"
    return m.group(1)


def write_tone(path, freq, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(2 * RATE) / RATE
    x = 0.3 * np.sin(2 * np.pi * freq * (1 + 0.02 * rng.standard_normal()) * t) + 0.05 * rng.standard_normal(t.size)
    write_wav(path, np.clip(x, -1, 1), RATE)


def test_docs_example_trains_a_users_model(repo, tmp_path):
    corpus = tmp_path / "corpus"
    for c, (name, freq) in enumerate(TONES.items()):
        (corpus / name).mkdir(parents=True)
        for i in range(FILES_PER_CLASS):
            write_tone(corpus / name / f"{i:02d}.wav", freq, 1000 * c + i)
    report = melforge.build(tmp_path / "dataset", input=corpus, n_mels=32, seed=1, quiet=True)
    assert report["files"]["written"] == len(TONES) * FILES_PER_CLASS, report["files"]
    script = tmp_path / "example.py"
    script.write_text(example_code(repo))
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "dataset"), "8"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"file accuracy ([0-9.]+) over (\d+) files", r.stdout)
    assert m, r.stdout
    accuracy, files = float(m.group(1)), int(m.group(2))
    assert files == len(melforge.Dataset(tmp_path / "dataset", "test").paths)
    assert accuracy >= BAR, r.stdout
