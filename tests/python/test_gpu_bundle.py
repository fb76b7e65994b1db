"""tools/gpu_bundle.sh's size cap, checked without building: a device call carries the working tree and the bundle,
64 MiB together, so the bundle's cap is 64 MiB less the bytes of the files git tracks (or would: untracked and not
ignored); a bundle over it, or a tree that leaves no room, fails naming both sizes."""
import os
import re
import subprocess

import pytest

HERE = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(HERE, "tools", "gpu_bundle.sh")
MIB = 1048576


def bundle_sh(*args, carry=None):
    env = dict(os.environ)
    env.pop("MELFORGE_CARRY_MIB", None)
    if carry is not None:
        env["MELFORGE_CARRY_MIB"] = str(carry)
    return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=env)


def tree_bytes():
    names = subprocess.run(["git", "-C", HERE, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    return sum(os.lstat(os.path.join(HERE, n)).st_size for n in names if n and os.path.lexists(os.path.join(HERE, n)))


def cap():
    r = bundle_sh("--size-cap")
    assert r.returncode == 0, r.stderr
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", r.stdout)}


def test_the_cap_is_the_carry_limit_less_the_tree():
    c = cap()
    assert c["tree_bytes"] == tree_bytes()
    assert c["carry_bytes"] == 64 * MIB
    assert c["cap_bytes"] == 64 * MIB - c["tree_bytes"]


def test_a_bundle_over_the_cap_fails_naming_both_sizes(tmp_path):
    c = cap()
    big = tmp_path / "bundle"
    big.mkdir()
    with open(big / "lib.so", "wb") as f:
        f.truncate(c["cap_bytes"])  # sparse: the cap exactly, no disk used
    r = bundle_sh("--check-size", str(big))
    assert r.returncode == 0, r.stderr
    with open(big / "one_more", "wb") as f:
        f.write(b"x")
    r = bundle_sh("--check-size", str(big))
    assert r.returncode == 1
    assert f"the bundle is {(c['cap_bytes'] + 1) / MIB:.2f} MiB ({c['cap_bytes'] + 1} bytes)" in r.stderr
    assert f"the working tree the device carries with it {c['tree_bytes'] / MIB:.2f} MiB ({c['tree_bytes']} bytes)" \
        in r.stderr
    assert "64 MiB" in r.stderr


def test_a_tree_that_leaves_no_room_fails_before_anything_else():
    t = tree_bytes()
    small = t // MIB  # MiB: at most the tree
    r = bundle_sh("--size-cap", carry=small)
    assert r.returncode == 1
    assert f"is {t / MIB:.2f} MiB ({t} bytes), at or over the {small} MiB" in r.stderr


@pytest.mark.parametrize("args, carry", [(["--size-cap", "x"], None), (["--check-size"], None), (["--size-cap"], "0"),
                                         (["--size-cap"], "64M"), (["--bogus"], None)])
def test_bad_arguments_exit_2(args, carry):
    assert bundle_sh(*args, carry=carry).returncode == 2
