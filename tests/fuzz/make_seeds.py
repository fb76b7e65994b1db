#!/usr/bin/python3
"""Writes the seed corpora of the libFuzzer targets into tests/fuzz/corpus/<target>/ (deterministic; small files).

    make_seeds.py [--out tests/fuzz/corpus]

fuzz_decode seeds are 4 parameter bytes (see fuzz_decode.cpp) followed by a short audio file made with sox: WAV
8/16/24-bit, float and double, 1 to 3 channels, 8 to 44.1 kHz, FLAC, Ogg Vorbis, AIFF, AU, plus a truncated header,
a text file and a float WAV at +-3e38 (near the float maximum). fuzz_manifest and fuzz_config seeds are text files;
fuzz_dataset seeds are the valid split files of each schema unedited (4 bytes: FuzzedDataProvider reads them from the
end: schema, classes, clips, cache), pseudo-random bytes (the target decodes any bytes into edits of a valid
split file), and one hostile storage edit each (issue 29: external storage in a file and a FIFO, virtual sources
that are the file itself, outside its folder or missing, 1 GiB and 64 KiB + 1 fixed strings, a 2 GiB chunk).
Needs sox (Debian's sox package). Existing seeds of the same names are replaced; others are left alone.
"""
import argparse
import random
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from make_bad_inputs import fix_ogg_serial  # noqa: E402  (the random Ogg serial number, rewritten to 1)


def sox(args, suffix):
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / ("x" + suffix)
        subprocess.run(["sox", "-D", "-n", *args[:-1], str(out), *args[-1]], check=True)
        return out.read_bytes()


def float_wav(samples, rate):
    data = b"".join(struct.pack("<f", s) for s in samples)
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def claimed_channels_wav(channels, frames, rate=8000):
    """A 16-bit WAV whose fmt chunk claims `channels` channels, with `frames` frames of a ramp."""
    data = b"".join(struct.pack("<h", (i * 37) % 2000 - 1000) for i in range(channels * frames))
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def decode_seeds():
    def synth(seconds, freq="440"):
        return ["synth", seconds, "sine", freq]

    seeds = {
        "wav16_mono_8k": (bytes([0, 0, 0x00, 1]), sox(["-r", "8000", "-c", "1", "-b", "16", synth("0.12")], ".wav")),
        "wav_u8_stereo_11k": (bytes([1, 1, 0x05, 0]), sox(["-r", "11025", "-c", "2", "-b", "8", "-e", "unsigned",
                                                          synth("0.06")], ".wav")),
        "wav24_3ch_16k": (bytes([0, 3, 0x04, 2]), sox(["-r", "16000", "-c", "3", "-b", "24", synth("0.04")], ".wav")),
        "wav_f32_22k": (bytes([3, 0, 0x01, 1]), sox(["-r", "22050", "-c", "1", "-b", "32", "-e", "floating-point",
                                                    synth("0.03")], ".wav")),
        "wav_f64_8k": (bytes([1, 0, 0x11, 0]), sox(["-r", "8000", "-c", "1", "-b", "64", "-e", "floating-point",
                                                   synth("0.05")], ".wav")),
        "flac_16k": (bytes([0, 0, 0x00, 0]), sox(["-r", "16000", "-c", "1", "-b", "16", synth("0.1")], ".flac")),
        "ogg_8k": (bytes([1, 0, 0x01, 0]), fix_ogg_serial(sox(["-r", "8000", "-c", "1", synth("0.15")], ".ogg"))),
        "aiff_8k": (bytes([0, 0, 0x00, 0]), sox(["-r", "8000", "-c", "1", "-b", "16", synth("0.05")], ".aiff")),
        "au_8k": (bytes([2, 0, 0x00, 0]), sox(["-r", "8000", "-c", "1", "-b", "16", synth("0.05")], ".au")),
        "float_near_max_44k": (bytes([0, 0, 0x00, 0]),
                               float_wav([3e38 if (i // 3) % 2 else -3e38 for i in range(2205)], 44100)),
    }
    # Issue 15: a decode chunk of 65,536 frames x channels made these allocate 256 MiB (the seed replay runs with
    # -malloc_limit_mb=64, tests/fuzz/CMakeLists.txt).
    seeds["wav_1024ch_claim"] = (bytes([0, 0, 0x00, 0]), claimed_channels_wav(1024, 12))
    seeds["wav_4096ch_claim"] = (bytes([0, 0, 0x00, 0]), claimed_channels_wav(4096, 2))
    wav = seeds["wav16_mono_8k"][1]
    seeds["truncated_header"] = (bytes([0, 0, 0, 0]), wav[:30])
    seeds["text"] = (bytes([0, 0, 0, 0]), b"this is not audio\n")
    return {name: prefix + body for name, (prefix, body) in seeds.items()}


def manifest_seeds():
    return {
        "basic.csv": b"path,label,split\na.wav,leak,train\nb.wav,noise,val\n/abs/c.wav,leak,test\n",
        "quoted.csv": b'"a, b.wav","le""ak"\n"c.wav",noise,\n',
        "bom_crlf.csv": b"\xef\xbb\xbfpath,label\r\nx.wav,a\r\n\r\n  \r\ny.wav,b\r\n",
        "duplicate.csv": b"a.wav,x\na.wav,y\n",
        "bad_split.csv": b"a.wav,x,holdout\n",
        "unterminated.csv": b'"a.wav,x\n',
        "fields.csv": b"a.wav\na.wav,x,train,extra\n,x\na.wav,\n",
        # Issue 15: one file under several spellings (refused), labels with stray spaces (trimmed).
        "spellings.csv": b"c/a/f0.wav,a\n./c/a/f0.wav,a\nc//a/../a/f0.wav,a\n",
        "label_spaces.csv": b"x.wav, a\ny.wav,a \nz.wav,\ta\t,\t test \n",
        # Issue 29: UTF-16 (refused naming the encoding), a NUL in a field, a header by column names, a first byte
        # 0xEF that is no byte order mark.
        "utf16.csv": "path,label\na.wav,x\n".encode("utf-16"),
        "nul.csv": b"a.wav,x\nb\x00.wav,y\n",
        "named_header.csv": b"Class,FileName\nx,a.wav\ny,b.wav\n",
        "ef_not_bom.csv": b"\xef\xbd\xa1.wav,x\n",
    }


def config_seeds():
    return {
        "mel.ini": b"sample-rate = 16000\nn-fft = 512\nwin-length = 400\nhop-length = 160\nn-mels = 64\n"
                   b"f-min = 20\nf-max = 7600\nwindow = hamming\ncenter = false\npad-mode = constant\n"
                   b"power = 1\nmel-scale = slaney\nmel-norm = slaney\nlog = ln\nlog-eps = 1e-6\n",
        "clips.ini": b"short-seconds = 0.5\nmax-seconds = 30\n",
        # The segment layout's flags, refused since schema 3 (InvalidArgument naming --max-seconds).
        "segment.ini": b"long-seconds = 2\nshort-seconds = 0.5\nnum-long = 3\nshort-files = skip\n",
        # Issue 29: prefixes of flags (never taken for the flag).
        "prefix.ini": b"n-mel = 32\nlong-sec = 5\n",
        "build.ini": b"# comment\nsplit = 0.7,0.2,0.1\nseed = 7\nthreads = 2\nmax-ram = 512M\ndtype = float32\n"
                     b"compression-level = 9\nshuffle = false\nframes-per-chunk = 64\nextensions = wav,.FLAC\n"
                     b"device = cpu\nchannel = 1\ndevice-batch = 64\nquiet = true\nstrict = false\n",
        "errors.ini": b"n-fft = 1\nmax-ram = 12X\nsplit = 1,1\nunknown = 3\n",
        "section.ini": b"[mel]\nn-fft = 256\n",
        # Regressions (fuzz_config findings, docs/RELIABILITY.md): each aborted under UBSan or a fuzz check before.
        "regress_max_ram_1e300.ini": b"max-ram = 1e300\n",
        "regress_n_mels_int_max.ini": b"n-mels = 2147483647\n",
        "regress_n_fft_2e30.ini": b"n-fft = 1073741824\n",
        "regress_long_seconds_1e300.ini": b"long-seconds = 1e300\nshort-seconds = 0.25\n",
        "regress_num_short_overflow.ini": b"long-seconds = 1e6\nshort-seconds = 0.0001\nn-fft = 2\n"
                                          b"center = false\nn-mels = 1\n",
        "regress_short_seconds_1e300.ini": b"short-seconds = 1e300\n",
        "regress_max_seconds_1e300.ini": b"max-seconds = 1e300\nshort-seconds = 0.0001\nhop-length = 1\n",
    }


def dataset_seeds():
    rng = random.Random(5)
    seeds = {f"random_{n}": bytes(rng.randrange(256) for _ in range(n)) for n in (0, 8, 32, 64, 128, 256, 512)}
    # Bytes read from the end: schema 1 + b % 3, classes 1 + b % 3, clips b % 5, cache 1 MiB when odd (else 1 byte).
    for schema, classes, clips, cache in ((1, 2, 4, 1), (2, 3, 3, 0), (3, 3, 4, 1), (3, 1, 1, 0), (3, 2, 0, 1)):
        seeds[f"valid_v{schema}_{clips}_clips"] = bytes([cache, clips, classes - 1, schema - 1])
    # Issue 29: one edit 8 (hostile storage) of a valid schema-3 split of 4 clips and 3 classes, read from the end:
    # schema, classes, clips, cache, edit 8, the dataset (index into kDataNames), the Storage value.
    names = ["frames", "frame_offset", "num_samples", "clip_flags", "mel", "num_valid_long", "label", "path",
             "class_names", "targets"]
    for storage, (value, dataset) in {"external_file": (1, "label"), "external_fifo": (2, "frame_offset"),
                                      "virtual_self": (3, "frames"), "virtual_outside": (4, "frames"),
                                      "virtual_absolute": (5, "frames"), "virtual_missing": (6, "frames"),
                                      "huge_fixed_string": (7, "class_names"), "long_fixed_string": (8, "path"),
                                      "huge_chunk": (9, "frames")}.items():
        seeds[f"hostile_{storage}_{dataset}"] = bytes([value, names.index(dataset), 8, 1, 4, 2, 2])
    return seeds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "corpus"))
    args = parser.parse_args()
    for target, seeds in {"fuzz_decode": decode_seeds(), "fuzz_manifest": manifest_seeds(),
                          "fuzz_config": config_seeds(), "fuzz_dataset": dataset_seeds()}.items():
        folder = Path(args.out) / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (folder / name).write_bytes(data)
        print(f"{folder}: {len(seeds)} seeds, {sum(len(d) for d in seeds.values())} bytes")


if __name__ == "__main__":
    main()
