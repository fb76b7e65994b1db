"""Crafted dataset folders (tools/make_hostile_h5.py, issue 29) refused by melforge.Dataset and by
`melforge-train inspect` with an error naming the file and the field: quickly, without a large allocation, and
without echoing the file's text (a 64 MiB attribute of escape sequences) into the message."""
import importlib.util
import json
import subprocess
import sys
import time

import pytest

from melforge_run import REPO, binary

pytestmark = pytest.mark.needs_h5py

_spec = importlib.util.spec_from_file_location("make_hostile_h5", REPO / "tools" / "make_hostile_h5.py")
hostile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hostile)

# Opens every case with melforge.Dataset in one fresh process, in the order of hostile.CASES (huge_attribute last),
# timing each, and prints the results with the process's peak RSS after each case as JSON: a case that allocated
# what a file declares shows in the peaks.
_PROBE = r"""
import json, resource, sys, time
import melforge
results = {}
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for name, folder in json.loads(sys.argv[1]).items():
    start = time.monotonic()
    try:
        melforge.Dataset(folder, "train")
        results[name] = ["accepted", "", time.monotonic() - start]
    except Exception as e:
        results[name] = [type(e).__name__, str(e), time.monotonic() - start]
    results[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
print(json.dumps({"results": results}))
"""


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """{case: (file, field, error type, message, seconds)} and the probe's RSS growth in KiB."""
    out = tmp_path_factory.mktemp("hostile")
    expected = {name: hostile.make(out, name) for name in hostile.CASES}
    folders = {name: str(out / name) for name in hostile.CASES}
    run = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(folders)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    cases = {name: (out / name / expected[name][0], expected[name][1], *report["results"][name][:3])
             for name in hostile.CASES}
    grown = {name: report["results"][name][3] for name in hostile.CASES}
    return cases, grown, out


@pytest.mark.parametrize("case", sorted(hostile.CASES))
def test_dataset_refuses_crafted_file(refused, case):
    cases, _, _ = refused
    file, field, kind, message, seconds = cases[case]
    assert kind == "FormatError", f"{case}: {kind}: {message[:500]}"
    assert str(file) in message, message[:500]
    assert field in message, message[:500]
    assert len(message) < 2000 and "\x1b" not in message, message[:500]
    limit = 1.5 if case == "mixed_build_ids" else 1.0  # a build_id mix is read again twice (0.3 s) before refusal
    assert seconds < limit, f"{case} took {seconds:.2f} s"


def test_refusals_allocate_little(refused):
    """Nothing the files declare (GiB of strings, targets, chunks) is allocated. The 64 MiB attribute is really
    stored, and HDF5 reads a variable-length string whole before its length can be checked: its cost is bounded by
    the file's size (a few copies of it), never by a declared size."""
    _, grown, _ = refused
    names = list(hostile.CASES)
    assert names[-1] == "huge_attribute"
    before = grown[names[-2]]
    assert before < 64 * 1024, f"refusing the crafted files grew the peak RSS by {before >> 10} MiB"
    assert grown["huge_attribute"] < 8 * 64 * 1024, f"the 64 MiB attribute took {grown['huge_attribute'] >> 10} MiB"


@pytest.mark.parametrize("case", ["external_fifo", "vds_outside", "mixed_build_ids"])
def test_inspect_refuses_with_exit_1(refused, case):
    cases, _, out = refused
    file, field, _, _, _ = cases[case]
    train = binary("MELFORGE_TRAIN_BIN", "trainer/melforge-train")
    start = time.monotonic()
    run = subprocess.run([str(train), "inspect", "--data", str(out / case)], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1, run.stderr[-2000:]
    assert str(file) in run.stderr and field in run.stderr, run.stderr[-2000:]
    assert time.monotonic() - start < 30
