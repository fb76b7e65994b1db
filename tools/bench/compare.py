"""Side-by-side comparison of melforge against its fair Python peers (issue 4). Run through tools/bench/compare.sh,
which finds the binaries and the Python environment. Every process runs under GNU time (/usr/bin/time -v) for its
wall time and peak RSS; every figure is the median over --repeats runs (scaling rows: one run each). Prints the
table of ratios with the issue's targets and writes results.json and results.md into --results.
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
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def log(msg):
    print(f"[compare {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, cwd=None, env=None):
    """Runs cmd under /usr/bin/time -v; returns (stdout, wall s, peak RSS bytes). Raises on failure."""
    tf = os.path.join(WORK, "time.txt")
    full = ["/usr/bin/time", "-v", "-o", tf] + [str(c) for c in cmd]
    p = subprocess.run(full, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"compare: command failed ({p.returncode}): {' '.join(str(c) for c in cmd)}")
    t = open(tf).read()
    m = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", t)
    wall = (int(m.group(1) or 0) * 3600 + int(m.group(2)) * 60 + float(m.group(3)))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", t).group(1)) * 1024
    return p.stdout, wall, rss


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def corpus(size_name, seed, copies):
    """1x: make_digits_corpus; Nx: N hard-linked copies of the 1x corpus under <class>/cK/."""
    base = os.path.join(WORK, f"corpus-{size_name}-s{seed}")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_digits_corpus.py"), "--out", base,
                    "--size", size_name, "--seed", str(seed)], check=True, stdout=subprocess.DEVNULL)
    if copies == 1:
        return base
    out = os.path.join(WORK, f"corpus-{size_name}-s{seed}-x{copies}")
    if not os.path.exists(os.path.join(out, ".complete")):
        shutil.rmtree(out, ignore_errors=True)
        for cls in sorted(os.listdir(base)):
            src = os.path.join(base, cls)
            if not os.path.isdir(src):
                continue
            for k in range(copies):
                shutil.copytree(src, os.path.join(out, cls, f"c{k}"), copy_function=os.link)
        open(os.path.join(out, ".complete"), "w").close()
    return out


def audio_files(root):
    return sorted(p for p in glob.glob(os.path.join(root, "**", "*.wav"), recursive=True))


def mf_build(corpus_dir, out, threads, extra=()):
    _, wall, rss = run([A.build_bin, "--config", INI, "--input", corpus_dir, "--output", out, "--overwrite",
                        "--quiet", "--threads", threads, "--device", "cpu", *extra])
    rep = json.load(open(os.path.join(out, "build_report.json")))
    return {"total_s": rep["total_s"], "wall_s": wall, "rss": rss, "files": rep["files"]["written"],
            "frames": rep["clips"]["frames"], "audio_seconds": rep["audio_seconds"], "times": rep["times_s"]}


def py_build(corpus_dir, out, threads):
    shutil.rmtree(out, ignore_errors=True)
    _, wall, rss = run([A.python, os.path.join(HERE, "py_builder.py"), "build", "--input", corpus_dir, "--output",
                        out, "--threads", threads])
    rep = json.load(open(os.path.join(out, "py_build_report.json")))
    return {"total_s": rep["total_s"], "wall_s": wall, "rss": rss, "files": rep["files"]["written"],
            "frames": rep["clips"]["frames"], "times": rep["times_s"]}


def speakers_dataset(size_name):
    """make_speakers_corpus.py's corpus of `size_name`, built by melforge-build with --split-by class (open set),
    2 s segments, 40 mel bands. Returns the dataset folder."""
    corpus_dir = os.path.join(WORK, f"speakers-{size_name}")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_speakers_corpus.py"), "--out", corpus_dir,
                    "--size", size_name], check=True, stdout=subprocess.DEVNULL)
    ds = os.path.join(WORK, f"ds-speakers-{size_name}")
    run([A.build_bin, "--input", corpus_dir, "--output", ds, "--overwrite", "--quiet", "--threads", 2, "--device",
         "cpu", "--split-by", "class", "--short-seconds", 2, "--n-mels", 40])
    return ds


def help_mentions(cmd, word):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return word in p.stdout


def verification(row, extra, quick, R):
    """Issue 19's row: `melforge-train train --task verification` against py_verification.py, same dataset, model
    (resnet-se, quarter width), batch 64, epochs and threads; samples/s is each run's median over the epochs after
    the first. Skipped (with a row saying why) when the builder has no --split-by; the Python side alone runs when
    melforge-train has no --task verification."""
    name = "verification training samples/s, resnet-se quarter width, batch 64"
    if not help_mentions([A.build_bin, "--help"], "--split-by"):
        row(name, None, None, "samples/s", note="skipped: melforge-build has no --split-by")
        return
    size, epochs = ("small", 2) if quick else ("full", 3)
    ds = speakers_dataset(size)
    has_task = help_mentions([A.train_bin, "train", "--help"], "verification")
    common = ["--data", ds, "--model", "resnet-se", "--width", "quarter", "--epochs", epochs, "--batch-size", 64,
              "--threads", 2]
    mf_runs, py_runs = [], []
    for r in range(R):
        if has_task:
            rd = os.path.join(WORK, "run-mf-verification")
            _, wall, rss = run([A.train_bin, "train", "--task", "verification", *common, "--out", rd, "--overwrite",
                                "--device", "cpu", "--log-level", "warn"])
            lines = [j for j in (json.loads(x) for x in open(os.path.join(rd, "metrics.jsonl")) if x.strip())
                     if j.get("type", "epoch") == "epoch"]
            rep = json.load(open(os.path.join(rd, "report.json")))
            rates = [x["samples_per_s"] for x in lines]
            mf_runs.append({"samples_per_s": med(rates[1:] or rates), "wall_s": wall, "rss": rss,
                            "test_eer": rep["test"]["verification"]["eer_percent"]})
        pd = os.path.join(WORK, "run-py-verification")
        _, wall, rss = run([A.python, os.path.join(HERE, "py_verification.py"), "train", *common, "--out", pd,
                            "--workers", A.py_workers])
        rep = json.load(open(os.path.join(pd, "py_report.json")))
        py_runs.append({"samples_per_s": rep["samples_per_s"], "wall_s": wall, "rss": rss,
                        "test_eer": rep["test"]["verification"]["eer_percent"]})
        log(f"verification run {r}: melforge {mf_runs[-1]['samples_per_s'] if mf_runs else float('nan'):.1f}, "
            f"python {py_runs[-1]['samples_per_s']:.1f} samples/s")
    ms = med([x["samples_per_s"] for x in mf_runs])
    ps = med([x["samples_per_s"] for x in py_runs])
    row(f"{name}, {epochs} epochs, 2 threads", ms, ps, "samples/s", ms / ps if ms else None, "(same model and loss)",
        None, f"speakers corpus '{size}', --split-by class, 2 s segments; python DataLoader workers {A.py_workers}"
        + ("" if has_task else "; melforge-train has no --task verification"))
    row("verification test EER", med([x["test_eer"] for x in mf_runs]), med([x["test_eer"] for x in py_runs]), "%",
        None, "(same)", None, "10000 seeded balanced trials (fewer when the split has fewer pairs)")
    extra["verification"] = {"melforge": mf_runs, "python": py_runs}


def write_results(rows, extra, scaling, quick, R, epochs):
    """Prints the table and writes results.json and results.md into --results."""
    machine = {"cpu": platform.processor() or "", "cores": os.cpu_count(), "uname": " ".join(platform.uname()),
               "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "load_avg_at_end": os.getloadavg(), "quick": quick, "repeats": R, "epochs": epochs}
    try:
        machine["cpu"] = next(x.split(":", 1)[1].strip() for x in open("/proc/cpuinfo") if x.startswith("model name"))
    except StopIteration:
        pass
    json.dump({"machine": machine, "rows": rows, "details": extra}, open(os.path.join(A.results, "results.json"), "w"),
              indent=2)

    def fmt(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"
        return str(v)

    md = [f"Machine: {machine['cpu']}, {machine['cores']} cores; {machine['date']}; repeats {R}"
          f"{' (--quick)' if quick else ''}; load average at the end {machine['load_avg_at_end'][0]:.2f}", "",
          "| metric | melforge | Python peer | unit | ratio | target | result | note |",
          "| --- | ---: | ---: | --- | ---: | --- | --- | --- |"]
    for r in rows:
        res = "" if r["pass"] is None else ("pass" if r["pass"] else "MISS")
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        md.append(f"| {r['metric']} | {fmt(r['melforge'])} | {fmt(r['python'])} | {r['unit']} | {ratio} | "
                  f"{r['target'] or ''} | {res} | {r['note']} |")
    if scaling:
        md += ["", "Scaling of the builder (one run each; internal total seconds, files/s):", "",
               "| corpus | tool | threads | files | seconds | files/s | peak RSS MiB |",
               "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for s in scaling:
        md.append(f"| {s['scale']}x | {s['tool']} | {s['threads']} | {s['files']} | {s['total_s']:.3f} | "
                  f"{s['files'] / s['total_s']:,.0f} | {s['rss'] / 2**20:.0f} |")
    text = "\n".join(md) + "\n"
    open(os.path.join(A.results, "results.md"), "w").write(text)
    print(text)
    print(f"results: {A.results}/results.json, results.md")


def main():
    global A, WORK, HERE, INI
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--results", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--build-bin", required=True)
    ap.add_argument("--train-bin", required=True)
    ap.add_argument("--bench-dir", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--py-workers", type=int, default=1)
    ap.add_argument("--only", choices=["verification"], default=None, help="run only this comparison")
    A = ap.parse_args()
    HERE = os.path.dirname(os.path.abspath(__file__))
    INI = os.path.join(ROOT, "tools", "demo_build.ini")
    WORK = A.work
    os.makedirs(WORK, exist_ok=True)
    os.makedirs(A.results, exist_ok=True)
    quick = A.quick
    R = A.repeats or (1 if quick else 3)
    epochs = A.epochs or (2 if quick else 8)
    size = "small" if quick else "full"
    scales = [1, 4] if quick else [1, 4, 16]
    mel_segments = 2000 if quick else 8000
    py = A.python
    rows, extra = [], {}

    def row(name, melforge, python, unit, ratio=None, target=None, ok=None, note=""):
        rows.append({"metric": name, "melforge": melforge, "python": python, "unit": unit, "ratio": ratio,
                     "target": target, "pass": ok, "note": note})

    if A.only == "verification":
        verification(row, extra, quick, R)
        write_results(rows, extra, [], quick, R, epochs)
        return

    log(f"corpus ({size}, scales {scales})")
    corpora = {s: corpus(size, 1, s) for s in scales}
    c1 = corpora[1]

    # 1. mel engine alone, bare FFT, torch (torchaudio's op sequence) and Debian's torchaudio 0.13
    mel = {}
    for th in (1, 2):
        sig = os.path.join(WORK, "signal.f32")
        ref = os.path.join(WORK, "mel_ref.f32")
        out, _, _ = run([os.path.join(A.bench_dir, "melforge-bench-mel"), "--segments", mel_segments, "--threads", th,
                         "--repeats", max(R, 3), "--dump-audio", sig, "--dump-mel", ref,
                         "--out", os.path.join(WORK, "mel.json")])
        m = json.load(open(os.path.join(WORK, "mel.json")))
        best = None
        for batch in (64, 1024):
            run([py, os.path.join(HERE, "py_mel.py"), "--audio", sig, "--segments", mel_segments, "--threads", th,
                 "--batch", batch, "--repeats", max(R, 3), "--check-mel", ref, "--out", os.path.join(WORK, "pm.json")])
            pm = json.load(open(os.path.join(WORK, "pm.json")))
            if best is None or pm["segments_per_s"] > best["segments_per_s"]:
                best = pm
        ta = None
        if subprocess.run(["/usr/bin/python3", "-c", "import torchaudio"], capture_output=True).returncode == 0:
            run(["/usr/bin/python3", os.path.join(HERE, "py_mel.py"), "--impl", "torchaudio", "--audio", sig,
                 "--segments", mel_segments, "--threads", th, "--batch", best["batch"], "--repeats", max(R, 3),
                 "--check-mel", ref, "--out", os.path.join(WORK, "ta.json")])
            ta = json.load(open(os.path.join(WORK, "ta.json")))
        mel[th] = {"melforge": m, "torch": best, "torchaudio013": ta}
        e, f = m["engine"]["segments_per_s"], m["fft"]["segments_per_s"]
        row(f"mel engine vs torch MelSpectrogram, {th} thread(s)", e, best["segments_per_s"], "segments/s",
            e / best["segments_per_s"], ">= 10x", e / best["segments_per_s"] >= 10,
            f"torch batch {best['batch']}; max |diff| {best['max_abs_diff_db_vs_melforge']:.1e} dB")
        if ta:
            row(f"mel engine vs torchaudio 0.13 (Debian), {th} thread(s)", e, ta["segments_per_s"], "segments/s",
                e / ta["segments_per_s"], "(reference)", None)
        row(f"mel engine time / bare FFTW r2c time, {th} thread(s)", m["engine"]["median_s"], m["fft"]["median_s"],
            "s", m["engine_over_fft"], "<= 1.5", m["engine_over_fft"] <= 1.5,
            f"FFT {m['fft']['frames_per_s']:.0f} frames/s")
        run([os.path.join(A.bench_dir, "melforge-bench-mel"), "--segments", mel_segments, "--threads", th,
             "--repeats", max(R, 3), "--engine-pool-segments", m["fft_pool_segments"],
             "--out", os.path.join(WORK, "mel_pool.json")])
        mp = json.load(open(os.path.join(WORK, "mel_pool.json")))
        mel[th]["melforge_cached_input"] = mp
        row(f"mel engine time / bare FFTW r2c time, input cycled over the FFT's {m['fft_pool_segments']} segments, "
            f"{th} thread(s)", mp["engine"]["median_s"], mp["fft"]["median_s"], "s", mp["engine_over_fft"],
            "(input from cache, not RAM)", None)
        log(f"mel {th} thread(s): engine {e:.0f}, fft {f:.0f}, torch {best['segments_per_s']:.0f} segments/s")
    extra["mel"] = mel

    # 2. builder end to end, 1x, 2 threads and 1 thread; physical limits
    for th in (2, 1):
        mfs = [mf_build(c1, os.path.join(WORK, "ds-mf"), th) for _ in range(R)]
        pys = [py_build(c1, os.path.join(WORK, "ds-py"), th) for _ in range(R)]
        mt, pt = med([r["total_s"] for r in mfs]), med([r["total_s"] for r in pys])
        mw, pw = med([r["wall_s"] for r in mfs]), med([r["wall_s"] for r in pys])
        nf = mfs[0]["files"]
        row(f"builder end to end, {th} thread(s)", nf / mt, pys[0]["files"] / pt, "files/s",
            (nf / mt) / (pys[0]["files"] / pt), ">= 10x" if th == 2 else "", (nf / mt) / (pys[0]["files"] / pt) >= 10
            if th == 2 else None, f"process wall incl. interpreter start: {mw:.2f} s vs {pw:.2f} s "
                                  f"({pw / mw:.1f}x)")
        row(f"builder peak RSS, {th} thread(s)", med([r["rss"] for r in mfs]) / 2**20,
            med([r["rss"] for r in pys]) / 2**20, "MiB", None, None, None)
        extra[f"builder_{th}"] = {"melforge": mfs, "python": pys}
        log(f"builder {th} thread(s): melforge {mt:.3f} s, python {pt:.3f} s")
    mf1 = extra["builder_2"]["melforge"][0]
    decoded = mf1["audio_seconds"] * 16000 * 4
    outbuf = mf1["frames"] * 64 * 2
    rss = med([r["rss"] for r in extra["builder_2"]["melforge"]])
    row("builder peak RSS / (decoded audio + output buffers)", rss / 2**20, (decoded + outbuf) / 2**20, "MiB",
        rss / (decoded + outbuf), "<= 1.3", rss / (decoded + outbuf) <= 1.3,
        "2nd column: decoded audio (whole corpus, float32) + output (float16), not Python; RSS includes the "
        "binary's libraries")

    files = audio_files(c1)
    cats = []
    for _ in range(R):
        t = time.perf_counter()
        with open(os.devnull, "wb") as dn:
            for i in range(0, len(files), 500):
                subprocess.run(["cat", *files[i:i + 500]], stdout=dn, check=True)
        cats.append(time.perf_counter() - t)
    raw = 0.0
    for split in ("train", "val", "test"):
        run([os.path.join(A.bench_dir, "melforge-bench-h5"), "--input", os.path.join(WORK, "ds-mf", f"{split}.h5"),
             "--scratch", WORK, "--threads", 2, "--repeats", R, "--out", os.path.join(WORK, f"h5_{split}.json")])
        raw += json.load(open(os.path.join(WORK, f"h5_{split}.json")))["raw"]["median_s"]
    mt = med([r["total_s"] for r in extra["builder_2"]["melforge"]])
    floor = med(cats) + raw
    row("builder time / (cat files + raw HDF5 write)", mt, floor, "s", mt / floor, "(physical limit)", None,
        f"cat {med(cats):.3f} s (page cache), raw write {raw:.3f} s")

    # melforge-build's own bench mode: each stage alone on the same corpus, then a whole build
    run([A.build_bin, "bench", "--config", INI, "--input", c1, "--threads", 2, "--device", "cpu", "--repeats", R,
         "--bench-files", 0, "--quiet", "--scratch", WORK, "--bench-out", os.path.join(WORK, "build_bench.json")])
    bb = json.load(open(os.path.join(WORK, "build_bench.json")))
    st = bb["stages"]
    row("melforge-build bench: sum of stage medians / end to end, 2 threads", bb["sum_of_stages_s"],
        st["end_to_end"]["median_s"], "s", bb["overlap"], "(overlap; > 1: stages overlap)", None,
        "; ".join(f"{k} {st[k]['median_s']:.3f}" for k in ("decode", "mel", "compress", "write")) + " s")
    extra["build_bench"] = bb

    # 3. HDF5 write: parallel-compressed vs h5py gzip, same level and chunks
    h5 = {}
    for th in (2, 1):
        run([os.path.join(A.bench_dir, "melforge-bench-h5"), "--input", os.path.join(WORK, "ds-mf", "train.h5"),
             "--scratch", WORK, "--threads", th, "--repeats", R, "--out", os.path.join(WORK, f"h5w{th}.json")])
        h5[th] = json.load(open(os.path.join(WORK, f"h5w{th}.json")))
    run([py, os.path.join(HERE, "py_builder.py"), "h5write", "--input", os.path.join(WORK, "ds-mf", "train.h5"),
         "--repeats", R, "--out", os.path.join(WORK, "h5py.json")])
    hp = json.load(open(os.path.join(WORK, "h5py.json")))
    for th in (2, 1):
        r_ = hp["gzip"]["median_s"] / h5[th]["melforge"]["median_s"]
        row(f"HDF5 write, level 4 + shuffle: melforge {th} thread(s) vs h5py gzip", h5[th]["melforge"]["mb_per_s"],
            hp["gzip"]["mb_per_s"], "MB/s", r_, ">= 1.7x" if th == 2 else "", r_ >= 1.7 if th == 2 else None,
            f"raw write {h5[th]['raw']['mb_per_s']:.0f} MB/s (C), {hp['raw']['mb_per_s']:.0f} MB/s (h5py)")
    extra["h5"] = {"melforge": h5, "h5py": hp}

    # 4. trainer: same dataset (melforge's), same model, hyperparameters, batch, epochs
    ds = os.path.join(WORK, "ds-mf")
    mf_runs, py_runs = [], []
    for r in range(R):
        rd = os.path.join(WORK, "run-mf")
        _, wall, rss = run([A.train_bin, "train", "--data", ds, "--out", rd, "--overwrite", "--epochs", epochs,
                            "--positive-class", "seven", "--threads", 2, "--device", "cpu", "--log-level", "warn"])
        lines = [j for j in (json.loads(x) for x in open(os.path.join(rd, "metrics.jsonl")) if x.strip())
                 if j.get("type", "epoch") == "epoch"]
        rep = json.load(open(os.path.join(rd, "report.json")))
        ts = sum(x["train_s"] for x in lines)
        mf_runs.append({"samples_per_s": sum(x["samples_per_s"] * x["train_s"] for x in lines) / ts,
                        "wait": sum(x["data_wait_fraction"] * x["train_s"] for x in lines) / ts,
                        "test_acc": rep["test"]["tiles"]["accuracy"], "test_file_acc": rep["test"]["file"]["accuracy"],
                        "wall_s": wall, "rss": rss})
        pd = os.path.join(WORK, "run-py")
        _, wall, rss = run([py, os.path.join(HERE, "py_trainer.py"), "train", "--data", ds, "--out", pd, "--epochs",
                            epochs, "--positive-class", "seven", "--threads", 2, "--workers", A.py_workers])
        rep = json.load(open(os.path.join(pd, "py_report.json")))
        py_runs.append({"samples_per_s": rep["samples_per_s"], "wait": rep["data_wait_fraction"],
                        "test_acc": rep["test_accuracy"], "test_file_acc": rep["test_file_accuracy"],
                        "wall_s": wall, "rss": rss, "rss_self": rep["peak_rss_bytes"]["self"],
                        "rss_worker": rep["peak_rss_bytes"]["children"]})
        log(f"trainer run {r}: melforge {mf_runs[-1]['samples_per_s']:.0f}, python {py_runs[-1]['samples_per_s']:.0f}"
            " samples/s")
    ms, ps = med([x["samples_per_s"] for x in mf_runs]), med([x["samples_per_s"] for x in py_runs])
    row(f"trainer samples/s, batch 64, {epochs} epochs, 2 threads", ms, ps, "samples/s", ms / ps, ">= 1.3x",
        ms / ps >= 1.3, f"python DataLoader workers {A.py_workers}")
    mwait = med([x["wait"] for x in mf_runs])
    row("trainer data wait / step time", 100 * mwait, 100 * med([x["wait"] for x in py_runs]), "%", None, "< 3%",
        mwait < 0.03)
    row("final test accuracy, segment", med([x["test_acc"] for x in mf_runs]), med([x["test_acc"] for x in py_runs]),
        "", None, "same", None)
    row("final test accuracy, file", med([x["test_file_acc"] for x in mf_runs]),
        med([x["test_file_acc"] for x in py_runs]), "", None, "same", None)
    row("trainer peak RSS", med([x["rss"] for x in mf_runs]) / 2**20, med([x["rss"] for x in py_runs]) / 2**20,
        "MiB", None, None, None, "python: main process + largest worker: "
        f"{med([x['rss_self'] for x in py_runs]) / 2**20:.0f} + {med([x['rss_worker'] for x in py_runs]) / 2**20:.0f}")
    extra["trainer"] = {"melforge": mf_runs, "python": py_runs}

    # model step on tensors in place (both sides alternately, R times, 200 steps after 20 warmup steps), and
    # melforge-train with glibc's default allocator (MELFORGE_MALLOC=default: the version before configure_allocator)
    steps, warm = (30, 5) if quick else (200, 20)
    default_malloc = dict(os.environ, MELFORGE_MALLOC="default")
    for th in (2, 1):
        tbs, pbs, tds = [], [], []
        for r in range(R):
            run([A.train_bin, "bench", "--data", ds, "--steps", steps, "--warmup-steps", warm, "--threads", th,
                 "--device", "cpu", "--positive-class", "seven", "--out", os.path.join(WORK, f"tb{th}.json"),
                 "--log-level", "warn"])
            tbs.append(json.load(open(os.path.join(WORK, f"tb{th}.json"))))
            run([py, os.path.join(HERE, "py_trainer.py"), "bench-step", "--data", ds, "--steps", steps,
                 "--warmup-steps", warm, "--threads", th, "--out", os.path.join(WORK, f"pb{th}.json")])
            pbs.append(json.load(open(os.path.join(WORK, f"pb{th}.json"))))
            run([A.train_bin, "bench", "--data", ds, "--steps", steps, "--warmup-steps", warm, "--threads", th,
                 "--device", "cpu", "--positive-class", "seven", "--out", os.path.join(WORK, f"td{th}.json"),
                 "--log-level", "warn"], env=default_malloc)
            tds.append(json.load(open(os.path.join(WORK, f"td{th}.json"))))
        t_step = med([x["train_step"]["samples_per_s"] for x in tbs])
        p_step = med([x["samples_per_s"] for x in pbs])
        d_step = med([x["train_step"]["samples_per_s"] for x in tds])
        row(f"training step on a batch in place, {th} thread(s)", t_step, p_step, "samples/s", t_step / p_step,
            "(same ATen kernels)", None, f"{steps} steps after {warm} warmup, {R} runs alternating")
        row(f"training step, melforge-train tuned allocator vs glibc default, {th} thread(s)", t_step, d_step,
            "samples/s", t_step / d_step, "(before/after)", None, "2nd column: MELFORGE_MALLOC=default")
        if th == 2:
            t_eval = med([x["evaluation"]["files_per_s"] for x in tbs])
            d_eval = med([x["evaluation"]["files_per_s"] for x in tds])
            row("evaluation (bench, val), tuned allocator vs glibc default, 2 threads", t_eval, d_eval, "files/s",
                t_eval / d_eval, "(before/after)", None, "2nd column: MELFORGE_MALLOC=default")
            row("trainer samples/s / its own step on tensors in place", ms, t_step,
                "samples/s", ms / t_step, "(physical limit)", None)
        extra[f"trainer_bench_{th}"] = {"melforge": tbs, "python": pbs, "melforge_glibc_default_malloc": tds}

    # Same work on both sides: `melforge-train eval` reads the split into RAM before its timer and times one (cold)
    # pass; py_trainer.py eval reads it into RAM before its timer too, and its files_per_s is its first (cold) pass.
    # melforge-train bench times the second of two passes over val (warm): its Python peer is the second of two
    # passes over val (files_per_s_warm).
    ck = os.path.join(WORK, "run-mf", "checkpoints", "best.pt")
    me, pe_s, pe_b, pe_w = [], [], [], []
    for _ in range(R):
        _, wall, _ = run([A.train_bin, "eval", "--checkpoint", ck, "--data", ds, "--split", "test", "--threads", 2,
                          "--device", "cpu", "--out", os.path.join(WORK, "eval.json"), "--log-level", "warn"])
        e = json.load(open(os.path.join(WORK, "eval.json")))
        me.append({"files_per_s": e["files_per_s"], "wall_s": wall, "file_acc": e["file"]["accuracy"]})
        for mode, dst in (("sequential", pe_s), ("batched", pe_b)):
            _, wall, _ = run([py, os.path.join(HERE, "py_trainer.py"), "eval", "--checkpoint", ck, "--data", ds,
                              "--split", "test", "--mode", mode, "--threads", 2,
                              "--out", os.path.join(WORK, "pe.json")])
            pe = json.load(open(os.path.join(WORK, "pe.json")))
            dst.append({"files_per_s": pe["files_per_s"], "files_per_s_with_load": pe["files_per_s_with_load"],
                        "wall_s": wall, "file_acc": pe["file_accuracy"]})
        run([py, os.path.join(HERE, "py_trainer.py"), "eval", "--checkpoint", ck, "--data", ds, "--split", "val",
             "--mode", "sequential", "--passes", 2, "--threads", 2, "--out", os.path.join(WORK, "pw.json")])
        pw = json.load(open(os.path.join(WORK, "pw.json")))
        pe_w.append({"files_per_s": pw["files_per_s_warm"], "file_acc": pw["file_accuracy"]})
    mfe = med([x["files_per_s"] for x in me])
    for mode, lst in (("sequential (per file)", pe_s), ("batched", pe_b)):
        pf = med([x["files_per_s"] for x in lst])
        seq = mode.startswith("seq")
        row(f"file-level eval vs Python {mode} (test split in RAM on both sides, one cold pass)", mfe, pf, "files/s",
            mfe / pf, ">= 5x" if seq else "", mfe / pf >= 5 if seq else None,
            f"process wall {med([x['wall_s'] for x in me]):.2f} s vs {med([x['wall_s'] for x in lst]):.2f} s; "
            f"Python with its load {med([x['files_per_s_with_load'] for x in lst]):.0f} files/s; "
            f"file accuracy {me[0]['file_acc']:.4f} vs {lst[0]['file_acc']:.4f}")
    t_eval = med([x["evaluation"]["files_per_s"] for x in extra["trainer_bench_2"]["melforge"]])
    pf_warm = med([x["files_per_s"] for x in pe_w])
    row("forward pass alone (melforge-train bench: evaluation of val on tensors in place, 2 threads, warm second "
        "pass) vs Python sequential (val in RAM, warm second pass)", t_eval, pf_warm, "files/s", t_eval / pf_warm,
        "(physical limit)", None, "no evaluator of this model on this CPU can pass the forward pass alone")
    extra["eval"] = {"melforge": me, "python_sequential": pe_s, "python_batched": pe_b,
                     "python_sequential_val_warm": pe_w}

    # 4b. verification training (issue 19)
    verification(row, extra, quick, R)

    # 5. scaling: builder against corpus size and threads (one run each)
    scaling = []
    for s in scales:
        for th in (1, 2):
            m = mf_build(corpora[s], os.path.join(WORK, f"ds-mf-x{s}"), th)
            scaling.append({"scale": s, "threads": th, "tool": "melforge", **{k: m[k] for k in
                                                                              ("files", "total_s", "wall_s", "rss")}})
        p = py_build(corpora[s], os.path.join(WORK, f"ds-py-x{s}"), 2)
        scaling.append({"scale": s, "threads": 2, "tool": "python", **{k: p[k] for k in
                                                                        ("files", "total_s", "wall_s", "rss")}})
        shutil.rmtree(os.path.join(WORK, f"ds-mf-x{s}"), ignore_errors=True)
        shutil.rmtree(os.path.join(WORK, f"ds-py-x{s}"), ignore_errors=True)
        log(f"scaling {s}x done")
    extra["scaling"] = scaling

    write_results(rows, extra, scaling, quick, R, epochs)

if __name__ == "__main__":
    main()
