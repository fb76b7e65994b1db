"""Verifies every CUDA path of melforge from a bundle of tools/gpu_bundle.sh; run through gpu_check.sh.

Writes REPORT/gpu_report.json (every step: status pass / fail / skipped, reason, seconds, figures) and
REPORT/gpu_report.md (the same for a person), plus the raw outputs of each step under REPORT/logs/ (also packed as
REPORT/gpu_logs.tar.gz). A machine
without a CUDA device (no nvidia-smi, or one that lists no GPU) gets "skipped: no CUDA device" for every GPU step
and exit status 0; the steps that need no GPU (the bundle's libraries, a CPU build of the corpus) still run, so
that the bundle cannot rot where CI runs it. Any failed step gives exit status 1.

Needs numpy and h5py; torch is used when importable (to find LibTorch and measure the device's copy bandwidth).
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET

import h5py
import numpy as np

NO_GPU = "skipped: no CUDA device"
SKIP_MARKER = "MELFORGE-SKIPPED:"
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
EPOCHS = 3
CORPUS_COPIES = 20  # the bundled 100-file corpus, hard-linked 20 times: 2,000 files, 8,000 segments


class Check:
    """Runs the steps, records them and writes the report."""

    def __init__(self, bundle, report):
        self.bundle = os.path.abspath(bundle)
        self.report = os.path.abspath(report)
        self.logs = os.path.join(self.report, "logs")
        self.work = os.path.join(self.report, "work")
        os.makedirs(self.logs, exist_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)
        os.makedirs(self.work)
        self.meta = json.load(open(os.path.join(self.bundle, "bundle.json")))
        self.steps = []
        self.gpu = None
        self.no_gpu_reason = ""
        self.env = dict(os.environ)
        self.torch = {}
        budget = float(os.environ.get("MELFORGE_GPU_CHECK_SECONDS", "540"))
        self.deadline = time.time() + budget

    # --- running things ---------------------------------------------------------------------------------------
    def run(self, name, argv, timeout=240, check=True):
        """Runs argv with the bundle's environment; its output goes to logs/NAME.log. Returns (rc, output). The
        timeouts keep the whole check inside the 10 minutes a GPU machine's command may run."""
        t0 = time.time()
        timeout = max(1.0, min(timeout, self.deadline - t0))
        try:
            p = subprocess.run(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               errors="replace", timeout=timeout, cwd=self.work)
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

    def step(self, name, title, fn, needs_gpu=True):
        """Runs one step and records its outcome: fn returns the step's details, or raises StepError to fail it."""
        print(f"[gpu_check] {title} ...", flush=True)
        t0 = time.time()
        rec = {"name": name, "title": title, "needs_gpu": needs_gpu}
        if needs_gpu and self.gpu is None:
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
        """LD_LIBRARY_PATH: the bundle's libraries, LibTorch's, the CUDA libraries beside it, the CUDA toolkit's."""
        torch_lib = os.environ.get("MELFORGE_TORCH_LIB", "")
        try:
            import torch  # noqa: F401  (the GPU image's python3 has it)
            torch_lib = torch_lib or os.path.join(os.path.dirname(torch.__file__), "lib")
            self.torch = {"version": torch.__version__, "cuda": torch.version.cuda, "python": sys.executable}
        except Exception as e:
            self.torch = {"import_error": f"{type(e).__name__}: {e}"}
        if not torch_lib and os.path.isdir(self.meta.get("torch_lib_on_build_machine", "")):
            torch_lib = self.meta["torch_lib_on_build_machine"]
        self.torch["lib"] = torch_lib
        # LibTorch's folder first: its libgomp.so.1 then serves every program, as it serves the trainer where it is
        # built (the RUNPATH lists it); the bundle's own libgomp only where no LibTorch was found.
        dirs = [torch_lib] if torch_lib else []
        dirs.append(os.path.join(self.bundle, "lib"))
        if torch_lib:
            nvidia = os.path.join(os.path.dirname(os.path.dirname(torch_lib)), "nvidia")
            if os.path.isdir(nvidia):
                dirs += sorted(os.path.join(nvidia, d, "lib") for d in os.listdir(nvidia)
                               if os.path.isdir(os.path.join(nvidia, d, "lib")))
        dirs += [d for d in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib") if os.path.isdir(d)]
        old = os.environ.get("LD_LIBRARY_PATH", "")
        self.env["LD_LIBRARY_PATH"] = ":".join(dirs + ([old] if old else []))
        rc, out = self.run("probe", [os.path.join(self.bundle, "bin", "melforge-build"), "--help"], check=False)
        self.compat = rc != 0 and ("GLIBCXX" in out or "GCC_" in out)
        if self.compat:
            self.env["LD_LIBRARY_PATH"] += ":" + os.path.join(self.bundle, "lib-compat")

    def find_gpu(self):
        """Fills self.gpu from nvidia-smi, or self.no_gpu_reason."""
        smi = shutil.which("nvidia-smi")
        if not smi:
            self.no_gpu_reason = "nvidia-smi not found"
            return
        fields = "name,driver_version,compute_cap,memory.total,pci.bus_id,clocks.max.memory"
        p = subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True,
                           text=True)
        rows = [r.split(", ") for r in p.stdout.strip().splitlines() if r.strip()]
        if p.returncode != 0 or not rows:
            self.no_gpu_reason = f"nvidia-smi: {(p.stderr or p.stdout).strip()[:200]}"
            return
        self.gpu = [dict(zip(fields.split(","), r)) for r in rows]
        with open(os.path.join(self.logs, "nvidia-smi.txt"), "w") as f:
            f.write(subprocess.run([smi], capture_output=True, text=True).stdout)

    # --- steps --------------------------------------------------------------------------------------------------
    def step_device(self):
        d = {"gpus": self.gpu, "torch": self.torch, "lib_compat_used": self.compat}
        if "version" in self.torch and not self.torch["version"].startswith(self.meta["torch_version"]):
            raise StepError(f"this machine's torch is {self.torch['version']}, the bundle was built against "
                            f"{self.meta['torch_version']}: melforge-train needs the same LibTorch")
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
        return {"ld_library_path": allowed_dirs}

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

    def build(self, device):
        out = os.path.join(self.work, f"dataset-{device}")
        argv = [os.path.join(self.bundle, "bin", "melforge-build"), "--config",
                os.path.join(self.bundle, "data", "build.ini"), "--input", self.replicated_corpus(), "--output", out,
                "--overwrite", "--device", device]
        t0 = time.time()
        self.run(f"build-{device}", argv)
        report = json.load(open(os.path.join(out, "build_report.json")))
        return out, report, time.time() - t0

    def step_build_cpu(self):
        out, report, seconds = self.build("cpu")
        self.cpu_dataset = out
        return {"engine": report["engine"], "files": report["files"]["written"], "segments": report["segments"],
                "wall_s": round(seconds, 2), "files_per_s": report["throughput"]["files_per_s"]}

    def step_build_cuda(self):
        out, report, seconds = self.build("cuda")
        self.cuda_dataset = out
        if not report["engine"].startswith("cuda"):
            raise StepError(f"build_report.json says engine {report['engine']!r} for --device cuda")
        if not getattr(self, "cpu_dataset", None):
            raise StepError("the CPU build failed, nothing to compare with")
        d = {"engine": report["engine"], "files": report["files"]["written"], "segments": report["segments"],
             "wall_s": round(seconds, 2), "files_per_s": report["throughput"]["files_per_s"],
             "mel_times_s": report.get("times_s", {}), "device_buffer_bytes": report.get("device_buffer_bytes"),
             "engine_choice": report.get("engine_choice")}
        d["comparison"] = {s: compare_split(os.path.join(self.cpu_dataset, f"{s}.h5"),
                                            os.path.join(out, f"{s}.h5")) for s in ("train", "val", "test")}
        bad = {s: c for s, c in d["comparison"].items() if c["outside_tolerance"] or c["metadata_differs"]}
        if bad:
            raise StepError("CUDA and CPU datasets differ beyond the tolerance: " + json.dumps(bad))
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
        """Device-to-device and host-to-device copy bandwidth measured with torch, when it is importable."""
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
        if "version" not in self.torch:
            return {"note": "torch not importable: bandwidth not measured"}
        rc, out = self.run("bandwidth", [sys.executable, "-c", code], check=False)
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
            argv = [train, "train", "--data", data, "--out", out, "--overwrite", "--epochs", str(EPOCHS),
                    "--device", "cuda", "--positive-class", "seven", *flags]
            try:
                self.run(f"train-{name}", argv)
                m = [j for j in (json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip())
                     if j.get("type", "epoch") == "epoch"]
                rep = json.load(open(os.path.join(out, "report.json")))
                check = json.load(open(os.path.join(out, "config.json"))).get("device_check")
                sps = [e["samples_per_s"] for e in m]
                runs[name] = {"flags": " ".join(flags), "device_check": check, "samples_per_s_each_epoch": sps,
                              "samples_per_s": float(np.median(sps[1:] if len(sps) > 1 else sps)),
                              "data_wait_fraction": m[-1].get("data_wait_fraction"),
                              "test_file_accuracy": pick(rep, "test", "file", "accuracy")}
            except StepError as e:
                failed.append(name)
                runs[name] = {"flags": " ".join(flags), "error": str(e)}
        if failed:
            raise StepError(f"trainer variants failed: {', '.join(failed)}: " +
                            " | ".join(runs[n]["error"] for n in failed))
        return {"epochs": EPOCHS, "dataset": os.path.basename(data),
                "note": "samples/s: median over the epochs after the first (warm-up, cuDNN autotuning, capture)",
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
    log = attrs["log"].decode() if isinstance(attrs["log"], bytes) else str(attrs["log"])
    v = v.astype(np.float64)
    if log == "db":
        return np.power(10.0, v * float(attrs["power"]) / 20.0)
    if log == "ln":
        return np.exp(v)
    return v


def compare_split(a_path, b_path):
    """CPU (a) against CUDA (b) value by value. An element agrees when |a - b| <= 2e-3 |a| + 5e-3 (float16 storage
    rounds to 2^-11 relative; float32 FFT rounding adds far less), or when its power differs by at most 1e-6 of the
    power of the loudest bin of its frame (FFTW and cuFFT round differently, and that rounding is relative to the
    frame's energy, not to a quiet bin's)."""
    with h5py.File(a_path, "r") as fa, h5py.File(b_path, "r") as fb:
        meta_same = all(np.array_equal(fa[k][()], fb[k][()]) for k in ("label", "path", "num_valid_long", "class_names"))
        a = fa["mel"][()].astype(np.float32)
        b = fb["mel"][()].astype(np.float32)
        attrs = dict(fa.attrs)
    r = {"shape": list(a.shape), "metadata_differs": not meta_same or a.shape != b.shape}
    if a.shape != b.shape or a.size == 0:
        r.update(elements=int(a.size), outside_tolerance=0 if a.shape == b.shape else -1)
        return r
    diff = np.abs(a - b)
    ok = diff <= 2e-3 * np.abs(a) + 5e-3
    pa, pb = to_power(a, attrs), to_power(b, attrs)
    peak = np.max(pa, axis=-2, keepdims=True)  # [..., n_mels, n_frames]: the loudest band of each frame
    ok |= np.abs(pa - pb) <= 1e-6 * peak
    r.update(elements=int(a.size), identical=float(np.mean(a == b)), max_abs_diff=float(diff.max()),
             mean_abs_diff=float(diff.mean()), p999_abs_diff=float(np.quantile(diff, 0.999)),
             outside_tolerance=int((~ok).sum()))
    if r["outside_tolerance"]:
        i = np.unravel_index(np.argmax(np.where(ok, 0, diff)), a.shape)
        r["worst"] = {"index": [int(x) for x in i], "cpu": float(a[i]), "cuda": float(b[i])}
    return r


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
    L.append(f"torch on this machine: {t.get('version', t.get('import_error', '—'))}; LibTorch used: `{t.get('lib')}`.")
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
    d = steps.get("build_cuda", {}).get("details")
    if d:
        L += ["", "### Build of the corpus: CUDA against CPU", "",
              f"Engine `{d['engine']}`, {d['files']} files, {d['segments']} segments, {d['wall_s']} s "
              f"({fmt(d['files_per_s'])} files/s in the report).", "",
              "| split | elements | identical | max abs diff | 99.9th pct | outside tolerance |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for sname, c in d["comparison"].items():
            L.append(f"| {sname} | {c['elements']:,} | {100 * c.get('identical', 1):.2f}% | "
                     f"{fmt(c.get('max_abs_diff'))} | {fmt(c.get('p999_abs_diff'))} | {c['outside_tolerance']} |")
        L.append("")
        L.append("Tolerance: " + " ".join(compare_split.__doc__.split("\n", 1)[1].split()))
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
        L += ["", f"### Trainer ({d['epochs']} epochs each, dataset `{d['dataset']}`)", "", d["note"] + ".", "",
              "| variant | flags | samples/s | data wait | test file accuracy |", "| --- | --- | ---: | ---: | ---: |"]
        for n, r in d["runs"].items():
            L.append(f"| {n} | `{r['flags']}` | {fmt(r.get('samples_per_s'))} | {fmt(r.get('data_wait_fraction'))} | "
                     f"{fmt(r.get('test_file_accuracy'))} |")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--report", required=True)
    a = ap.parse_args()
    c = Check(a.bundle, a.report)
    c.find_libraries()
    c.find_gpu()
    tests = os.path.join(c.bundle, "tests")
    builder_tests = [os.path.join(tests, t) for t in sorted(os.listdir(tests)) if not t.startswith("test_trainer")]
    trainer_tests = [os.path.join(tests, t) for t in sorted(os.listdir(tests)) if t.startswith("test_trainer")]
    c.step("device", "device, driver and torch", c.step_device)
    c.step("libraries", "bundle's shared libraries resolve", c.step_libraries, needs_gpu=False)
    c.step("builder_tests", "builder [cuda] tests", lambda: c.step_tests(builder_tests, "*", "builder"))
    c.step("trainer_tests", "trainer [cuda] tests", lambda: c.step_tests(trainer_tests, "[cuda]", "trainer"))
    c.step("build_cpu", f"melforge-build --device cpu ({CORPUS_COPIES}x the bundled corpus)", c.step_build_cpu,
           needs_gpu=False)
    c.step("build_cuda", "melforge-build --device cuda, compared with the CPU build", c.step_build_cuda)
    c.step("mel_throughput", "mel engine throughput (melforge-bench-mel)", c.step_mel_throughput)
    c.step("trainer", "melforge-train: fp32, fp16, bf16, CUDA graph, channels-last, --gpu-mem", c.step_trainer)
    c.step("nccl", "melforge-train: 1-rank job through c10d with NCCL", c.step_nccl)
    counts = c.write()
    print(f"[gpu_check] {counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped: "
          f"{os.path.join(c.report, 'gpu_report.md')}")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
