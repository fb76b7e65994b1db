"""melforge.MelSpectrogram against the committed torchaudio fixtures (tests/data/mel: manifest.json, made with
torchaudio 0.13, and manifest_extra.json, made with torchaudio 2.11 for pad, normalized and torchaudio's defaults),
with the tolerance of the C++ tests (tests/mel_reference.h, compare_log_mel), and its behaviour: batch dims, NumPy
and torch inputs, threads, the engine cache, parameter errors, the all-zero filterbank warning."""
import json
import warnings

import numpy as np
import pytest

import melforge

REL = 1e-4
FLOOR_REL = 1e-6


def unlog(v, p):
    """The linear mel energy a log-mel value stands for (the inverse of the log), in float64."""
    v = np.asarray(v, dtype=np.float64)
    if p["log"] == "db":
        return 10.0 ** (v * p["power"] / 20.0)
    if p["log"] == "ln":
        return np.exp(v) - p["log_eps"]
    return v


def tolerance_ratio(actual, expected, p):
    """|A - B| / allowed per element of [n_mels, n_frames] spectrograms, as compare_log_mel in tests/mel_reference.h:
    allowed = 1e-4 |B| + 1e-6 * (frame's peak reference energy) + (1e-5 log_eps for ln)."""
    a, b = unlog(actual, p), unlog(expected, p)
    eps_term = 1e-5 * p["log_eps"] if p["log"] == "ln" else 0.0
    frame_peak = np.abs(b).max(axis=-2, keepdims=True)
    allowed = REL * np.abs(b) + FLOOR_REL * frame_peak + eps_term
    return np.abs(a - b) / allowed


def load_cases(repo, manifest_name):
    folder = repo / "tests" / "data" / "mel"
    manifest = json.loads((folder / manifest_name).read_text())
    cases = []
    for s in manifest["spectrograms"]:
        sig = manifest["signals"][s["signal"]]
        signal = np.fromfile(folder / sig["file"], dtype="<f4")
        assert signal.size == sig["samples"]
        want = np.fromfile(folder / s["file"], dtype="<f4").reshape(len(s["offsets"]), s["n_mels"], s["n_frames"])
        cases.append((s["name"], s["params"], signal, s["segment_samples"], s["offsets"], want))
    return cases


def make_transform(p, **kwargs):
    """melforge.MelSpectrogram for a manifest's params (MelArgs field names, 0 meaning the default)."""
    norm = None if p["mel_norm"] == "none" else p["mel_norm"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return melforge.MelSpectrogram(
            sample_rate=p["sample_rate"], n_fft=p["n_fft"], win_length=p["win_length"] or None,
            hop_length=p["hop_length"] or None, f_min=p["f_min"], f_max=p["f_max"] or None, pad=p.get("pad", 0),
            n_mels=p["n_mels"], window_fn=p["window"], power=p["power"], normalized=p.get("normalized", False),
            center=p["center"], pad_mode=p["pad_mode"], norm=norm, mel_scale=p["mel_scale"], log=p["log"],
            amin=p["amin"], log_eps=p["log_eps"], **kwargs)


def fixture_params():
    import pathlib
    repo = pathlib.Path(__file__).resolve().parents[2]
    out = []
    for manifest in ("manifest.json", "manifest_extra.json"):
        for case in load_cases(repo, manifest):
            out.append(pytest.param(case, id=f"{manifest.split('.')[0]}:{case[0]}"))
    return out


@pytest.mark.parametrize("case", fixture_params())
def test_matches_torchaudio_fixture(case):
    name, p, signal, segment_samples, offsets, want = case
    batch = np.stack([signal[o:o + segment_samples] for o in offsets])
    got = make_transform(p, threads=2)(batch)
    assert got.dtype == np.float32 and got.shape == want.shape, name
    ratio = tolerance_ratio(got, want, p)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape)
    assert (ratio <= 1.0).all(), f"{name}: worst error / tolerance {ratio.max():.3g} at {worst}"


def test_fixture_sets_cover_torchaudio_defaults_pad_normalized_and_slaney(repo):
    params = [c[1] for m in ("manifest.json", "manifest_extra.json") for c in load_cases(repo, m)]
    assert any(p["n_fft"] == 400 and p["n_mels"] == 128 and p["log"] == "none" and p["hop_length"] == 0
               and p["f_max"] == 0 for p in params)
    assert any(p.get("normalized") is True for p in params)
    assert any(p.get("normalized") == "frame_length" for p in params)
    assert any(p.get("pad", 0) > 0 for p in params)
    assert any(p["mel_scale"] == "slaney" and p["mel_norm"] == "slaney" for p in params)


def test_a_wrong_output_fails_the_comparison(repo):
    name, p, signal, segment_samples, offsets, want = load_cases(repo, "manifest_extra.json")[0]
    got = make_transform(p)(np.stack([signal[o:o + segment_samples] for o in offsets]))
    assert (tolerance_ratio(got, want, p) <= 1.0).all()
    assert not (tolerance_ratio(got * 1.001, want, p) <= 1.0).all()


@pytest.fixture(scope="module")
def signal():
    rng = np.random.default_rng(5)
    t = np.arange(3 * 8000) / 16000.0
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def test_defaults_are_torchaudios():
    with pytest.warns(UserWarning, match="all zero values"):
        t = melforge.MelSpectrogram()
    assert (t.sample_rate, t.n_fft, t.win_length, t.hop_length, t.n_mels, t.power, t.log) == \
        (16000, 400, 400, 200, 128, 2.0, "none")
    assert t.n_frames(16000) == 81
    assert "MelSpectrogram(sample_rate=16000, n_fft=400" in repr(t)


def test_zero_filterbank_rows_warn_and_give_silence(signal):
    with pytest.warns(UserWarning) as record:
        t = melforge.MelSpectrogram(log="none")
    text = str(record[0].message)
    assert text.startswith("At least one mel filterbank has all zero values")
    assert "n_mels (128)" in text and "n_fft (400" in text
    bands = [int(b) for b in text.split("mel band")[1].split(" of ")[0].lstrip("s ").split(", ")]
    out = t(signal)
    zero_rows = np.flatnonzero((out == 0).all(axis=1))
    assert list(zero_rows) == bands
    with pytest.warns(UserWarning):
        db = melforge.MelSpectrogram(log="db", amin=1e-10)(signal)
    np.testing.assert_array_equal(db[bands], np.float32(-100.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        melforge.MelSpectrogram(n_fft=512, n_mels=64)


def test_leading_dims_and_float64(signal):
    t = melforge.MelSpectrogram(n_fft=512, n_mels=64, hop_length=160)
    x = np.stack([signal[i * 1000:i * 1000 + 8000] for i in range(6)]).reshape(2, 3, 8000)
    out = t(x)
    assert out.shape == (2, 3, 64, t.n_frames(8000)) and out.dtype == np.float32
    np.testing.assert_array_equal(out[1, 2], t(x[1, 2]))
    np.testing.assert_array_equal(t(x.astype(np.float64)), out)
    assert t(x[0, 0]).shape == (64, t.n_frames(8000))
    assert t(np.zeros((0, 8000), np.float32)).shape == (0, 64, t.n_frames(8000))
    strided = np.asfortranarray(x[:, :, ::1])
    np.testing.assert_array_equal(t(strided), out)


def test_threads_give_identical_results(signal):
    x = np.stack([signal[i * 997:i * 997 + 16000] for i in range(8)])
    one = melforge.MelSpectrogram(n_fft=512, n_mels=64, log="db", threads=1)(x)
    two = melforge.MelSpectrogram(n_fft=512, n_mels=64, log="db", threads=2)(x)
    np.testing.assert_array_equal(one, two)


def test_engine_cache(signal):
    t = melforge.MelSpectrogram(n_fft=512, n_mels=64)
    assert t.cached_engines() == 0
    first = t(signal[:8000])
    t(signal[:8000])
    t(np.stack([signal[:8000]] * 3))
    assert t.cached_engines() == 1
    t(signal[:9000])
    assert t.cached_engines() == 2
    t.threads = 1
    np.testing.assert_array_equal(t(signal[:8000]), first)
    assert t.cached_engines() == 3


@pytest.mark.parametrize("kwargs, message", [
    (dict(power=None), "power=None"),
    (dict(window_fn="blackman"), "window_fn"),
    (dict(window_fn=np.hanning), "window_fn"),
    (dict(n_fft=1), "n_fft"),
    (dict(n_fft=256, n_mels=200), "too large for n_fft"),
    (dict(win_length=600), "win_length"),
    (dict(hop_length=0), "hop_length"),
    (dict(f_max=9000.0), "Nyquist"),
    (dict(f_min=-1.0), "f_min"),
    (dict(normalized="power"), "normalized"),
    (dict(pad=-1), "pad"),
    (dict(pad_mode="circular"), "pad mode"),
    (dict(norm="l2"), "mel norm"),
    (dict(mel_scale="bark"), "mel scale"),
    (dict(log="log10"), "log mode"),
    (dict(amin=0.0), "amin"),
    (dict(threads=-1), "threads"),
    (dict(sample_rate=16000.5), "sample_rate"),
])
def test_bad_parameters_raise_invalid_argument(kwargs, message):
    with pytest.raises(melforge.InvalidArgument, match=message):
        melforge.MelSpectrogram(**dict(dict(n_fft=512, n_mels=64), **kwargs))


def test_bad_inputs_raise_invalid_argument():
    t = melforge.MelSpectrogram(n_fft=512, n_mels=64)
    with pytest.raises(melforge.InvalidArgument):
        t(np.float32(1.0))
    with pytest.raises(melforge.InvalidArgument, match="reflect"):
        t(np.zeros(200, np.float32))
    with pytest.raises(melforge.InvalidArgument):
        t(np.array(["a", "b"]))
    assert t.cached_engines() == 0


def test_window_fn_accepts_torch_functions_by_name():
    class hann_window:  # noqa: N801 - stands in for torch.hann_window, recognised by its name
        pass
    t = melforge.MelSpectrogram(n_fft=512, n_mels=64, window_fn=hann_window)
    assert t.window == "hann"


@pytest.mark.needs_torch
def test_torch_tensors_in_and_out(signal):
    torch = pytest.importorskip("torch")
    t = melforge.MelSpectrogram(n_fft=512, n_mels=64, window_fn=torch.hamming_window, log="db")
    x = torch.from_numpy(np.stack([signal[:8000], signal[100:8100]])).reshape(1, 2, 8000)
    out = t(x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.device == x.device
    assert tuple(out.shape) == (1, 2, 64, t.n_frames(8000))
    np.testing.assert_array_equal(out.numpy(), t(x.numpy()))
    double = t(x.double())  # float64 follows torchaudio: computed through torch.stft in float64 (test_modules.py)
    assert double.dtype == torch.float64
    np.testing.assert_allclose(double.numpy(), out.numpy(), rtol=0, atol=1e-3)
    np.testing.assert_array_equal(t.forward(x.requires_grad_(False)).numpy(), out.numpy())
    assert t.window == "hamming"
    if torch.cuda.is_available():
        on_gpu = t(x.cuda())
        assert on_gpu.device.type == "cuda"
        np.testing.assert_allclose(on_gpu.cpu().numpy(), out.numpy(), rtol=0, atol=1e-3)
