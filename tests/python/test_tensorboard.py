"""melforge-train's TensorBoard event files read back with TensorBoard's own reader (EventAccumulator): every scalar
equals its line of metrics.jsonl (tags, steps, values), the validation confusion matrix is a PNG that decodes to the
expected size and colours, --no-tensorboard writes nothing, and a run stopped by SIGTERM (with a crash's leftovers
appended) and resumed shows exactly the steps and values of an uninterrupted run. Trains tiny CPU runs with the C++
build's binaries (python/tests/melforge_run.py finds them)."""
import json
import math
import pathlib
import signal
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python" / "tests"))
from melforge_run import binary, build_binary, run, write_corpus  # noqa: E402

STEP_KEYS = ("loss", "lr", "samples_per_s", "data_wait_fraction")
TRAIN = ["--positive-class", "c1", "--device", "cpu", "--threads", 2, "--hidden", 16, "--batch-size", 16]


def train_bin():
    return binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tb")
    write_corpus(tmp / "corpus")
    run([build_binary(), "--input", tmp / "corpus", "--output", tmp / "data", "--sample-rate", 8000, "--n-fft", 256,
         "--hop-length", 64, "--n-mels", 32, "--short-seconds", 0.25, "--split",
         "0.5,0.25,0.25", "--seed", 3, "--device", "cpu", "--quiet"])
    return tmp / "data"


@pytest.fixture(scope="module")
def trained(dataset):
    out = dataset.parent / "run"
    run([train_bin(), "train", "--data", dataset, "--out", out, "--epochs", 3, "--log-every", 2, *TRAIN])
    return out


def metrics(run_dir):
    lines = [json.loads(x) for x in open(run_dir / "metrics.jsonl", encoding="utf-8") if x.strip()]
    return [x for x in lines if x["type"] == "epoch"], [x for x in lines if x["type"] == "step"]


def accumulator(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "images": 0})
    acc.Reload()
    return acc


def event_files(run_dir):
    return sorted(p for p in run_dir.iterdir() if p.name.startswith("events.out.tfevents."))


def as_float32(v):
    return np.float32(math.nan if v is None else v)


def same(a, b):
    return (np.isnan(a) and np.isnan(b)) or a == b


def check_scalars(acc, tag, lines, key):
    events = acc.Scalars(tag)
    assert [e.step for e in events] == [x["step"] for x in lines], tag
    for e, x in zip(events, lines):
        assert same(np.float32(e.value), as_float32(x[key])), (tag, e.step, e.value, x[key])


def decode_png(data):
    """(width, height, rgb uint8 [height, width, 3]) of an 8-bit RGB PNG with filter 0 rows, CRCs checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat, kinds = 8, b"", []
    while at < len(data):
        (n,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + n]
        (crc,) = struct.unpack(">I", data[at + 8 + n:at + 12 + n])
        assert crc == zlib.crc32(kind + body), kind
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert (depth, colour, interlace) == (8, 2, 0)
        elif kind == b"IDAT":
            idat += body
        kinds.append(kind)
        at += 12 + n
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND"
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, 1 + 3 * width)
    assert (raw[:, 0] == 0).all()
    return width, height, raw[:, 1:].reshape(height, width, 3)


def test_scalars_equal_the_lines_of_metrics_jsonl(trained):
    epochs, steps = metrics(trained)
    assert len(epochs) == 3
    assert [x["step"] for x in steps] == list(range(2, epochs[-1]["step"] + 1, 2))
    epoch_keys = [k for k, v in epochs[0].items() if k not in ("type", "step") and (v is None or
                                                                                    isinstance(v, (int, float)))]
    assert {"train_loss", "val_loss", "val_macro_f1", "samples_per_s", "data_wait_fraction", "lr"} <= set(epoch_keys)
    acc = accumulator(trained)
    assert set(acc.Tags()["scalars"]) == {"step/" + k for k in STEP_KEYS} | {"epoch/" + k for k in epoch_keys}
    for k in STEP_KEYS:
        check_scalars(acc, "step/" + k, steps, k)
    for k in epoch_keys:
        check_scalars(acc, "epoch/" + k, epochs, k)
    assert len(event_files(trained)) == 1


def test_the_confusion_image_decodes_to_the_validation_counts(trained):
    epochs, _ = metrics(trained)
    images = accumulator(trained).Images("epoch/val_confusion")
    assert [i.step for i in images] == [x["step"] for x in epochs]
    cell = 48  # heat_map_cell(3): 400 / 3 clamped to [4, 48]
    for i in images:
        width, height, rgb = decode_png(i.encoded_image_string)
        assert (width, height) == (i.width, i.height) == (3 * (cell + 1) + 1,) * 2
    report = json.load(open(trained / "report.json"))
    best = images[report["best_epoch"] - 1]
    _, _, rgb = decode_png(best.encoded_image_string)
    counts = np.array(report["val"]["tiles"]["confusion"], dtype=float)
    for t in range(3):
        for p in range(3):
            v = counts[t, p] / counts[t].sum()
            expected = [int(a + (b - a) * v + 0.5) for a, b in ((255, 8), (255, 48), (255, 107))]
            y, x = t * (cell + 1) + 1 + cell // 2, p * (cell + 1) + 1 + cell // 2
            assert rgb[y, x].tolist() == expected, (t, p)
    assert rgb[0, 0].tolist() == [200, 200, 200]


def test_no_tensorboard_and_log_every_0_write_epoch_lines_only(dataset, tmp_path):
    out = tmp_path / "run"
    run([train_bin(), "train", "--data", dataset, "--out", out, "--epochs", 1, "--no-tensorboard", "--log-every", 0,
         *TRAIN])
    epochs, steps = metrics(out)
    assert len(epochs) == 1 and steps == []
    assert event_files(out) == []


def append_crash_leftovers(run_dir, step):
    """What a run killed after its checkpoint leaves: a step line and a scalar event of a later step."""
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"type": "step", "epoch": 99, "step": step, "loss": 1e6, "lr": 1.0}) + "\n")
    ev = event_pb2.Event(wall_time=time.time(), step=step,
                         summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="step/loss",
                                                                                         simple_value=1e6)]))
    with open(event_files(run_dir)[-1], "ab") as f:
        RecordWriter(f).write(ev.SerializeToString())


def test_a_resumed_run_shows_the_steps_of_an_uninterrupted_one(dataset, tmp_path):
    epochs_total = 8
    args = ["--data", dataset, "--epochs", epochs_total, "--log-every", 2, *TRAIN]
    straight = tmp_path / "straight"
    run([train_bin(), "train", "--out", straight, *args])

    pieces = tmp_path / "pieces"
    proc = subprocess.Popen([str(a) for a in [train_bin(), "train", "--out", pieces, *args]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        m = pieces / "metrics.jsonl"
        if m.exists() and '"type":"epoch"' in m.read_text(encoding="utf-8"):
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.005)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, output
    done, _ = metrics(pieces)
    assert 1 <= len(done) < epochs_total
    append_crash_leftovers(pieces, done[-1]["step"] + 1)

    run([train_bin(), "train", "--resume", pieces, "--threads", 2, "--log-every", 2])
    assert len(event_files(pieces)) == 2
    (ea, sa), (eb, sb) = metrics(straight), metrics(pieces)
    assert [(x["epoch"], x["step"], x["loss"], x["lr"]) for x in sb] == \
        [(x["epoch"], x["step"], x["loss"], x["lr"]) for x in sa]
    assert [x["train_loss"] for x in eb] == [x["train_loss"] for x in ea]
    a, b = accumulator(straight), accumulator(pieces)
    for tag in ("step/loss", "step/lr", "epoch/train_loss", "epoch/val_loss"):
        assert [(e.step, e.value) for e in b.Scalars(tag)] == [(e.step, e.value) for e in a.Scalars(tag)], tag
    assert [i.step for i in b.Images("epoch/val_confusion")] == [i.step for i in a.Images("epoch/val_confusion")]


def test_plot_run_plots_the_step_lines(trained):
    """tools/plot_run.py on a real run folder, with a Python that has matplotlib (Debian's /usr/bin/python3 has
    python3-matplotlib; tests/python/test_plot_run.py covers the rest)."""
    python = "/usr/bin/python3"
    if subprocess.run([python, "-c", "import matplotlib"], capture_output=True).returncode != 0:
        pytest.fail(f"{python} has no matplotlib (apt-get install python3-matplotlib)")
    for p in trained.glob("*.png"):
        p.unlink()
    r = subprocess.run([python, str(REPO / "tools" / "plot_run.py"), str(trained)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    written = r.stdout.split()
    assert str(trained / "steps.png") in written and str(trained / "loss.png") in written
    for p in written:
        assert pathlib.Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
