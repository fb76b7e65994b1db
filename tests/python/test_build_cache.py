"""The compiler cache serves a clone in any folder (issue 27): after ccache's base_dir rewriting (tools/ccache_env.sh
sets it to the clone), no compile command and no generated unity batch may still hold the clone's absolute path.
One that did (CMake's own unity files, a test's path given as -D) would make every clone a cache miss: CI's clean
clone would compile everything again. Configures the builder (no trainer, no build) into a temporary folder: ~10 s."""
import json
import os
import shlex
import shutil
import subprocess

import pytest

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
# ccache rewrites these options' path arguments (and the source file) relative to the working directory.
PATH_OPTIONS = ("-I", "-isystem", "-iquote", "-idirafter", "-include", "-o", "-MF", "-MT", "-MQ", "--include-path")
# The one file that carries the test executables' absolute paths on purpose (cmake/MelforgeTestPaths.cmake).
ALLOWED = ("melforge_test_paths.cpp",)


def leaks(command, source, root):
    """The arguments of one compile command that still name `root` after ccache's base_dir rewriting: those that are
    neither the source file nor the path of an option whose paths ccache rewrites."""
    args = shlex.split(command)
    out = []
    path_follows = False
    for a in args:
        if path_follows:
            path_follows = False
            continue
        if a in PATH_OPTIONS:
            path_follows = True
            continue
        if root not in a or a == source:
            continue
        if any(a.startswith(o + root) for o in PATH_OPTIONS):
            continue
        out.append(a)
    return out


def test_leaks_finds_a_path_in_a_definition():
    src = f"{ROOT}/common/a.cpp"
    cmd = f'/usr/bin/c++ -I{ROOT}/common -DDIR=\\"{ROOT}/tests\\" -o x.o -c {src}'
    assert leaks(cmd, src, ROOT) == [f'-DDIR="{ROOT}/tests"']
    assert leaks(f"/usr/bin/c++ -I{ROOT}/common -isystem {ROOT}/x -o x.o -c {src}", src, ROOT) == []


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_no_absolute_clone_path_survives_base_dir(tmp_path):
    build = tmp_path / "b"
    subprocess.run(["cmake", "-S", ROOT, "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DMELFORGE_TRAINER=OFF",
                    "-DMELFORGE_CUDA=OFF", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"],
                   check=True, stdout=subprocess.DEVNULL)
    commands = json.loads((build / "compile_commands.json").read_text())
    assert len(commands) > 5
    bad = {}
    for c in commands:
        if c["file"].endswith(ALLOWED):
            continue
        found = leaks(c["command"], c["file"], ROOT)
        if found:
            bad[c["file"]] = found
    assert not bad, f"compile arguments that hold the clone's path (a cache miss in every other clone): {bad}"
    batches = list(build.rglob("melforge_unity/*/*.cpp"))
    assert batches, "no unity batch was generated"
    absolute = [str(b) for b in batches if '#include "/' in b.read_text()]
    assert not absolute, f"unity batches that #include by absolute path: {absolute}"
    test_units = [c for c in commands if "test_melforge" in c["file"]]
    assert test_units, "test_melforge's batches are not in the compile commands"
