#!/usr/bin/env python3
"""Fails the test run when a test that this machine is expected to run was skipped.

A skip is expected only for a Catch2 test case tagged [cuda] on a machine without a CUDA device (nvidia-smi missing,
failing, or listing no GPU). Every other skip (a missing tool, a missing torch venv, no permission to mount a tmpfs,
and any [cuda] test on a machine with a GPU) fails, with the test's name and the reason it printed. The README's
test command installs every tool the tests use, so on a machine set up by it nothing else may skip.

Usage: check_skips.py --build BUILD --ctest-junit FILE [--pytest-junit FILE]
  BUILD: the CMake build folder the CTest run used (its test executables are asked for their [cuda] cases).
  MELFORGE_ALLOWED_SKIPS (environment): a regular expression; skipped tests whose name it matches (re.search) are
  allowed too, for a developer's machine that cannot do everything (e.g. a container without CAP_SYS_ADMIN). CI
  never sets it.
Exit status: 0 when every skip was expected, 1 otherwise, 2 on bad input.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

SKIP_MARKER = "MELFORGE-SKIPPED:"


def gpu_present():
    """(True, description) when nvidia-smi lists at least one GPU, else (False, why not)."""
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"nvidia-smi cannot run ({e.__class__.__name__})"
    gpus = [line for line in r.stdout.splitlines() if line.startswith("GPU ")]
    if r.returncode != 0 or not gpus:
        return False, f"nvidia-smi -L lists no GPU (exit {r.returncode})"
    return True, f"{len(gpus)} GPU(s): " + "; ".join(gpus)


def cuda_test_names(build):
    """Names of the Catch2 test cases tagged [cuda] in every test executable CTest knows in BUILD."""
    shown = subprocess.run(["ctest", "--test-dir", build, "--show-only=json-v1"], capture_output=True, text=True,
                           check=True)
    executables = sorted({t["command"][0] for t in json.loads(shown.stdout)["tests"] if t.get("command")})
    names = set()
    for exe in executables:
        r = subprocess.run([exe, "[cuda]", "--list-test-names-only"], capture_output=True, text=True)
        names.update(line.strip() for line in r.stdout.splitlines() if line.strip())
    return names


def skip_reason(output):
    """The reason a test printed after the skip marker, or a note when it printed none."""
    for line in (output or "").splitlines():
        if SKIP_MARKER in line:
            return line.split(SKIP_MARKER, 1)[1].strip()
    if "no CUDA device: [cuda] tests skipped" in (output or ""):
        return "no CUDA device (its test executable exited with 77)"
    return "(no reason printed)"


def ctest_skips(path):
    """[(name, reason)] of the CTest JUnit file's test cases that did not run."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.get("status") == "notrun":
            name = case.get("name")
            out.append((name, skip_reason(case.findtext("system-out")).removeprefix(name + ": ")))
    return out


def pytest_skips(path):
    """[(name, reason)] of the pytest JUnit file's skipped test cases."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is not None:
            out.append((f"{case.get('classname')}::{case.get('name')}", skipped.get("message") or "(no reason)"))
    return out


def unexpected(skips, cuda_names, gpu, allowed_re):
    """The skips that are not expected: everything on a GPU machine, else those not tagged [cuda]; minus any whose
    name matches allowed_re."""
    bad = []
    for name, reason in skips:
        if allowed_re and re.search(allowed_re, name):
            continue
        if not gpu and name in cuda_names:
            continue
        bad.append((name, reason))
    return bad


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", required=True)
    p.add_argument("--ctest-junit", required=True)
    p.add_argument("--pytest-junit")
    a = p.parse_args(argv)
    for f in [a.ctest_junit] + ([a.pytest_junit] if a.pytest_junit else []):
        if not os.path.isfile(f):
            print(f"check_skips: {f}: no such JUnit file", file=sys.stderr)
            return 2
    gpu, gpu_desc = gpu_present()
    cuda_names = cuda_test_names(a.build)
    skips = ctest_skips(a.ctest_junit) + (pytest_skips(a.pytest_junit) if a.pytest_junit else [])
    allowed_re = os.environ.get("MELFORGE_ALLOWED_SKIPS") or None
    bad = unexpected(skips, cuda_names, gpu, allowed_re)
    expected = len(skips) - len(bad)
    print(f"check_skips: {len(skips)} skipped ({expected} expected: "
          + (f"none may skip, {gpu_desc}" if gpu else f"[cuda] tests, {gpu_desc}")
          + (f"; MELFORGE_ALLOWED_SKIPS={allowed_re}" if allowed_re else "") + ")")
    if bad:
        print(f"check_skips: {len(bad)} test(s) skipped that this machine is expected to run:", file=sys.stderr)
        for name, reason in bad:
            print(f"  {name}: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
