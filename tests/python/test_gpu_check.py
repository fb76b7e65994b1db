"""tools/gpu_check.py's pieces that decide a GPU run's verdict, checked on the CPU: the value-by-value comparison
of a CUDA build with a CPU build (its tolerance must pass rounding and fail real differences, augmented rows
included), the roofline's byte counts (docs/PERFORMANCE.md's GPU section), the augmentation banks, the choice of
the interpreter (fake interpreters: shell scripts that print a version, run through gpu_check.sh) and --steps."""
import json
import os
import shutil
import stat
import subprocess
import sys
import wave

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


def write_clips(path, frames, offsets, copy=None):
    """A schema-3 split: frames [N, M] frame-major, clip c = rows offsets[c]:offsets[c + 1]."""
    clips = len(offsets) - 1
    with h5py.File(path, "w") as f:
        f.create_dataset("frames", data=frames.astype(np.float16))
        f.create_dataset("frame_offset", data=np.array(offsets, dtype=np.int64))
        f.create_dataset("num_samples", data=np.full(clips, 1000, dtype=np.int64))
        f.create_dataset("clip_flags", data=np.zeros(clips, dtype=np.uint8))
        f.create_dataset("label", data=np.zeros(clips, dtype=np.int32))
        f.create_dataset("path", data=[f"a/{c}.wav".encode() for c in range(clips)])
        f.create_dataset("class_names", data=[b"a"])
        if copy is not None:
            f.create_dataset("aug_copy", data=np.array(copy, dtype=np.int32))
        f.attrs["log"] = "db"
        f.attrs["power"] = 2.0
        f.attrs["schema_version"] = 3


def test_schema_3_frames_are_compared_per_frame_with_its_loudest_band(tmp_path):
    rng = np.random.default_rng(5)
    a = -rng.uniform(0, 90, size=(9, 8))
    a[:, 2] = 0.0  # each frame (row) has a 0 dB band
    a = a.astype(np.float16).astype(np.float32)
    offsets = [0, 4, 9]

    def run(b, copy=None):
        write_clips(tmp_path / "cpu.h5", a, offsets, copy)
        write_clips(tmp_path / "cuda.h5", b, offsets, copy)
        return gpu_check.compare_split(str(tmp_path / "cpu.h5"), str(tmp_path / "cuda.h5"))

    assert run(a)["outside_tolerance"] == 0 and run(a)["agrees"]
    b = a.copy()
    b[6, 2] += 0.5
    r = run(b)
    assert r["outside_tolerance"] == 1 and r["worst"]["index"] == [6, 2] and not r["agrees"]
    a[3, 5] = -75.0
    b = a.copy()
    b[3, 5] = -74.5  # 0.5 dB on a band 75 dB below its frame's peak: FFT rounding of that frame
    assert run(b)["outside_tolerance"] == 0
    b = a.copy()
    b[5:, 4] += 0.3  # clip 1 is an augmented copy: held to the augmented bounds, not the engine's
    r = run(b, copy=[0, 1])
    assert r["outside_tolerance"] == 0 and r["augmented"]["rows"] == 5 and r["agrees"]


def test_other_labels_are_reported(tmp_path, mel):
    assert compare(tmp_path, mel, mel, labels_b=(1, 1))["metadata_differs"]


def test_roofline_bytes_match_performance_md():
    b = gpu_check.roofline_bytes(4000, 32, 512, 64)
    assert b["h2d"] == 16000 and b["d2h"] == 4096
    assert 280_000 <= b["device"] <= 284_000  # PERFORMANCE.md: about 282,000 bytes per segment


def write_augmented_split(path, mel, copy, noise=None):
    write_split(path, mel)
    n = len(copy)
    with h5py.File(path, "a") as f:
        f.create_dataset("aug_copy", data=np.array(copy, dtype=np.int32))
        f.create_dataset("aug_noise", data=noise or [b"" if c == 0 else b"noise/white.wav" for c in copy])
        f.create_dataset("aug_snr_db", data=np.array([np.nan if c == 0 else 10.0 for c in copy][:n], np.float32))


def test_augmented_rows_are_held_to_the_mean_and_max_bounds_and_clean_rows_to_the_element_bound(tmp_path, mel):
    a_path, b_path = str(tmp_path / "cpu.h5"), str(tmp_path / "cuda.h5")
    write_augmented_split(a_path, mel, [0, 1])
    b = mel.copy()
    b[1] += 0.03  # every element of the augmented row, within the mean bound but beyond the element bound
    write_augmented_split(b_path, b, [0, 1])
    r = gpu_check.compare_split(a_path, b_path)
    assert r["agrees"] and r["outside_tolerance"] == 0 and not r["metadata_differs"]
    assert r["augmented"]["rows"] == 1 and r["augmented"]["within_bound"]
    assert r["elements"] == mel[0].size and r["identical"] == 1.0

    b[1, 0, 0, 3, 2] += 1.5  # one element of the augmented row beyond the max bound
    write_augmented_split(b_path, b, [0, 1])
    r = gpu_check.compare_split(a_path, b_path)
    assert not r["agrees"] and not r["augmented"]["within_bound"] and r["outside_tolerance"] == 0

    b = mel.copy()
    b[1] += 0.2  # every element: the mean bound fails
    write_augmented_split(b_path, b, [0, 1])
    assert not gpu_check.compare_split(a_path, b_path)["agrees"]

    b = mel.copy()
    b[0, 0, 1, 2, 3] += 0.5  # the clean row keeps the element bound
    write_augmented_split(b_path, b, [0, 1])
    r = gpu_check.compare_split(a_path, b_path)
    assert not r["agrees"] and r["outside_tolerance"] == 1 and r["worst"]["index"] == [0, 0, 1, 2, 3]


def test_other_recipes_are_reported(tmp_path, mel):
    write_augmented_split(str(tmp_path / "cpu.h5"), mel, [0, 1])
    write_augmented_split(str(tmp_path / "cuda.h5"), mel, [0, 1], noise=[b"", b"noise/rumble.wav"])
    r = gpu_check.compare_split(str(tmp_path / "cpu.h5"), str(tmp_path / "cuda.h5"))
    assert r["metadata_differs"] and not r["agrees"]


def test_banks_are_reproducible_16_bit_wav_files(tmp_path):
    gpu_check.write_banks(str(tmp_path / "a"), 16000)
    gpu_check.write_banks(str(tmp_path / "b"), 16000)
    files = sorted(os.path.relpath(os.path.join(r, f), tmp_path / "a") for r, _, fs in os.walk(tmp_path / "a")
                   for f in fs)
    assert [f for f in files if f.startswith("noise")] and [f for f in files if f.startswith("rir")]
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
        with wave.open(str(tmp_path / "a" / f)) as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
            x = np.frombuffer(w.readframes(w.getnframes()), "<i2")
        assert np.abs(x).max() == round(0.9 * 32767)


# --- steps ---------------------------------------------------------------------------------------------------------
def test_select_steps_adds_what_a_step_uses_in_the_check_order():
    assert gpu_check.select_steps("") == list(gpu_check.STEPS)
    assert gpu_check.select_steps("trainer,build_cuda") == ["build_cpu", "build_cuda", "trainer"]
    assert gpu_check.select_steps("build_augment_cuda") == ["build_augment_cpu", "build_augment_cuda"]
    assert gpu_check.select_steps(" device ") == ["device"]


@pytest.mark.parametrize("spec, words", [("trainer,tranier", ["'tranier'", "the steps are: device,"]),
                                         ("device,,libraries", ["''"]),
                                         ("nccl,nccl", ["named twice", "nccl"])])
def test_select_steps_refuses_unknown_or_repeated_names(spec, words):
    with pytest.raises(ValueError) as e:
        gpu_check.select_steps(spec)
    for w in words:
        assert w in str(e.value)


# --- the interpreter -----------------------------------------------------------------------------------------------
BUNDLE_TORCH = "2.11.0+cu130"
TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")


def fake_python(folder, log, torch=None, numpy="2.1.0", h5py="3.11.0", name="python3"):
    """A shell script that answers gpu_check's probe (python -c ...) with these versions and logs every call; run
    otherwise (the check itself), it prints 'ran' and its arguments."""
    os.makedirs(folder, exist_ok=True)
    info = {"python_version": "3.12.0", "numpy": numpy, "h5py": h5py, "torch": torch}
    if torch:
        info["torch_file"] = f"{folder}/site-packages/torch/__init__.py"
    else:
        info["torch_error"] = "ModuleNotFoundError: No module named 'torch'"
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(f"""#!/bin/sh
echo "$0 $1" >> '{log}'
if [ "$1" = "-c" ]; then
  cat <<'EOF'
MELFORGE-PROBE {json.dumps(info)}
EOF
  exit 0
fi
echo "ran $0 $*"
""")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


def fake_nvidia_smi(folder, gpu):
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "nvidia-smi")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + ("echo 'NVIDIA H200, 580.65.06, 9.0, 143771, 00000000:19:00.0, 3201'\n" if gpu else
                                   "echo 'No devices were found'; exit 6\n"))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


@pytest.fixture
def bundle(tmp_path):
    """A bundle with gpu_check.sh, gpu_check.py and a bundle.json whose LibTorch is torch 2.11.0+cu130."""
    b = tmp_path / "bundle"
    b.mkdir()
    for f in ("gpu_check.sh", "gpu_check.py"):
        shutil.copy(os.path.join(TOOLS, f), b / f)
    (b / "bundle.json").write_text(json.dumps({"torch_version": BUNDLE_TORCH}))
    return b


def run_check(bundle, tmp_path, *args, gpu=False, path_dirs=(), **env):
    """bash BUNDLE/gpu_check.sh ARGS with PATH = path_dirs, a fake nvidia-smi (a GPU or none), /usr/bin, /bin."""
    fake_nvidia_smi(str(tmp_path / "smi"), gpu)
    e = {k: v for k, v in os.environ.items() if k not in ("MELFORGE_PYTHON", gpu_check.CHOSEN_ENV)}
    e.update(env, PATH=":".join([*path_dirs, str(tmp_path / "smi"), "/usr/bin", "/bin"]))
    return subprocess.run(["bash", str(bundle / "gpu_check.sh"), *args], capture_output=True, text=True, env=e)


def test_the_interpreter_with_the_bundles_torch_is_chosen_and_named(bundle, tmp_path):
    log = str(tmp_path / "calls.log")
    old = fake_python(str(tmp_path / "a"), log, torch="1.13.0a0+git6c9b55e")
    right = fake_python(str(tmp_path / "b"), log, torch=BUNDLE_TORCH)
    later = fake_python(str(tmp_path / "c"), log, torch=BUNDLE_TORCH)
    r = run_check(bundle, tmp_path, str(tmp_path / "report"), gpu=True, MELFORGE_PYTHON=f"{old}:{right}:{later}")
    assert r.returncode == 0, r.stderr
    assert f"python: {right}: torch {BUNDLE_TORCH} (the bundle's LibTorch version)" in r.stdout
    assert f"ran {right} {bundle}/gpu_check.py --bundle {bundle} {tmp_path}/report" in r.stdout
    assert later not in open(log).read()


def test_another_torch_first_on_path_does_not_win(bundle, tmp_path):
    log = str(tmp_path / "calls.log")
    fake_python(str(tmp_path / "debian"), log, torch="1.13.0")
    right = fake_python(str(tmp_path / "venv"), log, torch=BUNDLE_TORCH)
    r = run_check(bundle, tmp_path, str(tmp_path / "report"), "--steps", "trainer", gpu=True,
                  path_dirs=[str(tmp_path / "debian"), str(tmp_path / "venv")])
    assert r.returncode == 0, r.stderr
    assert f"ran {right} {bundle}/gpu_check.py --bundle {bundle} {tmp_path}/report --steps trainer" in r.stdout
    assert open(log).read().splitlines()[:2] == [f"{tmp_path}/debian/python3 -c", f"{right} -c"]


def test_no_match_on_a_gpu_machine_fails_naming_the_versions_found(bundle, tmp_path):
    log = str(tmp_path / "calls.log")
    a = fake_python(str(tmp_path / "a"), log, torch="1.13.0")
    b = fake_python(str(tmp_path / "b"), log, torch=None)
    c = fake_python(str(tmp_path / "c"), log, torch=BUNDLE_TORCH, h5py=None)
    r = run_check(bundle, tmp_path, str(tmp_path / "report"), gpu=True,
                  MELFORGE_PYTHON=f"{a}:{b}:{c}:{tmp_path}/missing/python3")
    assert r.returncode == 1
    assert "ran " not in r.stdout
    err = r.stderr
    assert f"no python3 has torch {BUNDLE_TORCH}" in err
    assert f"{a}: torch 1.13.0" in err
    assert f"{b}: no torch (ModuleNotFoundError: No module named 'torch')" in err
    assert f"{c}: torch {BUNDLE_TORCH}, no h5py" in err
    assert f"{tmp_path}/missing/python3: not an executable file" in err
    assert "MELFORGE_PYTHON" in err
    assert not (tmp_path / "report").exists()


def test_without_a_gpu_a_python_with_numpy_and_h5py_runs_the_cpu_steps_and_says_why(bundle, tmp_path):
    log = str(tmp_path / "calls.log")
    bare = fake_python(str(tmp_path / "a"), log, torch=None, numpy=None)
    old = fake_python(str(tmp_path / "b"), log, torch="1.13.0")
    r = run_check(bundle, tmp_path, str(tmp_path / "report"), gpu=False, MELFORGE_PYTHON=f"{bare}:{old}")
    assert r.returncode == 0, r.stderr
    assert f"ran {old} " in r.stdout
    assert f"no python3 has torch {BUNDLE_TORCH} ({bare}: no torch" in r.stdout
    assert f"{old}: torch 1.13.0)" in r.stdout and "only the CPU steps run" in r.stdout


def test_an_unknown_step_is_refused_before_anything_runs(bundle, tmp_path):
    log = str(tmp_path / "calls.log")
    right = fake_python(str(tmp_path / "b"), log, torch=BUNDLE_TORCH)
    r = run_check(bundle, tmp_path, str(tmp_path / "report"), "--steps", "build_cpu,bulid_cuda", gpu=True,
                  MELFORGE_PYTHON=right)
    assert r.returncode == 2
    assert "unknown step(s) 'bulid_cuda' in --steps; the steps are: device, libraries," in r.stderr
    assert not os.path.exists(log) and not (tmp_path / "report").exists()
    r = run_check(bundle, tmp_path, str(tmp_path / "report"), "--epochs", "0", MELFORGE_PYTHON=right)
    assert r.returncode == 2 and "--epochs must be at least 1" in r.stderr and not os.path.exists(log)
    r = run_check(bundle, tmp_path, str(tmp_path / "report"), MELFORGE_PYTHON=right, MELFORGE_GPU_CHECK_SECONDS="5m")
    assert r.returncode == 2 and "MELFORGE_GPU_CHECK_SECONDS must be a number" in r.stderr and not os.path.exists(log)


def test_list_steps_names_every_step_and_what_it_needs(bundle, tmp_path):
    r = run_check(bundle, tmp_path, "--list-steps")
    assert r.returncode == 0, r.stderr
    rows = [line.split()[:2] for line in r.stdout.splitlines()]
    assert rows == [[n, "GPU" if gpu else "CPU"] for n, (gpu, _, _) in gpu_check.STEPS.items()]


def test_python_candidates_come_from_path_in_order_each_once(tmp_path):
    log = str(tmp_path / "calls.log")
    a = fake_python(str(tmp_path / "a"), log)
    b = fake_python(str(tmp_path / "b"), log)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    env = {"PATH": f"{tmp_path}/a:{tmp_path}/nothing:{tmp_path}/link:{tmp_path}/b"}
    found = gpu_check.python_candidates(env)
    assert found[:2] == [a, b]
    assert found[2:] == [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.isfile(p)]
    assert gpu_check.python_candidates({"MELFORGE_PYTHON": f"{b}:{a}", "PATH": env["PATH"]}) == [b, a]


def test_libcudart_is_the_machines_where_it_has_one_else_the_bundles(tmp_path):
    bundled = tmp_path / "bundle" / "lib-cudart"
    wheel = tmp_path / "site-packages" / "nvidia" / "cu13" / "lib"
    other = tmp_path / "other"
    for d in (bundled, wheel, other):
        d.mkdir(parents=True)
    (bundled / "libcudart.so.13").write_bytes(b"bundle")
    (other / "libcudart.so.12").write_bytes(b"old")
    r = gpu_check.pick_cudart([str(other), str(wheel)], str(bundled))
    assert r == {"used": str(bundled / "libcudart.so.13"), "source": "the bundle (this machine has no libcudart.so.13)",
                 "add": str(bundled)}
    (wheel / "libcudart.so.13").write_bytes(b"wheel")
    assert gpu_check.pick_cudart([str(other), str(wheel)], str(bundled)) == {
        "used": str(wheel / "libcudart.so.13"), "source": "this machine"}
    assert gpu_check.pick_cudart([str(wheel)], str(tmp_path / "none")) == {}
