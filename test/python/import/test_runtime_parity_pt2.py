"""The runtime against eager PyTorch, from torch.export archives (.pt2).

For each tiny transformers model of test_runtime_parity.py: export it as a
transformers-5 user does (torch.export.export(model, args=(), kwargs=...,
strict=False), torch.export.save), compile the .pt2 with bmt-opt to
sharded.pt, run bmt-run --dump, and compare logits, loss and every parameter
gradient with the eager model (fp32, numerics.py's tolerances).

torch.export specializes shapes that are not declared dynamic, so the batch
fed to bmt-run has the export's shape (the TorchScript test uses another
shape on purpose; a static .pt2 program is valid at its export shape only).
"""
import subprocess
import warnings

import pytest
import torch

from bmt_paths import binary
from eager import build, check_dump_against_eager

warnings.filterwarnings("ignore")
BATCH, SEQ = 3, 12


def compile_exported(exported, tmp_path, name):
    """torch.export.save of `exported` to NAME.pt2, compiled by bmt-opt's
    default pipeline; returns the sharded.pt path."""
    pt2 = str(tmp_path / f"{name}.pt2")
    torch.export.save(exported, pt2)
    sharded = str(tmp_path / f"{name}.sharded.pt")
    result = subprocess.run([binary("bmt-opt"), pt2, "-o", sharded], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    return sharded, pt2


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "opt", "gpt_neox"])
def test_pt2_forward_and_gradients_match_eager(name, tmp_path):
    model = build(name)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (BATCH, SEQ), generator=g)
    exported = torch.export.export(model, args=(), kwargs={"input_ids": ids,
                                                           "attention_mask": torch.ones_like(ids)},
                                   strict=False)
    sharded, _ = compile_exported(exported, tmp_path, name)
    check_dump_against_eager(model, sharded, tmp_path, ids, g)
