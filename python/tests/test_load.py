"""melforge.load and melforge.info: the samples equal the WAV's (written here with the standard `wave` module),
channels are selected or mixed down, 44.1 kHz is resampled to 16 kHz, bad files raise melforge.AudioError naming
them, and melforge.MelSpectrogram of melforge.load(...) equals what `melforge-build` stores (read with h5py)."""
import subprocess

import numpy as np
import pytest

import melforge
from melforge_run import build_binary, write_wav



def tone(frames, rate, hz, amplitude=8000, seed=0):
    t = np.arange(frames) / rate
    noise = np.random.default_rng(seed).integers(-300, 300, frames)
    return (amplitude * np.sin(2 * np.pi * hz * t) + noise).astype(np.int16)


def test_load_returns_the_pcm_samples_and_rate(tmp_path):
    data = write_wav(tmp_path / "a.wav", tone(12345, 16000, 440), 16000)
    samples, rate = melforge.load(tmp_path / "a.wav")
    assert rate == 16000 and samples.dtype == np.float32 and samples.shape == (12345,)
    np.testing.assert_array_equal(samples, data[:, 0].astype(np.float32) / 32768)
    again, rate = melforge.load(str(tmp_path / "a.wav"), sample_rate=16000)
    assert rate == 16000
    np.testing.assert_array_equal(again, samples)


def test_channel_selection_and_mixdown(tmp_path):
    left, right = tone(8000, 16000, 300, seed=1), tone(8000, 16000, 1700, seed=2)
    write_wav(tmp_path / "s.wav", np.stack([left, right], axis=1), 16000)
    l, _ = melforge.load(tmp_path / "s.wav", channel=0)
    r, _ = melforge.load(tmp_path / "s.wav", channel=1)
    mono, _ = melforge.load(tmp_path / "s.wav")
    np.testing.assert_array_equal(l, left.astype(np.float32) / 32768)
    np.testing.assert_array_equal(r, right.astype(np.float32) / 32768)
    np.testing.assert_allclose(mono, (l.astype(np.float64) + r) / 2, rtol=0, atol=1e-7)
    with pytest.raises(melforge.AudioError, match="s.wav.*channel 2"):
        melforge.load(tmp_path / "s.wav", channel=2)
    info = melforge.info(tmp_path / "s.wav")
    assert (info["frames"], info["sample_rate"], info["channels"]) == (8000, 16000, 2)
    assert info["format"].startswith("WAV")


def test_resampling_44k_to_16k(tmp_path):
    write_wav(tmp_path / "hi.wav", tone(44100, 44100, 1000, amplitude=16000), 44100)
    x, rate = melforge.load(tmp_path / "hi.wav", sample_rate=16000)
    assert rate == 16000 and x.shape == (16000,)
    spectrum = np.abs(np.fft.rfft(x[2000:14000] * np.hanning(12000)))
    peak_hz = np.argmax(spectrum) * 16000 / 12000
    assert abs(peak_hz - 1000) < 2
    assert abs(np.sqrt(np.mean(x[2000:14000] ** 2)) - 16000 / 32768 / np.sqrt(2)) < 0.01


def test_bad_files_raise_audio_error_naming_them(tmp_path):
    (tmp_path / "junk.wav").write_bytes(b"RIFF0000WAVEnot really audio")
    with pytest.raises(melforge.AudioError, match="junk.wav"):
        melforge.load(tmp_path / "junk.wav")
    with pytest.raises(melforge.AudioError, match="missing.wav"):
        melforge.load(tmp_path / "missing.wav")
    with pytest.raises(melforge.AudioError, match="junk.wav"):
        melforge.info(tmp_path / "junk.wav")
    assert issubclass(melforge.AudioError, OSError)
    write_wav(tmp_path / "ok.wav", tone(100, 16000, 440), 16000)
    for kwargs in (dict(sample_rate=0), dict(sample_rate=-5), dict(channel=-1), dict(sample_rate=1.5)):
        with pytest.raises(melforge.InvalidArgument):
            melforge.load(tmp_path / "ok.wav", **kwargs)


@pytest.mark.needs_h5py
def test_mel_of_load_equals_what_the_builder_stores(tmp_path):
    h5py = pytest.importorskip("h5py")
    corpus = tmp_path / "in"
    write_wav(corpus / "low" / "a.wav", tone(20000, 16000, 300, seed=3), 16000)
    write_wav(corpus / "low" / "b.wav", np.stack([tone(60000, 44100, 500, seed=4),
                                                  tone(60000, 44100, 2500, seed=5)], axis=1), 44100)
    write_wav(corpus / "high" / "c.wav", tone(17000, 16000, 3000, seed=6), 16000)
    write_wav(corpus / "high" / "d.wav", tone(50000, 44100, 4000, seed=7), 44100)
    out = tmp_path / "out"
    for channel in (-1, 1):
        args = [str(build_binary()), "--input", str(corpus), "--output", str(out / str(channel)), "--sample-rate", "16000",
                "--n-fft", "512", "--hop-length", "160", "--n-mels", "64",
                "--short-seconds", "0.5", "--split", "1,0,0", "--dtype", "float32",
                "--device", "cpu", "--channel", str(channel), "--quiet"]
        run = subprocess.run(args, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        transform = melforge.MelSpectrogram(sample_rate=16000, n_fft=512, hop_length=160, n_mels=64, log="db")
        with h5py.File(out / str(channel) / "train.h5", "r") as f:
            frames, offset = f["frames"][...], f["frame_offset"][...]
            paths = [p.decode() if isinstance(p, bytes) else p for p in f["path"][...]]
        assert frames.shape[1] == 64 and len(offset) == len(paths) + 1
        compared = 0
        for i, rel in enumerate(paths):
            info = melforge.info(corpus / rel)
            if channel >= info["channels"]:
                continue
            x, rate = melforge.load(corpus / rel, sample_rate=16000, channel=None if channel < 0 else channel)
            assert rate == 16000
            got = transform(x)
            np.testing.assert_array_equal(got, frames[offset[i]:offset[i + 1]].T, err_msg=f"{rel} channel {channel}")
            compared += 1
        assert compared == (4 if channel < 0 else 1)
