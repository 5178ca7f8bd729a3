"""bench/random_tokens.py, the GPU benchmarks' token files: the ids and
metadata it writes, the same bytes for the same arguments, and bad
arguments refused with one error line and nothing written."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bmt_paths import REPO

SCRIPT = os.path.join(REPO, "bench", "random_tokens.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True)


def test_writes_ids_below_high_and_their_metadata(tmp_path):
    out = tmp_path / "tok.bin"
    r = run(out, 1000, 50, "--vocab-size", 64)
    assert r.returncode == 0, r.stderr
    ids = np.fromfile(out, dtype=np.uint32)
    assert len(ids) == 1000 and ids.max() < 50 and len(np.unique(ids)) == 50
    assert np.array_equal(ids, np.random.default_rng(0).integers(0, 50, 1000, dtype=np.uint32))
    meta = json.load(open(tmp_path / "tok.json"))
    assert (meta["format"], meta["dtype"], meta["num_tokens"], meta["vocab_size"]) == \
        ("bmt-tokens", "uint32", 1000, 64)
    assert sorted(os.listdir(tmp_path)) == ["tok.bin", "tok.json"]  # no temporary left
    first = out.read_bytes()
    assert run(out, 1000, 50, "--vocab-size", 64).returncode == 0
    assert out.read_bytes() == first


@pytest.mark.parametrize("args,message", [
    (["x.bin", 10, 2 ** 32 + 1], "HIGH must be in [1, 2^32]"),
    (["x.bin", 0, 5], "NUM_TOKENS must be in"),
    (["x.bin", 10 ** 14, 5], "NUM_TOKENS must be in"),
    (["x.bin", 10, 128, "--vocab-size", 100], "--vocab-size 100 is below HIGH 128"),
    (["x.txt", 10, 5], "OUT must be a file name ending in .bin"),
    ([".bin", 10, 5], "OUT must be a file name ending in .bin"),
    (["no/such/x.bin", 10, 5], "cannot write"),
    (["x.bin", 10, 5], "x.json is a folder"),
])
def test_bad_arguments_write_nothing(tmp_path, args, message):
    if message == "x.json is a folder":
        (tmp_path / "x.json").mkdir()
    before = sorted(os.listdir(tmp_path))
    r = subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and message in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(os.listdir(tmp_path)) == before
