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


PYTHON_DIR = os.path.join(REPO, "python")


def tool(name):
    """The command that runs this checkout's Python tool NAME (bmt-export-hf,
    bmt-prepare-data, bmt-plot) from its package python/bmt, e.g.
    [python3, -m, bmt.export_hf]. ctest puts <repo>/python first on
    PYTHONPATH (by hand: PYTHONPATH=<repo>/python python3 -m pytest ...);
    without it the test fails rather than run a copy that some checkout's
    `pip install .` left in the shared Python."""
    import importlib.util
    import sys
    spec = importlib.util.find_spec("bmt")
    found = os.path.dirname(spec.origin) if spec and spec.origin else None
    want = os.path.join(PYTHON_DIR, "bmt")
    if found is None or os.path.realpath(found) != os.path.realpath(want):
        pytest.fail(f"the package bmt is imported from {found}, not from {want}: "
                    f"run the tests with PYTHONPATH={PYTHON_DIR} (ctest sets it)")
    return [sys.executable, "-m", "bmt." + name.removeprefix("bmt-").replace("-", "_")]
