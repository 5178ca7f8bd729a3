"""Checkpoints of the optimizers beyond AdamW (docs/checkpoint-format.md), on
CPU ranks under torchrun, tiny GPT-2 in float32:

- resume is bit-identical for SGD with momentum (its momentum buffers are
  ZeRO shards) and Adafactor (its factored row/column statistics are kept
  per storage group and saved once): 10 steps straight against 5 steps, a
  checkpoint, the process gone, and a resumed run of the other 5;
- an Adafactor checkpoint of 3 ranks resumes on 2 (the shards change, the
  storage groups and so the statistics do not): losses within 1e-5 of a run
  on 2 ranks from the start;
- resuming with another optimizer or other hyperparameters is one clear
  error naming both, before anything is trained.
"""
import pytest
import torch

from numerics import assert_identical
from test_checkpoint import (HALF, SEQ, STEPS, GLOBAL_BATCH, compile, errors, straight_and_resumed,
                             torchrun, trace, train_log)
from eager import build

SGD = ["--optimizer", "sgd", "--momentum", "0.9", "--dampening", "0.1", "--lr", "1e-2"]
ADAFACTOR = ["--optimizer", "adafactor", "--lr", "1e-2", "--weight-decay", "0.01"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("optckpt")
    ids = torch.randint(0, 100, (2, SEQ), generator=torch.Generator().manual_seed(1))
    trace(build("gpt2"), tmp / "gpt2.pt", {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    vocab = build("gpt2").config.vocab_size
    torch.save(torch.randint(0, vocab, (2 * STEPS, GLOBAL_BATCH, SEQ + 1),
                             generator=torch.Generator().manual_seed(3)), tmp / "batches.pt")
    return {"tmp": tmp, "sharded": compile(tmp / "gpt2.pt", tmp / "sharded.pt"),
            "batches": ["--batches", tmp / "batches.pt", "--clip-grad", "0.5", "--warmup", "2"]}


@pytest.mark.parametrize("case", ["sgd", "adafactor"])
def test_resume_is_bit_identical(gpt2, case):
    tmp = gpt2["tmp"] / case
    tmp.mkdir()
    flags = gpt2["batches"] + (SGD if case == "sgd" else ADAFACTOR)
    a, b, pa, pb, _ = straight_and_resumed(tmp, 3, gpt2["sharded"], flags)
    assert [x["step"] for x in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        assert (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"]), (x, y)
    assert a[0]["loss"] != a[-1]["loss"]  # it trains
    assert_identical(pb, pa, f"{case}: parameters of the resumed run")


def test_adafactor_resumes_on_fewer_ranks(gpt2):
    tmp = gpt2["tmp"] / "adafactor-3-to-2"
    tmp.mkdir()
    flags = gpt2["batches"] + ADAFACTOR
    a = torchrun(2, gpt2["sharded"], *flags, "--steps", STEPS, "--log-file", tmp / "a.jsonl")
    assert a.returncode == 0, a.stderr[-3000:]
    ck = tmp / "ck"
    b1 = torchrun(3, gpt2["sharded"], *flags, "--steps", STEPS, "--checkpoint-dir", ck,
                  "--checkpoint-every", HALF, env={"BMT_DEBUG_EXIT_AFTER_STEP": str(HALF)})
    assert b1.returncode != 0 and not errors(b1), b1.stderr[-3000:]
    b2 = torchrun(2, gpt2["sharded"], *flags, "--steps", STEPS, "--checkpoint-dir", ck,
                  "--resume", "auto", "--log-file", tmp / "b.jsonl")
    assert b2.returncode == 0, b2.stdout[-2000:] + b2.stderr[-3000:]
    la, lb = train_log(tmp / "a.jsonl"), train_log(tmp / "b.jsonl")
    assert [x["step"] for x in lb] == list(range(HALF + 1, STEPS + 1))
    worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(la[HALF:], lb))
    assert worst <= 1e-5, (worst, la, lb)


@pytest.mark.parametrize("flags,message", [
    (ADAFACTOR, "was saved by --optimizer sgd; this run uses --optimizer adafactor"),
    (["--optimizer", "adamw"], "was saved by --optimizer sgd; this run uses --optimizer adamw"),
    (SGD[:3] + ["0.8"] + SGD[4:], "(momentum differs)"),
    (SGD + ["--weight-decay-params", "all"], "(weight_decay_params differs)"),
])
def test_resume_with_another_optimizer_is_an_error(gpt2, flags, message):
    ck = gpt2["tmp"] / "sgd" / "ck" / f"step-{HALF:08d}"
    if not ck.is_dir():
        pytest.skip("needs test_resume_is_bit_identical[sgd]'s checkpoint")
    tmp = gpt2["tmp"] / f"wrong-{abs(hash(tuple(flags)))}"
    tmp.mkdir()
    r = torchrun(3, gpt2["sharded"], *gpt2["batches"], *flags, "--steps", STEPS, "--resume", ck,
                 "--log-file", tmp / "log.jsonl")
    assert r.returncode != 0
    errs = errors(r)
    assert errs and message in errs[0], r.stderr[-3000:]
    assert not (tmp / "log.jsonl").exists() or not train_log(tmp / "log.jsonl")
