"""The runtime against eager PyTorch, from torch.export archives (.pt2).

For each tiny transformers model of test_runtime_parity.py: export it as a
transformers-5 user does (torch.export.export(model, args=(), kwargs=...,
strict=False), torch.export.save), compile the .pt2 with bmt-opt to
sharded.pt, run bmt-run --dump, and compare logits, loss and every parameter
gradient with the eager model: fp32, max abs difference <= 1e-5.

torch.export specializes shapes that are not declared dynamic, so the batch
fed to bmt-run has the export's shape (the TorchScript test uses another
shape on purpose; a static .pt2 program is valid at its export shape only).
"""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from bmt_paths import REPO, binary

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402  (the tiny model configs)

warnings.filterwarnings("ignore")
TOL = 1e-5
BATCH, SEQ = 3, 12


def build(name):
    import transformers
    torch.manual_seed(0)
    cls, config = make_fixtures.MODELS[name](transformers)
    model = cls(config)
    model.eval()
    return model


def export_and_compile(model, tmp_path, name, ids, mask):
    ep = torch.export.export(model, args=(), kwargs={"input_ids": ids, "attention_mask": mask},
                             strict=False)
    pt2 = str(tmp_path / f"{name}.pt2")
    torch.export.save(ep, pt2)
    sharded = str(tmp_path / f"{name}.sharded.pt")
    result = subprocess.run([binary("bmt-opt"), pt2, "-o", sharded], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    return sharded


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "opt", "gpt_neox"])
def test_pt2_forward_and_gradients_match_eager(name, tmp_path):
    model = build(name)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=g)
    mask = torch.ones_like(ids)
    sharded = export_and_compile(model, tmp_path, name, ids, mask)
    masked = name == "bert"
    if masked:
        labels = torch.full_like(ids, -100)
        pick = torch.rand(ids.shape, generator=g) < 0.3
        pick[0, 0] = True
        labels[pick] = ids[pick]
    else:
        labels = ids
    torch.save({"input_ids": ids, "attention_mask": mask, "labels": labels}, tmp_path / "in.pt")
    result = subprocess.run([binary("bmt-run"), sharded, "--dump", str(tmp_path / "in.pt"),
                             str(tmp_path / "out.pt"), "--device", "cpu"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    got = torch.load(tmp_path / "out.pt", weights_only=False)  # our own file: typed dict

    logits = model(input_ids=ids, attention_mask=mask).logits
    if masked:
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1),
                                                 ignore_index=-100)
    else:
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1), ignore_index=-100)
    loss.backward()

    assert got["logits"].shape == logits.shape
    assert (got["logits"] - logits.detach()).abs().max().item() <= TOL
    assert abs(got["loss"].item() - loss.item()) <= TOL
    params = dict(model.named_parameters())  # tied parameters appear once
    grads = {k[len("grad/"):]: v for k, v in got.items() if k.startswith("grad/")}
    assert set(grads) == set(params), set(grads) ^ set(params)
    for pname, p in params.items():
        diff = (grads[pname] - p.grad).abs().max().item()
        assert diff <= TOL, f"{pname}: max abs grad difference {diff}"
