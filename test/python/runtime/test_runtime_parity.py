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
import warnings

import pytest
import torch

from eager import build, check_dump_against_eager, compile_model, eager_training, run_bmt
from numerics import assert_loss_close, assert_trained_close

warnings.filterwarnings("ignore")


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
