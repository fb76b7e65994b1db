"""melforge.MelSpectrogram: torchaudio.transforms.MelSpectrogram's signature and results, computed by melforge's C++
CPU engine (FFTW, multi-threaded) or, for CUDA tensors, float64 and inputs that need a gradient, by torch.stft with
melforge's filterbank. A torch.nn.Module when torch is importable (resolved on first use of the name, so that
`import melforge` never imports torch), a plain callable on NumPy arrays without it. Also the bounded engine cache
(clear_cache, cache_info, set_cache_limit)."""
import importlib.util
import sys
import warnings

import numpy as np

from . import _core
from ._core import InvalidArgument

__all__ = ["MelSpectrogram", "clear_cache", "cache_info", "set_cache_limit"]

_WINDOWS = {"hann": "hann", "hann_window": "hann", "hamming": "hamming", "hamming_window": "hamming"}
_BACKENDS = ("auto", "engine", "torch")
#: Default bound of the engine cache, bytes (256 MiB); set_cache_limit changes it.
DEFAULT_CACHE_BYTES = 256 << 20
_clear_hooks = []


def clear_cache():
    """Drops every cached engine (FFTW plans and scratch buffers) of every MelSpectrogram, Fbank and
    compliance.kaldi.fbank; they are rebuilt on their next call."""
    _core.clear_engine_cache()
    for hook in _clear_hooks:
        hook()


def cache_info():
    """The engine cache: {"engines": count, "bytes": sum of their host bytes, "limit": the bound in bytes}."""
    return dict(_core.engine_cache_info())


def set_cache_limit(nbytes):
    """Bounds the engine cache to `nbytes` bytes (int >= 0; default DEFAULT_CACHE_BYTES): the least recently used
    engines are dropped first, at once and whenever a new one would exceed it. The engine in use is always kept."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise InvalidArgument(f"cache limit must be an integer number of bytes >= 0, got {nbytes!r}")
    _core.set_engine_cache_limit(int(nbytes))


def torch_available():
    """Whether torch can be imported (looked up without importing it; a None entry in sys.modules blocks it)."""
    if sys.modules.get("torch") is not None:
        return True
    return importlib.util.find_spec("torch") is not None


class EngineState:
    """Pickling (copy.deepcopy, torch.save) of an object holding a `_core` engine handle: the handle is left out of the
    state and rebuilt by `_make_core()` when the state is restored."""

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_core", None)
        state.pop("_bank_cache", None)
        return state

    def __setstate__(self, state):
        restore = getattr(super(), "__setstate__", None)
        if restore is not None:
            restore(state)
        else:
            self.__dict__.update(state)
        self.__dict__["_core"] = self._make_core()


def check_backend(backend):
    """`backend` if it is one of "auto", "engine", "torch"; else InvalidArgument."""
    if backend not in _BACKENDS:
        raise InvalidArgument(f"backend must be 'auto', 'engine' or 'torch', got {backend!r}")
    return backend


def check_threads(threads):
    """`threads` as an int if it is an integer >= 0; else InvalidArgument."""
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 0:
        raise InvalidArgument(f"threads must be an integer >= 0 (0: all cores), got {threads!r}")
    return int(threads)


def is_tensor(x):
    """Whether x is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def choose_path(x, backend, owner):
    """"engine" or "torch" for tensor `x` under `backend`, after refusing dtypes other than float32/float64
    (TypeError) and a gradient on the engine path (RuntimeError). auto: the engine for CPU float32 tensors that need
    no gradient, torch for the rest (CUDA, float64, requires_grad)."""
    import torch
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{owner}: input dtype must be torch.float32 or torch.float64 (as torchaudio computes), got "
                        f"{x.dtype}; convert it with x.float()")
    needs_grad = x.requires_grad and torch.is_grad_enabled()
    if backend == "engine":
        if needs_grad:
            raise RuntimeError(f"{owner}: backend='engine' (melforge's C++ engine) computes no gradient, and the input "
                               f"requires grad; use backend='torch' or 'auto' (the default), which compute through "
                               f"torch ops and are differentiable, or pass x.detach()")
        return "engine"
    if backend == "torch" or x.device.type != "cpu" or x.dtype == torch.float64 or needs_grad:
        return "torch"
    return "engine"


def engine_on_tensor(compute, x):
    """compute (NumPy float32 [..., time] -> float32 array) on a detached CPU float32 copy of tensor x; the result as a
    tensor of x's dtype on x's device."""
    import torch
    cpu32 = x.device.type == "cpu" and x.dtype == torch.float32
    out = torch.from_numpy(compute(x.detach().numpy() if cpu32 else x.detach().to("cpu", torch.float32).numpy()))
    return out if cpu32 else out.to(device=x.device, dtype=x.dtype)


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


class _MelSpectrogramImpl(EngineState):
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
        CPU threads of the engine (0: all cores).
    backend : str, keyword-only
        Which computes a torch tensor: "auto" (the engine for CPU float32 tensors that need no gradient; torch.stft
        with this module's filterbank for CUDA tensors, float64 and inputs that require grad), "engine" (always the
        C++ engine, on the CPU, in float32; an input that requires grad is refused with a RuntimeError) or "torch"
        (always torch ops: differentiable, on the input's device, in its dtype). NumPy input always uses the engine.

    Raises
    ------
    melforge.InvalidArgument
        For any invalid parameter, when the object is made (before any work).

    Notes
    -----
    Input x: a NumPy array of shape [..., time] (float32 out), or a float32/float64 torch tensor (the same dtype out,
    on x's device; other dtypes raise TypeError). Output [..., n_mels, n_frames]. n_frames is
    1 + (time + 2 * pad) // hop_length when centred, else 1 + (time + 2 * pad - n_fft) // hop_length. One engine
    (FFTW plan) is built per distinct (time, threads) and kept in the process-wide cache, bounded by bytes
    (melforge.set_cache_limit, melforge.clear_cache). As a module, its buffers are torchaudio's:
    `spectrogram.window` [win_length] and `mel_scale.fb` [n_freqs, n_mels]; they are derived from the parameters
    (loading other values changes only the torch path).
    """

    def __init__(self, sample_rate=16000, n_fft=400, win_length=None, hop_length=None, f_min=0.0, f_max=None,
                 pad=0, n_mels=128, window_fn="hann", power=2.0, normalized=False, center=True, pad_mode="reflect",
                 norm=None, mel_scale="htk", *, log="none", amin=1e-10, log_eps=1e-6, threads=0, backend="auto"):
        if power is None:
            raise InvalidArgument("power=None (a complex spectrogram) is not supported: melforge computes mel "
                                  "energies; use power=2.0 (power) or power=1.0 (magnitude)")
        if norm is not None and not isinstance(norm, str):
            raise InvalidArgument(f"norm must be None or 'slaney', got {norm!r}")
        threads = check_threads(threads)
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
        self.pad_mode, self.norm, self.mel_scale_name = pad_mode, norm, mel_scale
        self.log, self.amin, self.log_eps, self.threads = log, float(amin), float(log_eps), threads
        self.backend = check_backend(backend)
        self._core_kwargs = dict(
            sample_rate=self.sample_rate, n_fft=self.n_fft, win_length=_optional_int(win_length, "win_length"),
            hop_length=_optional_int(hop_length, "hop_length"), f_min=self.f_min,
            f_max=0.0 if f_max is None else float(f_max), pad=self.pad, n_mels=self.n_mels, window=self.window,
            power=self.power, normalized=_normalized_mode(normalized), center=self.center, pad_mode=str(pad_mode),
            norm="none" if norm is None else norm, mel_scale=str(mel_scale), log=str(log), amin=self.amin,
            log_eps=self.log_eps)
        self._core = self._make_core()
        warning = self._core.empty_bands_warning()
        if warning:
            warnings.warn(warning, UserWarning, stacklevel=3)

    def _make_core(self):
        return _core.MelCompute(**self._core_kwargs)

    def n_frames(self, time):
        """Frames of a signal of `time` samples (int)."""
        return self._core.n_frames(int(time))

    def cached_engines(self):
        """Number of this object's engines (FFTW plans) in the cache: one per distinct (time, threads) still cached."""
        return self._core.cached_engines()

    def forward(self, x):
        """Mel spectrogram of `x` [..., time]: a NumPy array (float32 out) or a float32/float64 torch tensor (its
        dtype out, on its device): [..., n_mels, n_frames]."""
        if is_tensor(x):
            if x.is_complex():
                raise InvalidArgument("x must be real, got a complex tensor")
            if choose_path(x, self.backend, "melforge.MelSpectrogram") == "torch":
                return self._torch_forward(x)
            return engine_on_tensor(self._call_numpy, x)
        return self._call_numpy(x)

    def _call_numpy(self, x):
        x = np.asarray(x)
        if x.ndim < 1:
            raise InvalidArgument("x must have shape [..., time], got a scalar")
        if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
            raise InvalidArgument(f"x must hold real numbers, got dtype {x.dtype}")
        lead, time = x.shape[:-1], x.shape[-1]
        rows = np.ascontiguousarray(x.reshape(-1, time), dtype=np.float32)
        out = self._core.compute(rows, self.threads)
        return out.reshape(*lead, out.shape[1], out.shape[2])

    def _window_fb(self, x):
        """The window [win_length] and filterbank [n_freqs, n_mels] for the torch path, on x's device and dtype."""
        import torch
        make = torch.hann_window if self.window == "hann" else torch.hamming_window
        window, fb = make(self.win_length), torch.from_numpy(self._core.filterbank())
        return window.to(device=x.device, dtype=x.dtype), fb.to(device=x.device, dtype=x.dtype)

    def _torch_forward(self, x):
        """torchaudio's MelSpectrogram in torch ops (torch.stft, this object's window and filterbank), then `log`."""
        import torch
        window, fb = self._window_fb(x)
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if self.pad > 0:
            rows = torch.nn.functional.pad(rows, (self.pad, self.pad), "constant")
        if self.n_frames(shape[-1]) < 1:
            raise InvalidArgument(f"a signal of {shape[-1]} samples gives no frame with n_fft {self.n_fft}"
                                  + ("" if self.center else " and center=False"))
        spec = torch.stft(rows, n_fft=self.n_fft, hop_length=self.hop_length, win_length=self.win_length,
                          window=window, center=self.center, pad_mode=self.pad_mode,
                          normalized=self.normalized == "frame_length", onesided=True, return_complex=True)
        if self.normalized is True or self.normalized == "window":
            spec = spec / window.pow(2.0).sum().sqrt()
        spec = spec.abs() if self.power == 1.0 else spec.abs().pow(self.power)
        mel = torch.matmul(spec.transpose(-1, -2), fb).transpose(-1, -2)
        if self.log == "db":
            mel = (20.0 / self.power) * torch.log10(torch.clamp(mel, min=self.amin))
        elif self.log == "ln":
            mel = torch.log(mel + self.log_eps)
        return mel.reshape(shape[:-1] + mel.shape[-2:])

    def _params_repr(self):
        return (f"sample_rate={self.sample_rate}, n_fft={self.n_fft}, win_length={self.win_length}, "
                f"hop_length={self.hop_length}, f_min={self.f_min}, f_max={self.f_max}, pad={self.pad}, "
                f"n_mels={self.n_mels}, window_fn={self.window!r}, power={self.power}, "
                f"normalized={self.normalized!r}, center={self.center}, pad_mode={self.pad_mode!r}, "
                f"norm={self.norm!r}, mel_scale={self.mel_scale_name!r}, log={self.log!r}, amin={self.amin}, "
                f"log_eps={self.log_eps}, threads={self.threads}, backend={self.backend!r}")


class _PlainMelSpectrogram(_MelSpectrogramImpl):
    __doc__ = _MelSpectrogramImpl.__doc__

    def __call__(self, x):
        return self.forward(x)

    def __repr__(self):
        return f"MelSpectrogram({self._params_repr()})"


_classes = {}


def _torch_classes():
    """The nn.Module classes (made once, on first use): MelSpectrogram and its buffer holders Spectrogram (window)
    and MelScale (fb), named as torchaudio's so that state_dict keys are torchaudio's."""
    if _classes:
        return _classes
    import torch

    class Spectrogram(torch.nn.Module):
        """Holds torchaudio's Spectrogram buffer `window` [win_length] (the window of the torch path)."""

        def __init__(self, window):
            super().__init__()
            self.register_buffer("window", window)

        def extra_repr(self):
            return f"window={tuple(self.window.shape)}"

    class MelScale(torch.nn.Module):
        """Holds torchaudio's MelScale buffer `fb` [n_freqs, n_mels] (the filterbank of the torch path)."""

        def __init__(self, fb):
            super().__init__()
            self.register_buffer("fb", fb)

        def extra_repr(self):
            return f"fb={tuple(self.fb.shape)}"

    class MelSpectrogram(_MelSpectrogramImpl, torch.nn.Module):
        __doc__ = _MelSpectrogramImpl.__doc__

        def __init__(self, *args, **kwargs):
            torch.nn.Module.__init__(self)
            _MelSpectrogramImpl.__init__(self, *args, **kwargs)
            make = torch.hann_window if self.window == "hann" else torch.hamming_window
            self.spectrogram = Spectrogram(make(self.win_length))
            self.mel_scale = MelScale(torch.from_numpy(self._core.filterbank()))

        def _window_fb(self, x):
            window = self.spectrogram.window.to(device=x.device, dtype=x.dtype)
            return window, self.mel_scale.fb.to(device=x.device, dtype=x.dtype)

        def extra_repr(self):
            return self._params_repr()

        def __repr__(self):
            return f"MelSpectrogram({self._params_repr()})"

    for cls in (Spectrogram, MelScale, MelSpectrogram):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    _classes.update(Spectrogram=Spectrogram, MelScale=MelScale, MelSpectrogram=MelSpectrogram)
    return _classes


def resolve(name, plain):
    """The class `name` of _torch_classes() when torch is importable, else `plain` (None: AttributeError)."""
    if torch_available():
        try:
            return _torch_classes()[name]
        except ImportError:
            pass
    if plain is None:
        raise AttributeError(f"melforge.mel.{name} needs torch")
    return plain


def __getattr__(name):
    """MelSpectrogram (and the buffer holders, for pickle) resolved on first use: the nn.Module when torch is
    importable, the plain callable otherwise."""
    if name == "MelSpectrogram":
        return resolve(name, _PlainMelSpectrogram)
    if name in ("Spectrogram", "MelScale"):
        return resolve(name, None)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
