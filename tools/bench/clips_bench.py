#!/usr/bin/python3
"""Whole clips (issue 28) against the dense segment layout, side by side in one run: two melforge builds (an old one,
schema 2, and this one, schema 3), alternating old and new on the same corpora.

  builder, demo corpus     tools/make_digits_corpus.py --size full --seed 1 (2,000 files of 0.4-1.1 s) with
                           tools/demo_build.ini; the old binary gets the old layout flags (--num-long 1
                           --long-seconds 1 --short-files pad), the new one refuses them;
  builder, FSD50K-like     tools/make_varlen_corpus.py (240 clips of 0.3-30 s, manifest with splits), builder
                           defaults (the old default keeps --num-long auto of 2 s long segments; the new stores every
                           clip whole), then the new one again under --max-ram 256M and 64M;
  trainer, FSD50K-like     melforge-train train --epochs E on each build's dataset: the old trainer on the old one,
                           the new one with the default tiles view and with --view crops; data wait per epoch.

Per build: files/s and stored audio seconds/s (median over --repeats, the ratio new/old pair by pair), peak RSS
(GNU time's maximum resident set and the report's peak_rss_bytes) against --max-ram + the documented 48 MiB fixed
overhead, the three .h5 files' size on disk, the size in RAM (old: the dense float32 `mel` [F, L, S, M, T] of every
split; new: `frames` [N, M] float32), and the audio stored and dropped (build_report.json). Writes WORK/results.json
and prints markdown tables.

  /usr/bin/python3 tools/bench/clips_bench.py --old-bin DIR [--new-bin BUILD] [--repeats 5] [--epochs 2]
        [--work /tmp/melforge-clips-bench] [--skip-train]

DIR holds the old melforge-build and melforge-train; BUILD is this tree's build folder (default build/). Needs numpy
and h5py (Debian's python3 has both) and GNU time (/usr/bin/time).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import h5py

ROOT = pathlib.Path(__file__).resolve().parents[2]
MIB = 2 ** 20
FIXED_OVERHEAD_MIB = 48  # docs/RELIABILITY.md: what --max-ram does not cover (binary, libraries, HDF5)
OLD_DEMO_FLAGS = ["--long-seconds", "1", "--num-long", "1", "--short-files", "pad"]


def timed(cmd, log):
    """Runs cmd under GNU time; returns (wall s, max RSS bytes). Raises with the log's tail on failure."""
    fmt = "%e %M"
    with open(log, "w") as out:
        p = subprocess.run(["/usr/bin/time", "-f", fmt, "-o", str(log) + ".time"] + cmd, stdout=out, stderr=out)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n" + pathlib.Path(log).read_text()[-2000:])
    wall, rss_kib = pathlib.Path(str(log) + ".time").read_text().split()[-2:]
    return float(wall), int(rss_kib) * 1024


def make_corpora(work):
    digits, varlen = work / "digits", work / "varlen"
    subprocess.run([sys.executable, str(ROOT / "tools/make_digits_corpus.py"), "--out", str(digits), "--size",
                    "full", "--seed", "1"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sys.executable, str(ROOT / "tools/make_varlen_corpus.py"), "--out", str(varlen)], check=True,
                   stdout=subprocess.DEVNULL)
    return digits, varlen


def h5_sizes(folder):
    """Bytes on disk of train/val/test.h5 and bytes of their mel data as float32 in RAM."""
    disk, ram, shapes = 0, 0, {}
    for split in ("train", "val", "test"):
        path = folder / f"{split}.h5"
        disk += path.stat().st_size
        with h5py.File(path, "r") as f:
            name = "frames" if "frames" in f else "mel"
            shape = f[name].shape
            shapes[split] = [name] + list(shape)
            n = 1
            for d in shape:
                n *= d
            ram += 4 * n
    return disk, ram, shapes


def report_figures(folder):
    r = json.loads((folder / "build_report.json").read_text())
    clips = r.get("clips", {})
    return {"files": r["files"]["written"], "total_s": r["total_s"], "peak_rss_report": r["peak_rss_bytes"],
            "audio_s": r["audio_seconds"], "dropped_s": r["dropped_seconds"],
            "stored_s": clips.get("seconds_stored", r["audio_seconds"] - r["dropped_seconds"]),
            "capped": r["files"].get("capped", 0), "padded": r["files"].get("padded", 0),
            "skipped": len(r.get("skipped", []))}


def build_cases(a, digits, varlen):
    new, old = str(a.new_build), str(a.old_bin / "melforge-build")
    demo = ["--config", str(ROOT / "tools/demo_build.ini"), "--input", str(digits), "--device", "cpu",
            "--threads", str(a.threads), "--quiet", "--overwrite"]
    var = ["--manifest", str(varlen / "manifest.csv"), "--device", "cpu", "--threads", str(a.threads), "--quiet",
           "--overwrite"]
    return [
        ("demo", "old", [old] + demo + OLD_DEMO_FLAGS, None),
        ("demo", "new", [new] + demo, None),
        ("varlen", "old", [old] + var, None),
        ("varlen", "new", [new] + var, None),
        ("varlen --num-long 15", "old", [old] + var + ["--num-long", "15"], None),
        ("varlen --max-ram 256M", "new", [new] + var + ["--max-ram", "256M"], 256),
        ("varlen --max-ram 64M", "new", [new] + var + ["--max-ram", "64M"], 64),
    ]


def bench_builds(a, digits, varlen):
    cases = build_cases(a, digits, varlen)
    runs = {(c, v): [] for c, v, _, _ in cases}
    for rep in range(a.repeats + 1):
        for corpus, version, cmd, _ in cases:
            out = a.work / "ds" / f"{corpus.replace(' ', '_')}-{version}"
            wall, rss = timed(cmd + ["--output", str(out)], a.work / "log" / f"build-{corpus.split()[0]}-{version}.log")
            if rep == 0:
                continue  # warm-up: page cache and the binaries' first start
            fig = report_figures(out)
            fig.update(wall=wall, rss=rss)
            runs[(corpus, version)].append(fig)
    rows = []
    for corpus, version, cmd, max_ram in cases:
        out = a.work / "ds" / f"{corpus.replace(' ', '_')}-{version}"
        rs = runs[(corpus, version)]
        disk, ram, shapes = h5_sizes(out)
        med = lambda k: statistics.median(r[k] for r in rs)
        rows.append({"corpus": corpus, "version": version, "command": " ".join(cmd), "runs": rs,
                     "files": rs[0]["files"], "wall_s": med("wall"), "total_s": med("total_s"),
                     "files_per_s": statistics.median(r["files"] / r["total_s"] for r in rs),
                     "stored_audio_s_per_s": statistics.median(r["stored_s"] / r["total_s"] for r in rs),
                     "rss_mib": max(r["rss"] for r in rs) / MIB,
                     "rss_report_mib": max(r["peak_rss_report"] for r in rs) / MIB,
                     "max_ram_mib": max_ram, "disk_bytes": disk, "ram_bytes": ram, "shapes": shapes,
                     "audio_s": rs[0]["audio_s"], "stored_s": rs[0]["stored_s"], "dropped_s": rs[0]["dropped_s"],
                     "capped": rs[0]["capped"], "padded": rs[0]["padded"], "skipped": rs[0]["skipped"]})
    for corpus in ("demo", "varlen"):
        o = runs[(corpus, "old")]
        n = runs[(corpus, "new")]
        ratios = [nn["files"] / nn["total_s"] / (oo["files"] / oo["total_s"]) for oo, nn in zip(o, n)]
        walls = [oo["wall"] / nn["wall"] for oo, nn in zip(o, n)]
        for r in rows:
            if r["corpus"] == corpus and r["version"] == "new":
                r["ratio_files_per_s"] = statistics.median(ratios)
                r["ratio_wall"] = statistics.median(walls)
    return rows


def epoch_records(run):
    recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return [r for r in recs if r.get("type") == "epoch"]


def test_file_accuracy(run):
    test = json.loads((run / "report.json").read_text()).get("test", {})
    return test.get("file", {}).get("accuracy", test.get("file_accuracy"))


def bench_train(a):
    new_train, old_train = str(a.new_train), str(a.old_bin / "melforge-train")
    base = ["--epochs", str(a.epochs), "--threads", str(a.threads), "--overwrite", "--positive-class", "none"]
    cases = [("old, tiles (its segments)", [old_train, "train", "--data", str(a.work / "ds/varlen-old")] + base),
             ("new, tiles (default)", [new_train, "train", "--data", str(a.work / "ds/varlen-new")] + base),
             ("new, --view crops", [new_train, "train", "--data", str(a.work / "ds/varlen-new"), "--view", "crops"]
              + base)]
    rows = []
    for i, (name, cmd) in enumerate(cases):
        run = a.work / "runs" / f"train{i}"
        wall, rss = timed(cmd + ["--out", str(run)], a.work / "log" / f"train{i}.log")
        eps = epoch_records(run)
        rows.append({"case": name, "command": " ".join(cmd), "wall_s": wall, "rss_mib": rss / MIB,
                     "examples_per_epoch": round(eps[-1]["samples_per_s"] * eps[-1]["train_s"]),
                     "samples_per_s": [e["samples_per_s"] for e in eps],
                     "data_wait_pct": [100 * e["data_wait_fraction"] for e in eps],
                     "test_file_accuracy": test_file_accuracy(run)})
    return rows


def fmt_build(rows):
    lines = ["| corpus | build | files | files/s | stored audio s/s | new/old files/s | peak RSS (time / report) "
             "| --max-ram + 48 MiB | .h5 on disk | float32 in RAM | audio stored / dropped | capped / padded / skipped |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        cap = f"{r['max_ram_mib'] + FIXED_OVERHEAD_MIB} MiB" if r["max_ram_mib"] else ""
        ratio = f"{r['ratio_files_per_s']:.2f}" if "ratio_files_per_s" in r else ""
        lines.append(f"| {r['corpus']} | {r['version']} | {r['files']} | {r['files_per_s']:,.0f} | "
                     f"{r['stored_audio_s_per_s']:,.0f} | {ratio} | {r['rss_mib']:.0f} / {r['rss_report_mib']:.0f} MiB | "
                     f"{cap} | {r['disk_bytes'] / MIB:.2f} MiB | {r['ram_bytes'] / MIB:.2f} MiB | "
                     f"{r['stored_s']:.1f} / {r['dropped_s']:.1f} s of {r['audio_s']:.1f} s | "
                     f"{r['capped']} / {r['padded']} / {r['skipped']} |")
    return "\n".join(lines)


def fmt_train(rows):
    lines = ["| trainer | examples/epoch | samples/s per epoch | data wait % per epoch | wall s | test file accuracy |",
             "| --- | ---: | --- | --- | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['examples_per_epoch']} | "
                     f"{', '.join(f'{s:,.0f}' for s in r['samples_per_s'])} | "
                     f"{', '.join(f'{w:.3f}' for w in r['data_wait_pct'])} | {r['wall_s']:.1f} | {r['test_file_accuracy']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-bin", type=pathlib.Path, required=True, help="folder of the old melforge-build/-train")
    ap.add_argument("--new-bin", type=pathlib.Path, default=ROOT / "build", help="this tree's build folder")
    ap.add_argument("--repeats", type=int, default=5, help="counted builds of each case (after one warm-up)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/melforge-clips-bench"))
    ap.add_argument("--skip-train", action="store_true")
    a = ap.parse_args()
    a.new_build = a.new_bin / "builder" / "melforge-build"
    a.new_train = a.new_bin / "trainer" / "melforge-train"
    for sub in ("log", "ds", "runs"):
        (a.work / sub).mkdir(parents=True, exist_ok=True)
    start = time.time()
    digits, varlen = make_corpora(a.work)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs", flush=True)
    results = {"load_before": os.getloadavg(), "builds": bench_builds(a, digits, varlen)}
    print(f"load average after builds: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print(fmt_build(results["builds"]), flush=True)
    if not a.skip_train:
        results["train"] = bench_train(a)
        print(f"load average after training: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(fmt_train(results["train"]))
    results["load_after"] = os.getloadavg()
    results["seconds"] = time.time() - start
    (a.work / "results.json").write_text(json.dumps(results, indent=1))
    print(f"{results['seconds']:.0f} s; {a.work / 'results.json'}")


if __name__ == "__main__":
    main()
