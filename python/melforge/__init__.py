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

# Each area's public names (one line each; keep the order: mel, audio, build, data, evaluate, predict, models).
from .build import build  # noqa: F401,E402
