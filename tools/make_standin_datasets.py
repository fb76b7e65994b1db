#!/usr/bin/python3
"""Writes tiny stand-ins of six public audio datasets, laid out EXACTLY like the real ones (issue 30).

    make_standin_datasets.py DATASET OUTDIR [--seed N]      DATASET: esc50, urbansound8k, speechcommands, fsd50k,
                                                            voxceleb1, librispeech, or all

OUTDIR/<DATASET>/ (OUTDIR/<name>/ for each with `all`) becomes the dataset's root as distributed (what
`melforge-build --layout NAME --input OUTDIR/NAME` reads): the same
folder tree, metadata file names, columns, header or no header, quoting, separators and file naming as the real
dataset (docs/LAYOUTS.md describes each real tree); only the number of classes, files and seconds is small, and the
class names, speakers and IDs are a subset of the real ones or made up in the real format.

| stand-in       | audio                                          | metadata                                   |
|----------------|------------------------------------------------|--------------------------------------------|
| esc50          | 40 wav (4 classes x 5 folds x 2 takes), 0.25 s | meta/esc50.csv                             |
| urbansound8k   | 60 wav (3 classes x 10 folds x 2), 0.25 s      | metadata/UrbanSound8K.csv, audio/fold1..10 |
| speechcommands | 48 wav (4 words x 6 speakers x 2), 0.25 s;     | validation_list.txt, testing_list.txt      |
|                | 2 noise files of 1 s in _background_noise_     | (8 files each: one speaker each)           |
| fsd50k         | 48 wav (dev 27 train + 9 val; eval 12), 0.3 s  | FSD50K.ground_truth/{dev,eval,vocabulary}  |
| voxceleb1      | 60 wav (10 speakers x 3 videos x 2), 0.5 s     | veri_test2.txt (40 trials), vox1_meta.csv  |
| librispeech    | 72 flac (8 speakers x 3 chapters x 3), 0.3 s   | *.trans.txt, SPEAKERS.TXT, CHAPTERS.TXT    |

Every clip is 16 kHz mono 16-bit PCM: a tone at its class's (or speaker's) frequency with two harmonics, plus seeded
white noise 20 dB below it, so that a model can learn the classes. The output depends only on DATASET and --seed (each
clip's noise comes from a generator seeded with (seed, clip name)). LibriSpeech's FLAC files are written by a
minimal encoder here (VERBATIM subframes: valid, uncompressed FLAC that libsndfile and sox read). An existing
OUTDIR/<files> is overwritten; nothing else is removed. Needs only Python 3 (standard library).
"""
import argparse
import csv
import io
import os
import struct
import sys
import wave
import zlib

import array
import math
import random

RATE = 16000


# ---------------------------------------------------------------------------------------------------------- audio

def tone(seed, name, freq_hz, seconds):
    """16-bit samples of a tone at freq_hz (plus harmonics 2 and 3) with seeded white noise 20 dB below it."""
    n = int(round(seconds * RATE))
    w = 2 * math.pi * freq_hz / RATE
    x = [math.sin(w * i) + 0.5 * math.sin(2 * w * i) + 0.25 * math.sin(3 * w * i) for i in range(n)]
    peak = max(abs(v) for v in x) or 1.0
    rng = random.Random(seed * 2 ** 32 + zlib.crc32(name.encode()))
    return pcm16([0.3 * v / peak + 0.03 * rng.gauss(0.0, 1.0) for v in x])


def pcm16(x):
    """Floats in [-1, 1] as 16-bit samples (rounded, clipped)."""
    return array.array("h", (max(-32768, min(32767, round(v * 32767))) for v in x))


def write_wav(path, samples):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        data = array.array("h", samples)
        if sys.byteorder == "big":
            data.byteswap()
        w.writeframes(data.tobytes())


def crc8(data):
    crc = 0
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc16_table():
    table = []
    for i in range(256):
        crc = i << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
        table.append(crc)
    return table


CRC16_TABLE = _crc16_table()


def crc16(data):
    """FLAC's frame CRC-16 (polynomial 0x8005, initial 0), table-driven."""
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFF) ^ CRC16_TABLE[(crc >> 8) ^ b]
    return crc


def write_flac(path, samples, block=4096):
    """Mono 16-bit FLAC at RATE (16 kHz): STREAMINFO, then fixed-blocksize frames of one VERBATIM subframe each."""
    assert RATE == 16000
    os.makedirs(os.path.dirname(path), exist_ok=True)
    total = len(samples)
    info = struct.pack(">HH", block, block) + b"\0\0\0" + b"\0\0\0"
    info += ((RATE << 44) | (0 << 41) | (15 << 36) | total).to_bytes(8, "big") + b"\0" * 16
    out = io.BytesIO()
    out.write(b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info)
    for frame, start in enumerate(range(0, total, block)):
        chunk = samples[start:start + block]
        assert frame < 128
        header = bytes([0xFF, 0xF8, (0b0111 << 4) | 0b0101, (0b0000 << 4) | (0b100 << 1), frame])
        header += struct.pack(">H", len(chunk) - 1)
        header += bytes([crc8(header)])
        data = array.array("h", chunk)
        if sys.byteorder == "little":
            data.byteswap()
        body = header + bytes([0x02]) + data.tobytes()
        out.write(body + struct.pack(">H", crc16(body)))
    with open(path, "wb") as f:
        f.write(out.getvalue())


def write_text(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        f.write(text)


def write_csv(path, rows, header=None, delimiter=","):
    """rows as the datasets write them: QUOTE_MINIMAL (a field holding a comma is quoted), '\\n' line ends."""
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=delimiter, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
    if header:
        w.writerow(header)
    w.writerows(rows)
    write_text(path, buf.getvalue())


def class_hz(k):
    return 250.0 * 2 ** (k * 0.5)


# ------------------------------------------------------------------------------------------------------- datasets

ESC50_CLASSES = [(0, "dog"), (1, "rooster"), (10, "rain"), (41, "chainsaw")]
ESC10 = {"dog", "rooster", "rain", "chainsaw"}


def make_esc50(out, seed):
    """ESC-50-master/: meta/esc50.csv + audio/<fold>-<src>-<take>-<target>.wav; clips of one source share a fold."""
    rows = []
    for fold in range(1, 6):
        for k, (target, category) in enumerate(ESC50_CLASSES):
            src = 100000 + 1000 * fold + 37 * target
            for take in "AB":
                name = f"{fold}-{src}-{take}-{target}.wav"
                write_wav(os.path.join(out, "audio", name), tone(seed, name, class_hz(k), 0.25))
                rows.append([name, fold, target, category, str(category in ESC10), src, take])
    rows.sort()
    write_csv(os.path.join(out, "meta", "esc50.csv"), rows,
              ["filename", "fold", "target", "category", "esc10", "src_file", "take"])
    write_text(os.path.join(out, "README.md"), "# ESC-50 dataset for environmental sound classification (stand-in)\n")
    write_text(os.path.join(out, "LICENSE"), "Creative Commons Attribution Non-Commercial license (stand-in)\n")


US8K_CLASSES = [(1, "car_horn"), (3, "dog_bark"), (8, "siren")]


def make_urbansound8k(out, seed):
    """UrbanSound8K/: metadata/UrbanSound8K.csv + audio/fold<k>/<fsID>-<classID>-<occurrence>-<slice>.wav."""
    rows = []
    for fold in range(1, 11):
        for k, (class_id, name) in enumerate(US8K_CLASSES):
            fsid = 7000 + 100 * fold + class_id
            for s in range(2):
                fname = f"{fsid}-{class_id}-0-{s}.wav"
                write_wav(os.path.join(out, "audio", f"fold{fold}", fname), tone(seed, fname, class_hz(k), 0.25))
                start = 0.5 * s
                rows.append([fname, fsid, f"{start}", f"{start + 0.25}", 1 + s % 2, fold, class_id, name])
    write_csv(os.path.join(out, "metadata", "UrbanSound8K.csv"), rows,
              ["slice_file_name", "fsID", "start", "end", "salience", "fold", "classID", "class"])
    write_text(os.path.join(out, "audio", "fold1", ".DS_Store"), "\0")
    write_text(os.path.join(out, "UrbanSound8K_README.txt"), "UrbanSound8K (stand-in)\n")
    write_text(os.path.join(out, "FREESOUNDCREDITS.txt"), "stand-in\n")


SC_WORDS = ["down", "no", "up", "yes"]
SC_SPEAKERS = ["0a7c2a8d", "0b09edd3", "1b4c9b89", "2aca1e72", "3e7124ba", "c50f55b8"]


def make_speechcommands(out, seed):
    """speech_commands_v0.02/: <word>/<speaker>_nohash_<n>.wav, validation_list.txt, testing_list.txt,
    _background_noise_/, LICENSE, README.md. Speaker 5 of 6 is the validation speaker, speaker 6 the test one."""
    val, test = [], []
    for k, word in enumerate(SC_WORDS):
        for s, spk in enumerate(SC_SPEAKERS):
            for n in range(2):
                rel = f"{word}/{spk}_nohash_{n}.wav"
                write_wav(os.path.join(out, rel), tone(seed, rel, class_hz(k) * (1 + 0.02 * s), 0.25))
                if s == 4:
                    val.append(rel)
                elif s == 5:
                    test.append(rel)
    write_text(os.path.join(out, "validation_list.txt"), "".join(r + "\n" for r in sorted(val)))
    write_text(os.path.join(out, "testing_list.txt"), "".join(r + "\n" for r in sorted(test)))
    rng = random.Random(seed * 2 ** 32 + 1)
    for name in ["white_noise.wav", "pink_noise.wav"]:
        noise = [rng.gauss(0.0, 1.0) for _ in range(RATE)]
        if name.startswith("pink"):
            level, smooth = 0.0, []
            for v in noise:
                level = 0.97 * level + v
                smooth.append(level)
            noise = smooth
        peak = max(abs(v) for v in noise)
        write_wav(os.path.join(out, "_background_noise_", name), pcm16([0.2 * v / peak for v in noise]))
    write_text(os.path.join(out, "_background_noise_", "README.md"), "Background noise files (stand-in)\n")
    write_text(os.path.join(out, "LICENSE"), "Creative Commons BY 4.0 (stand-in)\n")
    write_text(os.path.join(out, "README.md"), "Speech Commands Data Set v0.02 (stand-in)\n")


# index, label, mid, parent index (None: a root of the stand-in's ontology); the index order is not alphabetical.
FSD_VOCAB = [(0, "Bark", "/m/05tny_", 2), (1, "Meow", "/m/07qrkrw", 3), (2, "Dog", "/m/0bt9lr", 4),
             (3, "Cat", "/m/01yrx", 4), (4, "Animal", "/m/0jbk", None), (5, "Guitar", "/m/0342h", 6),
             (6, "Music", "/m/04rlf", None)]
FSD_LEAVES = [0, 1, 5]


def fsd_labels(leaf):
    chain = [leaf]
    while FSD_VOCAB[chain[-1]][3] is not None:
        chain.append(FSD_VOCAB[chain[-1]][3])
    return ",".join(FSD_VOCAB[i][1] for i in chain), ",".join(FSD_VOCAB[i][2] for i in chain)


def make_fsd50k(out, seed):
    """FSD50K/: FSD50K.dev_audio/<fname>.wav, FSD50K.eval_audio/<fname>.wav, FSD50K.ground_truth/dev.csv
    (fname,labels,mids,split), eval.csv (fname,labels,mids), vocabulary.csv (index,label,mid; no header)."""
    dev, ev = [], []
    fname = 1000
    for part, count in [("dev", 12), ("eval", 4)]:
        for leaf_pos, leaf in enumerate(FSD_LEAVES):
            for i in range(count):
                fname += 7
                labels, mids = fsd_labels(leaf)
                folder = "FSD50K.dev_audio" if part == "dev" else "FSD50K.eval_audio"
                write_wav(os.path.join(out, folder, f"{fname}.wav"),
                          tone(seed, str(fname), class_hz(2 * leaf_pos), 0.3))
                if part == "dev":
                    dev.append([fname, labels, mids, "val" if i % 4 == 3 else "train"])
                else:
                    ev.append([fname, labels, mids])
    truth = os.path.join(out, "FSD50K.ground_truth")
    write_csv(os.path.join(truth, "dev.csv"), dev, ["fname", "labels", "mids", "split"])
    write_csv(os.path.join(truth, "eval.csv"), ev, ["fname", "labels", "mids"])
    write_csv(os.path.join(truth, "vocabulary.csv"), [[i, label, mid] for i, label, mid, _ in FSD_VOCAB])
    write_text(os.path.join(out, "FSD50K.doc", "README.md"), "# Freesound Dataset 50k (FSD50K) (stand-in)\n")
    write_text(os.path.join(out, "FSD50K.metadata", "class_info_FSD50K.json"), "{}\n")
    write_text(os.path.join(out, "FSD50K.metadata", "dev_clips_info_FSD50K.json"), "{}\n")


VOX_DEV = [f"id1000{i}" for i in range(1, 7)]
VOX_TEST = ["id10270", "id10271", "id10272", "id10273"]
VIDEO_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"


def video_id(speaker, v):
    h = zlib.crc32(f"{speaker}/{v}".encode())
    return "".join(VIDEO_CHARS[(h >> (6 * i)) % 64 if i < 5 else (h * (i + 7)) % 64] for i in range(11))


def make_voxceleb1(out, seed):
    """VoxCeleb1/: wav/<speaker>/<video>/<utt>.wav (vox1_dev_wav and vox1_test_wav unzipped into one folder),
    veri_test2.txt ('<1|0> <path> <path>', paths relative to wav/), vox1_meta.csv (tab-separated)."""
    test_files = {}
    for s, spk in enumerate(VOX_DEV + VOX_TEST):
        for v in range(3):
            vid = video_id(spk, v)
            for u in range(1, 3):
                rel = f"{spk}/{vid}/{u:05d}.wav"
                write_wav(os.path.join(out, "wav", rel), tone(seed, rel, 110 * 2 ** (s / 10) * (1 + 0.01 * v), 0.5))
                if spk in VOX_TEST:
                    test_files.setdefault(spk, []).append(rel)
    trials = []
    rng = random.Random(seed * 2 ** 32 + 2)
    speakers = sorted(test_files)
    for t in range(40):
        a_spk = speakers[t % len(speakers)]
        b_spk = a_spk if t % 2 == 0 else speakers[(t + 1 + t // 8) % len(speakers)]
        a = rng.choice(test_files[a_spk])
        b = rng.choice([f for f in test_files[b_spk] if f != a])
        trials.append(f"{1 if a_spk == b_spk else 0} {a} {b}\n")
    write_text(os.path.join(out, "veri_test2.txt"), "".join(trials))
    meta = [[spk, f"Celebrity_{i:02d}", "mf"[i % 2], "Ireland", "test" if spk in VOX_TEST else "dev"]
            for i, spk in enumerate(VOX_DEV + VOX_TEST)]
    write_csv(os.path.join(out, "vox1_meta.csv"), meta, ["VoxCeleb1 ID", "VGGFace1 ID", "Gender", "Nationality", "Set"],
              delimiter="\t")


LIBRI = {"train-clean-100": [19, 26, 27, 32], "dev-clean": [84, 174], "test-clean": [61, 121]}
WORDS = ["CHAPTER", "ONE", "THE", "HOUSE", "OF", "MISTER", "AND", "MISSUS", "WHEN", "SHE", "CAME", "HOME"]


def make_librispeech(out, seed):
    """LibriSpeech/: <subset>/<speaker>/<chapter>/<speaker>-<chapter>-<utt>.flac and <speaker>-<chapter>.trans.txt,
    SPEAKERS.TXT, CHAPTERS.TXT, BOOKS.TXT, LICENSE.TXT, README.TXT at the root."""
    speakers, chapters = [], []
    for subset, spks in LIBRI.items():
        for spk in spks:
            speakers.append(f"{spk:<5}| {'FM'[spk % 2]} | {subset:<16} | 25.00 | Reader {spk}")
            for c in range(3):
                chapter = spk * 10 + c + 100
                chapters.append(f"{chapter:<7}| {spk:<6}| 25.00 | {subset:<16} | 1    | Book {c}   | Project")
                trans = []
                for u in range(3):
                    utt = f"{spk}-{chapter}-{u:04d}"
                    rel = f"{subset}/{spk}/{chapter}/{utt}.flac"
                    write_flac(os.path.join(out, rel), tone(seed, rel, 100 + 7 * (spk % 29) + 3 * c, 0.3))
                    trans.append(utt + " " + " ".join(WORDS[(u + i) % len(WORDS)] for i in range(4)) + "\n")
                write_text(os.path.join(out, subset, str(spk), str(chapter), f"{spk}-{chapter}.trans.txt"),
                           "".join(trans))
    write_text(os.path.join(out, "SPEAKERS.TXT"),
               "; LibriSpeech speakers (stand-in)\n;ID  |SEX| SUBSET           |MINUTES| NAME\n" +
               "".join(line + "\n" for line in speakers))
    write_text(os.path.join(out, "CHAPTERS.TXT"),
               "; LibriSpeech chapters (stand-in)\n;ID     |READER|MINUTES| SUBSET           | PROJ.|BOOK ID| "
               "CH. TITLE | PROJECT TITLE\n" + "".join(line + "\n" for line in chapters))
    write_text(os.path.join(out, "BOOKS.TXT"), "; stand-in\n")
    write_text(os.path.join(out, "LICENSE.TXT"), "CC BY 4.0 (stand-in)\n")
    write_text(os.path.join(out, "README.TXT"), "LibriSpeech ASR corpus (stand-in)\n")


MAKERS = {"esc50": make_esc50, "urbansound8k": make_urbansound8k, "speechcommands": make_speechcommands,
          "fsd50k": make_fsd50k, "voxceleb1": make_voxceleb1, "librispeech": make_librispeech}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dataset", choices=sorted(MAKERS) + ["all"])
    p.add_argument("outdir")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.seed < 0:
        p.error("--seed must be >= 0")
    for name in sorted(MAKERS) if a.dataset == "all" else [a.dataset]:
        MAKERS[name](os.path.join(a.outdir, name), a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
