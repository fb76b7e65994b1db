#!/usr/bin/python3
"""Generates a speaker-verification corpus of distinct synthetic speakers with espeak-ng.

A speaker is one espeak-ng voice: an English accent plus a voice variant (en-us+f2, en-gb-scotland+m5, ...) with
its own fixed pitch (-p) and base speed (-s), both spread deterministically over the speakers so that two speakers
of the same variant still differ. Speaker i takes accent ACCENTS[i % 8] and variant VARIANTS[i % 13] (8 and 13 are
coprime, so the first 104 speakers are 104 different voices), pitch 20 + (37 i mod 60) and speed 135 + (23 i mod 60)
words per minute. Each utterance is two short phrases of a fixed list (speakers say different, overlapping sets),
spoken at the speaker's speed jittered by a seeded +-8%; the espeak-ng WAV (22050 Hz) is trimmed of silence,
resampled to 16 kHz (FFT resampling, tools/make_digits_corpus.py), given a seeded gain, seeded leading and trailing
silence (each file lasts 2.0 to 3.5 s, so that it holds one 2 s segment, the usual training crop of VoxCeleb
trainers) and seeded white noise whose level depends on the session (each session of a speaker has its own SNR
range, like the recording conditions of a video), and written as 16 kHz mono 16-bit PCM in VoxCeleb's layout (the
class, i.e. the speaker, is the first folder; the file is named after its first phrase):

    OUT/spk<NN>_<voice>/<session>/<utterance>.wav      e.g. OUT/spk07_en-us-nyc-m8/s2/u004_open-the-door.wav

--size small:  20 speakers x 12 utterances (3 sessions) = 240 files, for tests (a few seconds on 2 cores).
--size bench:  24 speakers x 8 utterances (4 sessions) = 192 files, for side-by-side training runs on 2 cores.
--size medium: 36 speakers x 10 utterances (4 sessions) = 360 files (the size of issue 32's corpus).
--size full:   60 speakers x 40 utterances (4 sessions) = 2400 files, for benchmarks.

--lengths MIN,MAX (seconds, 1 <= MIN < MAX <= 60): variable-length utterances, as VoxCeleb's. Each file's length is
drawn uniform in [MIN, MAX] from its own generator; its speech is the utterance's two phrases followed by more
phrases of the same speaker (the fixed list, from a speaker- and utterance-dependent offset), spoken in chunks of a
few phrases with seeded pauses (0.15 to 0.6 s) between chunks, until it fills the length less the leading and
trailing silence; the last chunk is cut there with a 20 ms fade. Gain, silences and session noise as above. Without
--lengths the output is the 2.0 to 3.5 s corpus above, byte for byte as before the option existed.

The output depends only on --size, --seed and --lengths (and the installed espeak-ng): each file's randomness comes
from a generator seeded with (seed, speaker, utterance). A marker file, OUT/.melforge_corpus.json, is written last;
when it names the same size, seed, lengths and generator version and every listed file exists, the run does nothing
(idempotent; a marker without "lengths" is a corpus made without --lengths). Any other state is regenerated: the
marker and the speaker folders of this generator are removed first.

Needs only Debian's python3 and python3-numpy, and the espeak-ng binary. Run with /usr/bin/python3.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import tempfile
import time
import zlib

import numpy as np

from make_digits_corpus import TARGET_RATE, espeak, parse_common_args, resample_fft, trim_silence, write_pcm16

MIN_SECONDS = 2.0
MAX_SECONDS = 3.5
MARKER = ".melforge_corpus.json"
# Bump when the output for a given (size, seed) changes, so that old corpora are regenerated.
GENERATOR_VERSION = 1

ACCENTS = ["en", "en-us", "en-gb-x-rp", "en-gb-scotland", "en-029", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-us-nyc"]
VARIANTS = ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "f1", "f2", "f3", "f4", "f5"]
PHRASES = [
    "open the door", "good morning", "the weather is fine", "turn on the light", "call me later",
    "where is the station", "a cup of tea", "seven green apples", "the river runs north", "please sit down",
    "my favourite colour", "the train is late", "close the window", "bring the blue box", "a quiet evening",
    "the market opens early", "thank you very much", "read the first page", "the cat sleeps", "summer holidays",
    "how are you today", "the bridge is closed", "four small boats", "listen to the music", "a long winter",
    "the keys are on the table", "meet me at noon", "paper and pencil", "the clock stopped", "walk along the beach",
    "a cold glass of water", "the garden needs rain", "send the letter", "yellow umbrella", "the road turns left",
    "nine hundred people", "wake up slowly", "a bright red kite", "the shop is closed", "mountains and valleys",
    "speak a little louder", "the last bus home", "fresh bread and butter", "count to twenty", "an old wooden chair",
    "the phone is ringing", "dinner is ready", "a map of the city",
]
SIZES = {"small": {"speakers": 20, "utterances": 12, "sessions": 3},
         "medium": {"speakers": 36, "utterances": 10, "sessions": 4},
         "bench": {"speakers": 24, "utterances": 8, "sessions": 4},
         "full": {"speakers": 60, "utterances": 40, "sessions": 4}}
# --lengths: phrases per espeak-ng call, the pause between calls (seconds) and the accepted range of MIN, MAX.
CHUNK_PHRASES = 4
PAUSE_SECONDS = (0.15, 0.6)
LENGTH_RANGE = (1.0, 60.0)


def speaker(i):
    """Speaker i: (espeak-ng voice, pitch 0..99, base speed in words per minute)."""
    voice = f"{ACCENTS[i % len(ACCENTS)]}+{VARIANTS[i % len(VARIANTS)]}"
    return voice, 20 + (37 * i) % 60, 135 + (23 * i) % 60


def speaker_folder(i):
    return f"spk{i:02d}_{speaker(i)[0].replace('+', '-')}"


def plan(size):
    """Every file of a corpus of `size`: list of (speaker, utterance, session, phrase, relative path), sorted."""
    spec = SIZES[size]
    jobs = []
    for s in range(spec["speakers"]):
        for u in range(spec["utterances"]):
            first = PHRASES[(u + 5 * s) % len(PHRASES)]
            phrase = f"{first}, {PHRASES[(u + 5 * s + 17) % len(PHRASES)]}"
            session = u % spec["sessions"]
            name = f"u{u:03d}_{re.sub(r'[^a-z]+', '-', first)}.wav"
            jobs.append((s, u, session, phrase, os.path.join(speaker_folder(s), f"s{session + 1}", name)))
    return sorted(jobs, key=lambda j: j[4])


def fit_length(speech, rng):
    """speech cut to MAX_SECONDS (with a 20 ms fade) or padded with seeded silence to MIN_SECONDS..MAX_SECONDS."""
    max_len, min_len = int(MAX_SECONDS * TARGET_RATE), int(MIN_SECONDS * TARGET_RATE)
    clipped = len(speech) > max_len
    if clipped:
        speech = speech[:max_len].copy()
        fade = TARGET_RATE // 50
        speech[-fade:] *= np.linspace(1.0, 0.0, fade)
    room = max_len - len(speech)
    lead = min(int(rng.uniform(0.05, 0.25) * TARGET_RATE), room)
    trail = min(int(rng.uniform(0.05, 0.25) * TARGET_RATE), room - lead)
    short = min_len - (lead + len(speech) + trail)
    if short > 0:
        lead += short // 2
        trail += short - short // 2
    return np.concatenate([np.zeros(lead), speech, np.zeros(trail)]), clipped


def speak(voice, speed, pitch, text, tmp_wav):
    """espeak-ng's rendering of `text`, trimmed of silence and resampled to TARGET_RATE: float64 samples."""
    x, rate = espeak(voice, speed, pitch, text, tmp_wav)
    return resample_fft(trim_silence(x, rate), rate, TARGET_RATE)


def long_speech(job, rng, lengths, tmp_dir):
    """--lengths: (seeded silence + speech + silence of a length drawn uniform in `lengths` seconds, clipped=False).
    Chunks of CHUNK_PHRASES phrases of speaker s (the first one the utterance's own two phrases), each at the
    speaker's speed jittered by +-8%, with seeded pauses between them, until the speech fills its share."""
    s, u, _, phrase, rel = job
    voice, pitch, base_speed = speaker(s)
    total = int(round(rng.uniform(*lengths) * TARGET_RATE))
    lead = int(rng.uniform(0.05, 0.25) * TARGET_RATE)
    trail = int(rng.uniform(0.05, 0.25) * TARGET_RATE)
    room = total - lead - trail
    pieces, chunk = [], 0
    while sum(len(p) for p in pieces) < room:
        if chunk == 0:
            text = phrase
        else:
            start = (u + 5 * s + 11 * chunk) % len(PHRASES)
            text = ". ".join(PHRASES[(start + 7 * k) % len(PHRASES)] for k in range(CHUNK_PHRASES))
        if pieces:
            pieces.append(np.zeros(int(rng.uniform(*PAUSE_SECONDS) * TARGET_RATE)))
        speed = int(round(base_speed * rng.uniform(0.92, 1.08)))
        pieces.append(speak(voice, speed, pitch, text, os.path.join(tmp_dir, f"{rel.replace(os.sep, '__')}.{chunk}")))
        chunk += 1
    speech = np.concatenate(pieces)[:room].copy()
    fade = TARGET_RATE // 50
    speech[-fade:] *= np.linspace(1.0, 0.0, fade)
    speech *= rng.uniform(0.3, 0.9) / max(1e-9, np.abs(speech).max())
    return np.concatenate([np.zeros(lead), speech, np.zeros(trail)]), speech, False


def synthesize(job, seed, out_dir, tmp_dir, lengths=None):
    """Makes one corpus file (of a length drawn in `lengths` seconds when given). Returns (relative path, seconds,
    clipped_speech)."""
    s, u, session, phrase, rel = job
    voice, pitch, speed = speaker(s)
    rng = np.random.default_rng(np.random.SeedSequence([seed, s, u, zlib.crc32(phrase.encode())]))
    if lengths is None:
        speed = int(round(speed * rng.uniform(0.92, 1.08)))
        speech = speak(voice, speed, pitch, phrase, os.path.join(tmp_dir, rel.replace(os.sep, "__")))
        speech *= rng.uniform(0.3, 0.9) / max(1e-9, np.abs(speech).max())
        y, clipped = fit_length(speech, rng)
    else:
        y, speech, clipped = long_speech(job, rng, lengths, tmp_dir)
    snr_low = 20.0 + 5.0 * ((s + 3 * session) % 4)
    snr_db = rng.uniform(snr_low, snr_low + 5.0)
    y += rng.standard_normal(len(y)) * np.sqrt(np.mean(speech**2)) * 10.0 ** (-snr_db / 20.0)
    pcm = np.clip(np.round(y * 32767.0), -32768, 32767).astype("<i2")
    write_pcm16(os.path.join(out_dir, rel), pcm)
    return rel, len(pcm) / TARGET_RATE, clipped


def parse_lengths(text):
    """--lengths "MIN,MAX" -> (MIN, MAX) seconds, LENGTH_RANGE[0] <= MIN < MAX <= LENGTH_RANGE[1]."""
    try:
        low, high = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX in seconds (e.g. 2,12), got {text!r}") from None
    if not LENGTH_RANGE[0] <= low < high <= LENGTH_RANGE[1]:
        raise argparse.ArgumentTypeError(f"need {LENGTH_RANGE[0]:g} <= MIN < MAX <= {LENGTH_RANGE[1]:g} seconds, "
                                         f"got {text!r}")
    return low, high


def corpus_complete(out_dir, size, seed, jobs, lengths=None):
    try:
        with open(os.path.join(out_dir, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False
    if (marker.get("size"), marker.get("seed"), marker.get("version")) != (size, seed, GENERATOR_VERSION):
        return False
    if marker.get("lengths") != (None if lengths is None else list(lengths)):
        return False
    if marker.get("generator") != "tools/make_speakers_corpus.py" or marker.get("files") != [j[4] for j in jobs]:
        return False
    return all(os.path.isfile(os.path.join(out_dir, rel)) for rel in marker["files"])


def remove_old(out_dir):
    """Removes the marker and every speaker folder this generator makes (spkNN_<voice>)."""
    try:
        os.remove(os.path.join(out_dir, MARKER))
    except FileNotFoundError:
        pass
    for name in os.listdir(out_dir):
        if re.fullmatch(r"spk\d\d+_[a-z0-9-]+", name) and os.path.isdir(os.path.join(out_dir, name)):
            shutil.rmtree(os.path.join(out_dir, name))


def report(results, jobs, elapsed, workers, args):
    seconds = np.array([r[1] for r in results])
    clipped = [r[0] for r in results if r[2]]
    spec = SIZES[args.size]
    print(f"make_speakers_corpus: wrote {len(results)} files to {os.path.abspath(args.out)} in {elapsed:.1f} s "
          f"({workers} workers)")
    print(f"  size {args.size}, seed {args.seed}: {spec['speakers']} speakers x {spec['utterances']} utterances in "
          f"{spec['sessions']} sessions; duration min {seconds.min():.2f} s, mean {seconds.mean():.2f} s, "
          f"max {seconds.max():.2f} s, total {seconds.sum() / 60:.1f} min"
          + ("" if args.lengths is None else f" (--lengths {args.lengths[0]:g},{args.lengths[1]:g})"))
    pitches = sorted({speaker(s)[1] for s in range(spec["speakers"])})
    print(f"  {len({speaker(s)[0] for s in range(spec['speakers'])})} distinct voices, pitches {pitches[0]}.."
          f"{pitches[-1]} ({len(pitches)} distinct)")
    if clipped:
        print(f"  warning: speech longer than {MAX_SECONDS} s was cut in {len(clipped)} files, e.g. {clipped[0]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created); gets one sub-folder per speaker")
    ap.add_argument("--size", choices=sorted(SIZES), default="small",
                    help="small: 20 speakers x 12 files; bench: 24 x 8; medium: 36 x 10; full: 60 x 40")
    ap.add_argument("--lengths", type=parse_lengths, default=None, metavar="MIN,MAX",
                    help="variable-length utterances: seconds drawn uniform in [MIN, MAX] per file (e.g. 2,12); "
                    "default: the 2.0-3.5 s files")
    args = parse_common_args(ap, "make_speakers_corpus", "seed of the speed jitter, gains, silences and noise (>= 0)")

    out_dir = os.path.abspath(args.out)
    jobs = plan(args.size)
    if not args.force and corpus_complete(out_dir, args.size, args.seed, jobs, args.lengths):
        kind = "" if args.lengths is None else f", lengths {args.lengths[0]:g}-{args.lengths[1]:g} s"
        print(f"make_speakers_corpus: {out_dir} already holds the complete '{args.size}' corpus for seed {args.seed} "
              f"({len(jobs)} files{kind}); nothing to do")
        return

    start = time.monotonic()
    os.makedirs(out_dir, exist_ok=True)
    remove_old(out_dir)
    for rel in sorted({os.path.dirname(j[4]) for j in jobs}):
        os.makedirs(os.path.join(out_dir, rel), exist_ok=True)
    workers = args.jobs if args.jobs > 0 else 2 * (os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="melforge_espeak_") as tmp_dir:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda job: synthesize(job, args.seed, out_dir, tmp_dir, args.lengths), jobs))

    spec = SIZES[args.size]
    marker = {"generator": "tools/make_speakers_corpus.py", "version": GENERATOR_VERSION, "size": args.size,
              "seed": args.seed, "sample_rate": TARGET_RATE,
              "speakers": {speaker_folder(s): dict(zip(("voice", "pitch", "speed"), speaker(s)))
                           for s in range(spec["speakers"])},
              "files": [r[0] for r in results]}
    if args.lengths is not None:
        marker["lengths"] = list(args.lengths)
    tmp_marker = os.path.join(out_dir, MARKER + ".part")
    with open(tmp_marker, "w") as f:
        json.dump(marker, f, indent=1)
    os.replace(tmp_marker, os.path.join(out_dir, MARKER))
    report(results, jobs, time.monotonic() - start, workers, args)


if __name__ == "__main__":
    main()
