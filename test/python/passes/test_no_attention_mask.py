"""Models traced or exported with input_ids only (no attention_mask).

A user may trace (`torch.jit.trace(m, example_kwarg_inputs={"input_ids":
ids}, strict=False)`) or export (`torch.export.export(m, (), {"input_ids":
ids}, strict=False)`) a transformers model without attention_mask. Its
program then takes input_ids alone, and, because transformers 5 always runs
its packed-sequence detection under tracing
(masking_utils.find_packed_sequence_indices: aten::diff and cumsum on
position_ids = arange(seq)), the mask gets a term `ids[b, q] == ids[b, kv]`
of packed-sequence ids that are zeros for position_ids of an arange.
bmt-causal-attention (default pipeline) proves them zeros: an SDPA call
becomes is_causal=True with no assumption, and in eager attention each
lookup of the ids becomes zeros of the lookup's shape, so that a trace at
batch 1 (where transformers did not expand position_ids to the batch) runs
at any batch.

For the tiny GPT-2 and LLaMA of test_runtime_parity.py (eager attention),
traced (.pt, run at another shape than the trace's) and exported (.pt2, run
at its export shape): bmt-run --dump with input_ids only gives the eager
model's logits, loss and every parameter gradient within numerics.py's tolerances (fp32, CPU).
Also: LLaMA traced at batch 1 and run at batch 3; LLaMA with SDPA made
causal; --dump refusing a padded attention_mask the program cannot take;
bmt-run --eval-only and training on a token file (--data).
"""
import json
import os
import subprocess
import warnings

import pytest
import torch

from bmt_paths import binary
from numerics import assert_close, assert_gradients_close, assert_loss_close
from test_bmt_run import check_eval_only_against_eager, write_tokens
from test_causal_attention import build_sdpa
from eager import build, causal_loss

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
BATCH, SEQ = 3, 12
FOLDED = "2 lookups of a constant tensor (packed-sequence ids"


def save(model, path, ids):
    """Traces (.pt) or exports (.pt2) `model` with input_ids only."""
    if str(path).endswith(".pt2"):
        ep = torch.export.export(model, args=(), kwargs={"input_ids": ids}, strict=False)
        torch.export.save(ep, str(path))
    else:
        with torch.no_grad():
            torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids}, strict=False).save(
                str(path))


def compile_archive(path):
    """bmt-opt's default pipeline; returns (sharded.pt, its remarks)."""
    sharded = str(path) + ".sharded.pt"
    r = subprocess.run([binary("bmt-opt"), str(path), "-o", sharded], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return sharded, r.stderr


def bmt_run(*args):
    return subprocess.run([binary("bmt-run"), *map(str, args), "--device", "cpu"],
                          capture_output=True, text=True)


def ids_of(shape, seed):
    return torch.randint(0, 128, shape, generator=torch.Generator().manual_seed(seed))


def check_against_eager(model, sharded, tmp, ids):
    """bmt-run --dump on {input_ids, labels} against model(input_ids=ids)."""
    torch.save({"input_ids": ids, "labels": ids}, tmp / "in.pt")
    r = bmt_run(sharded, "--dump", tmp / "in.pt", tmp / "out.pt")
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp / "out.pt")  # a plain dict of tensors: the default weights_only=True
    model.zero_grad()
    logits = model(input_ids=ids).logits
    loss = causal_loss(logits, ids)
    loss.backward()
    assert got["logits"].shape == logits.shape
    assert_close(got["logits"], logits, what="logits")
    assert_loss_close(got["loss"].item(), loss.item())
    params = dict(model.named_parameters())
    grads = {k[len("grad/"):]: v for k, v in got.items() if k.startswith("grad/")}
    assert_gradients_close(grads, {n: p.grad for n, p in params.items()})


@pytest.fixture(scope="module")
def llama_pt(tmp_path_factory):
    """LLaMA traced at 2 x 8 with input_ids only, compiled."""
    tmp = tmp_path_factory.mktemp("llama-nomask")
    model = build("llama")
    save(model, tmp / "llama.pt", ids_of((2, 8), 1))
    sharded, remarks = compile_archive(tmp / "llama.pt")
    assert FOLDED in remarks, remarks
    return model, sharded, tmp


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("ext", ["pt", "pt2"])
def test_forward_and_gradients_match_eager(name, ext, tmp_path, request):
    if name == "llama" and ext == "pt":
        model, sharded, _ = request.getfixturevalue("llama_pt")
    else:
        model = build(name)
        # The trace at 2 x 8, run at 3 x 12; the static export at its own shape.
        save(model, tmp_path / f"{name}.{ext}", ids_of((2, 8) if ext == "pt" else (BATCH, SEQ), 1))
        sharded, remarks = compile_archive(tmp_path / f"{name}.{ext}")
        assert FOLDED in remarks, remarks
    check_against_eager(model, sharded, tmp_path, ids_of((BATCH, SEQ), 2))


def test_trace_at_batch_one_runs_at_any_batch(tmp_path):
    """Traced at batch 1, transformers' position_ids stay [1, seq] and the
    packed-sequence ids are looked up with every batch row: folded away."""
    model = build("llama")
    save(model, tmp_path / "llama1.pt", ids_of((1, 8), 1))
    sharded, remarks = compile_archive(tmp_path / "llama1.pt")
    assert FOLDED in remarks, remarks
    check_against_eager(model, sharded, tmp_path, ids_of((BATCH, SEQ), 2))
    check_against_eager(model, sharded, tmp_path, ids_of((1, 5), 3))


def test_sdpa_made_causal_without_assumption(tmp_path):
    model = build_sdpa("llama")
    save(model, tmp_path / "llama-sdpa.pt", ids_of((2, 8), 1))
    sharded, remarks = compile_archive(tmp_path / "llama-sdpa.pt")
    line = next(l for l in remarks.splitlines() if "bmt-causal-attention" in l)
    assert "2 of 2 aten::scaled_dot_product_attention with an attn_mask made causal" in line, line
    assert "assuming" not in line, line
    check_against_eager(model, sharded, tmp_path, ids_of((BATCH, SEQ), 2))


def test_dump_refuses_a_padded_attention_mask(llama_pt, tmp_path):
    """The program has no attention_mask to honour: padding is refused, all
    ones is what it computes anyway."""
    model, sharded, _ = llama_pt
    ids = ids_of((2, 8), 2)
    mask = torch.ones_like(ids)
    torch.save({"input_ids": ids, "attention_mask": mask}, tmp_path / "ones.pt")
    r = bmt_run(sharded, "--dump", tmp_path / "ones.pt", tmp_path / "out.pt")
    assert r.returncode == 0, r.stderr
    mask[0, :3] = 0
    torch.save({"input_ids": ids, "attention_mask": mask}, tmp_path / "padded.pt")
    r = bmt_run(sharded, "--dump", tmp_path / "padded.pt", tmp_path / "out2.pt")
    assert r.returncode == 1, r.stderr
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert "3 of 16 entries that are not 1" in errors[0] and "takes no attention_mask" in errors[0]
    assert not os.path.exists(tmp_path / "out2.pt")


def test_training_and_evaluation_on_token_files(llama_pt, tmp_path):
    """bmt-run feeds input_ids only to such a program: --eval-only matches
    eager on the same windows, and --data trains."""
    model, sharded, _ = llama_pt
    tokens = ids_of((600,), 5)
    data = write_tokens(tmp_path / "data", tokens.tolist(), 128)
    check_eval_only_against_eager(model, sharded, tmp_path, data, tokens, 8, 4)

    log = tmp_path / "train.jsonl"
    r = bmt_run(sharded, "--data", data, "--steps", 3, "--micro-batch", 2, "--seq-len", 8,
                "--lr", "1e-3", "--log-file", log)
    assert r.returncode == 0, r.stderr
    train = [json.loads(l) for l in open(log) if l.strip()]
    losses = [rec["loss"] for rec in train if rec["kind"] == "train"]
    assert len(losses) == 3 and all(0 < x < 10 for x in losses), losses
