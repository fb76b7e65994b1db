"""melforge.MelSpectrogram: torchaudio.transforms.MelSpectrogram's signature and results, computed by melforge's C++
CPU engine (FFTW, multi-threaded), on NumPy arrays or torch tensors, without needing torch."""
import warnings

import numpy as np

from . import _core
from ._core import InvalidArgument

__all__ = ["MelSpectrogram"]

_WINDOWS = {"hann": "hann", "hann_window": "hann", "hamming": "hamming", "hamming_window": "hamming"}


def _window_name(window_fn):
    """'hann' or 'hamming' for a window given as that string or as torch.hann_window / torch.hamming_window
    (recognised by name, so that torch need not be imported)."""
    name = window_fn if isinstance(window_fn, str) else getattr(window_fn, "__name__", None)
    if isinstance(name, str) and name in _WINDOWS:
        return _WINDOWS[name]
    raise InvalidArgument(f"window_fn must be 'hann', 'hamming', torch.hann_window or torch.hamming_window, "
                          f"got {window_fn!r}")


def _normalized_mode(normalized):
    """torchaudio's `normalized` as the engine's spelling: False -> 'none', True -> 'window', or the string."""
    if isinstance(normalized, bool):
        return "window" if normalized else "none"
    if normalized in ("window", "frame_length"):
        return normalized
    raise InvalidArgument(f"normalized must be False, True, 'window' or 'frame_length', got {normalized!r}")


def _optional_int(value, name):
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise InvalidArgument(f"{name} must be a positive integer or None, got {value!r}")
    return int(value)


class MelSpectrogram:
    """Mel spectrogram with torchaudio.transforms.MelSpectrogram's parameters and defaults, plus a log stage.

    With the defaults the output equals torchaudio's (mel power, no log) within float32 rounding. Computed on the CPU
    by melforge's engine: every row of a batch in one call, on `threads` threads, with the GIL released. Usable like
    a torch module (call it, or `forward`), but needs no torch.

    Parameters
    ----------
    sample_rate : int
        Sample rate of the input, Hz.
    n_fft : int
        FFT size, samples; the spectrum has n_fft // 2 + 1 bins.
    win_length : int or None
        Window length, samples (None: n_fft); the window is zero-padded to n_fft on both sides.
    hop_length : int or None
        Hop between frames, samples (None: win_length // 2).
    f_min, f_max : float, float or None
        Lowest and highest filter edge, Hz (f_max None: sample_rate // 2).
    pad : int
        Zeros added on both sides of the signal before the STFT, samples.
    n_mels : int
        Number of mel bands. Bands that hold no FFT bin (e.g. n_fft 400 with n_mels 128, torchaudio's defaults) are
        all zero, and a UserWarning names them, as torchaudio warns.
    window_fn : str or callable
        "hann" or "hamming", or torch.hann_window / torch.hamming_window (periodic, as torchaudio calls them).
    power : float
        Exponent of the magnitude: 2 for power, 1 for magnitude. None (complex output) is not supported.
    normalized : bool or str
        As torchaudio: False; True or "window" (STFT divided by sqrt(sum(window**2))); "frame_length" (divided by
        sqrt(n_fft)).
    center : bool
        Pad by n_fft // 2 on both sides so that frame t is centred on sample t * hop_length.
    pad_mode : str
        "reflect" or "constant" (the padding of `center`).
    norm : str or None
        None or "slaney" (area normalisation of the filters).
    mel_scale : str
        "htk" or "slaney".
    log : str, keyword-only
        "none" (mel energy, torchaudio's output), "db" ((20 / power) * log10(max(x, amin)), i.e. AmplitudeToDB with
        top_db None) or "ln" (log(x + log_eps)).
    amin : float, keyword-only
        Floor of log "db".
    log_eps : float, keyword-only
        Offset of log "ln".
    threads : int, keyword-only
        CPU threads (0: all cores).

    Raises
    ------
    melforge.InvalidArgument
        For any invalid parameter, when the object is made (before any work).

    Notes
    -----
    Input x: float32 or float64 array of shape [..., time] (NumPy, or a torch tensor). Output: float32
    [..., n_mels, n_frames], the same kind as x (a torch tensor for a torch tensor, on x's device: a CUDA tensor is
    copied to the CPU, computed there, and the result copied back to its device). n_frames is
    1 + (time + 2 * pad) // hop_length when centred, else 1 + (time + 2 * pad - n_fft) // hop_length. One engine
    (FFTW plan) is built per distinct (time, threads) and kept for later calls.
    """

    def __init__(self, sample_rate=16000, n_fft=400, win_length=None, hop_length=None, f_min=0.0, f_max=None,
                 pad=0, n_mels=128, window_fn="hann", power=2.0, normalized=False, center=True, pad_mode="reflect",
                 norm=None, mel_scale="htk", *, log="none", amin=1e-10, log_eps=1e-6, threads=0):
        if power is None:
            raise InvalidArgument("power=None (a complex spectrogram) is not supported: melforge computes mel "
                                  "energies; use power=2.0 (power) or power=1.0 (magnitude)")
        if norm is not None and not isinstance(norm, str):
            raise InvalidArgument(f"norm must be None or 'slaney', got {norm!r}")
        if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 0:
            raise InvalidArgument(f"threads must be an integer >= 0 (0: all cores), got {threads!r}")
        for name, value in (("sample_rate", sample_rate), ("n_fft", n_fft), ("n_mels", n_mels), ("pad", pad)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InvalidArgument(f"{name} must be an integer, got {value!r}")
        for name, value in (("f_min", f_min), ("power", power), ("amin", amin), ("log_eps", log_eps)):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
                raise InvalidArgument(f"{name} must be a number, got {value!r}")
        if f_max is not None and (isinstance(f_max, bool) or not isinstance(f_max, (int, float, np.number))
                                  or f_max <= 0):
            raise InvalidArgument(f"f_max must be a number > 0 or None (sample_rate // 2), got {f_max!r}")
        self.sample_rate, self.n_fft, self.n_mels, self.pad = int(sample_rate), int(n_fft), int(n_mels), int(pad)
        self.win_length = win_length if win_length is not None else self.n_fft
        self.hop_length = hop_length if hop_length is not None else self.win_length // 2
        self.f_min, self.f_max = float(f_min), f_max
        self.window = _window_name(window_fn)
        self.power, self.normalized, self.center = float(power), normalized, bool(center)
        self.pad_mode, self.norm, self.mel_scale = pad_mode, norm, mel_scale
        self.log, self.amin, self.log_eps, self.threads = log, float(amin), float(log_eps), int(threads)
        self._core = _core.MelCompute(
            sample_rate=self.sample_rate, n_fft=self.n_fft, win_length=_optional_int(win_length, "win_length"),
            hop_length=_optional_int(hop_length, "hop_length"), f_min=self.f_min,
            f_max=0.0 if f_max is None else float(f_max), pad=self.pad, n_mels=self.n_mels, window=self.window,
            power=self.power, normalized=_normalized_mode(normalized), center=self.center, pad_mode=str(pad_mode),
            norm="none" if norm is None else norm, mel_scale=str(mel_scale), log=str(log), amin=self.amin,
            log_eps=self.log_eps)
        warning = self._core.empty_bands_warning()
        if warning:
            warnings.warn(warning, UserWarning, stacklevel=2)

    def n_frames(self, time):
        """Frames of a signal of `time` samples (int)."""
        return self._core.n_frames(int(time))

    def cached_engines(self):
        """Number of engines (FFTW plans) built so far: one per distinct (time, threads)."""
        return self._core.cached_engines()

    def __call__(self, x):
        """Mel spectrogram of `x` [..., time] (float32/float64 NumPy array or torch tensor): float32
        [..., n_mels, n_frames] of the same kind (and, for a tensor, on the same device)."""
        if type(x).__module__.split(".")[0] == "torch":
            return self._call_torch(x)
        return self._call_numpy(x)

    forward = __call__

    def _call_numpy(self, x):
        x = np.asarray(x)
        if x.ndim < 1:
            raise InvalidArgument(f"x must have shape [..., time], got a scalar")
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise InvalidArgument(f"x must hold real numbers, got dtype {x.dtype}")
        lead, time = x.shape[:-1], x.shape[-1]
        rows = np.ascontiguousarray(x.reshape(-1, time), dtype=np.float32)
        out = self._core.compute(rows, self.threads)
        return out.reshape(*lead, out.shape[1], out.shape[2])

    def _call_torch(self, x):
        import torch
        if x.is_complex():
            raise InvalidArgument("x must be real, got a complex tensor")
        out = self._call_numpy(x.detach().to("cpu", torch.float32).numpy())
        result = torch.from_numpy(out)
        return result if x.device.type == "cpu" else result.to(x.device)

    def __repr__(self):
        return (f"MelSpectrogram(sample_rate={self.sample_rate}, n_fft={self.n_fft}, win_length={self.win_length}, "
                f"hop_length={self.hop_length}, f_min={self.f_min}, f_max={self.f_max}, pad={self.pad}, "
                f"n_mels={self.n_mels}, window_fn={self.window!r}, power={self.power}, "
                f"normalized={self.normalized!r}, center={self.center}, pad_mode={self.pad_mode!r}, "
                f"norm={self.norm!r}, mel_scale={self.mel_scale!r}, log={self.log!r}, amin={self.amin}, "
                f"log_eps={self.log_eps}, threads={self.threads})")
