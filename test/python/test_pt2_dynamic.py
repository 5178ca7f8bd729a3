"""Dynamic shapes: a .pt2 exported with a dynamic batch and sequence length
runs at other shapes than its example's.

GPT-2 and LLaMA (the tiny fixture configs) exported as make_fixtures.py's
export_dynamic does (torch.export.export(model, (), kwargs,
dynamic_shapes={batch, seq}, strict=False)) with a 2 x 8 example, compiled
by bmt-opt, and run by bmt-run --dump at 3 x 12 and 1 x 5: logits, loss
and every parameter gradient within 1e-5 of the eager model (fp32).
"""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from bmt_paths import REPO, binary
from test_runtime_parity import build, check_dump_against_eager

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402

warnings.filterwarnings("ignore")


def export_dynamic_and_compile(model, tmp_path, name):
    make_fixtures._import_torch()
    inputs = make_fixtures._example_inputs(model)  # batch 2 x seq 8
    pt2 = str(tmp_path / f"{name}-dyn.pt2")
    torch.export.save(make_fixtures.export_dynamic(model, inputs), pt2)
    sharded = str(tmp_path / f"{name}-dyn.sharded.pt")
    result = subprocess.run([binary("bmt-opt"), pt2, "-o", sharded], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    return pt2, sharded


@pytest.mark.parametrize("name", make_fixtures.DYNAMIC_MODELS)
def test_dynamic_pt2_runs_at_other_shapes(name, tmp_path):
    model = build(name)
    pt2, sharded = export_dynamic_and_compile(model, tmp_path, name)
    # The program really is symbolic: its sizes come from aten::size.int.
    ir = subprocess.run([binary("bmt-opt"), pt2], capture_output=True, text=True, check=True)
    assert '"aten::size.int"' in ir.stdout
    for batch, seq in [(3, 12), (1, 5)]:
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
        model.zero_grad()
        check_dump_against_eager(model, sharded, tmp_path, ids, g)
