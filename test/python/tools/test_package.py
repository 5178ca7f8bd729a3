"""`pip install .` of a checkout gives working console scripts: the package
(pyproject.toml, python/bmt) is installed offline (--no-deps
--no-build-isolation --no-index) into a temporary --target directory, and
bmt-export-hf, bmt-prepare-data, bmt-plot and bmt-to-hf run from its bin/ with only
that directory on PYTHONPATH, so they import the copy just installed (not
the checkout's python/, nor one in the shared Python). The other tests run
the tools as `python3 -m bmt.*` from the checkout."""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from bmt_paths import PYTHON_DIR, REPO

SCRIPTS = {"bmt-export-hf": "bmt.export_hf", "bmt-prepare-data": "bmt.prepare_data",
           "bmt-plot": "bmt.plot", "bmt-to-hf": "bmt.to_hf"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The package installed from a copy of the checkout's sources (pip builds
    in the source tree: a copy keeps build/ and *.egg-info out of the
    checkout); returns the --target directory."""
    tmp = tmp_path_factory.mktemp("package")
    src, target = tmp / "src", tmp / "site"
    src.mkdir()
    shutil.copy(os.path.join(REPO, "pyproject.toml"), src)
    shutil.copytree(PYTHON_DIR, src / "python",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-deps", "--no-build-isolation", "--no-index", "--target", str(target),
                        str(src)], capture_output=True, text=True, timeout=300, cwd=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def run(target, *cmd):
    env = dict(os.environ, PYTHONPATH=str(target))
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120,
                          env=env, cwd=target.parent)


def test_console_scripts_run_the_installed_package(installed):
    for script, module in SCRIPTS.items():
        path = installed / "bin" / script
        assert os.access(path, os.X_OK), f"{script} is not installed in {installed / 'bin'}"
        r = run(installed, path, "--help")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"usage: {script} "), r.stdout
        # The script imports the installed copy of the module.
        r = run(installed, sys.executable, "-c", f"import {module}; print({module}.__file__)")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(installed / module.replace(".", "/")) + ".py"


def test_console_script_exit_status_and_output(installed, tmp_path):
    """The entry point passes the arguments through and returns main()'s
    status: a plot is written (0), a missing log is one error line (1)."""
    log = tmp_path / "metrics.jsonl"
    with open(log, "w") as f:
        for step in range(1, 11):
            f.write(json.dumps({"kind": "train", "step": step, "loss": 5.0 - 0.1 * step,
                                "tokens_per_s": 1000.0}) + "\n")
    r = run(installed, installed / "bin" / "bmt-plot", log, "-o", tmp_path / "p.png")
    assert r.returncode == 0, r.stderr
    assert "10 train loss" in r.stdout, r.stdout
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = run(installed, installed / "bin" / "bmt-plot", tmp_path / "nope.jsonl", "-o",
            tmp_path / "q.png")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"error: metrics log {tmp_path / 'nope.jsonl'} does not exist"]


def test_metadata_names_the_scripts_and_dependencies(installed):
    [dist] = importlib.metadata.distributions(path=[str(installed)])
    assert dist.metadata["Name"] == "bmt"
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == {script: f"{module}:main" for script, module in SCRIPTS.items()}
    # What the tools import (safetensors: checkpoint weights, read through transformers;
    # pyarrow, datasets, zstandard, tqdm: bmt-prepare-data's records).
    assert sorted(re.match(r"[A-Za-z0-9._-]+", r).group() for r in dist.requires) == [
        "datasets", "matplotlib", "numpy", "pyarrow", "safetensors", "tokenizers", "torch", "tqdm",
        "transformers", "zstandard"]
