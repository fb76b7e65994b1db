"""tools/check_skips.py: a skip is allowed only for a [cuda] test without a GPU; anything else fails the test run."""
import os
import stat
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))
import check_skips  # noqa: E402

CTEST_JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="melforge" tests="4" failures="0" disabled="0" skipped="2">
  <testcase name="a plain test" classname="a plain test" time="0.1" status="run"><system-out>ok</system-out></testcase>
  <testcase name="engine on CUDA" classname="engine on CUDA" time="0.1" status="notrun">
    <skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/>
    <system-out>MELFORGE-SKIPPED: engine on CUDA: no CUDA device</system-out></testcase>
  <testcase name="kernel image" classname="kernel image" time="0.1" status="notrun">
    <skipped message="SKIP_RETURN_CODE=77"/><system-out>no CUDA device: [cuda] tests skipped</system-out></testcase>
  <testcase name="h5py reads it" classname="h5py reads it" time="0.1" status="{status}">
    <system-out>MELFORGE-SKIPPED: h5py reads it: /usr/bin/python3 with h5py is not available</system-out></testcase>
</testsuite>
"""

PYTEST_JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="2" skipped="1">
<testcase classname="tests.python.test_x" name="test_ok" time="0.1"/>
<testcase classname="tests.python.test_x" name="test_torch" time="0.0">
<skipped type="pytest.skip" message="torch is not installed">skip</skipped></testcase>
</testsuite></testsuites>
"""

CUDA_NAMES = {"engine on CUDA", "kernel image"}


@pytest.fixture
def junit(tmp_path):
    def make(status):
        p = tmp_path / f"ctest_{status}.xml"
        p.write_text(CTEST_JUNIT.format(status=status))
        return str(p)
    return make


def fake_nvidia_smi(tmp_path, monkeypatch, output, code=0):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho '{output}'\nexit {code}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_ctest_skips_carry_each_reason(junit):
    skips = dict(check_skips.ctest_skips(junit("notrun")))
    assert skips == {"engine on CUDA": "no CUDA device",
                     "kernel image": "no CUDA device (its test executable exited with 77)",
                     "h5py reads it": "/usr/bin/python3 with h5py is not available"}
    assert set(dict(check_skips.ctest_skips(junit("run")))) == CUDA_NAMES


def test_pytest_skips(tmp_path):
    p = tmp_path / "py.xml"
    p.write_text(PYTEST_JUNIT)
    assert check_skips.pytest_skips(str(p)) == [("tests.python.test_x::test_torch", "torch is not installed")]


def test_only_cuda_tests_may_skip_without_a_gpu(junit):
    skips = check_skips.ctest_skips(junit("notrun"))
    bad = check_skips.unexpected(skips, CUDA_NAMES, gpu=False, allowed_re=None)
    assert [name for name, _ in bad] == ["h5py reads it"]
    assert check_skips.unexpected(skips, CUDA_NAMES, gpu=False, allowed_re="^h5py") == []


def test_nothing_may_skip_with_a_gpu(junit):
    skips = check_skips.ctest_skips(junit("run"))
    bad = check_skips.unexpected(skips, CUDA_NAMES, gpu=True, allowed_re=None)
    assert sorted(name for name, _ in bad) == sorted(CUDA_NAMES)


def test_gpu_present_reads_nvidia_smi(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "GPU 0: NVIDIA H100 (UUID: GPU-1)")
    assert check_skips.gpu_present() == (True, "1 GPU(s): GPU 0: NVIDIA H100 (UUID: GPU-1)")
    fake_nvidia_smi(tmp_path, monkeypatch, "NVIDIA-SMI has failed", code=9)
    present, why = check_skips.gpu_present()
    assert not present and "exit 9" in why


def test_main_exit_status(junit, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(check_skips, "cuda_test_names", lambda build: CUDA_NAMES)
    fake_nvidia_smi(tmp_path, monkeypatch, "No devices were found", code=6)
    monkeypatch.delenv("MELFORGE_ALLOWED_SKIPS", raising=False)
    assert check_skips.main(["--build", "b", "--ctest-junit", junit("run")]) == 0
    assert check_skips.main(["--build", "b", "--ctest-junit", junit("notrun")]) == 1
    assert "h5py reads it: /usr/bin/python3 with h5py is not available" in capsys.readouterr().err
    monkeypatch.setenv("MELFORGE_ALLOWED_SKIPS", "h5py")
    assert check_skips.main(["--build", "b", "--ctest-junit", junit("notrun")]) == 0
    assert check_skips.main(["--build", "b", "--ctest-junit", str(tmp_path / "missing.xml")]) == 2
