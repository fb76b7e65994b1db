"""melforge.MelSpectrogram and melforge.Fbank as torch modules (nn.Sequential, .to(), state_dict with torchaudio's
buffer names, repr), dtype rules, the torch path against the engine path and against a naive NumPy filterbank,
gradients, CUDA tensors (checked where a device exists), the plain classes without torch, and the bounded engine
cache."""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import melforge

try:  # the module imports without torch (a venv without it deselects needs_torch; the others still run)
    import torch
except ImportError:
    torch = None

REL, FLOOR_REL = 1e-4, 1e-6


def assert_close_mel(got, want, log="none", power=2.0):
    """Mel spectrograms [..., n_mels, n_frames] within test_mel's tolerance (1e-4 relative plus 1e-6 of the frame's
    peak), compared as energies."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if log == "db":
        got, want = 10.0 ** (got * power / 20.0), 10.0 ** (want * power / 20.0)
    allowed = REL * np.abs(want) + FLOOR_REL * np.abs(want).max(axis=-2, keepdims=True)
    ratio = np.abs(got - want) / np.maximum(allowed, 1e-30)
    assert got.shape == want.shape and (ratio <= 1.0).all(), f"worst error / tolerance {ratio.max():.3g}"


@pytest.fixture(scope="module")
def signal():
    rng = np.random.default_rng(11)
    t = np.arange(8000) / 16000.0
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.mark.needs_torch
def test_mel_spectrogram_is_a_module_in_sequential(signal):
    mf = melforge.MelSpectrogram(sample_rate=16000, n_fft=512, hop_length=160, n_mels=64)
    assert isinstance(mf, torch.nn.Module)
    model = torch.nn.Sequential(mf, torch.nn.Flatten())
    x = torch.from_numpy(np.stack([signal, signal[::-1].copy()]))
    y = model(x)
    assert tuple(y.shape) == (2, 64 * mf.n_frames(8000)) and y.dtype == torch.float32
    np.testing.assert_array_equal(y.numpy(), mf(x).reshape(2, -1).numpy())
    assert model.to("cpu") is model and mf.training
    mf.eval()
    assert not mf.training


@pytest.mark.needs_torch
def test_mel_state_dict_has_torchaudios_buffers():
    mf = melforge.MelSpectrogram(sample_rate=16000, n_fft=512, hop_length=160, n_mels=64,
                                 window_fn=torch.hamming_window)
    state = mf.state_dict()
    assert sorted(state) == ["mel_scale.fb", "spectrogram.window"]
    assert tuple(state["mel_scale.fb"].shape) == (257, 64) and state["mel_scale.fb"].dtype == torch.float32
    torch.testing.assert_close(state["spectrogram.window"], torch.hamming_window(512))
    other = melforge.MelSpectrogram(sample_rate=16000, n_fft=512, hop_length=160, n_mels=64,
                                    window_fn=torch.hamming_window)
    other.mel_scale.fb.zero_()
    other.load_state_dict(state)
    torch.testing.assert_close(other.mel_scale.fb, state["mel_scale.fb"], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="size mismatch"):
        melforge.MelSpectrogram(n_fft=512, n_mels=32).load_state_dict(state)


def naive_htk_fbanks(n_freqs, f_min, f_max, n_mels, sample_rate):
    """torchaudio.functional.melscale_fbanks (htk, norm None) in float64 NumPy: [n_freqs, n_mels]."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)  # noqa: E731
    all_freqs = np.linspace(0, sample_rate // 2, n_freqs)
    f_pts = hz(np.linspace(mel(f_min), mel(f_max), n_mels + 2))
    f_diff = np.diff(f_pts)
    slopes = f_pts[None, :] - all_freqs[:, None]
    down = -slopes[:, :-2] / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return np.maximum(0.0, np.minimum(down, up))


@pytest.mark.needs_torch
def test_mel_filterbank_buffer_matches_a_naive_reference():
    mf = melforge.MelSpectrogram(sample_rate=16000, n_fft=512, n_mels=40, f_min=50.0, f_max=7000.0)
    want = naive_htk_fbanks(257, 50.0, 7000.0, 40, 16000)
    np.testing.assert_allclose(mf.mel_scale.fb.numpy(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.needs_torch
def test_modules_deepcopy_and_pickle(signal):
    import copy
    import pickle
    mf = melforge.MelSpectrogram(n_fft=512, hop_length=160, n_mels=64)
    fb = melforge.Fbank(num_mel_bins=40)
    x = torch.from_numpy(signal)
    for module in (mf, fb):
        for twin in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
            assert type(twin) is type(module) and repr(twin) == repr(module)
            np.testing.assert_array_equal(twin(x).numpy(), module(x).numpy())


@pytest.mark.needs_torch
def test_mel_repr_names_the_parameters():
    text = repr(melforge.MelSpectrogram(n_fft=512, n_mels=64, log="db", threads=2))
    assert text.startswith("MelSpectrogram(sample_rate=16000, n_fft=512, win_length=512, hop_length=256")
    assert "n_mels=64" in text and "log='db'" in text and "threads=2" in text and "backend='auto'" in text
    assert "\n" not in text
    assert repr(melforge.MelSpectrogram(n_fft=512, n_mels=64).mel_scale) == "MelScale(fb=(257, 64))"


@pytest.mark.needs_torch
@pytest.mark.parametrize("kwargs", [
    dict(n_fft=512, hop_length=160, n_mels=64),
    dict(n_fft=400, win_length=300, hop_length=100, n_mels=40, window_fn="hamming", log="db"),
    dict(n_fft=512, n_mels=64, pad=37, normalized=True, center=False, power=1.0, log="db"),
    dict(n_fft=256, n_mels=32, normalized="frame_length", pad_mode="constant", norm="slaney", mel_scale="slaney"),
], ids=["defaults", "hamming-db", "pad-window-norm-magnitude", "slaney-frame-length"])
def test_torch_path_matches_the_engine(signal, kwargs):
    mf = melforge.MelSpectrogram(sample_rate=16000, **kwargs)
    x = torch.from_numpy(np.stack([signal[:6000], signal[1000:7000]])).reshape(1, 2, 6000)
    engine = mf(x)
    mf.backend = "torch"
    path = mf(x)
    assert path.dtype == torch.float32 and path.shape == engine.shape
    assert_close_mel(path.numpy(), engine.numpy(), kwargs.get("log", "none"), kwargs.get("power", 2.0))
    double = mf(x.double())
    assert double.dtype == torch.float64
    assert_close_mel(double.numpy(), engine.numpy(), kwargs.get("log", "none"), kwargs.get("power", 2.0))


@pytest.mark.needs_torch
def test_dtypes_follow_torchaudio(signal):
    mf = melforge.MelSpectrogram(n_fft=512, hop_length=160, n_mels=64)
    x = torch.from_numpy(signal)
    out64 = mf.to(torch.float64)(x.double())
    assert out64.dtype == torch.float64 and mf.mel_scale.fb.dtype == torch.float64
    assert mf(x).dtype == torch.float32
    for dtype in (torch.float16, torch.bfloat16, torch.int16, torch.int64):
        with pytest.raises(TypeError, match="torch.float32 or torch.float64"):
            mf(x.to(dtype))
    assert mf(signal).dtype == np.float32 and mf(signal.astype(np.float64)).dtype == np.float32
    with pytest.raises(TypeError, match="torch.float32 or torch.float64"):
        melforge.Fbank()(x.half())


@pytest.mark.needs_torch
def test_gradient_through_the_torch_path(signal):
    mf = melforge.MelSpectrogram(n_fft=512, hop_length=160, n_mels=64, log="db")
    x = torch.from_numpy(signal[:4000]).requires_grad_(True)
    y = mf(x)
    assert y.requires_grad
    y.mean().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert_close_mel(y.detach().numpy(), mf(x.detach()).numpy(), "db")
    mf.backend = "engine"
    with pytest.raises(RuntimeError, match="backend='torch'"):
        mf(x)
    assert not mf(x.detach()).requires_grad
    with pytest.raises(melforge.InvalidArgument, match="backend"):
        melforge.MelSpectrogram(n_fft=512, n_mels=64, backend="gpu")


@pytest.mark.needs_torch
def test_cuda_tensors_stay_on_their_device(signal):
    mf = melforge.MelSpectrogram(n_fft=512, hop_length=160, n_mels=64)
    fb = melforge.Fbank(num_mel_bins=80)
    x = torch.from_numpy(np.stack([signal, signal[::-1].copy()]))
    cpu_mel, cpu_fbank = mf(x), fb(x)
    if torch.cuda.is_available():
        mf.to("cuda")
        fb.to("cuda")
        assert mf.mel_scale.fb.device.type == "cuda" and fb.mel_banks.device.type == "cuda"
        gpu_mel, gpu_fbank = mf(x.cuda()), fb(x.cuda())
        assert gpu_mel.device.type == "cuda" and gpu_fbank.device.type == "cuda"
        assert_close_mel(gpu_mel.cpu().numpy(), cpu_mel.numpy())
        np.testing.assert_allclose(gpu_fbank.cpu().numpy(), cpu_fbank.numpy(), rtol=0, atol=2e-3)
        assert mf(x.cuda().double()).dtype == torch.float64


@pytest.mark.needs_torch
def test_fbank_module(signal):
    fb = melforge.Fbank(num_mel_bins=40, use_energy=True, window_type="hamming", threads=1)
    assert isinstance(fb, torch.nn.Module) and fb.num_mel_bins == 40 and fb.bins == 41
    assert sorted(fb.state_dict()) == ["mel_banks"] and tuple(fb.mel_banks.shape) == (40, 257)
    text = repr(fb)
    assert text.startswith("Fbank(") and "num_mel_bins=40" in text and "window_type='hamming'" in text
    x = torch.from_numpy(np.stack([signal[:6000], signal[500:6500], signal[1000:7000]]) * 32768).reshape(3, 1, 6000)
    y = torch.nn.Sequential(fb, torch.nn.Flatten(start_dim=2))(x)
    frames = 1 + (6000 - 400) // 160
    assert tuple(y.shape) == (3, 1, frames * 41) and fb.n_frames(6000) == frames
    for i in range(3):
        row = melforge.compliance.kaldi.fbank(x[i], num_mel_bins=40, use_energy=True, window_type="hamming")
        np.testing.assert_array_equal(fb(x)[i, 0].numpy(), row.numpy())
    torch_path = melforge.Fbank(num_mel_bins=40, use_energy=True, window_type="hamming", backend="torch")(x)
    np.testing.assert_allclose(torch_path.numpy(), fb(x).numpy(), rtol=0, atol=2e-3)
    other = melforge.Fbank(num_mel_bins=40, use_energy=True, window_type="hamming")
    other.load_state_dict(fb.state_dict())
    assert fb.to(torch.float64)(x.double()).dtype == torch.float64
    with pytest.raises(melforge.InvalidArgument, match="fewer than one window"):
        fb(x[..., :399])
    with pytest.raises(NotImplementedError, match="vtln_warp"):
        melforge.Fbank(vtln_warp=1.1)
    with pytest.raises(TypeError, match="channel"):
        melforge.Fbank(channel=0)


def test_without_torch_the_classes_are_plain_callables():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, melforge\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "mf = melforge.MelSpectrogram(n_fft=512, n_mels=64); fb = melforge.Fbank(num_mel_bins=40)\n"
            "x = np.random.default_rng(0).standard_normal((2, 4000)).astype(np.float32)\n"
            "assert mf(x).shape == (2, 64, mf.n_frames(4000)) and fb(x).shape == (2, 23, 40)\n"
            "assert melforge.compliance.kaldi.fbank(x).shape == (23, 23)\n"
            "assert repr(mf).startswith('MelSpectrogram(sample_rate=16000') and repr(fb).startswith('Fbank(')\n"
            "import melforge.mel\n"
            "print(type(mf).__name__, isinstance(mf, melforge.mel._MelSpectrogramImpl))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "_PlainMelSpectrogram True"
    lazy = subprocess.run([sys.executable, "-c", "import sys, melforge; print('torch' in sys.modules)"],
                          capture_output=True, text=True, timeout=60)
    assert lazy.stdout.strip() == "False", lazy.stderr


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_engine_cache_is_bounded_by_bytes():
    melforge.clear_cache()
    assert melforge.cache_info() == {"engines": 0, "bytes": 0, "limit": melforge.mel.DEFAULT_CACHE_BYTES}
    mf = melforge.MelSpectrogram(n_fft=512, hop_length=512, n_mels=64, threads=1)
    x = np.random.default_rng(1).standard_normal(34000).astype(np.float32)
    mf(x[:32768])
    one = melforge.cache_info()["bytes"]
    assert one > 0 and mf.cached_engines() == 1
    limit = 50 * one
    melforge.set_cache_limit(limit)
    try:
        before = rss_bytes()
        peak = 0
        for length in range(32768, 32768 + 2000):
            mf(x[:length])
            peak = max(peak, melforge.cache_info()["bytes"])
        grown = rss_bytes() - before
        info = melforge.cache_info()
        assert peak <= limit and info["bytes"] <= limit and mf.cached_engines() == info["engines"] <= 50
        assert info["engines"] >= 40
        assert grown < 2000 * one // 4, f"RSS grew by {grown} bytes over 2,000 lengths (one engine: {one} bytes)"
        melforge.set_cache_limit(3 * one)
        assert melforge.cache_info()["engines"] <= 3
    finally:
        melforge.set_cache_limit(melforge.mel.DEFAULT_CACHE_BYTES)
    melforge.clear_cache()
    assert melforge.cache_info()["engines"] == 0 and mf.cached_engines() == 0
    np.testing.assert_array_equal(mf(x[:32768]), mf(x[:32768]))
    with pytest.raises(melforge.InvalidArgument, match="cache limit"):
        melforge.set_cache_limit(-1)


def test_fbank_engines_serve_every_length_and_are_dropped_with_their_object():
    melforge.clear_cache()
    fb = melforge.Fbank(num_mel_bins=23, threads=1)
    x = np.zeros(5000, np.float32)
    for length in (400, 401, 999, 5000):
        assert fb(x[:length]).shape == (fb.n_frames(length), 23)
    assert fb.cached_engines() == 1 and melforge.cache_info()["engines"] == 1
    del fb
    assert melforge.cache_info()["engines"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        melforge.compliance.kaldi.fbank(x[None])
    assert melforge.cache_info()["engines"] == 1
    melforge.clear_cache()
    assert melforge.cache_info()["engines"] == 0
