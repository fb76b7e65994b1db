"""melforge.build: a build from Python with the builder's own options; the same files as the melforge-build binary."""
import _thread
import json
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

import melforge
from melforge_run import build_binary, write_wav

# Small and fast: 8 kHz, a default tile of 0.25 s, 32 mel bands.
FLAGS = dict(sample_rate=8000, n_fft=256, hop_length=64, n_mels=32, short_seconds=0.25,
             device="cpu", threads=2, max_ram="70M", quiet=True)


def write_corpus(root, classes=2, per_class=5, seconds=1.5, rate=8000):
    """`classes` folders of `per_class` tones each (a different pitch per file); returns the file count."""
    t = np.arange(int(seconds * rate)) / rate
    for c in range(classes):
        for i in range(per_class):
            freq = 200.0 + 150.0 * c + 37.0 * i
            write_wav(root / f"class{c}" / f"tone{i}.wav", 0.5 * np.sin(2 * np.pi * freq * t), rate)
    return classes * per_class


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "in"
    write_corpus(root)
    return root


def flag_args(flags):
    """The command line of `flags` as melforge.build spells them for the binary (switches bare)."""
    args = []
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


@pytest.mark.needs_h5py
def test_build_returns_the_report_and_writes_the_dataset(tmp_path, corpus):
    import h5py

    out = tmp_path / "out"
    report = melforge.build(out, input=corpus, **FLAGS)
    assert report == json.loads((out / "build_report.json").read_text())
    assert report["files"]["written"] == 10
    assert report["files"]["skipped"] == 0
    assert sum(report["files"]["per_split"].values()) == 10
    assert report["config"]["n_fft"] == 256
    assert report["config"]["n_mels"] == 32
    frames = 1 + 12000 // 64  # centred frames of a whole 1.5 s clip at hop 64
    total = 0
    for split in ("train", "val", "test"):
        with h5py.File(out / f"{split}.h5", "r") as f:
            assert f.attrs["split"] == split and f.attrs["schema_version"] == 3
            assert int(f.attrs["n_fft"]) == 256
            clips = report["files"]["per_split"][split]
            assert f["frame_offset"].shape == (clips + 1,)
            assert (np.diff(f["frame_offset"][...]) == frames).all()
            assert f["frames"].shape == (clips * frames, 32)
            if clips:
                assert np.isfinite(f["frames"][...].astype(np.float32)).all()
            total += clips
    assert total == 10


def test_invalid_option_raises_before_any_work(tmp_path, corpus):
    out = tmp_path / "out"
    with pytest.raises(melforge.InvalidArgument, match="n_fft"):
        melforge.build(out, input=corpus, **{**FLAGS, "n_fft": 1})
    with pytest.raises(melforge.InvalidArgument, match="--compression-level"):
        melforge.build(out, input=corpus, compression_level=12, **FLAGS)
    with pytest.raises(melforge.InvalidArgument, match="--split"):
        melforge.build(out, input=corpus, split=(0.5, 0.6, 0.1), **FLAGS)
    with pytest.raises(melforge.InvalidArgument, match="--overwrite is a switch"):
        melforge.build(out, input=corpus, overwrite="yes", **FLAGS)
    with pytest.raises(melforge.InvalidArgument, match="exactly one of --input DIR or --manifest CSV"):
        melforge.build(out, **FLAGS)
    assert issubclass(melforge.InvalidArgument, ValueError)
    assert not out.exists()


def test_unknown_keyword_names_the_nearest_flag(tmp_path, corpus):
    out = tmp_path / "out"
    with pytest.raises(melforge.InvalidArgument) as e:
        melforge.build(out, input=corpus, nfft=512, **FLAGS)
    assert str(e.value) == "unrecognised option '--nfft'; did you mean --n-fft? (keyword n_fft=)"
    with pytest.raises(melforge.InvalidArgument, match=r"^unrecognised option '--xyzzy'$"):
        melforge.build(out, input=corpus, xyzzy=1, **FLAGS)
    # A keyword is a whole name: the prefix guessing of the command line (--n-ff for --n-fft) does not apply.
    with pytest.raises(melforge.InvalidArgument, match="did you mean --n-fft"):
        melforge.build(out, input=corpus, n_ff=512, **{k: v for k, v in FLAGS.items() if k != "n_fft"})
    assert not out.exists()


def test_torchaudio_names_and_value_spellings(tmp_path, corpus):
    ini = tmp_path / "build.ini"
    ini.write_text("win_length = 200\n")
    report = melforge.build(tmp_path / "out", input=corpus, norm="Slaney", mel_scale="HTK", window_fn="Hann",
                            pad_mode="Reflect", split=(0.6, 0.4), config=ini, **FLAGS)
    config = report["config"]
    assert config["mel_norm"] == "slaney"
    assert config["mel_scale"] == "htk"
    assert config["window"] == "hann"
    assert config["win_length"] == 200
    assert report["files"]["per_split"]["test"] == 0


def test_strict_raises_strict_error_naming_the_file(tmp_path, corpus):
    (corpus / "class0" / "broken.wav").write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk")
    out = tmp_path / "out"
    with pytest.raises(melforge.StrictError, match="broken.wav"):
        melforge.build(out, input=corpus, strict=True, **FLAGS)
    assert issubclass(melforge.StrictError, melforge.Error)
    assert not (out / "build_report.json").exists()
    report = melforge.build(out, input=corpus, strict=False, **FLAGS)
    assert report["files"]["skipped"] == 1


@pytest.mark.needs_h5py
def test_same_files_as_the_binary(tmp_path, corpus, repo):
    import h5py

    binary = build_binary()
    flags = {**FLAGS, "n_mels": 24, "norm": "slaney", "split": "0.5,0.25,0.25", "seed": 7, "dtype": "float32"}
    py_report = melforge.build(tmp_path / "py", input=corpus, **flags)
    binary_flags = {**flags, "mel_norm": flags["norm"]}
    del binary_flags["norm"]
    run = subprocess.run([str(binary), "--input", str(corpus), "--output", str(tmp_path / "bin"),
                          *flag_args(binary_flags)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    bin_report = json.loads((tmp_path / "bin" / "build_report.json").read_text())
    assert {k: v for k, v in py_report["config"].items() if k != "output"} == \
        {k: v for k, v in bin_report["config"].items() if k != "output"}
    assert py_report["files"] == bin_report["files"]
    for split in ("train", "val", "test"):
        with h5py.File(tmp_path / "py" / f"{split}.h5", "r") as a, h5py.File(tmp_path / "bin" / f"{split}.h5",
                                                                             "r") as b:
            assert sorted(a.keys()) == sorted(b.keys())
            for name in a.keys():
                np.testing.assert_array_equal(a[name][...], b[name][...], err_msg=f"{split}.h5 {name}")
            assert sorted(a.attrs.keys()) == sorted(b.attrs.keys())
            for key in a.attrs.keys():
                assert np.array_equal(np.asarray(a.attrs[key]), np.asarray(b.attrs[key])), key


def test_keyboard_interrupt_stops_the_build_and_a_later_build_runs(tmp_path):
    root = tmp_path / "big"
    write_corpus(root, classes=2, per_class=100, seconds=4.0)
    slow = {**FLAGS, "threads": 1, "compression_level": 9, "n_fft": 1024, "hop_length": 16, "n_mels": 64}
    t0 = time.monotonic()
    report = melforge.build(tmp_path / "whole", input=root, **slow)
    whole = time.monotonic() - t0
    assert report["files"]["written"] == 200
    out = tmp_path / "out"
    cancel = threading.Event()

    def interrupt_at_a_third():
        if not cancel.wait(whole / 3):
            _thread.interrupt_main()

    # A shell that starts a job in the background (CI may) leaves SIGINT ignored, and then interrupt_main does
    # nothing: give SIGINT Python's own handler for the test, as an interactive session has it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Thread(target=interrupt_at_a_third, daemon=True)
    t0 = time.monotonic()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            melforge.build(out, input=root, **slow)
    finally:
        cancel.set()
        timer.join()
        signal.signal(signal.SIGINT, previous)
    stopped_after = time.monotonic() - t0
    assert stopped_after < whole * 0.9, f"stopped after {stopped_after:.2f} s, a whole build takes {whole:.2f} s"
    assert not out.exists()  # the build created it, so it removes it with its staging folder and lock file
    write_corpus(tmp_path / "small")
    report = melforge.build(tmp_path / "small_out", input=tmp_path / "small", **FLAGS)
    assert report["files"]["written"] == 10


def test_help_prints_the_options(capsys):
    assert melforge.build(None, help=True) is None
    text = capsys.readouterr().out
    assert "--n-fft" in text and "--mel-norm" in text


@pytest.mark.needs_h5py
def test_columns_classes_and_folds_through_the_same_options(tmp_path):
    """An ESC-50-like metadata CSV read by its column names, a class order file, folds and groups: the build's
    datasets and report follow them."""
    import h5py

    audio = tmp_path / "audio"
    rows = ["filename,fold,target,category,esc10,src_file,take"]
    t = np.arange(4000) / 8000
    for i in range(12):
        category = ("dog", "rain", "rooster")[i % 3]
        name = f"{i % 4 + 1}-{100 + i // 2}-A-{i % 3}.wav"
        write_wav(audio / name, 0.5 * np.sin(2 * np.pi * (200 + 40 * i) * t), 8000)
        rows.append(f"{name},{i % 4 + 1},{i % 3},{category},True,{100 + i // 2},A")
    (tmp_path / "esc50.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "classes.txt").write_text("rooster\ndog\nrain\nsiren\n")
    out = tmp_path / "out"
    report = melforge.build(out, manifest=tmp_path / "esc50.csv", audio_root=audio, classes=tmp_path / "classes.txt",
                            columns="path=filename,label=category,fold=fold,group=src_file", **FLAGS)
    assert report["classes"] == ["rooster", "dog", "rain", "siren"]
    assert report["protocol"]["folds"] == 4
    assert report["protocol"]["class_order"] == "classes file"
    assert report["protocol"]["group_by"] == "column src_file"
    assert report["files"]["per_split"] == {"train": 6, "val": 3, "test": 3}
    assert any("siren" in w for w in report["warnings"])
    for split, folds in (("train", {1, 2}), ("val", {3}), ("test", {4})):
        with h5py.File(out / f"{split}.h5", "r") as f:
            assert int(f.attrs["folds"]) == 4
            assert set(f["fold"][...].tolist()) == folds
            assert [n.decode() for n in f["class_names"][...]] == ["rooster", "dog", "rain", "siren"]
            assert all(g.decode().isdigit() for g in f["group"][...])
    with pytest.raises(melforge.InvalidArgument, match="--columns"):
        melforge.build(tmp_path / "bad", manifest=tmp_path / "esc50.csv", audio_root=audio,
                       columns="path=filename,label=class", **FLAGS)


@pytest.mark.needs_h5py
def test_speed_speakers_and_test_trials_by_keyword(tmp_path, corpus):
    import h5py

    out = tmp_path / "sp"
    report = melforge.build(out, input=corpus, speed_speakers=(0.9, 1.1), **FLAGS)
    assert report["speed_speakers"]["factors"] == [0.9, 1.1]
    assert report["speed_speakers"]["classes_added"] == 4
    with h5py.File(out / "train.h5", "r") as f:
        names = [n.decode() if isinstance(n, bytes) else n for n in f["class_names"][...]]
        assert names == ["class0", "class1", "class0_sp0.9", "class1_sp0.9", "class0_sp1.1", "class1_sp1.1"]
        assert f.attrs["speed_speakers"] == "0.9,1.1"
        factors = f["speed_speaker"][...]
        assert sorted(set(factors.tolist())) == pytest.approx([0.9, 1.0, 1.1])
        assert (factors != 1).sum() == report["speed_speakers"]["utterances_added"]
    with h5py.File(out / "val.h5", "r") as f:
        assert (f["speed_speaker"][...] == 1).all()

    trials = tmp_path / "veri.txt"
    trials.write_text("1 class1/tone0.wav class1/tone1.wav\n")
    report = melforge.build(tmp_path / "tt", input=corpus, split_by="class", split=(0.5, 0.5, 0.0),
                            test_trials=trials, **FLAGS)
    assert report["files"]["per_split"]["test"] == 5
    assert report["protocol"]["test_trials"]["speakers"] == 1
    assert (tmp_path / "tt" / "trials.txt").read_text() == trials.read_text()
