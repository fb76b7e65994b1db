"""melforge.compliance.kaldi.fbank: torchaudio.compliance.kaldi.fbank's signature, defaults, output and errors,
computed by melforge's C++ engine (CPU float32 tensors and NumPy arrays) or by torch ops following torchaudio's
pipeline (CUDA tensors, float64, inputs that need a gradient). See docs/PYTHON.md, "Kaldi fbank"."""
from collections import OrderedDict

import numpy as np

from .. import mel as _mel
from .._core import InvalidArgument
from ..fbank import _PlainFbank, fbank_params, short_signal_message, torch_fbank
from ..mel import check_backend, check_threads, choose_path, is_tensor

__all__ = ["fbank", "FbankAssertionError"]

#: Engines kept for the last parameter sets used (their engines live in the bounded engine cache).
_MAX_CORES = 16
_cores = OrderedDict()


class FbankAssertionError(InvalidArgument, AssertionError):
    """Raised where torchaudio's kaldi.fbank asserts (a waveform shorter than the window, a bad channel or parameter):
    a melforge.InvalidArgument (ValueError) that is also an AssertionError, so code written for torchaudio still
    catches it."""


def _clear():
    _cores.clear()


_mel._clear_hooks.append(_clear)


def _row(waveform, channel):
    """The channel torchaudio takes: waveform[max(channel, 0)] of [channels, time] ([time] is taken as one channel)."""
    shape = tuple(waveform.shape)
    if len(shape) not in (1, 2):
        raise FbankAssertionError(f"kaldi.fbank: waveform must be [channels, time] (or [time]), got shape {shape}")
    if len(shape) == 1:
        waveform, shape = waveform[None], (1,) + shape
    if isinstance(channel, bool) or not isinstance(channel, (int, np.integer)):
        raise FbankAssertionError(f"kaldi.fbank: channel must be an integer, got {channel!r}")
    index = max(int(channel), 0)
    if index >= shape[0]:
        raise FbankAssertionError(f"kaldi.fbank: invalid channel {channel} for a waveform of {shape[0]} channel(s)")
    return waveform[index:index + 1]


def fbank(waveform, blackman_coeff=0.42, channel=-1, dither=0.0, energy_floor=1.0, frame_length=25.0,
          frame_shift=10.0, high_freq=0.0, htk_compat=False, low_freq=20.0, min_duration=0.0, num_mel_bins=23,
          preemphasis_coefficient=0.97, raw_energy=True, remove_dc_offset=True, round_to_power_of_two=True,
          sample_frequency=16000.0, snip_edges=True, subtract_mean=False, use_energy=False, use_log_fbank=True,
          use_power=True, vtln_high=-500.0, vtln_low=100.0, vtln_warp=1.0, window_type="povey", *, dither_seed=0,
          threads=1, backend="auto"):
    """Kaldi's log mel filterbank of one channel of `waveform`, as torchaudio.compliance.kaldi.fbank.

    Every keyword is torchaudio's, with its default; see torchaudio's documentation. Ours, keyword-only:
    dither_seed (int; the dither noise is melforge's seeded Gaussian, reproducible, not torch.randn's: with
    dither 0, torchaudio's default, the numbers are torchaudio's), threads (engine threads, default 1; 0: all cores)
    and backend ("auto", "engine", "torch"; see melforge.MelSpectrogram).

    waveform: a [channels, time] torch tensor (float32 or float64; other dtypes raise TypeError) or NumPy array;
    [time] is taken as one channel. channel -1 (default) or 0 takes the first channel (torchaudio's max(channel, 0)).
    Returns [frames, bins] (bins = num_mel_bins, + 1 with use_energy): a tensor of the waveform's dtype on its
    device, or a float32 NumPy array for a NumPy waveform. A waveform shorter than min_duration seconds gives an empty
    [0] result, as torchaudio. Raises FbankAssertionError (a melforge.InvalidArgument and an AssertionError) where
    torchaudio asserts (a waveform shorter than one window, a bad channel), melforge.InvalidArgument for other bad
    parameters, NotImplementedError for vtln_warp != 1.
    """
    key = tuple((type(v), v) for v in (
        blackman_coeff, dither, energy_floor, frame_length, frame_shift, high_freq, htk_compat, low_freq,
        num_mel_bins, preemphasis_coefficient, raw_energy, remove_dc_offset, round_to_power_of_two, sample_frequency,
        snip_edges, subtract_mean, use_energy, use_log_fbank, use_power, vtln_high, vtln_low, vtln_warp, window_type,
        dither_seed, threads))
    try:
        core = _cores.get(key)
    except TypeError:  # an unhashable value: _make_core's checks name it
        core = None
    if core is None:
        core = _make_core(key)
    else:
        _cores.move_to_end(key)
    return _compute(core, waveform, channel, min_duration, backend)


def _make_core(key):
    """Checks the parameters of a fbank call (`key`: its (type, value) pairs in fbank's order, then threads) and caches
    the engine object for them under `key` (the last _MAX_CORES parameter sets are kept)."""
    (blackman_coeff, dither, energy_floor, frame_length, frame_shift, high_freq, htk_compat, low_freq, num_mel_bins,
     preemphasis_coefficient, raw_energy, remove_dc_offset, round_to_power_of_two, sample_frequency, snip_edges,
     subtract_mean, use_energy, use_log_fbank, use_power, vtln_high, vtln_low, vtln_warp, window_type, dither_seed,
     threads) = (v for _, v in key)
    p, rate = fbank_params(dict(
        blackman_coeff=blackman_coeff, dither=dither, energy_floor=energy_floor, frame_length=frame_length,
        frame_shift=frame_shift, high_freq=high_freq, htk_compat=htk_compat, low_freq=low_freq,
        num_mel_bins=num_mel_bins, preemphasis_coefficient=preemphasis_coefficient, raw_energy=raw_energy,
        remove_dc_offset=remove_dc_offset, round_to_power_of_two=round_to_power_of_two,
        sample_frequency=sample_frequency, snip_edges=snip_edges, subtract_mean=subtract_mean, use_energy=use_energy,
        use_log_fbank=use_log_fbank, use_power=use_power, vtln_high=vtln_high, vtln_low=vtln_low,
        vtln_warp=vtln_warp, window_type=window_type, dither_seed=dither_seed))
    core = _PlainFbank(threads=check_threads(threads), backend="engine", **p)
    _cores[key] = core
    while len(_cores) > _MAX_CORES:
        _cores.popitem(last=False)
    return core


def _compute(core, waveform, channel, min_duration, backend):
    """kaldi.fbank's work once its engine object `core` is known: channel, sizes, min_duration, then the path."""
    check_backend(backend)
    tensor = is_tensor(waveform)
    if tensor and waveform.is_complex():
        raise InvalidArgument("kaldi.fbank: the waveform must be real, got a complex tensor")
    if not tensor:
        waveform = np.asarray(waveform)
    row = _row(waveform, channel)
    samples = row.shape[-1]
    if not 2 <= core.window_size <= samples:
        raise FbankAssertionError(short_signal_message("kaldi.fbank", samples, core.window_size))
    if not isinstance(min_duration, (int, float, np.integer, np.floating)) or isinstance(min_duration, bool):
        raise InvalidArgument(f"min_duration must be a number of seconds, got {min_duration!r}")
    if samples < min_duration * core.sample_frequency:
        return waveform.new_empty(0) if tensor else np.empty(0, np.float32)
    if not tensor:
        return core.forward(row)[0]
    if choose_path(waveform, backend, "melforge.compliance.kaldi.fbank") == "torch":
        return torch_fbank(row, core.params, core.sample_rate, core.banks())[0]
    return core.engine_tensor(row)[0]
