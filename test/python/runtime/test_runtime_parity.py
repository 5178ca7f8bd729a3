"""The runtime against eager PyTorch on the same weights and batches.

For each tiny transformers model (GPT-2, LLaMA with GQA, BERT masked-LM,
OPT, GPT-NeoX): trace it as a user does, compile it with bmt-opt to
sharded.pt (the default pipeline, with its elementwise fusion, once more
with --fuse-elementwise=false: plain ATen ops, and once with
--fuse-second-results: regions that also return the residual sum before a
norm), run bmt-run --dump on a
batch of another shape than the traced one, and compare logits, loss and
every parameter gradient with the eager model (fp32, within the tolerances
of numerics.py: 64 ulps of the largest value, gradients norm-wise).

Then AdamW: 5 training steps on fixed batches through bmt-run against
torch.optim.AdamW in eager PyTorch (with bmt-run's default weight-decay
groups: none on parameters of fewer than 2 dimensions): losses within 32 ulps, final parameters
by numerics.assert_trained_close; and a run with gradient accumulation and
clipping the same way.
"""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from bmt_paths import REPO, binary
from numerics import (assert_close, assert_gradients_close,
                      assert_loss_close, assert_trained_close)

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402  (the tiny model configs)

warnings.filterwarnings("ignore")


def build(name):
    """The fixture model (seed 0, eval mode: the trace records dropout off)."""
    import transformers
    torch.manual_seed(0)
    cls, config = make_fixtures.MODELS[name](transformers)
    model = cls(config)
    model.eval()
    return model


def compile_model(model, tmp_path, name, flags=()):
    """Trace with batch 2 x seq 8 and compile to sharded.pt (bmt-opt `flags`)."""
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (2, 8), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
    pt = str(tmp_path / f"{name}.pt")
    traced.save(pt)
    sharded = str(tmp_path / f"{name}.sharded.pt")
    r = subprocess.run([binary("bmt-opt"), pt, "-o", sharded, *flags], check=True, capture_output=True,
                       text=True)
    (tmp_path / f"{name}.remarks").write_text(r.stderr)
    return sharded


def run_bmt(args):
    result = subprocess.run([binary("bmt-run"), *args, "--device", "cpu"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result


def causal_loss(logits, labels):
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100)


def check_dump_against_eager(model, sharded, tmp_path, ids, g):
    """Runs bmt-run --dump on `ids` and compares logits, loss and every
    parameter gradient with the eager `model` (masked-LM labels for BERT)."""
    vocab = model.config.vocab_size
    mask = torch.ones_like(ids)
    masked = model.config.model_type == "bert"
    if masked:
        labels = torch.full_like(ids, -100)
        pick = torch.rand(ids.shape, generator=g) < 0.3
        pick[0, 0] = True
        labels[pick] = ids[pick]
    else:
        labels = ids
    torch.save({"input_ids": ids, "attention_mask": mask, "labels": labels}, tmp_path / "in.pt")
    run_bmt([sharded, "--dump", str(tmp_path / "in.pt"), str(tmp_path / "out.pt")])
    got = torch.load(tmp_path / "out.pt")  # the default weights_only=True: a plain dict
    assert type(got) is dict and all(isinstance(v, torch.Tensor) for v in got.values()), got

    logits = model(input_ids=ids, attention_mask=mask).logits
    if masked:
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1),
                                                 ignore_index=-100)
    else:
        loss = causal_loss(logits, labels)
    loss.backward()

    assert got["logits"].shape == logits.shape
    assert_close(got["logits"], logits, what="logits")
    assert_loss_close(got["loss"].item(), loss.item())
    params = dict(model.named_parameters())  # tied parameters appear once
    grads = {k[len("grad/"):]: v for k, v in got.items() if k.startswith("grad/")}
    assert_gradients_close(grads, {n: p.grad for n, p in params.items()})


PLAN_FLAGS = {"default": [], "plain": ["--fuse-elementwise=false"],
              "second-results": ["--fuse-second-results"]}


@pytest.mark.parametrize("plan", ["default", "plain", "second-results"])
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "opt", "gpt_neox"])
def test_forward_and_gradients_match_eager(name, plan, tmp_path):
    model = build(name)
    sharded = compile_model(model, tmp_path, name, PLAN_FLAGS[plan])
    if plan == "second-results" and name in ("gpt2", "llama"):
        remarks = (tmp_path / f"{name}.remarks").read_text()
        assert "with a second result" in remarks, remarks  # the plan this case is about
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (3, 12), generator=g)  # not the traced 2 x 8
    # An embedding's padding_idx (BERT's 0, OPT's 1) in every row: its rows
    # of the gradient must stay untouched by those positions.
    pads = sorted({m.padding_idx for m in model.modules()
                   if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None})
    for k, pad in enumerate(pads):
        ids[:, 3 + k] = pad
    check_dump_against_eager(model, sharded, tmp_path, ids, g)


def decay_groups(params, wd):
    """bmt-run's default weight-decay groups as torch.optim param groups:
    parameters of 2+ dimensions get `wd`, biases and norm weights none."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def eager_training(model, batches, steps, accum, lr_of_step, clip, wd):
    opt = torch.optim.AdamW(decay_groups(model.parameters(), wd), lr=1.0, betas=(0.9, 0.999),
                            eps=1e-8)
    losses, k = [], 0
    for step in range(1, steps + 1):
        opt.zero_grad()
        total = 0.0
        for _ in range(accum):
            w = batches[k % len(batches)]
            k += 1
            logits = model(input_ids=w[:, :-1], attention_mask=torch.ones_like(w[:, :-1])).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                     w[:, 1:].reshape(-1))
            (loss / accum).backward()
            total += loss.item()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for group in opt.param_groups:
            group["lr"] = lr_of_step(step)
        opt.step()
        losses.append(total / accum)
    return losses


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("accum,clip", [(1, 0.0), (2, 0.5)])
def test_adamw_training_matches_torch_optim(name, accum, clip, tmp_path):
    model = build(name)
    sharded = compile_model(model, tmp_path, name)
    vocab = model.config.vocab_size
    steps = 5
    batches = torch.randint(0, vocab, (steps * accum, 2, 9), generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    log = tmp_path / "log.jsonl"
    run_bmt([sharded, "--batches", str(tmp_path / "batches.pt"), "--steps", str(steps),
             "--grad-accum", str(accum), "--lr", "1e-3", "--schedule", "cosine", "--warmup", "2",
             "--clip-grad", str(clip), "--weight-decay", "0.01", "--log-file", str(log),
             "--save-params", str(tmp_path / "params.safetensors")])
    records = [json.loads(line) for line in open(log) if line.strip()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, steps + 1))
    # The learning rates bmt used (the schedule itself is unit-tested) drive
    # the eager run, so that everything else is compared independently.
    lrs = {r["step"]: r["lr"] for r in train}
    losses = eager_training(model, batches, steps, accum, lambda s: lrs[s], clip, 0.01)
    for r, want in zip(train, losses):
        assert_loss_close(r["loss"], want, what=f"loss of step {r['step']}")
    from safetensors.torch import load_file
    got = load_file(tmp_path / "params.safetensors")  # every state-dict name, tied ones too
    assert set(got) == set(dict(model.named_parameters(remove_duplicate=False)))
    stats = assert_trained_close(got, dict(model.named_parameters()), sum(lrs.values()))
    print(f"{name} accum {accum} clip {clip}: parameters max {stats[0]:.2e}, mean {stats[1]:.2e}, "
          f"differing {stats[2]:.1%}")
