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
from eager import build, check_dump_against_eager, compile_model


def compile_fused(model, tmp_path, name):
    """compile_model with elementwise fusion on: (sharded.pt, bmt-opt's remarks)."""
    sharded = compile_model(model, tmp_path, name, ["--bmt-default-pipeline=fuse-elementwise=true"])
    return sharded, (tmp_path / f"{name}.remarks").read_text()


# The regions the default pipeline makes in each fixture, those with a last-dim reduction
# (each norm, and each attention's scale + mask + softmax: these models keep their eager
# attention here) and the rotate_half they hold (fuse-inline-calls is on there;
# test/Passes/fuse-elementwise-models.test).
REGIONS = {"gpt2": (7, 7, 0), "llama": (15, 7, 4), "bert": (9, 8, 0)}


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert"])
def test_fused_plan_matches_eager(name, tmp_path):
    model = build(name)
    sharded, remarks = compile_fused(model, tmp_path, name)
    m = re.search(r"bmt-fuse-elementwise: \d+ ops in (\d+) regions? \((\d+) with a last-dim "
                  r"reduction(?:, (\d+) rotate_half)?\)", remarks)
    assert m, remarks
    assert (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) == REGIONS[name]
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


def test_random_init_and_training_match_unfused(tmp_path):
    """A weights-free plan (--random-init) initializes the parameters by rule:
    the RMSNorm weights inside fused regions must still be recognized as
    scales (ones), so fused and unfused plans start from the same weights
    and train to the same losses (fp32, CPU)."""
    import json
    import numpy as np
    model = build("llama")
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.zeros(2, 8, dtype=torch.long),
              "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    pt = str(tmp_path / "llama.pt")
    torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(pt)
    n = 4000
    np.random.default_rng(0).integers(0, vocab, n, dtype=np.uint16).tofile(tmp_path / "tok.bin")
    json.dump({"format": "bmt-tokens", "version": 1, "dtype": "uint16", "num_tokens": n,
               "num_documents": 1, "vocab_size": vocab, "eos_id": 0, "mask_id": None, "pad_id": None,
               "tokenizer": "random", "source": []}, open(tmp_path / "tok.json", "w"))
    losses = {}
    for kind, pipeline in [("plain", "fuse-elementwise=false"), ("fused", "fuse-elementwise=true")]:
        sharded = str(tmp_path / f"{kind}.sharded.pt")
        subprocess.run([binary("bmt-opt"), pt, f"--bmt-default-pipeline={pipeline} summary=false",
                        "--random-init", "-o", sharded], check=True, capture_output=True)
        log = tmp_path / f"{kind}.jsonl"
        r = subprocess.run([binary("bmt-run"), sharded, "--data", str(tmp_path / "tok.bin"),
                            "--steps", "4", "--micro-batch", "2", "--seq-len", "16", "--lr", "1e-2",
                            "--device", "cpu", "--log-file", str(log), "--log-every", "1"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        losses[kind] = [json.loads(line)["loss"] for line in open(log) if '"train"' in line]
    assert len(losses["plain"]) == 4
    # A uniform prediction (norm weights initialized to zero) would give ln(vocab).
    assert abs(losses["plain"][0] - float(np.log(vocab))) > 1e-3
    for a, b in zip(losses["fused"], losses["plain"]):
        assert abs(a - b) <= 1e-5 * abs(b), (losses["fused"], losses["plain"])
