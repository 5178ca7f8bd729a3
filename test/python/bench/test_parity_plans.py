"""bench/make_parity_plans.py and bench/gpu_parity.py on CPU.

The plans gpu_parity.py checks on the GPU are made here (the GPU machine has
no MLIR); this runs the two scripts end to end on CPU for two architectures,
one traced (gpt2) and one exported with torch.export (bloom), fp32 and bf16,
fused and plain, and checks that gpu_parity.py refuses an archive compiled
from other weights (its CRC-32 check against the eager model it rebuilds)
rather than comparing with the wrong reference. The numbers are gpu_parity's
own bars (fp32 --tol 1e-4; bf16 within twice eager bf16's difference from
the float32 model); the whole table is in bench/RESULTS.md.
"""
import os
import subprocess
import sys

import pytest

from bmt_paths import REPO, binary

BENCH = os.path.join(REPO, "bench")
NAMES = ["gpt2", "bloom"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity")
    bindir = os.path.dirname(binary("bmt-opt"))
    r = subprocess.run([sys.executable, os.path.join(BENCH, "make_parity_plans.py"), str(out),
                        *NAMES, "--plain", "--bin", bindir], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def parity(plans, folder, *extra):
    return subprocess.run([sys.executable, os.path.join(BENCH, "gpu_parity.py"),
                           binary("bmt-run"), str(plans / folder), *NAMES, "--device", "cpu",
                           "--jobs", "2", *extra], capture_output=True, text=True)


def test_layout(plans):
    for name in NAMES:
        suffix = ".pt2" if name == "bloom" else ".pt"
        assert (plans / "models" / (name + suffix)).exists()
        assert (plans / "models" / (name + "-bf16" + suffix)).exists()
        for folder in ("tiny-fused", "tiny-plain", "tiny-fused-bf16", "tiny-plain-bf16"):
            assert (plans / folder / (name + ".sharded.pt")).exists()


@pytest.mark.parametrize("folder", ["tiny-fused", "tiny-plain"])
def test_fp32(plans, folder):
    r = parity(plans, folder)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in NAMES:
        assert f"\n{name}: logits " in "\n" + r.stdout


@pytest.mark.parametrize("folder", ["tiny-fused-bf16", "tiny-plain-bf16"])
def test_bf16(plans, folder):
    r = parity(plans, folder, "--dtype", "bfloat16")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in NAMES:
        assert f"{name} (bf16): logits" in r.stdout


def test_other_weights_refused(plans):
    # The bf16 archives hold the bf16-rounded weights: not the float32 model's.
    r = parity(plans, "tiny-fused-bf16")
    assert r.returncode == 1
    assert "bloom.sharded.pt was not compiled from this model" in r.stdout
    assert "failed to run: gpt2, bloom" in r.stdout
