"""Where the tests find bmt's binaries and fixtures helpers.

BMT_BIN_DIR (set by ctest) or <repo>/build/bin holds bmt-opt and bmt-run.
"""
import os
import shutil

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("BMT_BIN_DIR", os.path.join(REPO, "build", "bin"))


def binary(name):
    """Path of a bmt binary; skips the test when it was not built (e.g. a
    runtime-only build has no bmt-opt)."""
    path = os.path.join(BIN_DIR, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not built in {BIN_DIR}")
    return path
