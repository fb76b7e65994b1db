"""melforge.load and melforge.info: audio files decoded and resampled exactly as melforge-build does (libsndfile,
then the channel mix-down or selection, then libsoxr)."""
import os

import numpy as np

from . import _core
from ._core import InvalidArgument

__all__ = ["load", "info"]


def load(path, sample_rate=None, channel=None):
    """Decodes an audio file as melforge-build does before computing its spectrograms.

    Parameters
    ----------
    path : str or os.PathLike
        Audio file (any format libsndfile reads: WAV, FLAC, OGG, ...).
    sample_rate : int or None
        Target rate, Hz; the audio is resampled to it (libsoxr, high quality) when the file's rate differs. None: the
        file's own rate (no resampling).
    channel : int or None
        0-based channel to keep; None averages all channels to mono (the builder's --channel -1).

    Returns
    -------
    samples : numpy.ndarray
        float32 [frames], mono, in [-1, 1] for PCM files.
    sample_rate : int
        Rate of `samples`, Hz.

    Raises
    ------
    melforge.AudioError
        The file is missing, unreadable, not audio, truncated, holds NaN/Inf, or has no channel `channel`; the
        message names the file.
    melforge.InvalidArgument
        sample_rate <= 0 or channel < 0.
    """
    if sample_rate is not None and (isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, np.integer))
                                    or sample_rate <= 0):
        raise InvalidArgument(f"sample_rate must be a positive integer or None, got {sample_rate!r}")
    if channel is not None and (isinstance(channel, bool) or not isinstance(channel, (int, np.integer))
                                or channel < 0):
        raise InvalidArgument(f"channel must be an integer >= 0 or None (mix down), got {channel!r}")
    samples, rate = _core.load(os.fspath(path), 0 if sample_rate is None else int(sample_rate),
                               -1 if channel is None else int(channel))
    return samples, int(rate)


def info(path):
    """The header of an audio file, without decoding it.

    Parameters
    ----------
    path : str or os.PathLike
        Audio file.

    Returns
    -------
    dict
        frames (int, per channel), sample_rate (int, Hz), channels (int), format (str, e.g. "WAV PCM_16"),
        seconds (float, frames / sample_rate).

    Raises
    ------
    melforge.AudioError
        The file is missing, unreadable or not audio; the message names it.
    """
    return dict(_core.info(os.fspath(path)))
