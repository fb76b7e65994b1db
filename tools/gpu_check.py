"""Verifies every CUDA path of melforge from a bundle of tools/gpu_bundle.sh; run through gpu_check.sh.

    gpu_check.py --bundle BUNDLE REPORT [--steps a,b,...] [--epochs N]
    gpu_check.py --list-steps

Writes REPORT/gpu_report.json (every step: status pass / fail / skipped, reason, seconds, figures) and
REPORT/gpu_report.md (the same for a person), plus the raw outputs of each step under REPORT/logs/ (also packed as
REPORT/gpu_logs.tar.gz). A machine without a CUDA device (no nvidia-smi, or one that lists no GPU) gets "skipped: no
CUDA device" for every GPU step and exit status 0; the steps that need no GPU (the bundle's libraries, CPU builds of
the corpus) still run, so that the bundle cannot rot where CI runs it. Any failed step gives exit status 1; a bad
argument gives exit status 2 before anything runs.

The interpreter: the arguments are parsed, and --steps checked, with the standard library alone (numpy and h5py are
imported where they are used); then the interpreter that runs the check is chosen (choose_python: the first
candidate whose torch.__version__ is the bundle's LibTorch version and that has numpy and h5py; the candidates are
MELFORGE_PYTHON, ':'-separated, or else every python3 on PATH in PATH's order, then /usr/bin/python3 and
/usr/local/bin/python3), and this script runs again under it. Without a CUDA device a candidate with numpy and h5py
but another torch (or none) is accepted, with a note, since no step then loads LibTorch's CUDA code; with a device,
no match is an error that names the versions found.
"""
import argparse
import datetime
import glob
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import wave
import xml.etree.ElementTree as ET

NO_GPU = "skipped: no CUDA device"
NOT_SELECTED = "skipped: not selected (--steps)"
SKIP_MARKER = "MELFORGE-SKIPPED:"
PROBE_MARKER = "MELFORGE-PROBE "
# Set by the first run of this script for its second run under the chosen interpreter: the choice, as JSON.
CHOSEN_ENV = "MELFORGE_GPU_CHECK_CHOSEN"
# The demo's parameters (tools/demo_build.ini, docs/PERFORMANCE.md's GPU section): 16 kHz, n_fft 512, hop 128,
# 64 mels, short segments of 0.25 s (4,000 samples, 32 frames); a 1-second file is 4 such segments.
MEL = {"sample_rate": 16000, "n_fft": 512, "hop_length": 128, "n_mels": 64, "segment_samples": 4000}
SEED_SEGMENTS_PER_S = 19.1e6  # the Python seed's GPU mel figure on an RTX 5090 (other corpus and segment sizes)
# Trainer variants: name, extra flags. Each trains --epochs EPOCHS on the bundled corpus' dataset.
TRAIN_VARIANTS = [
    ("fp32", []),
    ("amp-fp16", ["--amp", "fp16"]),
    ("amp-bf16", ["--amp", "bf16"]),
    ("cuda-graph", ["--cuda-graph"]),
    ("channels-last", ["--channels-last"]),
    ("gpu-mem", ["--gpu-mem", "1024"]),
]
# A first run and a rerun must fit one 15-minute device lease with its 2 to 4 minutes of start-up: one epoch per
# trainer variant by default, and a time budget (MELFORGE_GPU_CHECK_SECONDS) after which steps are stopped.
EPOCHS = 1
BUDGET_S = 300
CORPUS_COPIES = 20  # the bundled 100-file corpus, hard-linked 20 times: 2,000 files, 8,000 segments
# The augmented builds: the bundled corpus once, every split, two copies per file with noise and reverberation.
AUGMENT_FLAGS = ["--augment-copies", "2", "--augment-splits", "train,val,test", "--snr-db", "5,20",
                 "--noise-prob", "1", "--rir-prob", "1"]
# Augmented rows of a CUDA build against a CPU build: the bounds of tests/test_augment_build_cuda.cpp.
AUGMENTED_MEAN_ABS = 0.05
AUGMENTED_MAX_ABS = 1.0
# The steps, in the order they run: name -> (needs a GPU, steps whose output it uses, what it does).
STEPS = {
    "device": (True, (), "device, driver and torch"),
    "libraries": (False, (), "bundle's shared libraries resolve"),
    "builder_tests": (True, (), "builder [cuda] tests"),
    "trainer_tests": (True, (), "trainer [cuda] tests"),
    "build_cpu": (False, (), f"melforge-build --device cpu ({CORPUS_COPIES}x the bundled corpus)"),
    "build_cuda": (True, ("build_cpu",), "melforge-build --device cuda, compared with the CPU build"),
    "build_augment_cpu": (False, (), "melforge-build --device cpu with noise and reverberation (--augment-copies)"),
    "build_augment_cuda": (True, ("build_augment_cpu",),
                           "melforge-build --device cuda with noise and reverberation (the CUDA augmenter), "
                           "compared with the CPU build"),
    "mel_throughput": (True, (), "mel engine throughput (melforge-bench-mel)"),
    "trainer": (True, ("build_cpu",), "melforge-train: fp32, fp16, bf16, CUDA graph, channels-last, --gpu-mem"),
    "nccl": (True, ("build_cpu",), "melforge-train: 1-rank job through c10d with NCCL"),
}


class Check:
    """Runs the steps, records them and writes the report."""

    def __init__(self, bundle, report, selected, epochs, chosen, budget_s):
        self.bundle = os.path.abspath(bundle)
        self.report = os.path.abspath(report)
        self.logs = os.path.join(self.report, "logs")
        self.work = os.path.join(self.report, "work")
        os.makedirs(self.logs, exist_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.meta = read_bundle_meta(self.bundle)
        self.selected = selected
        self.epochs = epochs
        self.chosen = chosen
        self.steps = []
        self.gpu = None
        self.no_gpu_reason = ""
        self.env = dict(os.environ)
        self.torch = {}
        self.cudart = {}
        self.deadline = time.time() + budget_s

    # --- running things ---------------------------------------------------------------------------------------
    def run(self, name, argv, timeout=240, check=True, env=None):
        """Runs argv with the bundle's environment (or `env`); its output goes to logs/NAME.log. Returns (rc, output).
        The timeouts keep the whole check inside the time a GPU machine's command may run."""
        t0 = time.time()
        timeout = max(1.0, min(timeout, self.deadline - t0))
        try:
            p = subprocess.run(argv, env=self.env if env is None else env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace", timeout=timeout, cwd=self.work)
            rc, out = p.returncode, p.stdout
        except subprocess.TimeoutExpired as e:
            partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc, out = 124, partial + f"\n[gpu_check] killed after {timeout} s\n"
        with open(os.path.join(self.logs, name + ".log"), "w") as f:
            f.write("$ " + " ".join(argv) + f"\n[exit {rc}, {time.time() - t0:.1f} s]\n" + out)
        if check and rc != 0:
            tail = "\n".join(out.strip().splitlines()[-15:])
            raise StepError(f"{os.path.basename(argv[0])} exited {rc} (logs/{name}.log):\n{tail}")
        return rc, out

    def step(self, name, fn, title=None):
        """Runs step `name` (STEPS) and records its outcome: fn returns the step's details, or raises StepError to fail
        it. A step not selected with --steps, or one that needs a GPU on a machine without one, is skipped."""
        needs_gpu = STEPS[name][0]
        title = title or STEPS[name][2]
        print(f"[gpu_check] {title} ...", flush=True)
        t0 = time.time()
        rec = {"name": name, "title": title, "needs_gpu": needs_gpu}
        if name not in self.selected:
            rec.update(status="skipped", reason=NOT_SELECTED)
        elif needs_gpu and self.gpu is None:
            rec.update(status="skipped", reason=NO_GPU + (f" ({self.no_gpu_reason})" if self.no_gpu_reason else ""))
        elif time.time() >= self.deadline:
            rec.update(status="fail", reason="not run: the check's time budget (MELFORGE_GPU_CHECK_SECONDS) was spent")
        else:
            try:
                rec.update(status="pass", details=fn())
            except StepError as e:
                rec.update(status="fail", reason=str(e))
            except Exception as e:  # a bug of this script is a failed step too, never a silent pass
                rec.update(status="fail", reason=f"{type(e).__name__}: {e}")
        rec["seconds"] = round(time.time() - t0, 2)
        self.steps.append(rec)
        reason = rec["reason"].splitlines()[0] if rec.get("reason") else ""
        print(f"[gpu_check]   {rec['status']}" + (f" ({reason.removeprefix('skipped: ')})" if reason else "")
              + f" ({rec['seconds']} s)", flush=True)
        return rec

    # --- environment --------------------------------------------------------------------------------------------
    def find_libraries(self):
        """LD_LIBRARY_PATH: LibTorch's libraries, the bundle's, the CUDA wheels' beside LibTorch (nvidia/*/lib of its
        site-packages), the CUDA toolkit's, and the bundle's libcudart only where none of those has one."""
        info = self.chosen.get("info", {})
        torch_lib, source = os.environ.get("MELFORGE_TORCH_LIB", ""), "MELFORGE_TORCH_LIB"
        if not torch_lib and info.get("torch") == self.meta["torch_version"] and info.get("torch_file"):
            torch_lib, source = os.path.join(os.path.dirname(info["torch_file"]), "lib"), "the chosen python's torch"
        if not torch_lib and os.path.isdir(self.meta.get("torch_lib_on_build_machine", "")):
            torch_lib, source = self.meta["torch_lib_on_build_machine"], "the build machine's (bundle.json)"
        self.torch = {"python": self.chosen.get("python"), "version": info.get("torch"),
                      "import_error": info.get("torch_error"), "matches_bundle": self.chosen.get("matches"),
                      "note": self.chosen.get("note"), "lib": torch_lib, "lib_source": source if torch_lib else None}
        # LibTorch's folder first: its libgomp.so.1 then serves every program, as it serves the trainer where it is
        # built (the RUNPATH lists it); the bundle's own libgomp only where no LibTorch was found.
        dirs = [torch_lib] if torch_lib else []
        dirs.append(os.path.join(self.bundle, "lib"))
        if torch_lib:
            dirs += sorted(d for d in glob.glob(os.path.join(os.path.dirname(os.path.dirname(torch_lib)), "nvidia",
                                                             "*", "lib")) if os.path.isdir(d))
        dirs += [d for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib") if os.path.isdir(d)]
        self.cudart = pick_cudart(dirs, os.path.join(self.bundle, "lib-cudart"))
        if self.cudart.get("add"):
            dirs.append(self.cudart["add"])
        old = os.environ.get("LD_LIBRARY_PATH", "")
        self.env["LD_LIBRARY_PATH"] = ":".join(dirs + ([old] if old else []))
        rc, out = self.run("probe", [os.path.join(self.bundle, "bin", "melforge-build"), "--help"], check=False)
        self.compat = rc != 0 and ("GLIBCXX" in out or "GCC_" in out)
        if self.compat:
            self.env["LD_LIBRARY_PATH"] += ":" + os.path.join(self.bundle, "lib-compat")

    def find_gpu(self):
        """Fills self.gpu from nvidia-smi, or self.no_gpu_reason."""
        self.gpu, self.no_gpu_reason = query_gpus()
        if self.gpu:
            with open(os.path.join(self.logs, "nvidia-smi.txt"), "w") as f:
                f.write(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)

    # --- steps --------------------------------------------------------------------------------------------------
    def step_device(self):
        d = {"gpus": self.gpu, "torch": self.torch, "cudart": self.cudart, "lib_compat_used": self.compat}
        if self.torch.get("version") != self.meta["torch_version"]:
            raise StepError(f"this machine's torch ({self.torch.get('python')}) is "
                            f"{self.torch.get('version') or self.torch.get('import_error')}, the bundle was built "
                            f"against {self.meta['torch_version']}: melforge-train needs the same LibTorch")
        return d

    def step_libraries(self):
        """Every library of every bundled program resolves, and only to the bundle, LibTorch and the CUDA libraries,
        or to the C and C++ runtimes of the machine (anything else would be a library the bundle forgot)."""
        allowed_dirs = [d for d in self.env["LD_LIBRARY_PATH"].split(":") if d]
        runtime = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libresolv|libutil|libmvec)[.-]"
                             r"|^(libstdc\+\+|libgcc_s)\.")
        missing, foreign = {}, {}
        for sub in ("bin", "tests"):
            for b in sorted(os.listdir(os.path.join(self.bundle, sub))):
                _, out = self.run(f"ldd-{b}", ["ldd", os.path.join(self.bundle, sub, b)], check=False)
                for line in out.splitlines():
                    parts = line.split()
                    if "not found" in line:
                        missing.setdefault(b, []).append(parts[0])
                    elif len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
                        path = os.path.realpath(parts[2])
                        if not runtime.match(parts[0]) and not any(
                                path.startswith(os.path.realpath(d) + "/") for d in allowed_dirs):
                            foreign.setdefault(b, []).append(parts[2])
        if missing:
            raise StepError("libraries not found: " + json.dumps(missing))
        if foreign:
            raise StepError("libraries taken from the machine instead of the bundle: " + json.dumps(foreign))
        return {"ld_library_path": allowed_dirs, "cudart": self.cudart}

    def catch_tests(self, binary, spec, tag):
        """Runs the Catch2 tests of `binary` matching `spec`; returns each test case's status: its failures from the
        JUnit report, its skip from the MELFORGE-SKIPPED line tests/test_skip.h prints, else pass (exit 0)."""
        name = os.path.basename(binary)
        _, listing = self.run(f"{tag}-{name}-list", [binary, "--list-test-names-only", spec], check=False)
        names = [l.strip() for l in listing.splitlines() if l.strip() and not l.startswith(("Matching", "["))]
        xml = os.path.join(self.logs, f"{tag}-{name}.xml")
        rc, out = self.run(f"{tag}-{name}", [binary, spec, "-r", "junit", "-o", xml], check=False)
        if rc == 77:
            return {"binary": name, "exit": rc, "skipped_all": True, "output": out.strip()[-300:]}
        if not os.path.exists(xml):
            raise StepError(f"{name} wrote no report (exit {rc}): {out.strip()[-500:]}")
        cases = {n: {"status": "pass"} for n in names}
        for tc in ET.parse(xml).getroot().iter("testcase"):
            top = (tc.get("name") or "").split("/")[0]
            if tc.find("failure") is not None or tc.find("error") is not None:
                c = cases.setdefault(top, {})
                c["status"] = "fail"
                text = "".join((e.text or "") for e in tc.iter() if e.tag in ("failure", "error"))
                c.setdefault("failures", []).append(text.strip()[-400:])
        for line in out.splitlines():
            if line.startswith(SKIP_MARKER):
                rest = line[len(SKIP_MARKER):].strip()
                top = next((n for n in names if rest.startswith(n + ":")), rest)
                c = cases.setdefault(top, {})
                if c.get("status") != "fail":
                    c.update(status="skipped", reason=rest[len(top) + 1:].strip())
        return {"binary": name, "exit": rc, "cases": cases}

    def step_tests(self, binaries, spec, tag):
        results = [self.catch_tests(b, spec, tag) for b in binaries]
        failed, skipped, passed = [], [], []
        for r in results:
            if r.get("skipped_all"):
                skipped.append(f"{r['binary']} (exit 77: its main found no CUDA device)")
                continue
            for case, c in r["cases"].items():
                {"pass": passed, "fail": failed, "skipped": skipped}[c["status"]].append(f"{r['binary']}: {case}")
            if r["exit"] != 0 and not any(c["status"] == "fail" for c in r["cases"].values()):
                failed.append(f"{r['binary']}: exit {r['exit']} with no failed case (crash?)")
        d = {"passed": len(passed), "failed": len(failed), "skipped": len(skipped), "tests": passed,
             "failures": failed, "skips": skipped, "results": results}
        if failed:
            raise StepError(f"{len(failed)} failed: " + "; ".join(failed))
        if skipped:
            raise StepError(f"{len(skipped)} [cuda] test(s) skipped although nvidia-smi lists a GPU: "
                            + "; ".join(skipped))
        if not passed:
            raise StepError("no [cuda] test ran")
        return d

    def replicated_corpus(self):
        """The bundled corpus hard-linked CORPUS_COPIES times under other names (same classes)."""
        src = os.path.join(self.bundle, "data", "corpus")
        dst = os.path.join(self.work, "corpus")
        if os.path.isdir(dst):
            return dst
        for cls in sorted(os.listdir(src)):
            if not os.path.isdir(os.path.join(src, cls)):
                continue
            os.makedirs(os.path.join(dst, cls))
            for f in sorted(os.listdir(os.path.join(src, cls))):
                for k in range(CORPUS_COPIES):
                    target = os.path.join(dst, cls, f"c{k:02d}_{f}")
                    try:
                        os.link(os.path.join(src, cls, f), target)
                    except OSError:
                        shutil.copyfile(os.path.join(src, cls, f), target)
        return dst

    def build(self, name, device, corpus, extra=()):
        """melforge-build of `corpus` with the demo's configuration on `device` into work/NAME; (folder, report)."""
        out = os.path.join(self.work, name)
        argv = [os.path.join(self.bundle, "bin", "melforge-build"), "--config",
                os.path.join(self.bundle, "data", "build.ini"), "--input", corpus, "--output", out, "--overwrite",
                "--device", device, *extra]
        t0 = time.time()
        self.run(name, argv)
        report = json.load(open(os.path.join(out, "build_report.json")))
        report["gpu_check_wall_s"] = round(time.time() - t0, 2)
        return out, report

    def step_build_cpu(self):
        self.cpu_dataset, report = self.build("build-cpu", "cpu", self.replicated_corpus())
        return build_summary(report)

    def step_build_cuda(self):
        out, report = self.build("build-cuda", "cuda", self.replicated_corpus())
        self.cuda_dataset = out
        return compare_builds(getattr(self, "cpu_dataset", None), out, report)

    def augment_flags(self):
        banks = os.path.join(self.work, "banks")
        if not os.path.isdir(banks):
            write_banks(banks, MEL["sample_rate"])
        return [*AUGMENT_FLAGS, "--noise", os.path.join(banks, "noise"), "--rir", os.path.join(banks, "rir")]

    def step_build_augment_cpu(self):
        out, report = self.build("build-augment-cpu", "cpu", os.path.join(self.bundle, "data", "corpus"),
                                 self.augment_flags())
        augmenter = pick(report, "augmentation", "augmenter")
        if augmenter != "cpu-fftw":
            raise StepError(f"build_report.json says augmenter {augmenter!r} for --device cpu with --augment-copies")
        self.cpu_augmented = out
        return build_summary(report)

    def step_build_augment_cuda(self):
        out, report = self.build("build-augment-cuda", "cuda", os.path.join(self.bundle, "data", "corpus"),
                                 self.augment_flags())
        augmenter = pick(report, "augmentation", "augmenter")
        if augmenter != "cuda-cufft":
            raise StepError(f"build_report.json says augmenter {augmenter!r} for --device cuda: the CUDA augmenter "
                            "did not run")
        d = compare_builds(getattr(self, "cpu_augmented", None), out, report)
        d["augmentation"] = {k: report["augmentation"].get(k) for k in ("augmenter", "device_bytes", "copies")}
        return d

    def step_mel_throughput(self):
        res = {}
        # Input: a pool of 16,384 distinct segments (256 MiB of float32, far larger than any cache) cycled, so the
        # samples stream from RAM as a build's arena does, without generating gigabytes of signal first.
        for name, extra in (("cuda", ["--device", "cuda", "--only", "engine", "--segments", "400000"]),
                            ("cpu-all-cores", ["--device", "cpu", "--only", "engine", "--segments", "40000",
                                               "--threads", "0"])):
            extra += ["--engine-pool-segments", "16384"]
            js = os.path.join(self.logs, f"bench-mel-{name}.json")
            self.run(f"bench-mel-{name}", [os.path.join(self.bundle, "bin", "melforge-bench-mel"), *extra,
                                           "--repeats", "5", "--segment-samples", str(MEL["segment_samples"]),
                                           "--n-fft", str(MEL["n_fft"]), "--hop-length", str(MEL["hop_length"]),
                                           "--n-mels", str(MEL["n_mels"]), "--out", js])
            res[name] = json.load(open(js))
        b = res["cuda"]
        seg_s = b["engine"]["segments_per_s"]
        bw = self.bandwidth()
        per_seg = roofline_bytes(b["segment_samples"], b["n_frames"], b["n_fft"], b["n_mels"])
        d = {
            "parameters": {k: b[k] for k in ("segment_samples", "n_fft", "hop_length", "n_mels", "n_frames", "dtype",
                                             "device_batch", "segments")},
            "segments_per_s": seg_s,
            "files_per_s_at_4_segments_per_file": seg_s / 4,
            "stages_median_s": b["engine_stages_median_s"],
            "wall_median_s": b["engine"]["median_s"],
            "cpu_all_cores_segments_per_s": res["cpu-all-cores"]["engine"]["segments_per_s"],
            "seed_rtx5090_segments_per_s": SEED_SEGMENTS_PER_S,
            "hbm_bytes_per_segment": per_seg,
            "pcie_bytes_per_segment": per_seg["h2d"] + per_seg["d2h"],
            "bandwidth": bw,
        }
        if bw.get("device_bytes_per_s"):
            d["hbm_bound_segments_per_s"] = bw["device_bytes_per_s"] / per_seg["device"]
        if bw.get("h2d_bytes_per_s"):
            d["pcie_bound_segments_per_s"] = bw["h2d_bytes_per_s"] / per_seg["h2d"]
        return d

    def bandwidth(self):
        """Device-to-device and host-to-device copy bandwidth measured with the chosen python's torch, in this machine's
        own environment (not the bundle's LD_LIBRARY_PATH, which is for melforge's programs)."""
        code = r"""
import json, time, torch
d = torch.device('cuda')
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device=d); b = torch.empty_like(a)
h = torch.empty(n // 4, dtype=torch.uint8).pin_memory(); g = torch.empty(n // 4, dtype=torch.uint8, device=d)
def t(f, reps=10):
    f(); torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(reps): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / reps
dd = t(lambda: b.copy_(a)); hd = t(lambda: g.copy_(h, non_blocking=True))
print(json.dumps({"device_bytes_per_s": 2 * n / dd, "h2d_bytes_per_s": (n // 4) / hd,
                  "method": "torch copies: 1 GiB device-to-device (read + write counted), 256 MiB pinned host-to-device"}))
"""
        if self.torch.get("version") != self.meta["torch_version"]:
            return {"note": "no torch of the bundle's version: bandwidth not measured"}
        rc, out = self.run("bandwidth", [sys.executable, "-c", code], check=False, env=dict(os.environ))
        try:
            return json.loads(out.strip().splitlines()[-1])
        except Exception:
            return {"note": f"bandwidth measurement failed (exit {rc}), see logs/bandwidth.log"}

    def step_trainer(self):
        data = getattr(self, "cuda_dataset", None) or getattr(self, "cpu_dataset", None)
        if not data:
            raise StepError("no dataset was built")
        train = os.path.join(self.bundle, "bin", "melforge-train")
        runs, failed = {}, []
        for name, flags in TRAIN_VARIANTS:
            out = os.path.join(self.work, f"run-{name}")
            argv = [train, "train", "--data", data, "--out", out, "--overwrite", "--epochs", str(self.epochs),
                    "--device", "cuda", "--positive-class", "seven", *flags]
            try:
                self.run(f"train-{name}", argv)
                m = [j for j in (json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip())
                     if j.get("type", "epoch") == "epoch"]
                rep = json.load(open(os.path.join(out, "report.json")))
                check = json.load(open(os.path.join(out, "config.json"))).get("device_check")
                sps = [e["samples_per_s"] for e in m]
                runs[name] = {"flags": " ".join(flags), "device_check": check, "samples_per_s_each_epoch": sps,
                              "samples_per_s": float(statistics.median(sps[1:] if len(sps) > 1 else sps)),
                              "data_wait_fraction": m[-1].get("data_wait_fraction"),
                              "test_file_accuracy": pick(rep, "test", "file", "accuracy")}
            except StepError as e:
                failed.append(name)
                runs[name] = {"flags": " ".join(flags), "error": str(e)}
        if failed:
            raise StepError(f"trainer variants failed: {', '.join(failed)}: " +
                            " | ".join(runs[n]["error"] for n in failed))
        return {"epochs": self.epochs, "dataset": os.path.basename(data),
                "note": "samples/s: median over the epochs after the first (warm-up, cuDNN autotuning, capture); "
                        "with one epoch, that epoch's, warm-up included",
                "runs": runs}

    def step_nccl(self):
        out = os.path.join(self.work, "run-nccl")
        data = getattr(self, "cuda_dataset", None) or getattr(self, "cpu_dataset", None)
        if not data:
            raise StepError("no dataset was built")
        argv = [os.path.join(self.bundle, "bin", "melforge-train"), "train", "--data", data, "--out", out,
                "--overwrite", "--epochs", "1", "--device", "cuda", "--positive-class", "seven", "--world-size", "1",
                "--dist-backend", "nccl", "--dist-timeout", "120", "--log-level", "info"]
        saved = dict(self.env)
        self.env["NCCL_DEBUG"] = "INFO"
        try:
            _, log = self.run("nccl", argv, timeout=180)
        finally:
            self.env = saved
        joined = [l for l in log.splitlines() if "joined the job through c10d" in l]
        if not any("nccl" in l for l in joined):
            raise StepError("the log does not say the rank joined the job through c10d with NCCL (logs/nccl.log)")
        config = json.load(open(os.path.join(out, "config.json")))
        if json.dumps(config).find('"dist_backend": "nccl"') < 0:
            raise StepError("config.json does not record dist_backend nccl")
        return {"log": joined, "nccl_version": [l.strip() for l in log.splitlines() if "NCCL version" in l][:1]}

    # --- report -------------------------------------------------------------------------------------------------
    def write(self):
        counts = {s: sum(1 for r in self.steps if r["status"] == s) for s in ("pass", "fail", "skipped")}
        doc = {
            "generated_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "host": {"hostname": platform.node(), "cpus": os.cpu_count(), "kernel": platform.release()},
            "bundle": self.meta,
            "gpu": self.gpu,
            "no_gpu_reason": self.no_gpu_reason or None,
            "torch": self.torch,
            "python_candidates": self.chosen.get("found"),
            "cudart": self.cudart,
            "selected_steps": self.selected,
            "epochs": self.epochs,
            "summary": counts,
            "steps": self.steps,
        }
        with open(os.path.join(self.report, "gpu_report.json"), "w") as f:
            json.dump(doc, f, indent=2, default=str)
        with open(os.path.join(self.report, "gpu_report.md"), "w") as f:
            f.write(markdown(doc))
        shutil.rmtree(self.work, ignore_errors=True)
        with tarfile.open(os.path.join(self.report, "gpu_logs.tar.gz"), "w:gz") as t:
            t.add(self.logs, arcname="logs")
        return counts


class StepError(Exception):
    """A step's failure, with the reason the report shows."""


def pick(d, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def roofline_bytes(samples, n_frames, n_fft, n_mels):
    """Bytes one segment moves: host<->device, and device memory traffic of gather -> FFT -> mel (float16 out)."""
    n_freqs = n_fft // 2 + 1
    h2d, d2h = 4 * samples, 2 * n_mels * n_frames
    device = 4 * samples + 2 * 4 * n_frames * n_fft + 2 * 8 * n_frames * n_freqs + 2 * n_mels * n_frames
    return {"h2d": h2d, "d2h": d2h, "device": device}


def to_power(v, attrs):
    """Stored log-mel values -> power, to judge a difference against the frame's energy."""
    import numpy as np
    log = attrs["log"].decode() if isinstance(attrs["log"], bytes) else str(attrs["log"])
    v = v.astype(np.float64)
    if log == "db":
        return np.power(10.0, v * float(attrs["power"]) / 20.0)
    if log == "ln":
        return np.exp(v)
    return v


AUG_COLUMNS = ("aug_copy", "aug_speed", "aug_rir", "aug_noise", "aug_snr_db", "aug_gain_db")


def same_values(x, y):
    """Equal shapes and values, NaN equal to NaN in floating-point arrays (aug_snr_db is NaN without noise)."""
    import numpy as np
    x, y = np.asarray(x), np.asarray(y)
    if x.shape != y.shape:
        return False
    if x.dtype.kind == "f" and y.dtype.kind == "f":
        return bool(np.array_equal(x, y, equal_nan=True))
    return bool(np.array_equal(x, y))


def compare_split(a_path, b_path):
    """CPU (a) against CUDA (b) value by value. An element agrees when |a - b| <= 2e-3 |a| + 5e-3 (float16 storage
    rounds to 2^-11 relative; float32 FFT rounding adds far less), or when its power differs by at most 1e-6 of the
    power of the loudest bin of its frame (FFTW and cuFFT round differently, and that rounding is relative to the
    frame's energy, not to a quiet bin's). Rows of augmented copies (aug_copy > 0) are held, together, to the bounds
    of tests/test_augment_build_cuda.cpp instead: mean |a - b| <= 0.05 and max |a - b| <= 1.0 (the two augmenters'
    waveforms agree within 1e-4 of the copy's largest sample, kernels/augment/augment_math.h, which a band far below
    that sample turns into more than the bound above). Labels, paths, classes and the recipes (aug_*) must be
    equal."""
    import h5py
    import numpy as np
    with h5py.File(a_path, "r") as fa, h5py.File(b_path, "r") as fb:
        clips = "frames" in fa  # schema 3: frames [N, M], frame-major; else schema 1/2: mel [F, L, S, M, T]
        keys = [k for k in ("label", "path", "num_valid_long", "frame_offset", "num_samples", "clip_flags",
                            "class_names", *AUG_COLUMNS) if k in fa or k in fb]
        meta_same = all(k in fa and k in fb and same_values(fa[k][()], fb[k][()]) for k in keys)
        name = "frames" if clips else "mel"
        a = fa[name][()].astype(np.float32)
        b = fb[name][()].astype(np.float32) if name in fb else np.zeros((0,), dtype=np.float32)
        rows = len(fa["label"])
        copy = fa["aug_copy"][()] if "aug_copy" in fa else np.zeros(rows, dtype=np.int32)
        if clips:  # the copy index of each frame: its clip's
            copy = np.repeat(copy, np.diff(fa["frame_offset"][()]))
        attrs = dict(fa.attrs)
    r = {"shape": list(a.shape), "metadata_differs": not meta_same or a.shape != b.shape}
    if a.shape != b.shape or a.size == 0:
        r.update(elements=int(a.size), outside_tolerance=0 if a.shape == b.shape else -1)
        r["agrees"] = not r["metadata_differs"]
        return r
    augmented = (copy > 0).reshape((-1,) + (1,) * (a.ndim - 1))
    clean = np.broadcast_to(~augmented, a.shape)
    diff = np.abs(a - b)
    ok = diff <= 2e-3 * np.abs(a) + 5e-3
    pa, pb = to_power(a, attrs), to_power(b, attrs)
    # The loudest band of each frame: the last axis of [N, M] (schema 3), the band axis of [..., M, T] (1/2).
    peak = np.max(pa, axis=-1 if clips else -2, keepdims=True)
    ok |= np.abs(pa - pb) <= 1e-6 * peak
    ok |= augmented
    d = diff[clean]
    r.update(elements=int(d.size), outside_tolerance=int((~ok).sum()))
    if d.size:
        r.update(identical=float(np.mean(a[clean] == b[clean])), max_abs_diff=float(d.max()),
                 mean_abs_diff=float(d.mean()), p999_abs_diff=float(np.quantile(d, 0.999)))
    if r["outside_tolerance"]:
        i = np.unravel_index(np.argmax(np.where(ok, 0, diff)), a.shape)
        r["worst"] = {"index": [int(x) for x in i], "cpu": float(a[i]), "cuda": float(b[i])}
    if augmented.any():
        d = diff[~clean]
        r["augmented"] = {"rows": int(augmented.sum()), "elements": int(d.size), "mean_abs_diff": float(d.mean()),
                          "max_abs_diff": float(d.max()), "p999_abs_diff": float(np.quantile(d, 0.999)),
                          "within_bound": bool(d.mean() <= AUGMENTED_MEAN_ABS and d.max() <= AUGMENTED_MAX_ABS)}
    r["agrees"] = (not r["metadata_differs"] and r["outside_tolerance"] == 0
                   and r.get("augmented", {}).get("within_bound", True))
    return r


def build_summary(report):
    """The figures of a build_report.json that the report shows."""
    return {"engine": report["engine"], "files": report["files"]["written"],
            "frames": report["clips"]["frames"] if "clips" in report else report.get("segments"),
            "wall_s": report["gpu_check_wall_s"], "files_per_s": report["throughput"]["files_per_s"]}


def compare_builds(cpu_dir, cuda_dir, report):
    """The CUDA build in cuda_dir (its build_report.json: `report`) against the CPU build in cpu_dir, split by split
    (compare_split). Raises StepError when the CUDA engine did not run, its engine check (the build's own comparison
    of its first batches with the CPU engine) did not pass, there is no CPU build, or a split differs."""
    if not report["engine"].startswith("cuda"):
        raise StepError(f"build_report.json says engine {report['engine']!r} for --device cuda")
    check = report.get("engine_check")
    if check is not None and check.get("result") != "passed":
        raise StepError("the build's engine check did not pass: " + json.dumps(check))
    if not cpu_dir:
        raise StepError("the CPU build failed, nothing to compare with")
    d = build_summary(report)
    d.update(mel_times_s=report.get("times_s", {}), device_buffer_bytes=report.get("device_buffer_bytes"),
             engine_choice=report.get("engine_choice"), engine_check=check)
    d["comparison"] = {s: compare_split(os.path.join(cpu_dir, f"{s}.h5"), os.path.join(cuda_dir, f"{s}.h5"))
                       for s in ("train", "val", "test")}
    bad = {s: c for s, c in d["comparison"].items() if not c["agrees"]}
    if bad:
        raise StepError("CUDA and CPU datasets differ beyond the tolerance: " + json.dumps(bad))
    return d


def write_wav_pcm16(path, x, sample_rate):
    """x (float, peak below 1) as a mono 16-bit PCM WAV file."""
    import numpy as np
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes((np.clip(x, -1, 1) * 32767).round().astype("<i2").tobytes())


def write_banks(root, sample_rate):
    """The augmentation banks of the build_augment_* steps, from a fixed seed: root/noise/ (white noise and a rumble
    in noise/, a chord of tones in tones/; 1.5 to 3 s each) and root/rir/ (two rooms: a direct path a few taps in,
    then a decaying noise tail, 0.25 and 0.5 s long), each clip peaking at 0.9, as 16-bit PCM WAV."""
    import numpy as np
    rng = np.random.default_rng(2718)
    n = [int(s * sample_rate) for s in (0.25, 0.5, 1.5, 2.0, 3.0)]
    t = np.arange(n[2]) / sample_rate
    clips = {
        "noise/noise/white.wav": rng.uniform(-1, 1, n[3]),
        "noise/noise/rumble.wav": np.convolve(rng.standard_normal(n[4]), np.ones(64), mode="same"),
        "noise/tones/chord.wav": sum(np.sin(2 * np.pi * f * t) for f in (220.0, 277.2, 329.6)),
    }
    for k, (length, decay_s) in enumerate(((n[0], 0.04), (n[1], 0.12))):
        h = 0.3 * rng.standard_normal(length) * np.exp(-np.arange(length) / (decay_s * sample_rate))
        h[: 3 + k] = 0.0
        h[3 + k] = 1.0
        clips[f"rir/room{k}.wav"] = h
    for rel, x in clips.items():
        write_wav_pcm16(os.path.join(root, rel), 0.9 * x / np.max(np.abs(x)), sample_rate)


def fmt(x, unit=""):
    if x is None:
        return "—"
    if isinstance(x, float):
        if abs(x) >= 1e6:
            return f"{x / 1e6:.2f}M{unit}"
        if abs(x) >= 1e3:
            return f"{x:,.0f}{unit}"
        return f"{x:.3g}{unit}"
    return f"{x}{unit}"


def markdown_build(step):
    """The report's section for a CUDA build compared with a CPU build (build_cuda, build_augment_cuda)."""
    d = step["details"]
    L = ["", f"### {step['title']}", "",
         f"Engine `{d['engine']}`, {d['files']} files, {d['frames']} frames, {d['wall_s']} s "
         f"({fmt(d['files_per_s'])} files/s in the report).", ""]
    if "augmentation" in d:
        L += [f"Augmenter `{d['augmentation']['augmenter']}`, {fmt(d['augmentation']['device_bytes'])} bytes of "
              f"device memory; rows: `{json.dumps(d['augmentation']['copies'])}`.", ""]
    L += ["| split | elements | identical | max abs diff | 99.9th pct | outside tolerance | augmented rows: mean / "
          "max abs diff |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for sname, c in d["comparison"].items():
        aug = c.get("augmented")
        L.append(f"| {sname} | {c['elements']:,} | {100 * c.get('identical', 1):.2f}% | "
                 f"{fmt(c.get('max_abs_diff'))} | {fmt(c.get('p999_abs_diff'))} | {c['outside_tolerance']} | "
                 + (f"{aug['rows']} rows: {fmt(aug['mean_abs_diff'])} / {fmt(aug['max_abs_diff'])} |" if aug
                    else "— |"))
    L += ["", "Tolerance: " + " ".join(compare_split.__doc__.split("\n", 1)[1].split())]
    return L


def markdown(doc):
    L = ["# melforge GPU check", ""]
    b = doc["bundle"]
    L.append(f"Generated {doc['generated_utc']} on `{doc['host']['hostname']}` ({doc['host']['cpus']} CPUs). "
             f"Bundle of commit `{b['commit'][:12]}`{' (with uncommitted changes)' if b.get('dirty') else ''}, "
             f"built {b['built_utc']}, LibTorch {b['torch_version']}, CUDA architectures `{b['cuda_architectures']}`.")
    L.append("")
    if doc["gpu"]:
        for g in doc["gpu"]:
            L.append(f"GPU: **{g['name']}**, driver {g['driver_version']}, compute capability {g['compute_cap']}, "
                     f"{g['memory.total']} MiB, PCI {g['pci.bus_id']}.")
    else:
        L.append(f"No CUDA device: {doc['no_gpu_reason']}. Every GPU step is skipped.")
    t = doc["torch"]
    L.append(f"Python: `{t.get('python')}`, torch {t.get('version') or t.get('import_error') or '—'}"
             + (f" ({t['note']})" if t.get("note") else "") + f"; LibTorch used: `{t.get('lib')}` "
             f"({t.get('lib_source')}); libcudart: `{doc['cudart'].get('used')}` ({doc['cudart'].get('source')}).")
    L.append(f"Steps run: {', '.join(doc['selected_steps'])}.")
    s = doc["summary"]
    L += ["", f"**{s['pass']} passed, {s['fail']} failed, {s['skipped']} skipped.**", "",
          "| step | status | seconds | note |", "| --- | --- | ---: | --- |"]
    for r in doc["steps"]:
        note = (r.get("reason") or "").splitlines()[0][:160] if r.get("reason") else ""
        L.append(f"| {r['title']} | {r['status']} | {r['seconds']} | {note} |")
    steps = {r["name"]: r for r in doc["steps"]}
    for key in ("builder_tests", "trainer_tests"):
        d = steps.get(key, {}).get("details")
        if d:
            L += ["", f"### {steps[key]['title']}", "", f"{d['passed']} passed, {d['failed']} failed, "
                  f"{d['skipped']} skipped."]
            L += [f"- pass: {x}" for x in d["tests"]] + [f"- FAIL: {x}" for x in d["failures"]]
    for key in ("build_cuda", "build_augment_cuda"):
        if steps.get(key, {}).get("details"):
            L += markdown_build(steps[key])
    d = steps.get("mel_throughput", {}).get("details")
    if d:
        p = d["parameters"]
        st = d["stages_median_s"]
        L += ["", "### Mel engine throughput", "",
              f"{p['segments']:,} segments of {p['segment_samples']} samples ({p['n_frames']} frames, n_fft "
              f"{p['n_fft']}, hop {p['hop_length']}, {p['n_mels']} mels, {p['dtype']}), device batch "
              f"{p['device_batch']}: **{fmt(d['segments_per_s'])} segments/s** host to host "
              f"({fmt(d['files_per_s_at_4_segments_per_file'])} one-second files/s); this machine's CPU engine on "
              f"all cores: {fmt(d['cpu_all_cores_segments_per_s'])} segments/s. The seed's figure, "
              f"{fmt(d['seed_rtx5090_segments_per_s'])} segments/s on an RTX 5090, is for other segment sizes.", "",
              f"Per run (median, seconds; device stages of the two slots overlap): H2D {fmt(st['h2d'])} (host "
              f"gather into pinned memory + copy), compute {fmt(st['compute'])}, D2H {fmt(st['d2h'])}; wall "
              f"{fmt(d['wall_median_s'])}.", "",
              f"Bounds per segment: {d['pcie_bytes_per_segment']:,} bytes over PCIe, "
              f"{d['hbm_bytes_per_segment']['device']:,} bytes of device memory traffic. "
              f"Measured bandwidth: {json.dumps(d['bandwidth'])}. "
              f"HBM bound {fmt(d.get('hbm_bound_segments_per_s'))} segments/s, host-to-device bound "
              f"{fmt(d.get('pcie_bound_segments_per_s'))} segments/s."]
    d = steps.get("trainer", {}).get("details")
    if d:
        L += ["", f"### Trainer ({d['epochs']} epoch(s) each, dataset `{d['dataset']}`)", "", d["note"] + ".", "",
              "| variant | flags | samples/s | data wait | test file accuracy |", "| --- | --- | ---: | ---: | ---: |"]
        for n, r in d["runs"].items():
            L.append(f"| {n} | `{r['flags']}` | {fmt(r.get('samples_per_s'))} | {fmt(r.get('data_wait_fraction'))} | "
                     f"{fmt(r.get('test_file_accuracy'))} |")
    return "\n".join(L) + "\n"


# --- the interpreter, the GPUs, the arguments --------------------------------------------------------------------
PROBE = f"""
import json, site, sys
r = {{"python_version": sys.version.split()[0]}}
for m in ("numpy", "h5py", "torch"):
    try:
        mod = __import__(m)
        r[m] = str(mod.__version__)
        if m == "torch":
            r["torch_file"] = mod.__file__
    except Exception as e:
        r[m] = None
        r[m + "_error"] = f"{{type(e).__name__}}: {{e}}"
print({PROBE_MARKER!r} + json.dumps(r))
"""


def pick_cudart(dirs, bundled_dir):
    """The libcudart the programs load: the first of `dirs` that holds one of the sonames in bundled_dir (the bundle's
    lib-cudart/), so that LibTorch and melforge share this machine's CUDA runtime; else the bundle's, with "add": the
    folder to append to LD_LIBRARY_PATH. {"used": path, "source": where from[, "add": folder]}; {} when the bundle
    carries none."""
    bundled = sorted(glob.glob(os.path.join(bundled_dir, "libcudart.so*")))
    names = [os.path.basename(f) for f in bundled]
    machine = next((os.path.join(d, n) for d in dirs for n in names if os.path.exists(os.path.join(d, n))), None)
    if machine:
        return {"used": machine, "source": "this machine"}
    if bundled:
        return {"used": bundled[0], "source": "the bundle (this machine has no " + ", ".join(names) + ")",
                "add": bundled_dir}
    return {}


def read_bundle_meta(bundle):
    """BUNDLE/bundle.json (written by tools/gpu_bundle.sh)."""
    with open(os.path.join(bundle, "bundle.json")) as f:
        return json.load(f)


def query_gpus():
    """(GPUs as nvidia-smi describes them, "") when it lists at least one, else (None, why not)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None, "nvidia-smi not found"
    fields = "name,driver_version,compute_cap,memory.total,pci.bus_id,clocks.max.memory"
    try:
        p = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi: {type(e).__name__}: {e}"
    rows = [r.split(", ") for r in p.stdout.strip().splitlines() if r.strip()]
    if p.returncode != 0 or not rows:
        return None, f"nvidia-smi: {(p.stderr or p.stdout).strip()[:200]}"
    return [dict(zip(fields.split(","), r)) for r in rows], ""


def python_candidates(environ):
    """The interpreters to consider, in order: MELFORGE_PYTHON (':'-separated) when set; else every python3 on PATH
    in PATH's order, then /usr/bin/python3 and /usr/local/bin/python3 where they exist. Each once: two names are the
    same interpreter when their folders resolve to one folder (/bin and /usr/bin); a venv's python3 is a link to the
    system's binary, yet another interpreter, so the file itself is not resolved."""
    if environ.get("MELFORGE_PYTHON"):
        names = [p for p in environ["MELFORGE_PYTHON"].split(":") if p]
    else:
        names = [os.path.join(d or ".", "python3") for d in environ.get("PATH", "").split(":")]
        names = [p for p in names if os.path.isfile(p) and os.access(p, os.X_OK)]
        names += [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.isfile(p)]
    out, seen = [], set()
    for p in names:
        full = shutil.which(p) if os.sep not in p else os.path.abspath(p)
        key = (os.path.realpath(os.path.dirname(full)), os.path.basename(full)) if full else p
        if key not in seen:
            seen.add(key)
            out.append(full or p)
    return out


def probe_python(exe, timeout=180):
    """exe's versions of Python, numpy, h5py and torch (None, and an *_error, for a module it cannot import), where
    its torch lies (torch_file), or {"error": why} when it cannot run."""
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        return {"error": "not an executable file"}
    try:
        p = subprocess.run([exe, "-c", PROBE], capture_output=True, text=True, errors="replace", timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(PROBE_MARKER):
            try:
                return json.loads(line[len(PROBE_MARKER):])
            except ValueError:
                break
    return {"error": f"exit {p.returncode}, no probe output: {(p.stderr or p.stdout).strip()[-200:]}"}


def describe_python(exe, info):
    """One line on what `exe` has, for the messages of choose_python."""
    if "error" in info:
        return f"{exe}: {info['error']}"
    parts = [f"torch {info['torch']}" if info.get("torch") else f"no torch ({info.get('torch_error')})"]
    parts += [f"no {m}" for m in ("numpy", "h5py") if not info.get(m)]
    return f"{exe}: " + ", ".join(parts)


class ChoiceError(Exception):
    """No interpreter can run the check; the message says what was found."""


def choose_python(candidates, torch_version, gpu_present, probe=probe_python):
    """The interpreter for the check: the first candidate with numpy, h5py and torch.__version__ == torch_version
    (the bundle's LibTorch). Without a GPU, when none matches, the first with numpy and h5py, and a note that names the
    versions found. Returns {"python", "info", "matches", "note", "found"}; raises ChoiceError naming every candidate
    and what it has when nothing fits."""
    found = []
    for exe in candidates:
        info = probe(exe)
        found.append((exe, info))
        if info.get("torch") == torch_version and info.get("numpy") and info.get("h5py"):
            return {"python": exe, "info": info, "matches": True, "note": None,
                    "found": [describe_python(e, i) for e, i in found]}
    lines = [describe_python(e, i) for e, i in found] or ["(no candidate: PATH has no python3, MELFORGE_PYTHON unset)"]
    listing = "; ".join(lines)
    if gpu_present:
        raise ChoiceError(f"no python3 has torch {torch_version} (the LibTorch the bundle was built against) with "
                          f"numpy and h5py; found: {listing}. Set MELFORGE_PYTHON to one that has them.")
    usable = next(((e, i) for e, i in found if i.get("numpy") and i.get("h5py")), None)
    if not usable:
        raise ChoiceError(f"no python3 with numpy and h5py; found: {listing}. Set MELFORGE_PYTHON.")
    note = (f"no python3 has torch {torch_version} ({listing}); without a CUDA device only the CPU steps run, "
            "so this one does, with the build machine's LibTorch or MELFORGE_TORCH_LIB")
    return {"python": usable[0], "info": usable[1], "matches": False, "note": note, "found": lines}


def select_steps(spec):
    """The steps `--steps a,b,...` runs: those named, and those whose output they use (STEPS), in STEPS' order.
    None or "" selects every step. Raises ValueError naming unknown or repeated names and the known ones."""
    if not spec:
        return list(STEPS)
    names = [n.strip() for n in spec.split(",")]
    unknown = [n for n in names if n not in STEPS]
    if unknown:
        raise ValueError(f"unknown step(s) {', '.join(repr(n) for n in unknown)} in --steps; the steps are: "
                         + ", ".join(STEPS))
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"step(s) named twice in --steps: {', '.join(repeated)}")
    wanted = set(names)
    for n in names:
        wanted.update(STEPS[n][1])
    return [n for n in STEPS if n in wanted]


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="gpu_check.sh", description=__doc__.splitlines()[0])
    ap.add_argument("report", nargs="?", help="folder for gpu_report.md, gpu_report.json and the logs")
    ap.add_argument("--bundle", help="the bundle's folder (gpu_check.sh passes its own)")
    ap.add_argument("--steps", default="", help="comma-separated steps to run (see --list-steps; default: all); the "
                    "steps whose output a named step uses are added")
    ap.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs of each trainer variant (default {EPOCHS})")
    ap.add_argument("--list-steps", action="store_true", help="print the steps and exit")
    a = ap.parse_args(argv)
    if a.list_steps:
        return a
    try:
        a.selected = select_steps(a.steps)
    except ValueError as e:
        ap.error(str(e))
    if a.epochs < 1:
        ap.error(f"--epochs must be at least 1, not {a.epochs}")
    budget = os.environ.get("MELFORGE_GPU_CHECK_SECONDS", str(BUDGET_S))
    try:
        a.budget_s = float(budget)
    except ValueError:
        a.budget_s = -1.0
    if not a.budget_s > 0:
        ap.error(f"MELFORGE_GPU_CHECK_SECONDS must be a number of seconds above 0, not {budget!r}")
    if not a.report:
        ap.error("REPORT_DIR is required")
    if not a.bundle or not os.path.isfile(os.path.join(a.bundle, "bundle.json")):
        ap.error(f"--bundle {a.bundle!r} is not a bundle of tools/gpu_bundle.sh (no bundle.json)")
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    if a.list_steps:
        for name, (needs_gpu, needs, title) in STEPS.items():
            print(f"{name:20} {'GPU' if needs_gpu else 'CPU'}  {title}"
                  + (f" (uses {', '.join(needs)})" if needs else ""))
        return 0
    meta = read_bundle_meta(a.bundle)
    if CHOSEN_ENV not in os.environ:
        gpus, why = query_gpus()
        try:
            chosen = choose_python(python_candidates(os.environ), meta["torch_version"], bool(gpus))
        except ChoiceError as e:
            print(f"gpu_check: {e}", file=sys.stderr)
            return 1
        print(f"[gpu_check] python: {describe_python(chosen['python'], chosen['info'])}"
              + (" (the bundle's LibTorch version)" if chosen["matches"] else f": {chosen['note']}"), flush=True)
        env = dict(os.environ, **{CHOSEN_ENV: json.dumps(chosen)})
        os.execve(chosen["python"], [chosen["python"], os.path.abspath(__file__), *argv], env)
    c = Check(a.bundle, a.report, a.selected, a.epochs, json.loads(os.environ[CHOSEN_ENV]), a.budget_s)
    c.find_libraries()
    c.find_gpu()
    added = [n for n in a.selected if a.steps and n not in [x.strip() for x in a.steps.split(",")]]
    print(f"[gpu_check] steps: {', '.join(a.selected)}"
          + (f" ({', '.join(added)} added: the steps named use their output)" if added else ""), flush=True)
    tests = os.path.join(c.bundle, "tests")
    builder_tests = [os.path.join(tests, t) for t in sorted(os.listdir(tests)) if not t.startswith("test_trainer")]
    trainer_tests = [os.path.join(tests, t) for t in sorted(os.listdir(tests)) if t.startswith("test_trainer")]
    c.step("device", c.step_device)
    c.step("libraries", c.step_libraries)
    c.step("builder_tests", lambda: c.step_tests(builder_tests, "*", "builder"))
    c.step("trainer_tests", lambda: c.step_tests(trainer_tests, "[cuda]", "trainer"))
    c.step("build_cpu", c.step_build_cpu)
    c.step("build_cuda", c.step_build_cuda)
    c.step("build_augment_cpu", c.step_build_augment_cpu)
    c.step("build_augment_cuda", c.step_build_augment_cuda)
    c.step("mel_throughput", c.step_mel_throughput)
    c.step("trainer", c.step_trainer, title=f"{STEPS['trainer'][2]} ({a.epochs} epoch(s) each)")
    c.step("nccl", c.step_nccl)
    counts = c.write()
    print(f"[gpu_check] {counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped: "
          f"{os.path.join(c.report, 'gpu_report.md')}")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
