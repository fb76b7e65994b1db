"""The mel peer (issue 4): torchaudio's MelSpectrogram (+ AmplitudeToDB, float16 output as the builder stores) on the
very segments melforge-bench-mel timed (its --dump-audio signal, consecutive segments), batched, on --threads.

  py_mel.py --audio SIGNAL.f32 --segments N [--segment-samples 4000] [--threads T] [--batch 1024] [--repeats R]
            [--impl torch|torchaudio] [--check-mel MEL.f32 --check-segments K] [--out results.json]

--check-mel compares with melforge's float32 spectrograms of the first K segments (max |difference| in dB over
values above -80 dB, where float32 rounding of tiny energies does not dominate) and fails above 0.05 dB.
"""
import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import py_common as pc  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--audio", required=True)
    ap.add_argument("--segments", type=int, required=True)
    ap.add_argument("--segment-samples", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--impl", choices=["torch", "torchaudio"], default="torch")
    ap.add_argument("--config", default=None, help="melforge-build INI (default: tools/demo_build.ini)")
    ap.add_argument("--check-mel", default=None)
    ap.add_argument("--check-segments", type=int, default=64)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    pc.set_threads(a.threads)
    here = os.path.dirname(os.path.abspath(__file__))
    cfg = pc.read_ini(a.config or os.path.join(here, "..", "demo_build.ini"))
    mel = pc.make_mel(cfg, a.impl).eval()
    sig = np.fromfile(a.audio, dtype=np.float32)
    x = torch.from_numpy(sig[: a.segments * a.segment_samples]).view(a.segments, a.segment_samples)
    with torch.inference_mode():
        probe = mel(x[:1])
        out = torch.empty((a.segments,) + tuple(probe.shape[1:]), dtype=torch.float16)
        times = []
        for r in range(a.repeats + 1):
            t0 = time.perf_counter()
            for b in range(0, a.segments, a.batch):
                out[b:b + a.batch] = mel(x[b:b + a.batch])
            if r > 0:
                times.append(time.perf_counter() - t0)
        check = None
        if a.check_mel:
            k = min(a.check_segments, a.segments)
            ref = torch.from_numpy(np.fromfile(a.check_mel, dtype=np.float32)).view(k, *probe.shape[1:])
            ours = mel(x[:k])
            sel = ref > -80
            check = float((ours - ref).abs()[sel].max())
    s = pc.median(times)
    n_frames = probe.shape[-1]
    res = {"impl": a.impl, "torch": torch.__version__, "threads": torch.get_num_threads(), "segments": a.segments,
           "batch": a.batch, "n_frames": n_frames, "seconds": times, "median_s": s, "segments_per_s": a.segments / s,
           "frames_per_s": a.segments * n_frames / s, "max_abs_diff_db_vs_melforge": check}
    print(f"{a.impl} mel (torch {torch.__version__}, {torch.get_num_threads()} thread(s), batch {a.batch}): "
          f"{a.segments} segments: {s:.4f} s, {a.segments / s:.0f} segments/s"
          + (f"; max |diff| vs melforge {check:.4f} dB" if check is not None else ""))
    pc.write_json(a.out, res)
    if check is not None and not check < 0.05:
        pc.log(f"py_mel.py: {a.impl} differs from melforge by {check} dB (> 0.05): not the same computation")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
