"""Dynamic shapes: a .pt2 exported with a dynamic batch and sequence length
runs at other shapes than its example's.

GPT-2 and LLaMA (the tiny fixture configs) exported as make_fixtures.py's
export_dynamic does (torch.export.export(model, (), kwargs,
dynamic_shapes={batch, seq}, strict=False)) with a 2 x 8 example, compiled
by bmt-opt, and run by bmt-run --dump at 3 x 12 and 1 x 5: logits, loss
and every parameter gradient within numerics.py's tolerances of the eager model (fp32).

The same for the architectures of scripts/architectures.py whose exports
differ in how they compute with sizes (ARCHITECTURES: bidirectional and
causal masks, learned, ALiBi, rotary and partial rotary positions, parallel
blocks, sliding window, experts: the tokens each expert gets, DeepSeek-V3's
group-limited routing with its -inf mask), exported the same way (a named
batch Dim, the sequence Dim.DYNAMIC: one export each; that script's dynamic column also
tries a named sequence Dim, which gives the same program where torch
accepts it). Each is about 10 s on 2 cores, most of it torch.export.

And sym_ops.pt2's model (make_fixtures.sym_ops_model): every kind of
symbolic scalar node (_operator.*, torch.sym_*, math.trunc; SymInt, SymFloat,
SymBool values, across a function boundary too) evaluated by the runtime at
shapes that take both sides of each of its conditions.
"""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from bmt_paths import REPO, binary
from numerics import assert_close, assert_gradients_close, assert_loss_close
from eager import build, causal_loss, check_dump_against_eager, run_bmt
from test_runtime_parity_pt2 import compile_exported

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import architectures  # noqa: E402
import make_fixtures  # noqa: E402

warnings.filterwarnings("ignore")

SHAPES = [(3, 12), (1, 5)]  # batch x seq, neither the export's 2 x 8
# Architectures of scripts/architectures.py beyond GPT-2 and LLaMA, one per
# distinct way of computing with sizes; Qwen2, Gemma and LLaMA-tied compute
# theirs as LLaMA does (scripts/architectures.py's dynamic column runs them).
ARCHITECTURES = ["bert (masked LM)", "opt", "bloom", "gpt_neox", "falcon", "phi", "gptj",
                 "mistral", "mixtral", "gpt_oss", "deepseek_v3"]


def compile_pt2(exported, tmp_path, name, check_ir=True):
    sharded, pt2 = compile_exported(exported, tmp_path, f"{name}-dyn")
    if check_ir:
        # The program really is symbolic: its sizes come from aten::size.int.
        ir = subprocess.run([binary("bmt-opt"), pt2], capture_output=True, text=True,
                            check=True)
        assert '"aten::size.int"' in ir.stdout
    return sharded


def run_at_other_shapes(model, sharded, tmp_path):
    for batch, seq in SHAPES:
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
        model.zero_grad()
        check_dump_against_eager(model, sharded, tmp_path, ids, g)


@pytest.mark.parametrize("name", make_fixtures.DYNAMIC_MODELS)
def test_dynamic_pt2_runs_at_other_shapes(name, tmp_path):
    model = build(name)
    make_fixtures._import_torch()
    inputs = make_fixtures._example_inputs(model)  # batch 2 x seq 8
    sharded = compile_pt2(make_fixtures.export_dynamic(model, inputs), tmp_path, name)
    run_at_other_shapes(model, sharded, tmp_path)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_architecture_dynamic_pt2_runs_at_other_shapes(name, tmp_path):
    make_fixtures._import_torch()  # export_dynamic's torch (each test on its own, e.g. under xdist)
    model = architectures.build(name)
    g = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(0, architectures.VOCAB, (2, 8), generator=g),
              "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    sharded = compile_pt2(make_fixtures.export_dynamic(model, inputs), tmp_path, "arch",
                          check_ir=False)
    run_at_other_shapes(model, sharded, tmp_path)


def test_symbolic_scalars_run_at_other_shapes(tmp_path):
    make_fixtures._import_torch()
    model = make_fixtures.sym_ops_model()
    sharded = compile_pt2(make_fixtures.export_sym_ops(model), tmp_path, "sym_ops")
    # 4 x 4: b == s; 1 x 5 and 3 x 12 the other sides of s > 4, s <= 9,
    # s >= 6, b < 3 and b != 2.
    for batch, seq in SHAPES + [(4, 4)]:
        g = torch.Generator().manual_seed(3)
        ids = torch.randint(0, make_fixtures.SYM_OPS_VOCAB, (batch, seq), generator=g)
        mask = torch.ones_like(ids)
        torch.save({"input_ids": ids, "attention_mask": mask, "labels": ids},
                   tmp_path / "in.pt")
        run_bmt([sharded, "--dump", str(tmp_path / "in.pt"), str(tmp_path / "out.pt")])
        got = torch.load(tmp_path / "out.pt", weights_only=False)
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask)["logits"]
        loss = causal_loss(logits, ids)
        loss.backward()
        assert got["logits"].shape == logits.shape
        assert_close(got["logits"], logits, what=f"logits at {batch} x {seq}")
        assert_loss_close(got["loss"].item(), loss.item())
        assert_gradients_close({n: got["grad/" + n] for n, _ in model.named_parameters()},
                               {n: p.grad for n, p in model.named_parameters()})
