"""Training on the loss the model computes itself (docs/runtime/objectives.md,
"The model's own loss"): a forward taking labels returns a scalar, and bmt-run trains
on it, feeding the labels transformers' models expect.

(a) Hugging Face causal LMs exported by bmt-export-hf --labels (GPT-2 as
    TorchScript, LLaMA with GQA and Qwen3-MoE with the router's
    load-balancing loss (output_router_logits, router_aux_loss_coef 0.1) as
    torch.export): 5 AdamW steps on fixed
    batches on 1 and 2 ranks (torchrun, ZeRO-3, recompute) against eager
    transformers computing model(input_ids, labels=input_ids).loss with
    torch.optim.AdamW; on 2 ranks each rank's loss counts equally.
    T5 traced with labels, on ready source/target pairs on 2 ranks whose
    target counts differ (the ranks' losses count equally), or one of which
    has none (its loss counts as 0).
(b) A user's wrapper whose loss is not plain cross-entropy: label-smoothed
    cross-entropy plus PaLM's z-loss (1e-4 * logsumexp^2 over the targets),
    traced with torch.jit.trace (forward(input_ids, labels)) and exported
    with torch.export (forward(input_ids, attention_mask, labels)).
(c) The errors: a forward taking labels whose result is not a scalar, and
    --objective model-loss on a program without labels.
(d) Qwen3-MoE's training log: each step's tokens per expert (expert_tokens_min
    and _max over layers and experts, all ranks' micro-batches) equal the
    counts of eager's router top-k ids exactly, on 1 and 2 ranks with every
    block recomputed and on 1 rank with none (a recompute must not count its
    tokens again), and aux_loss the mean of eager's aux_loss within LOSS_ULPS;
    the other models' records have none of those keys.
Losses within numerics.py's LOSS_ULPS, parameters by assert_trained_close
and within 1e-4 (DESIGN.md's bar for fp32).
"""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from bmt_paths import REPO, binary, tool
from numerics import assert_loss_close, assert_trained_close
from eager import decay_groups

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402  (the tiny model configs)

warnings.filterwarnings("ignore")

STEPS = 5
SEQ = 8
VOCAB = make_fixtures.VOCAB


def run(cmd, ranks=1):
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={ranks}", "--no-python", *cmd]
    env = dict(os.environ, OMP_NUM_THREADS="1", BMT_COMM_TIMEOUT_S="120")
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env,
                          timeout=300)


def compile_model(archive, tmp, ranks, *flags):
    sharded = tmp / f"{archive.stem}.n{ranks}{''.join(flags)}.sharded.pt"
    r = run([binary("bmt-opt"), archive, "-o", sharded, "--world-size", ranks, *flags])
    assert r.returncode == 0, r.stderr
    return sharded, r.stderr


def train(sharded, batches, tmp, ranks):
    """bmt-run on the fixed batches; (start line, train records, params)."""
    log, params = tmp / f"{sharded.stem}.log.jsonl", tmp / f"{sharded.stem}.params.safetensors"
    r = run([binary("bmt-run"), sharded, "--batches", batches, "--steps", STEPS, "--lr", "1e-3",
             "--schedule", "cosine", "--warmup", 2, "--clip-grad", 0.5, "--weight-decay", 0.01,
             "--log-file", log, "--save-params", params, "--device", "cpu"], ranks)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = [json.loads(line) for line in open(log) if line.strip()]
    records = [x for x in records if x["kind"] == "train"]
    assert [x["step"] for x in records] == list(range(1, STEPS + 1))
    from safetensors.torch import load_file
    return r.stdout.splitlines()[0], records, load_file(params)


def eager(model, loss_of, batches, ranks, lrs):
    """The reference: torch.optim.AdamW on the same global batches; each
    rank's rows give one loss (the model's), and the step's objective is
    their mean (each rank counts equally), as bmt-run defines it."""
    opt = torch.optim.AdamW(decay_groups(model.parameters(), 0.01), lr=1.0, betas=(0.9, 0.999),
                            eps=1e-8)
    losses = []
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        rows = batches[step - 1][:, :-1]
        parts = [loss_of(model, r) for r in rows.chunk(ranks)]
        loss = sum(parts) / ranks
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def check(records, params, losses, want, what):
    for x, loss in zip(records, losses):
        assert_loss_close(x["loss"], loss, what=f"{what}: loss of step {x['step']}")
    lr_sum = sum(x["lr"] for x in records)
    stats = assert_trained_close(params, want, lr_sum)
    assert stats[0] <= 1e-4, f"{what}: max parameter difference {stats[0]:.3g}"
    print(f"{what}: losses max diff {max(abs(x['loss'] - l) for x, l in zip(records, losses)):.2e}, "
          f"parameters max {stats[0]:.2e}, mean {stats[1]:.2e}")


def hf_loss(model, ids):
    # The user's call: transformers shifts the labels itself.
    return model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids).loss


# (a) Hugging Face causal LMs exported with their loss ----------------------

HF = {
    # name: (bmt-export-hf --config and --set, output suffix)
    "gpt2": (["--config", "gpt2", "--set", "n_layer=2", "--set", "n_embd=32", "--set", "n_head=4",
              "--set", "n_inner=64", "--set", f"vocab_size={VOCAB}", "--set", "n_positions=64"],
             ".pt"),
    "llama": (["--config", "llama", "--set", "num_hidden_layers=2", "--set", "hidden_size=32",
               "--set", "intermediate_size=64", "--set", "num_attention_heads=4",
               "--set", "num_key_value_heads=2", "--set", f"vocab_size={VOCAB}",
               "--set", "max_position_embeddings=64", "--set", "tie_word_embeddings=false"],
              ".pt2"),
    # A mixture of experts whose config asks for the router's load-balancing
    # loss: the model's loss is cross-entropy + 0.1 x transformers' aux loss.
    "qwen3_moe": (["--config", "qwen3_moe", "--set", "num_hidden_layers=2", "--set", "hidden_size=32",
                   "--set", "intermediate_size=64", "--set", "num_attention_heads=4",
                   "--set", "num_key_value_heads=2", "--set", "head_dim=8", "--set", "num_experts=4",
                   "--set", "num_experts_per_tok=2", "--set", "moe_intermediate_size=48",
                   "--set", f"vocab_size={VOCAB}", "--set", "max_position_embeddings=64",
                   "--set", "tie_word_embeddings=false", "--set", "output_router_logits=true",
                   "--set", "router_aux_loss_coef=0.1"],
                  ".pt2"),
}


@pytest.fixture(scope="module", params=list(HF))
def exported(request, tmp_path_factory):
    """bmt-export-hf --labels (a .pt2 at 2 x SEQ: the rows of one rank), and
    the same transformers model with the archive's weights."""
    import transformers
    name = request.param
    flags, suffix = HF[name]
    tmp = tmp_path_factory.mktemp(name)
    archive = tmp / f"{name}{suffix}"
    r = subprocess.run([*tool("bmt-export-hf"), *flags, "--labels", "--batch", "2",
                        "--seq-len", str(SEQ), "-o", str(archive)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if suffix == ".pt2":
        import transformers.integrations.moe  # noqa: F401 (its custom op, which a MoE's .pt2 calls)
        state = torch.export.load(str(archive)).state_dict
    else:
        state = torch.jit.load(str(archive)).state_dict()
    import zipfile
    with zipfile.ZipFile(archive) as z:
        config = json.loads(z.read(next(n for n in z.namelist() if n.endswith("extra/config.json"))))
    cls = getattr(transformers, config["architectures"][0])
    model = cls(transformers.AutoConfig.for_model(config.pop("model_type"), **config)).eval()
    model.load_state_dict(state, strict=False)  # tied weights appear once
    for n, p in model.state_dict().items():
        if n in state:
            assert torch.equal(p, state[n]), n
    return {"name": name, "archive": archive, "tmp": tmp, "model": model, "stderr": r.stderr}


@pytest.mark.parametrize("ranks", [1, 2])
def test_hf_model_loss_matches_eager(exported, ranks):
    import copy
    tmp = exported["tmp"]
    sharded, remarks = compile_model(exported["archive"], tmp, ranks)
    # The loss ops sit outside the blocks: the passes find them as before.
    assert "bmt-find-blocks: 2 blocks in" in remarks, remarks
    assert "bmt-zero: ZeRO-3, 2 block storage groups" in remarks, remarks
    assert "bmt-checkpoint: 2 of 2 blocks recomputed" in remarks, remarks
    if exported["name"] != "qwen3_moe":  # its aux loss reads the attention mask too
        assert "2 of 2 aten::scaled_dot_product_attention with an attn_mask made causal" in remarks
    batches = torch.randint(0, VOCAB, (STEPS, 2 * ranks, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp / f"batches.n{ranks}.pt")
    start, records, params = train(sharded, tmp / f"batches.n{ranks}.pt", tmp, ranks)
    assert "objective model-loss (the loss its forward returns, fed causal-lm labels)" in start
    model = copy.deepcopy(exported["model"])
    if exported["name"] == "qwen3_moe":
        check_expert_load(records, params, model, batches, ranks)
        return
    assert not any(k.startswith("expert_") or k == "aux_loss" for k in records[0]), records[0]
    losses, want = eager(model, hf_loss, batches, ranks, {x["step"]: x["lr"] for x in records})
    check(records, params, losses, want, f"{exported['name']} on {ranks} rank(s)")


@pytest.mark.parametrize("exported", ["qwen3_moe"], indirect=True)
def test_moe_expert_load_is_not_counted_again_without_recompute(exported):
    """--checkpoint none: the same counts as eager's, as with recomputing
    blocks (a recompute in the backward must not add its tokens again)."""
    import copy
    tmp = exported["tmp"]
    sharded, remarks = compile_model(exported["archive"], tmp, 1, "--checkpoint", "none")
    assert "2 of 2 blocks recomputed" not in remarks, remarks
    batches = torch.randint(0, VOCAB, (STEPS, 2, SEQ + 1), generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp / "batches.n1.pt")
    _, records, params = train(sharded, tmp / "batches.n1.pt", tmp, 1)
    check_expert_load(records, params, copy.deepcopy(exported["model"]), batches, 1)


def check_expert_load(records, params, model, batches, ranks):
    """The eager loop of test_hf_model_loss_matches_eager, counting each
    step's router top-k ids per layer and expert over every rank's rows and
    averaging the ranks' aux_loss; then the losses and parameters as there."""
    gates = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
    experts = model.config.num_experts
    counts = []  # per gate call: [E]
    hooks = [g.register_forward_hook(
        lambda _m, _i, out: counts.append(torch.bincount(out[2].reshape(-1), minlength=experts)))
        for g in gates]
    aux = []

    def loss_of(m, ids):
        out = m(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
        aux.append(out.aux_loss.item())
        return out.loss

    losses, want = eager(model, loss_of, batches, ranks, {x["step"]: x["lr"] for x in records})
    for h in hooks:
        h.remove()
    calls = len(gates) * ranks  # gate calls a step: each rank's rows once through every layer
    assert len(gates) == 2 and len(counts) == STEPS * calls and len(aux) == STEPS * ranks
    for x in records:
        step = x["step"] - 1
        layers = torch.stack([sum(counts[step * calls + c] for c in range(layer, calls, len(gates)))
                              for layer in range(len(gates))])
        assert layers.sum() == ranks * 2 * SEQ * model.config.num_experts_per_tok * len(gates)
        assert (x["expert_tokens_min"], x["expert_tokens_max"]) == (
            layers.min().item(), layers.max().item()), (x, layers)
        want_aux = sum(aux[step * ranks:(step + 1) * ranks]) / ranks
        assert_loss_close(x["aux_loss"], want_aux, what=f"aux_loss of step {x['step']}")
    check(records, params, losses, want, f"qwen3_moe on {ranks} rank(s)")
    print(f"qwen3_moe on {ranks} rank(s): expert tokens "
          f"{[(x['expert_tokens_min'], x['expert_tokens_max']) for x in records]}, aux_loss "
          f"{[round(x['aux_loss'], 6) for x in records]}")


def shift_right(labels):
    """Teacher forcing's decoder input (decoder start 0, bmt-run's default
    without a token file; -100 becomes 0), written out here."""
    dec = torch.zeros_like(labels)
    dec[:, 1:] = labels[:, :-1]
    return dec.masked_fill(dec == -100, 0)


@pytest.mark.parametrize("case", ["unequal", "rank-without-targets"])
def test_t5_model_loss_on_pairs_matches_eager(case, tmp_path):
    """An encoder-decoder traced with labels, trained on ready pairs on 2
    ranks: the model gets the target as labels (and decoder_input_ids, the
    target shifted right). Rank 0's rows have fewer targets than rank 1's,
    so the equal weighting of the ranks' losses is what is checked; or rank
    1's rows have none, and its loss counts as 0 (transformers': NaN)."""
    ranks = 2
    import copy
    import transformers
    torch.manual_seed(0)
    cls, config = make_fixtures.MODELS["t5"](transformers)
    model = cls(config).eval()
    g = torch.Generator().manual_seed(1)
    ids, labels = torch.randint(0, VOCAB, (2, 8), generator=g), torch.randint(0, VOCAB, (2, 5), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "decoder_input_ids": shift_right(labels), "labels": labels}
    archive = tmp_path / "t5.pt"
    with torch.no_grad():
        torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(str(archive))
    sharded, _ = compile_model(archive, tmp_path, ranks)
    ids = torch.randint(0, VOCAB, (STEPS, 4, 9), generator=g)
    labels = torch.randint(0, VOCAB, (STEPS, 4, 6), generator=g)
    labels[:, 0, -4:] = -100  # rank 0's rows (0, 1 of 4 on 2 ranks): 8 targets against 12
    if case == "rank-without-targets":
        labels[:, 2:] = -100  # rank 1's rows
    torch.save({"input_ids": ids, "labels": labels}, tmp_path / "pairs.pt")
    start, records, params = train(sharded, tmp_path / "pairs.pt", tmp_path, ranks)
    assert "objective model-loss (the loss its forward returns, fed span-corruption labels)" in start

    def loss_of(m, i, y):
        return m(input_ids=i, attention_mask=torch.ones_like(i), decoder_input_ids=shift_right(y),
                 labels=y).loss
    reference = copy.deepcopy(model)
    opt = torch.optim.AdamW(decay_groups(reference.parameters(), 0.01), lr=1.0)
    losses = []
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        parts = [loss_of(reference, i, y) if y.ne(-100).any() else 0
                 for i, y in zip(ids[step - 1].chunk(ranks), labels[step - 1].chunk(ranks))]
        loss = sum(parts) / ranks
        if step == 1 and case == "unequal":  # weighting by targets would give another value
            counts = [y.ne(-100).sum().item() for y in labels[0].chunk(2)]
            weighted = sum(p.item() * c for p, c in zip(parts, counts)) / sum(counts)
            assert abs(weighted - records[0]["loss"]) > 1e-3, (weighted, records[0]["loss"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        for group in opt.param_groups:
            group["lr"] = records[step - 1]["lr"]
        opt.step()
        losses.append(loss.item())
    check(records, params, losses, dict(reference.named_parameters()), f"t5 on {ranks} rank(s)")


# (b) A user's wrapper with its own loss ------------------------------------

class SmoothedZLoss(torch.nn.Module):
    """A causal LM trained on label-smoothed cross-entropy (0.1) plus PaLM's
    z-loss, 1e-4 * logsumexp(logits)^2 averaged over the targets."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, labels, attention_mask=None):
        logits = self.lm(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, :-1].reshape(-1, logits.size(-1))
        targets = labels[:, 1:].reshape(-1)
        ce = torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100,
                                               label_smoothing=0.1)
        valid = targets.ne(-100)
        z = torch.logsumexp(logits, dim=-1)
        return ce + 1e-4 * (z.pow(2) * valid).sum() / valid.sum()


class WithMask(SmoothedZLoss):
    def forward(self, input_ids, attention_mask, labels):
        return super().forward(input_ids, labels, attention_mask)


def fixture_lm():
    import transformers
    torch.manual_seed(0)
    cls, config = make_fixtures.MODELS["gpt2"](transformers)
    return cls(config).eval()


@pytest.mark.parametrize("fmt,ranks", [("pt", 1), ("pt", 2), ("pt2", 1)])
def test_wrapper_loss_matches_eager(fmt, ranks, tmp_path):
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()  # its own tensor: one passed twice is one input
    archive = tmp_path / f"wrapper.{fmt}"
    if fmt == "pt":
        module = SmoothedZLoss(fixture_lm())
        torch.jit.trace(module, (ids, labels), strict=False).save(str(archive))
    else:
        module = WithMask(fixture_lm())
        inputs = (ids, torch.ones_like(ids), labels)
        torch.export.save(torch.export.export(module, inputs, strict=False), str(archive))
    sharded, _ = compile_model(archive, tmp_path, ranks)
    batches = torch.randint(0, VOCAB, (STEPS, 2 * ranks, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    start, records, params = train(sharded, tmp_path / "batches.pt", tmp_path, ranks)
    assert "objective model-loss" in start, start

    def loss_of(m, rows):
        if fmt == "pt":
            return m(rows, rows)
        return m(rows, torch.ones_like(rows), rows)
    reference = SmoothedZLoss(fixture_lm()) if fmt == "pt" else WithMask(fixture_lm())
    losses, want = eager(reference, loss_of, batches, ranks, {x["step"]: x["lr"] for x in records})
    # Neither term is lost: the value is not plain cross-entropy, nor the
    # smoothed one without the z-loss (about 1e-4 * log(vocab)^2 = 2.4e-3
    # at initialization), nor plain cross-entropy plus the z-loss (the
    # smoothing: -1.9e-3 here); each at least 20 times the loss tolerance.
    lm = fixture_lm()
    F = torch.nn.functional
    others = torch.zeros(3)
    for r in batches[0][:, :-1].chunk(ranks):
        logits, y = lm(r).logits[:, :-1].reshape(-1, VOCAB), r[:, 1:].reshape(-1)
        z = 1e-4 * torch.logsumexp(logits, -1).pow(2).mean()
        plain, smoothed = F.cross_entropy(logits, y), F.cross_entropy(logits, y, label_smoothing=0.1)
        others += torch.stack([plain, smoothed, plain + z]).detach() / ranks
    for other in others.tolist():
        assert abs(records[0]["loss"] - other) > 4e-4, (records[0]["loss"], others)
    check(records, params, losses, want, f"wrapper .{fmt} on {ranks} rank(s)")


# (c) Errors -----------------------------------------------------------------

class PerTokenLoss(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, labels):
        logits = self.lm(input_ids=input_ids).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 labels.reshape(-1), reduction="none")


def test_a_result_that_is_not_a_scalar_is_refused(tmp_path):
    ids = torch.randint(0, VOCAB, (2, SEQ))
    archive = tmp_path / "per_token.pt"
    torch.jit.trace(PerTokenLoss(fixture_lm()), (ids, ids.clone()), strict=False).save(str(archive))
    sharded, _ = compile_model(archive, tmp_path, 1)
    batches = torch.randint(0, VOCAB, (1, 2, SEQ + 1))
    torch.save(batches, tmp_path / "batches.pt")
    params = tmp_path / "params.safetensors"
    r = run([binary("bmt-run"), sharded, "--batches", tmp_path / "batches.pt", "--steps", 1,
             "--save-params", params, "--device", "cpu"])
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert "takes labels" in errors[0] and "tensor of shape [16]" in errors[0], errors[0]
    assert "not a scalar loss" in errors[0], errors[0]
    assert "step 1" not in r.stdout and not params.exists()


def test_model_loss_without_labels_is_refused(tmp_path):
    ids = torch.randint(0, VOCAB, (2, SEQ))
    archive = tmp_path / "plain.pt"
    torch.jit.trace(fixture_lm(), example_kwarg_inputs={"input_ids": ids}, strict=False).save(
        str(archive))
    sharded, _ = compile_model(archive, tmp_path, 1)
    torch.save(torch.randint(0, VOCAB, (1, 2, SEQ + 1)), tmp_path / "batches.pt")
    r = run([binary("bmt-run"), sharded, "--batches", tmp_path / "batches.pt", "--steps", 1,
             "--objective", "model-loss", "--device", "cpu"])
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr
    assert "--objective model-loss" in errors[0] and "takes no 'labels' input" in errors[0]
    # Without the flag the same program trains on bmt-run's cross-entropy.
    r = run([binary("bmt-run"), sharded, "--batches", tmp_path / "batches.pt", "--steps", 1,
             "--device", "cpu"])
    assert r.returncode == 0 and "objective causal-lm" in r.stdout, r.stdout + r.stderr


def test_export_hf_labels_needs_a_head(tmp_path):
    r = subprocess.run([*tool("bmt-export-hf"), "--config", "gpt2", "--set", "n_layer=1",
                        "--head", "none", "--labels", "-o", str(tmp_path / "x.pt")],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: --labels needs a model with a head")
    assert not (tmp_path / "x.pt").exists()
