"""Fused regions (bmt-opt --bmt-default-pipeline='fuse-elementwise=true')
run by bmt-run on CPU against eager PyTorch.

For the tiny GPT-2, LLaMA and BERT of test/fixtures: trace, compile with
the elementwise fusion on, check the compiler fused regions, run bmt-run
--dump on a batch of another shape than the traced one, and compare logits,
loss and every parameter gradient with the eager model (fp32, the
tolerances of numerics.py, as test_runtime_parity.py does for the unfused
plans). On CPU the executor evaluates each region's forward graph and its
symbolically derived backward graph with ATen ops (runtime/fusion), so the
gradients here are the generator's derivative formulas, not autograd's.
"""
import re
import subprocess

import pytest
import torch

from bmt_paths import binary
from test_runtime_parity import build, check_dump_against_eager


def compile_fused(model, tmp_path, name):
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (2, 8), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
    pt = str(tmp_path / f"{name}.pt")
    traced.save(pt)
    sharded = str(tmp_path / f"{name}.sharded.pt")
    result = subprocess.run([binary("bmt-opt"), pt, "--bmt-default-pipeline=fuse-elementwise=true",
                             "-o", sharded], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return sharded, result.stderr


# The regions the pass makes in each fixture (test/Passes/fuse-elementwise-models.test).
REGIONS = {"gpt2": (2, 0), "llama": (13, 5), "bert": (3, 0)}


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_fused_plan_matches_eager(name, tmp_path):
    model = build(name)
    sharded, remarks = compile_fused(model, tmp_path, name)
    m = re.search(r"bmt-fuse-elementwise: \d+ ops in (\d+) regions? \((\d+) with", remarks)
    assert m, remarks
    assert (int(m.group(1)), int(m.group(2))) == REGIONS[name]
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (3, 12), generator=g)  # not the traced 2 x 8
    check_dump_against_eager(model, sharded, tmp_path, ids, g)


def test_old_reader_refuses_fused_plan(tmp_path):
    """The plan of a fused model is format version 5 (docs/sharded-format.md)."""
    import zipfile
    sharded, _ = compile_fused(build("llama"), tmp_path, "llama")
    with zipfile.ZipFile(sharded) as z:
        version = [n for n in z.namelist() if n.endswith("bmt/version")][0]
        assert z.read(version) == b"bmt-sharded 5\n"
