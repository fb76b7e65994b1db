"""tools/gpu_check.py's pieces that decide a GPU run's verdict, checked on the CPU: the value-by-value comparison
of a CUDA build with a CPU build (its tolerance must pass rounding and fail real differences) and the roofline's
byte counts (docs/PERFORMANCE.md's GPU section)."""
import os
import sys

import h5py
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import gpu_check  # noqa: E402


def write_split(path, mel, labels=(0, 1)):
    with h5py.File(path, "w") as f:
        f.create_dataset("mel", data=mel.astype(np.float16))
        f.create_dataset("label", data=np.array(labels, dtype=np.int32))
        f.create_dataset("num_valid_long", data=np.ones(len(labels), dtype=np.int32))
        f.create_dataset("path", data=[b"a/x.wav", b"b/y.wav"][: len(labels)])
        f.create_dataset("class_names", data=[b"a", b"b"])
        f.attrs["log"] = "db"
        f.attrs["power"] = 2.0


@pytest.fixture
def mel():
    """[F=2, L=1, S=2, M=8, T=5] dB values: each frame has a 0 dB band and bands down to -90 dB."""
    rng = np.random.default_rng(3)
    m = -rng.uniform(0, 90, size=(2, 1, 2, 8, 5))
    m[:, :, :, 2, :] = 0.0
    return m.astype(np.float16).astype(np.float32)


def compare(tmp_path, a, b, labels_b=(0, 1)):
    write_split(tmp_path / "cpu.h5", a)
    write_split(tmp_path / "cuda.h5", b, labels_b)
    return gpu_check.compare_split(str(tmp_path / "cpu.h5"), str(tmp_path / "cuda.h5"))


def test_identical_datasets_agree(tmp_path, mel):
    r = compare(tmp_path, mel, mel)
    assert r["outside_tolerance"] == 0 and r["identical"] == 1.0 and not r["metadata_differs"]
    assert r["elements"] == mel.size


def test_one_float16_step_everywhere_is_within_tolerance(tmp_path, mel):
    b = np.nextafter(mel.astype(np.float16), np.float16(np.inf)).astype(np.float32)
    r = compare(tmp_path, mel, b)
    assert r["outside_tolerance"] == 0
    assert r["identical"] < 0.01


def test_a_loud_band_off_by_half_a_db_fails(tmp_path, mel):
    b = mel.copy()
    b[1, 0, 1, 2, 3] += 0.5
    r = compare(tmp_path, mel, b)
    assert r["outside_tolerance"] == 1
    assert r["worst"]["index"] == [1, 0, 1, 2, 3]


def test_a_band_80_db_below_its_frame_may_differ_by_rounding_of_the_frame_energy(tmp_path, mel):
    a = mel.copy()
    a[0, 0, 0, 5, 1] = -80.0
    b = a.copy()
    b[0, 0, 0, 5, 1] = -79.5  # power off by 1.2e-9 of a frame whose peak power is 1: FFT rounding of that frame
    assert compare(tmp_path, a, b)["outside_tolerance"] == 0
    b[0, 0, 0, 5, 1] = -40.0  # 1e-4 of the peak: no rounding does that
    assert compare(tmp_path, a, b)["outside_tolerance"] == 1


def test_other_labels_are_reported(tmp_path, mel):
    assert compare(tmp_path, mel, mel, labels_b=(1, 1))["metadata_differs"]


def test_roofline_bytes_match_performance_md():
    b = gpu_check.roofline_bytes(4000, 32, 512, 64)
    assert b["h2d"] == 16000 and b["d2h"] == 4096
    assert 280_000 <= b["device"] <= 284_000  # PERFORMANCE.md: about 282,000 bytes per segment
