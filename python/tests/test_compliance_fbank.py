"""melforge.compliance.kaldi.fbank against torchaudio.compliance.kaldi.fbank's committed outputs (tests/data/fbank:
manifest.json, made by tools/gen_fbank_fixtures.py with torchaudio 2.11), every set through the engine (NumPy and CPU
float32 tensors) and through the torch path (float32 and float64), with each set's tolerance from the manifest; the
Kaldi mel banks against get_mel_banks' fixtures; torchaudio's signature, channel, min_duration and errors; the seeded
dither on both paths; gradients."""
import inspect
import json
import pathlib

import numpy as np
import pytest

import melforge
from melforge.compliance import kaldi

try:  # the module imports without torch (a venv without it deselects needs_torch; the NumPy tests still run)
    import torch
except ImportError:
    torch = None

FOLDER = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "fbank"
MANIFEST = FOLDER / "manifest.json"


def manifest():
    return json.loads(MANIFEST.read_text())


def set_params():
    """One pytest param per fixture set; one failing param when the fixtures are missing (never an empty list)."""
    if not MANIFEST.exists():
        return [pytest.param(None, id="missing-manifest")]
    return [pytest.param(s, id=s["name"]) for s in manifest()["sets"]]


def load_set(s):
    """(signal float32 [samples], expected float32 [frames, bins]) of a manifest set."""
    assert s is not None, f"{MANIFEST} is missing (tools/gen_fbank_fixtures.py writes it)"
    signal = np.fromfile(FOLDER / s["signal"], dtype="<f4")
    assert signal.size == s["samples"]
    want = np.fromfile(FOLDER / s["output"], dtype="<f4").reshape(s["frames"], s["bins"])
    return signal, want


def assert_within(got, want, s, label):
    """|got - want| <= atol + rtol |want| elementwise, the set's tolerance."""
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, f"{s['name']} {label}: shape {got.shape}, want {want.shape}"
    allowed = s["atol"] + s["rtol"] * np.abs(want.astype(np.float64))
    excess = np.abs(got - want) - allowed
    worst = np.unravel_index(np.argmax(excess), excess.shape)
    assert bool((excess <= 0).all()), (f"{s['name']} {label}: |error| {np.abs(got - want)[worst]:.4g} > allowed "
                                 f"{allowed[worst]:.4g} at frame, bin {worst}")


@pytest.mark.parametrize("s", set_params())
def test_engine_matches_torchaudio_fixture(s):
    signal, want = load_set(s)
    got = kaldi.fbank(signal[None], **s["params"])
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert_within(got, want, s, "engine, NumPy")
    np.testing.assert_array_equal(kaldi.fbank(signal, **s["params"]), got)


@pytest.mark.needs_torch
@pytest.mark.parametrize("s", set_params())
def test_engine_on_tensors_equals_numpy(s):
    signal, _ = load_set(s)
    got = kaldi.fbank(signal[None], **s["params"])
    tensor = kaldi.fbank(torch.from_numpy(signal)[None], **s["params"])
    assert isinstance(tensor, torch.Tensor) and tensor.dtype == torch.float32
    np.testing.assert_array_equal(tensor.numpy(), got)


@pytest.mark.needs_torch
@pytest.mark.parametrize("s", set_params())
def test_torch_path_matches_torchaudio_fixture(s):
    signal, want = load_set(s)
    x = torch.from_numpy(signal)[None]
    got = kaldi.fbank(x, backend="torch", **s["params"])
    assert got.dtype == torch.float32
    assert_within(got.numpy(), want, s, "torch path, float32")
    double = kaldi.fbank(x.double(), **s["params"])
    assert double.dtype == torch.float64
    assert_within(double.numpy(), want, s, "torch path, float64")


@pytest.mark.needs_torch
def test_fixture_sets_cover_the_issue_and_a_wrong_output_fails():
    sets = {s["name"]: s for s in manifest()["sets"]}
    params = [s["params"] for s in sets.values()]
    assert any(p.get("num_mel_bins") == 80 and p["sample_frequency"] == 16000 for p in params)
    assert any(p.get("num_mel_bins") == 128 for p in params)
    assert any(p["sample_frequency"] == 8000 for p in params)
    assert any(p.get("window_type") == "hamming" for p in params)
    assert any(p.get("snip_edges") is False for p in params)
    assert any(p.get("use_energy") is True for p in params)
    s = next(iter(sets.values()))
    signal, want = load_set(s)
    got = kaldi.fbank(torch.from_numpy(signal)[None], backend="torch", **s["params"]).numpy()
    assert_within(got, want, s, "torch path")
    with pytest.raises(AssertionError):
        assert_within(got + 3 * s["atol"] + 1e-3, want, s, "shifted")


@pytest.mark.needs_torch
def test_kaldi_banks_match_get_mel_banks_fixtures():
    from melforge.fbank import fbank_params, kaldi_banks
    banks = manifest()["banks"]
    assert len(banks) >= 3
    for b in banks:
        want = np.fromfile(FOLDER / b["file"], dtype="<f4").reshape(b["rows"], b["columns"])
        p, _ = fbank_params(dict(num_mel_bins=b["num_mel_bins"], sample_frequency=b["sample_frequency"],
                                 low_freq=b["low_freq"], high_freq=b["high_freq"]))
        got = kaldi_banks(p, b["padded_window_size"]).numpy()
        assert got.shape == (b["rows"], b["columns"] + 1) and (got[:, -1] == 0).all()
        np.testing.assert_allclose(got[:, :-1], want, rtol=0, atol=1e-6, err_msg=b["name"])


TORCHAUDIO_DEFAULTS = dict(
    blackman_coeff=0.42, channel=-1, dither=0.0, energy_floor=1.0, frame_length=25.0, frame_shift=10.0,
    high_freq=0.0, htk_compat=False, low_freq=20.0, min_duration=0.0, num_mel_bins=23, preemphasis_coefficient=0.97,
    raw_energy=True, remove_dc_offset=True, round_to_power_of_two=True, sample_frequency=16000.0, snip_edges=True,
    subtract_mean=False, use_energy=False, use_log_fbank=True, use_power=True, vtln_high=-500.0, vtln_low=100.0,
    vtln_warp=1.0, window_type="povey")


def test_signature_is_torchaudios():
    params = inspect.signature(kaldi.fbank).parameters
    positional = [n for n, p in params.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == ["waveform"] + list(TORCHAUDIO_DEFAULTS)
    for name, default in TORCHAUDIO_DEFAULTS.items():
        assert params[name].default == default and type(params[name].default) is type(default), name
    assert [n for n, p in params.items() if p.kind == p.KEYWORD_ONLY] == ["dither_seed", "threads", "backend"]


@pytest.fixture(scope="module")
def speech():
    rng = np.random.default_rng(31)
    t = np.arange(8000) / 16000.0
    return (3000 * np.sin(2 * np.pi * 300 * t * (1 + t)) + 300 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.mark.needs_torch
def test_channel_min_duration_and_shapes(speech):
    two = torch.from_numpy(np.stack([speech, speech[::-1].copy()]))
    first = kaldi.fbank(two, num_mel_bins=40)
    assert tuple(first.shape) == (1 + (8000 - 400) // 160, 40)
    np.testing.assert_array_equal(kaldi.fbank(two, channel=0, num_mel_bins=40).numpy(), first.numpy())
    np.testing.assert_array_equal(kaldi.fbank(two[1:], num_mel_bins=40).numpy(),
                                  kaldi.fbank(two, channel=1, num_mel_bins=40).numpy())
    np.testing.assert_array_equal(kaldi.fbank(two[0], num_mel_bins=40).numpy(), first.numpy())
    with pytest.raises(AssertionError, match="channel 2"):
        kaldi.fbank(two, channel=2)
    empty = kaldi.fbank(two, min_duration=0.51)
    assert tuple(empty.shape) == (0,) and empty.dtype == torch.float32
    assert tuple(kaldi.fbank(two.double(), min_duration=0.51).shape) == (0,)
    assert kaldi.fbank(speech[None], min_duration=0.51).shape == (0,)
    assert tuple(kaldi.fbank(two, min_duration=0.5, use_energy=True).shape) == (48, 24)


@pytest.mark.needs_torch
def test_errors_are_torchaudios_and_clear(speech):
    short = torch.from_numpy(speech[:399])[None]
    for snip_edges in (True, False):
        with pytest.raises(AssertionError, match="fewer than one window of 400") as info:
            kaldi.fbank(short, snip_edges=snip_edges)
        assert isinstance(info.value, melforge.InvalidArgument)
    assert tuple(kaldi.fbank(torch.from_numpy(speech[:400])[None]).shape) == (1, 23)
    with pytest.raises(NotImplementedError, match="vtln_warp"):
        kaldi.fbank(short, vtln_warp=0.9)
    with pytest.raises(TypeError, match="float32 or torch.float64"):
        kaldi.fbank(torch.zeros(1, 800, dtype=torch.int16))
    with pytest.raises(TypeError, match="float32 or torch.float64"):
        kaldi.fbank(torch.zeros(1, 800, dtype=torch.float16))
    with pytest.raises(melforge.InvalidArgument, match="window_type"):
        kaldi.fbank(short, window_type="kaiser")
    with pytest.raises(melforge.InvalidArgument, match="preemphasis"):
        kaldi.fbank(short, preemphasis_coefficient=1.5)
    with pytest.raises(melforge.InvalidArgument, match="sample_frequency"):
        kaldi.fbank(short, sample_frequency=16000.5)
    with pytest.raises(melforge.InvalidArgument, match="backend"):
        kaldi.fbank(short, backend="cuda")


def test_numpy_waveforms_errors_and_dither(speech):
    got = kaldi.fbank(speech[None], num_mel_bins=40, use_energy=True)
    assert got.shape == (1 + (8000 - 400) // 160, 41) and got.dtype == np.float32
    np.testing.assert_array_equal(kaldi.fbank(speech[None].astype(np.float64), num_mel_bins=40, use_energy=True), got)
    with pytest.raises(kaldi.FbankAssertionError, match="fewer than one window of 400"):
        kaldi.fbank(speech[None, :399])
    with pytest.raises(NotImplementedError, match="vtln_warp"):
        kaldi.fbank(speech[None], vtln_warp=0.9)
    with pytest.raises(TypeError, match="unexpected keyword"):
        kaldi.fbank(speech[None], num_mel_bin=40)
    a = kaldi.fbank(speech[None], dither=1.0, dither_seed=5)
    np.testing.assert_array_equal(kaldi.fbank(speech[None], dither=1.0, dither_seed=5), a)
    assert not np.array_equal(kaldi.fbank(speech[None], dither=1.0, dither_seed=6), a), "dither_seed changes nothing"
    assert not np.array_equal(kaldi.fbank(speech[None]), a), "dither 1.0 changes nothing"


@pytest.mark.needs_torch
def test_dither_is_seeded_and_the_same_on_both_paths(speech):
    x = torch.from_numpy(speech)[None]
    a = kaldi.fbank(x, dither=1.0, dither_seed=7)
    np.testing.assert_array_equal(kaldi.fbank(x, dither=1.0, dither_seed=7).numpy(), a.numpy())
    b = kaldi.fbank(x, dither=1.0, dither_seed=8)
    clean = kaldi.fbank(x)
    assert not torch.equal(a, b) and not torch.equal(a, clean)
    torch_path = kaldi.fbank(x, dither=1.0, dither_seed=7, backend="torch")
    np.testing.assert_allclose(torch_path.numpy(), a.numpy(), rtol=0, atol=2e-3)
    quiet = torch.zeros(1, 4000)
    silent = kaldi.fbank(quiet, dither=1.0, dither_seed=3, backend="torch")
    assert silent.std() > 0.1


@pytest.mark.needs_torch
def test_gradient_through_the_torch_path(speech):
    x = torch.from_numpy(speech)[None].requires_grad_(True)
    y = kaldi.fbank(x, num_mel_bins=40)
    assert y.requires_grad
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    np.testing.assert_allclose(y.detach().numpy(), kaldi.fbank(x.detach(), num_mel_bins=40).numpy(), atol=2e-3)
    with pytest.raises(RuntimeError, match="backend='torch'"):
        kaldi.fbank(x, backend="engine")
    with torch.no_grad():
        assert not kaldi.fbank(x, backend="engine").requires_grad


@pytest.mark.needs_torch
def test_cuda_tensors_stay_on_their_device(speech):
    x = torch.from_numpy(speech)[None]
    cpu = kaldi.fbank(x, num_mel_bins=80, use_energy=True)
    if torch.cuda.is_available():
        on_gpu = kaldi.fbank(x.cuda(), num_mel_bins=80, use_energy=True)
        assert on_gpu.device.type == "cuda" and on_gpu.dtype == torch.float32
        np.testing.assert_allclose(on_gpu.cpu().numpy(), cpu.numpy(), rtol=0, atol=2e-3)
        double = kaldi.fbank(x.cuda().double(), num_mel_bins=80, use_energy=True)
        assert double.device.type == "cuda" and double.dtype == torch.float64
