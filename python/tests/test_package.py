"""The package imports from its installed location and maps melforge's typed errors to Python exceptions."""
import pathlib

import melforge


def test_installed_not_source():
    here = pathlib.Path(melforge.__file__).resolve()
    assert "site-packages" in here.parts or "dist-packages" in here.parts, here


def test_exception_hierarchy():
    assert issubclass(melforge.InvalidArgument, ValueError)
    assert issubclass(melforge.InvalidArgument, melforge.Error)
    assert issubclass(melforge.IoError, OSError)
    assert issubclass(melforge.AudioError, melforge.IoError)
    assert issubclass(melforge.FormatError, ValueError)
    assert issubclass(melforge.Error, RuntimeError)
    assert melforge.__version__.count(".") == 2
