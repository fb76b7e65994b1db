"""melforge.compliance: drop-in replacements of torchaudio.compliance's functions (kaldi.fbank)."""
from . import kaldi  # noqa: F401

__all__ = ["kaldi"]
