#!/usr/bin/python3
"""Writes hostile and odd input files into one class folder of a corpus, for end-to-end and reliability tests.

    make_bad_inputs.py --out CORPUS [--class NAME] [--manifest FILE.json]
                       [--set basic|full] [--rate HZ] [--long-seconds S] [--short-seconds S]

--set basic (the default) writes the seven files below into CORPUS/<class>/ (the class folder is created if
needed; by default the first existing sub-folder of CORPUS in sorted order):

    name                      what it is                                   what melforge's decoder does
    bad_empty.wav             zero bytes                                   AudioError "empty file"
    bad_text.wav              a text file named .wav                       AudioError "not an audio file: ..."
    bad_truncated_header.wav  the first 30 bytes of a valid WAV            AudioError "not an audio file: ..."
    bad_nan.wav               32-bit float WAV, NaN at sample 1234         AudioError "NaN sample at frame 1234 ..."
                              and +Inf at sample 4000
    bad_dir.wav/              an empty directory named like a WAV          AudioError "is a directory" (if scanned)
    ok_short_0.05s.wav        valid 16 kHz mono 16-bit, 0.05 s (800        decodes; the builder stores it whole (a
                              frames)                                      few frames), like every short clip
    ok_stereo_44k.wav         valid 44.1 kHz stereo 16-bit, 1 s, two       decodes: mixed down to mono and resampled
                              different tones                              to 16 kHz (16000 frames)

--set full writes the basic set plus every case of issue 5's "Hostile and odd audio" list (the very long file
larger than --max-ram excepted: the tests write it at run time into a temporary folder). The build these files are
meant for runs at --rate Hz with --long-seconds / --short-seconds segments (defaults 16000, 1.0, 0.25): they fix the
length of ok_one_long_segment.wav (exactly one long segment at --rate) and bad_shorter_than_short.wav (half a short
segment). The full set adds:

    bad_inf.wav                  float WAV, +Inf at frame 100                  skipped "Inf sample"
    bad_claims_more_frames.flac  FLAC cut in half: STREAMINFO claims more     skipped "truncated"
                                 frames than the stream holds
    bad_shorter_than_short.wav   half a short segment (the default tile)     written whole (nothing is skipped for
                                                                              being short)
    bad_unreadable.wav           valid WAV, mode 000                          skipped "permission denied" (only when
                                                                              the build does not run as root)
    ok_truncated_data.wav        16-bit WAV cut inside its data chunk, on an  written: libsndfile clamps the frame
                                 odd byte (the RIFF/data sizes claim more)    count to the whole frames present
    ok_u8.wav ok_s24.wav ok_f32.wav ok_f64.wav   8-bit, 24-bit, float, double written
    ok_ch1.wav ... ok_ch8.wav    1 to 8 channels (sox writes WAVE_FORMAT_     written (mixed down)
                                 EXTENSIBLE above 2)
    ok_rate_8000.wav ... ok_rate_96000.wav  8, 11.025, 16, 22.05, 32, 44.1,   written (resampled)
                                 48, 88.2 and 96 kHz
    ok_flac.flac ok_ogg.ogg      FLAC 16-bit and Ogg Vorbis                   written
    ok_one_long_segment.wav      exactly --long-seconds at --rate             written whole, no padding
    ok_silence.wav               all zeros                                    written
    ok_clipped_square.wav        a square wave at full scale (+32767/-32768)  written
    ok name with spaces.wav      a name with spaces                           written
    ok_nön_äscii_音.wav          a non-ASCII (UTF-8) name                      written
    link_ok.wav                  relative symbolic link to ok_f32.wav         written (as link_ok.wav)
    link_loop.wav                symbolic link to itself                      skipped "symbolic link"
    link_dangling.wav            symbolic link to a missing file              skipped "broken symbolic link"
    link_dir_loop/               symbolic link to its own folder (a loop)     skipped "symbolic link loop" (links to
                                                                              folders are followed, each folder once)
    bad_unreadable_dir/          a folder with mode 000 holding a valid WAV   skipped "cannot read folder: permission
                                                                              denied" (only when not run as root)
    sub/ok_nested.wav            a valid WAV in a sub-folder of the class     written
    ._ok_f32.wav .DS_Store       AppleDouble and Finder files (hidden)        "hidden": ignored, counted in the report
    .hidden_dir/ok_hidden.wav    a valid WAV in a hidden folder               "hidden" (the folder, unread)

--manifest writes the table as JSON: {"class", "folder", "set", "files": [{"name", "path", "kind", "expect",
"reason", "build", "build_reason"}, ...]}. "expect" is what audio::decode does with the path ("error", with a
substring of the message in "reason", or "ok"); "build" is what melforge-build does with the entry ("written" into a
split, "skipped" with a substring of the skip reason in "build_reason", or "hidden": listed in the report's
"hidden" paths, unread, for a name starting with '.' or inside such a folder, where "name" is the hidden entry).
Short clips are "written": melforge-build stores every clip whole. Entries with "needs_non_root": true
(bad_unreadable.wav, bad_unreadable_dir) are only unreadable to a user other than root.

Everything is deterministic (sox runs with -D, no dither; the random Ogg stream serial number is rewritten to 1 and
the page checksums recomputed); existing files of these names are replaced. Needs Debian's python3 and numpy, and
/usr/bin/sox for --set full.
"""
import argparse
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import wave

import numpy as np


def pcm16_wav_bytes(samples, rate, channels):
    """A 16-bit PCM WAV of interleaved float samples in [-1, 1), as bytes (Python's wave module)."""
    pcm = np.clip(np.round(np.asarray(samples) * 32767.0), -32768, 32767).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def float32_wav_bytes(samples, rate):
    """A mono WAVE_FORMAT_IEEE_FLOAT (format tag 3) WAV, written with struct since `wave` only writes PCM."""
    data = np.asarray(samples, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    fact = struct.pack("<I", len(samples))
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"fact" + struct.pack("<I", len(fact)) + fact
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def tone(freq, seconds, rate, amp=0.5):
    t = np.arange(int(round(seconds * rate))) / rate
    return amp * np.sin(2 * np.pi * freq * t)


def ogg_crc(data):
    """The Ogg page checksum: CRC-32, polynomial 0x04c11db7, not reflected, initial value and final xor 0."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
    return crc


def fix_ogg_serial(data, serial=1):
    """Rewrites the stream serial number of every Ogg page to `serial` and recomputes the page checksums."""
    out = bytearray(data)
    pos = 0
    while pos + 27 <= len(out):
        if out[pos:pos + 4] != b"OggS":
            raise ValueError("not an Ogg page at byte %d" % pos)
        nseg = out[pos + 26]
        body = sum(out[pos + 27:pos + 27 + nseg])
        end = pos + 27 + nseg + body
        out[pos + 14:pos + 18] = struct.pack("<I", serial)
        out[pos + 22:pos + 26] = b"\0\0\0\0"
        out[pos + 22:pos + 26] = struct.pack("<I", ogg_crc(out[pos:end]))
        pos = end
    return bytes(out)


def sox_bytes(samples, rate, channels, out_ext, out_args):
    """Runs sox on interleaved float32 `samples` and returns the file it writes (extension `out_ext`)."""
    sox = shutil.which("sox") or "/usr/bin/sox"
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "in.f32")
        out = os.path.join(tmp, "out." + out_ext)
        np.asarray(samples, dtype="<f4").tofile(raw)
        cmd = [sox, "-D", "-r", str(rate), "-e", "floating-point", "-b", "32", "-c", str(channels), "-t", "raw", raw]
        subprocess.run(cmd + out_args + [out], check=True)
        with open(out, "rb") as f:
            return f.read()


def write(path, data):
    remove(path)
    with open(path, "wb") as f:
        f.write(data)


def remove(path):
    if os.path.islink(path):
        os.remove(path)
    elif os.path.isdir(path):
        os.chmod(path, 0o755)
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.chmod(path, 0o644)
        os.remove(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="corpus root holding one folder per class")
    ap.add_argument("--class", dest="cls", default=None,
                    help="class folder to write into (default: the first existing sub-folder of --out)")
    ap.add_argument("--manifest", default=None, help="also write what was written, and the expected outcome, as JSON")
    ap.add_argument("--set", dest="which", choices=["basic", "full"], default="basic",
                    help="basic: the seven files of the demo; full: every case of issue 5's hostile-audio list")
    ap.add_argument("--rate", type=int, default=16000, help="sample rate of the build the files are meant for, Hz")
    ap.add_argument("--long-seconds", type=float, default=1.0, help="long segment of that build, seconds")
    ap.add_argument("--short-seconds", type=float, default=0.25, help="short segment of that build, seconds")
    args = ap.parse_args()

    root = os.path.abspath(args.out)
    cls = args.cls
    if cls is None:
        subdirs = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))) if os.path.isdir(
            root) else []
        if not subdirs:
            sys.exit(f"make_bad_inputs: {root} has no class folder; pass --class NAME")
        cls = subdirs[0]
    folder = os.path.join(root, cls)
    os.makedirs(folder, exist_ok=True)

    rate = 16000
    files = []

    def add(name, kind, expect, reason, data=None, directory=False, build=None, build_reason=None, link=None,
            mode=None):
        path = os.path.join(folder, name)
        if directory:
            if os.path.lexists(path) and not (os.path.isdir(path) and not os.path.islink(path)):
                remove(path)
            os.makedirs(path, exist_ok=True)
        elif link is not None:
            remove(path)
            os.symlink(link, path)
        else:
            write(path, data)
        if mode is not None:
            os.chmod(path, mode)
        if build is None:
            build = "written" if expect == "ok" else "skipped"
        entry = {"name": name, "path": path, "kind": kind, "expect": expect, "reason": reason, "build": build,
                 "build_reason": reason if build_reason is None else build_reason}
        if mode == 0:
            entry["needs_non_root"] = True
        files.append(entry)

    add("bad_empty.wav", "zero-byte file", "error", "empty file", b"")
    add("bad_text.wav", "text file named .wav", "error", "not an audio file",
        b"This is a text file, not audio. melforge must skip it with a clear message.\n" * 4)
    valid = pcm16_wav_bytes(tone(440.0, 0.5, rate), rate, 1)
    add("bad_truncated_header.wav", "WAV cut after 30 bytes, inside its fmt chunk", "error", "not an audio file",
        valid[:30])
    bad = tone(330.0, 0.5, rate).astype(np.float32)
    bad[1234] = np.nan
    bad[4000] = np.inf
    add("bad_nan.wav", "float WAV with NaN (sample 1234) and Inf (sample 4000)", "error",
        "NaN sample at frame 1234", float32_wav_bytes(bad, rate))
    add("bad_dir.wav", "directory named like a WAV file", "error", "is a directory", directory=True)
    add("ok_short_0.05s.wav", "valid 16 kHz mono, 0.05 s (800 frames)", "ok", "",
        pcm16_wav_bytes(tone(500.0, 0.05, rate), rate, 1))
    stereo = np.stack([tone(300.0, 1.0, 44100), tone(600.0, 1.0, 44100, 0.3)], axis=1).ravel()
    add("ok_stereo_44k.wav", "valid 44.1 kHz stereo, 1 s (44100 frames; 16000 after resampling)", "ok", "",
        pcm16_wav_bytes(stereo, 44100, 2))

    if args.which == "full":
        r = args.rate
        sec = 1.0
        base = tone(440.0, sec, r)
        inf = tone(350.0, 0.5, r).astype(np.float32)
        inf[100] = np.inf
        add("bad_inf.wav", "float WAV with +Inf at frame 100", "error", "Inf sample at frame 100",
            float32_wav_bytes(inf, r))
        flac = sox_bytes(base, r, 1, "flac", ["-b", "16"])
        add("bad_claims_more_frames.flac", "FLAC cut in half: the header claims more frames than are present",
            "error", "truncated", flac[:len(flac) // 2])
        add("bad_shorter_than_short.wav", "half a short segment at the build's rate", "ok", "",
            pcm16_wav_bytes(tone(500.0, 0.5 * args.short_seconds, r), r, 1))
        add("bad_unreadable.wav", "valid WAV with mode 000 (unreadable unless root)", "error", "permission denied",
            pcm16_wav_bytes(base, r, 1), mode=0)
        whole = pcm16_wav_bytes(base, r, 1)
        add("ok_truncated_data.wav", "16-bit WAV cut inside its data chunk on an odd byte (sizes claim more)", "ok",
            "", whole[:44 + 2 * (3 * r // 5) + 1])
        for name, enc in [("ok_u8.wav", ["-e", "unsigned-integer", "-b", "8"]),
                          ("ok_s24.wav", ["-e", "signed-integer", "-b", "24"]),
                          ("ok_f32.wav", ["-e", "floating-point", "-b", "32"]),
                          ("ok_f64.wav", ["-e", "floating-point", "-b", "64"])]:
            add(name, "WAV " + " ".join(enc[1:]), "ok", "", sox_bytes(base, r, 1, "wav", enc))
        for ch in range(1, 9):
            multi = np.stack([tone(200.0 + 50 * c, sec, r, 0.4) for c in range(ch)], axis=1).ravel()
            add(f"ok_ch{ch}.wav", f"16-bit WAV with {ch} channels", "ok", "",
                sox_bytes(multi, r, ch, "wav", ["-e", "signed-integer", "-b", "16"]))
        for native in [8000, 11025, 16000, 22050, 32000, 44100, 48000, 88200, 96000]:
            add(f"ok_rate_{native}.wav", f"16-bit WAV at {native} Hz", "ok", "",
                pcm16_wav_bytes(tone(440.0, sec, native), native, 1))
        add("ok_flac.flac", "FLAC 16-bit", "ok", "", flac)
        add("ok_ogg.ogg", "Ogg Vorbis", "ok", "", fix_ogg_serial(sox_bytes(base, r, 1, "ogg", ["-C", "3"])))
        long_samples = int(round(args.long_seconds * r))
        add("ok_one_long_segment.wav", f"exactly one long segment ({long_samples} frames at {r} Hz)", "ok", "",
            pcm16_wav_bytes(tone(600.0, long_samples / r, r), r, 1))
        add("ok_silence.wav", "all-zero 16-bit WAV", "ok", "", pcm16_wav_bytes(np.zeros(r), r, 1))
        square = np.where(np.sin(2 * np.pi * 100.0 * np.arange(r) / r) >= 0, 1.5, -1.5)
        add("ok_clipped_square.wav", "square wave clipped at full scale (+32767/-32768)", "ok", "",
            pcm16_wav_bytes(square, r, 1))
        add("ok name with spaces.wav", "file name with spaces", "ok", "", pcm16_wav_bytes(tone(700.0, sec, r), r, 1))
        add("ok_nön_äscii_音.wav", "non-ASCII UTF-8 file name", "ok", "", pcm16_wav_bytes(tone(800.0, sec, r), r, 1))
        add("link_ok.wav", "relative symbolic link to ok_f32.wav", "ok", "", link="ok_f32.wav")
        add("link_loop.wav", "symbolic link to itself", "error", "too many levels of symbolic links",
            link="link_loop.wav", build_reason="symbolic link")
        add("link_dangling.wav", "symbolic link to a missing file", "error", "no such file",
            link="does_not_exist.wav", build_reason="broken symbolic link")
        add("link_dir_loop", "symbolic link to its own folder (a directory loop)", "error", "is a directory",
            link=".", build_reason="symbolic link loop")
        add("bad_unreadable_dir", "folder with mode 000 holding a valid WAV (unreadable unless root)", "error",
            "is a directory", directory=True, build="skipped", build_reason="cannot read folder: permission denied")
        write(os.path.join(folder, "bad_unreadable_dir", "inside.wav"), pcm16_wav_bytes(base, r, 1))
        os.chmod(os.path.join(folder, "bad_unreadable_dir"), 0)
        files[-1]["needs_non_root"] = True
        os.makedirs(os.path.join(folder, "sub"), exist_ok=True)
        add("sub/ok_nested.wav", "valid WAV in a sub-folder of the class folder", "ok", "",
            pcm16_wav_bytes(tone(440.0, sec, r), r, 1))
        add("._ok_f32.wav", "AppleDouble companion file (hidden)", "error", "not an audio file",
            b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        ", build="hidden")
        add(".DS_Store", "Finder metadata (hidden)", "error", "not an audio file", b"\x00\x00\x00\x01Bud1",
            build="hidden")
        os.makedirs(os.path.join(folder, ".hidden_dir"), exist_ok=True)
        write(os.path.join(folder, ".hidden_dir", "ok_hidden.wav"), pcm16_wav_bytes(base, r, 1))
        add(".hidden_dir", "hidden folder holding a valid WAV", "error", "is a directory", directory=True,
            build="hidden")

    if args.manifest:
        with open(args.manifest, "w") as f:
            json.dump({"class": cls, "folder": folder, "set": args.which, "files": files}, f, indent=1,
                      ensure_ascii=False)
    print(f"make_bad_inputs: wrote {len(files)} entries into {folder}")
    for e in files:
        outcome = "ok" if e["expect"] == "ok" else f"error '{e['reason']}'"
        print(f"  {e['name']:<28} {e['kind']} -> {outcome}; build: {e['build']}")


if __name__ == "__main__":
    main()
