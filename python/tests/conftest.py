"""Shared fixtures of the melforge package tests. They import the installed package (tools/setup_python.sh installs
it with `pip install .`), never the source folder, so that they test what a user gets."""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def repo():
    """The repository root (committed fixtures live in tests/data/)."""
    return REPO


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_h5py: reads files back with h5py (deselected in the wheel's venv)")
    config.addinivalue_line("markers", "needs_torch: uses torch")
