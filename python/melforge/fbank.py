"""melforge.Fbank: Kaldi's log mel filterbank as torchaudio.compliance.kaldi.fbank computes it, over a batch
[..., time], computed by melforge's C++ CPU engine (MelArgs::use_fbank) or, for CUDA tensors, float64 and inputs
that need a gradient, by torch ops that follow torchaudio's pipeline with our seeded dither. A torch.nn.Module when
torch is importable (resolved on first use of the name), a plain callable on NumPy arrays without it. The torch
pipeline here also serves melforge.compliance.kaldi.fbank."""
import math

import numpy as np

from . import _core
from ._core import InvalidArgument
from .mel import EngineState, check_backend, check_threads, choose_path, engine_on_tensor, is_tensor, torch_available

__all__ = ["Fbank", "FBANK_DEFAULTS"]

#: torchaudio.compliance.kaldi.fbank's feature keywords and defaults (all but waveform, channel and min_duration),
#: plus our dither_seed.
FBANK_DEFAULTS = dict(blackman_coeff=0.42, dither=0.0, energy_floor=1.0, frame_length=25.0, frame_shift=10.0,
                      high_freq=0.0, htk_compat=False, low_freq=20.0, num_mel_bins=23, preemphasis_coefficient=0.97,
                      raw_energy=True, remove_dc_offset=True, round_to_power_of_two=True, sample_frequency=16000.0,
                      snip_edges=True, subtract_mean=False, use_energy=False, use_log_fbank=True, use_power=True,
                      vtln_high=-500.0, vtln_low=100.0, vtln_warp=1.0, window_type="povey", dither_seed=0)
_BOOLS = ("htk_compat", "raw_energy", "remove_dc_offset", "round_to_power_of_two", "snip_edges", "subtract_mean",
          "use_energy", "use_log_fbank", "use_power")
_FLT_EPSILON = float(np.finfo(np.float32).eps)


def fbank_params(kwargs):
    """The checked parameters: FBANK_DEFAULTS updated by `kwargs` with each value's type checked, and the integer
    sample rate. Raises NotImplementedError for vtln_warp != 1, InvalidArgument (a ValueError) otherwise."""
    unknown = sorted(set(kwargs) - set(FBANK_DEFAULTS))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {', '.join(unknown)}")
    p = dict(FBANK_DEFAULTS, **kwargs)
    for name in _BOOLS:
        if not isinstance(p[name], (bool, np.bool_)):
            raise InvalidArgument(f"{name} must be True or False, got {p[name]!r}")
        p[name] = bool(p[name])
    for name, value in p.items():
        if name in _BOOLS or name in ("window_type", "num_mel_bins", "dither_seed"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidArgument(f"{name} must be a number, got {value!r}")
        p[name] = float(value)
    for name in ("num_mel_bins", "dither_seed"):
        if isinstance(p[name], bool) or not isinstance(p[name], (int, np.integer)) or p[name] < 0:
            raise InvalidArgument(f"{name} must be an integer >= 0, got {p[name]!r}")
        p[name] = int(p[name])
    if not isinstance(p["window_type"], str):
        raise InvalidArgument(f"window_type must be a string, got {p['window_type']!r}")
    if p["vtln_warp"] != 1.0:
        raise NotImplementedError(f"vtln_warp={p['vtln_warp']}: VTLN warping is not implemented by melforge; only "
                                  f"vtln_warp=1.0 (no warp, torchaudio's default) is supported")
    rate = p["sample_frequency"]
    if not (rate > 0 and rate == int(rate)):
        raise InvalidArgument(f"sample_frequency must be a whole positive number of Hz, got {rate!r}")
    return p, int(rate)


def make_core(p, rate):
    """The engine object (_core.MelCompute.fbank) for checked parameters `p` at `rate` Hz."""
    engine = {k: v for k, v in p.items() if k not in ("sample_frequency", "vtln_low", "vtln_high")}
    return _core.MelCompute.fbank(rate, engine)


def geometry(p, rate):
    """(window_size, window_shift, padded_window_size), samples, as torchaudio computes them."""
    size = int(p["sample_frequency"] * p["frame_length"] * 0.001)
    shift = int(p["sample_frequency"] * p["frame_shift"] * 0.001)
    padded = 1 << max(size - 1, 0).bit_length() if p["round_to_power_of_two"] else size
    return size, shift, padded


def short_signal_message(owner, samples, size):
    """The error for a signal shorter than the window (torchaudio asserts 2 <= window_size <= len(waveform))."""
    return (f"{owner}: the waveform has {samples} samples, fewer than one window of {size} samples (frame_length); "
            f"torchaudio's kaldi.fbank refuses it too (\"choose a window size {size} that is [2, {samples}]\")")


def kaldi_banks(p, padded):
    """torchaudio's get_mel_banks (vtln_warp 1) computed as it does, in float32, with the zero column for the
    Nyquist bin that fbank appends: [num_mel_bins, padded // 2 + 1]."""
    import torch
    bins, rate = p["num_mel_bins"], p["sample_frequency"]
    high = p["high_freq"] + 0.5 * rate if p["high_freq"] <= 0.0 else p["high_freq"]
    mel_low = 1127.0 * math.log(1.0 + p["low_freq"] / 700.0)
    mel_high = 1127.0 * math.log(1.0 + high / 700.0)
    delta = (mel_high - mel_low) / (bins + 1)
    b = torch.arange(bins, dtype=torch.float32).unsqueeze(1)
    left, center, right = mel_low + b * delta, mel_low + (b + 1.0) * delta, mel_low + (b + 2.0) * delta
    freqs = (rate / padded) * torch.arange(padded // 2, dtype=torch.float32)
    mel = (1127.0 * (1.0 + freqs / 700.0).log()).unsqueeze(0)
    up, down = (mel - left) / (center - left), (right - mel) / (right - center)
    banks = torch.max(torch.zeros(1), torch.min(up, down))
    return torch.nn.functional.pad(banks, (0, 1), mode="constant", value=0.0)


def kaldi_window(p, size, device, dtype):
    """torchaudio's _feature_window_function in `dtype` on `device`: [window_size]."""
    import torch
    kind = p["window_type"].lower()
    if kind == "hanning":
        return torch.hann_window(size, periodic=False, device=device, dtype=dtype)
    if kind == "hamming":
        return torch.hamming_window(size, periodic=False, alpha=0.54, beta=0.46, device=device, dtype=dtype)
    if kind == "povey":
        return torch.hann_window(size, periodic=False, device=device, dtype=dtype).pow(0.85)
    if kind == "rectangular":
        return torch.ones(size, device=device, dtype=dtype)
    a = 2 * math.pi / (size - 1)
    n = torch.arange(size, device=device, dtype=dtype)
    c = p["blackman_coeff"]
    return c - 0.5 * torch.cos(a * n) + (0.5 - c) * torch.cos(2 * a * n)


def frame_index(samples, size, shift, snip_edges):
    """[frames, window_size] sample indices of torchaudio's _get_strided (snip_edges false: the signal mirrored with
    the edge sample repeated)."""
    if snip_edges:
        frames = 1 + (samples - size) // shift
        positions = np.arange(samples)
    else:
        frames = (samples + shift // 2) // shift
        pad = size // 2 - shift // 2
        forward, backward = np.arange(samples), np.arange(samples)[::-1]
        positions = (np.concatenate([backward[-pad:], forward, backward]) if pad > 0
                     else np.concatenate([forward[-pad:], backward]))
    return positions[np.arange(frames)[:, None] * shift + np.arange(size)[None, :]]


def log_energy(frames, floor):
    """torchaudio's _get_log_energy over the last axis: [..., frames]."""
    import torch
    eps = torch.tensor(_FLT_EPSILON, device=frames.device, dtype=frames.dtype)
    energy = torch.max(frames.pow(2).sum(-1), eps).log()
    if floor == 0.0:
        return energy
    return torch.max(energy, torch.tensor(math.log(floor), device=frames.device, dtype=frames.dtype))


def torch_fbank(rows, p, rate, banks):
    """Kaldi's filterbank of rows [B, time] (float32/float64 tensor, any device) in torch ops, following
    torchaudio.compliance.kaldi.fbank step by step; the dither is ours (fbank_dither_noise, the engine's noise).
    `banks` [num_mel_bins, padded // 2 + 1]. Returns [B, frames, bins], differentiable."""
    import torch
    size, shift, padded = geometry(p, rate)
    index = frame_index(rows.shape[-1], size, shift, p["snip_edges"])
    frames = rows[:, torch.from_numpy(index).to(rows.device)]
    if p["dither"] != 0.0:
        noise = _core.fbank_dither_noise(p["dither_seed"], index.shape[0], size)
        frames = frames + p["dither"] * torch.from_numpy(noise).to(device=rows.device, dtype=rows.dtype)
    if p["remove_dc_offset"]:
        frames = frames - frames.mean(-1, keepdim=True)
    if p["raw_energy"]:
        energy = log_energy(frames, p["energy_floor"])
    c = p["preemphasis_coefficient"]
    if c != 0.0:
        frames = frames - c * torch.cat([frames[..., :1], frames[..., :-1]], dim=-1)
    frames = frames * kaldi_window(p, size, rows.device, rows.dtype)
    if padded != size:
        frames = torch.nn.functional.pad(frames, (0, padded - size), mode="constant", value=0.0)
    if not p["raw_energy"]:
        energy = log_energy(frames, p["energy_floor"])
    spectrum = torch.fft.rfft(frames).abs()
    if p["use_power"]:
        spectrum = spectrum.pow(2.0)
    mel = torch.matmul(spectrum, banks.to(device=rows.device, dtype=rows.dtype).T)
    if p["use_log_fbank"]:
        mel = torch.max(mel, torch.tensor(_FLT_EPSILON, device=rows.device, dtype=rows.dtype)).log()
    if p["use_energy"]:
        parts = (mel, energy.unsqueeze(-1)) if p["htk_compat"] else (energy.unsqueeze(-1), mel)
        mel = torch.cat(parts, dim=-1)
    if p["subtract_mean"]:
        mel = mel - mel.mean(-2, keepdim=True)
    return mel


class _FbankImpl(EngineState):
    """Kaldi's log mel filterbank (torchaudio.compliance.kaldi.fbank's features) of every row of a batch.

    Parameters: torchaudio.compliance.kaldi.fbank's keywords and defaults (num_mel_bins=23, frame_length=25.0 ms,
    frame_shift=10.0 ms, window_type="povey", blackman_coeff, preemphasis_coefficient=0.97, remove_dc_offset=True,
    dither=0.0, round_to_power_of_two=True, snip_edges=True, low_freq=20.0, high_freq=0.0 (<= 0: Nyquist + it),
    use_energy=False, raw_energy=True, energy_floor=1.0, htk_compat=False, use_log_fbank=True, use_power=True,
    subtract_mean=False, sample_frequency=16000.0, vtln_low, vtln_high, vtln_warp=1.0 (other values:
    NotImplementedError)), without `channel` and `min_duration` (see melforge.compliance.kaldi.fbank), plus
    keyword-only `dither_seed` (int, default 0: our dither noise is seeded and the same on every call, row and path),
    `threads` (engine threads, 0: all cores) and `backend` ("auto", "engine", "torch", as melforge.MelSpectrogram).

    Input [..., time]: a NumPy array (float32 out) or a float32/float64 torch tensor (its dtype out, on its device;
    other dtypes raise TypeError); every row is one utterance (subtract_mean and the dither frame index are per row).
    Output [..., frames, bins], bins = num_mel_bins (+ 1 energy column with use_energy: first, last with htk_compat).
    A row shorter than one window raises melforge.InvalidArgument, as torchaudio asserts. As a module its buffer
    `mel_banks` [num_mel_bins, padded_window_size // 2 + 1] is Kaldi's bank as torchaudio builds it (float32), used
    by the torch path; the engine builds its own from the parameters.
    """

    def __init__(self, *, threads=0, backend="auto", **kwargs):
        self.params, self.sample_rate = fbank_params(kwargs)
        self.threads, self.backend = check_threads(threads), check_backend(backend)
        self._core = self._make_core()
        self.window_size, self.window_shift, self.padded_window_size = geometry(self.params, self.sample_rate)

    def __getattr__(self, name):
        """The parameters as attributes (fb.num_mel_bins, fb.dither, ...)."""
        params = self.__dict__.get("params")
        if params is not None and name in params:
            return params[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _make_core(self):
        return make_core(self.params, self.sample_rate)

    @property
    def bins(self):
        """Output columns: num_mel_bins, + 1 with use_energy."""
        return self.params["num_mel_bins"] + (1 if self.params["use_energy"] else 0)

    def n_frames(self, time):
        """Frames of a row of `time` samples (Kaldi's count; 0 when it gives none)."""
        return self._core.n_frames(int(time))

    def cached_engines(self):
        """Number of this object's engines in the cache (one per thread count: an engine serves every length)."""
        return self._core.cached_engines()

    def forward(self, x):
        """Filterbank of `x` [..., time] (NumPy, or a float32/float64 tensor): [..., frames, bins]."""
        if is_tensor(x):
            if x.is_complex():
                raise InvalidArgument("x must be real, got a complex tensor")
            self._check_length(x.shape)
            if choose_path(x, self.backend, "melforge.Fbank") == "torch":
                rows = x.reshape(-1, x.shape[-1])
                out = torch_fbank(rows, self.params, self.sample_rate, self._banks(x))
                return out.reshape(tuple(x.shape[:-1]) + tuple(out.shape[-2:]))
            return engine_on_tensor(self._call_numpy, x)
        return self._call_numpy(x)

    def _check_length(self, shape):
        if len(shape) < 1:
            raise InvalidArgument("x must have shape [..., time], got a scalar")
        if shape[-1] < self.window_size:
            raise InvalidArgument(short_signal_message("melforge.Fbank", shape[-1], self.window_size))

    def _banks(self, x):
        return self.banks()

    def banks(self):
        """Kaldi's mel banks as torchaudio builds them: a float32 torch tensor [num_mel_bins, padded // 2 + 1],
        built once."""
        if self.__dict__.get("_bank_cache") is None:
            self.__dict__["_bank_cache"] = kaldi_banks(self.params, self.padded_window_size)
        return self.__dict__["_bank_cache"]

    def engine_tensor(self, x):
        """The engine's filterbank of tensor x [..., time] as a tensor of x's dtype on x's device (no gradient)."""
        return engine_on_tensor(self._call_numpy, x)

    def _call_numpy(self, x):
        x = np.asarray(x)
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise InvalidArgument(f"x must hold real numbers, got dtype {x.dtype}")
        self._check_length(x.shape)
        lead, time = x.shape[:-1], x.shape[-1]
        rows = np.ascontiguousarray(x.reshape(-1, time), dtype=np.float32)
        out = self._core.compute(rows, self.threads)
        return out.reshape(*lead, out.shape[1], out.shape[2])

    def _params_repr(self):
        changed = [f"{k}={v!r}" for k, v in self.params.items() if v != FBANK_DEFAULTS[k] or k == "num_mel_bins"]
        return ", ".join(changed + [f"threads={self.threads}", f"backend={self.backend!r}"])


class _PlainFbank(_FbankImpl):
    __doc__ = _FbankImpl.__doc__

    def __call__(self, x):
        return self.forward(x)

    def __repr__(self):
        return f"Fbank({self._params_repr()})"


_classes = {}


def _torch_class():
    """The nn.Module Fbank (made once, on first use)."""
    if _classes:
        return _classes["Fbank"]
    import torch

    class Fbank(_FbankImpl, torch.nn.Module):
        __doc__ = _FbankImpl.__doc__

        def __init__(self, *, threads=0, backend="auto", **kwargs):
            torch.nn.Module.__init__(self)
            _FbankImpl.__init__(self, threads=threads, backend=backend, **kwargs)
            self.register_buffer("mel_banks", kaldi_banks(self.params, self.padded_window_size))

        def __getattr__(self, name):
            params = self.__dict__.get("params")
            if params is not None and name in params:
                return params[name]
            return torch.nn.Module.__getattr__(self, name)

        def _banks(self, x):
            return self.mel_banks

        def extra_repr(self):
            return self._params_repr()

    Fbank.__module__ = __name__
    Fbank.__qualname__ = "Fbank"
    _classes["Fbank"] = Fbank
    return Fbank


def __getattr__(name):
    """Fbank resolved on first use: the nn.Module when torch is importable, the plain callable otherwise."""
    if name == "Fbank":
        if torch_available():
            try:
                return _torch_class()
            except ImportError:
                pass
        return _PlainFbank
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
