"""melforge: torchaudio-compatible log-mel spectrograms, HDF5 mel datasets and a C++ batch loader for PyTorch users.

The package binds the C++ libraries that `melforge-build` and `melforge-train` are built from; arrays cross as NumPy
buffers (zero-copy to `torch.from_numpy`), and torch is optional. See docs/PYTHON.md.
"""
from ._core import (  # noqa: F401
    __version__,
    Error,
    InvalidArgument,
    IoError,
    AudioError,
    FormatError,
    CudaError,
    StrictError,
)

# Each area's public names (one line each; keep the order: mel, audio, build, data, cv, evaluate, predict, embed,
# models).
# MelSpectrogram and Fbank are resolved by __getattr__ below (torch.nn.Modules when torch is importable).
from .mel import clear_cache, cache_info, set_cache_limit  # noqa: F401,E402
from . import compliance  # noqa: F401,E402
from .audio import load, info  # noqa: F401,E402
from .build import build  # noqa: F401,E402
from .data import Batch, Dataset, Example, Loader  # noqa: F401,E402
from .cv import cv_splits  # noqa: F401,E402
from .evaluate import FileEvaluation, evaluate_files  # noqa: F401,E402
from .predict import predict  # noqa: F401,E402
from .embed import embed  # noqa: F401,E402


def __getattr__(name):
    """`melforge.models` (python/melforge/models.py) imports torch, so it is loaded on first use, not by
    `import melforge`; so are `MelSpectrogram` and `Fbank`, torch.nn.Modules when torch is importable (plain callables
    on NumPy arrays otherwise)."""
    import importlib

    if name == "models":
        return importlib.import_module(".models", __name__)
    if name == "MelSpectrogram":
        return importlib.import_module(".mel", __name__).__getattr__(name)
    if name == "Fbank":
        return importlib.import_module(".fbank", __name__).__getattr__(name)
    raise AttributeError(f"module 'melforge' has no attribute '{name}'")
