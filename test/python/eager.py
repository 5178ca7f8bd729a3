"""Eager references the parity tests share: the tiny fixture models of
test/fixtures/make_fixtures.py, traced and compiled as a user does; bmt-run
--dump against the eager model's logits, loss and gradients (numerics.py's
bounds); bmt-run's default weight-decay groups and an eager AdamW loop."""
import math
import os
import subprocess
import sys

import torch

from bmt_paths import REPO, binary
from numerics import assert_close, assert_gradients_close, assert_loss_close

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402  (the tiny model configs)


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


def decay_groups(params, wd):
    """bmt-run's default weight-decay groups as torch.optim param groups:
    parameters of 2+ dimensions get `wd`, biases and norm weights none."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def eager_training(model, batches, steps, accum, lr_of_step, clip, wd, ranks=1,
                   after_step=None, optimizer=None):
    """bmt-run's causal-LM training of `batches` (windows [rows, seq + 1]) in
    eager PyTorch: AdamW, `accum` micro-batches a step; with `ranks`, each
    rank's rows (a chunk of each window batch) give one loss and the step's
    objective is their mean, as bmt-run's data parallelism defines it.
    `after_step(step)` runs after each optimizer step; `optimizer(groups)`
    makes another optimizer than AdamW. Returns the losses."""
    groups = decay_groups(model.parameters(), wd)
    opt = optimizer(groups) if optimizer else torch.optim.AdamW(groups, lr=1.0,
                                                                betas=(0.9, 0.999), eps=1e-8)
    losses, k = [], 0
    for step in range(1, steps + 1):
        opt.zero_grad()
        total = 0.0
        for _ in range(accum):
            window = batches[k % len(batches)]
            k += 1
            for w in window.chunk(ranks):
                logits = model(input_ids=w[:, :-1],
                               attention_mask=torch.ones_like(w[:, :-1])).logits
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                         w[:, 1:].reshape(-1))
                (loss / (accum * ranks)).backward()
                total += loss.item() / ranks
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for group in opt.param_groups:
            group["lr"] = lr_of_step(step)
        opt.step()
        if after_step:
            after_step(step)
        losses.append(total / accum)
    return losses


def train_on_batches(prep, sharded, ranks, tag, *extra):
    """bmt-run of `sharded` on `ranks` CPU ranks over the prepared model's
    fixed batches (scripts/parallel_matrix.py's prepare: its STEPS and
    TRAIN_FLAGS), writing its log and --save-params into prep["tmp"] under
    `tag`. Returns (the train records, the saved parameters' path)."""
    import json
    import os
    from parallel_matrix import STEPS, TRAIN_FLAGS
    from test_zero_multirank import torchrun
    log = os.path.join(prep["tmp"], f"{tag}.jsonl")
    saved = os.path.join(prep["tmp"], f"{tag}.safetensors")
    r = torchrun(ranks, sharded, "--batches", os.path.join(prep["tmp"], "batches.pt"),
                 "--steps", STEPS, "--objective", "causal-lm", *TRAIN_FLAGS, "--log-file", log,
                 "--save-params", saved, *extra, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    prep.setdefault("stdout", {})[tag] = r.stdout
    return [x for x in map(json.loads, open(log)) if x["kind"] == "train"], saved


def assert_frozen_sharded(stdout, sharded, ranks, tp=1, tp_split=False):
    """The frozen parameters of `sharded`'s plan are ZeRO-sharded: in
    frozen storage groups, of which bmt-run's first line (`stdout`) says a
    rank holds ceil(size / R) elements each, R = ranks / tp the data-parallel
    ranks, at most 1/R of the frozen bytes plus alignment padding (with
    `tp_split`, the frozen base split over the TP group too: at least 1/N); on
    several ranks (tp 1) each rank read at most 1/N of the weights. Returns
    (frozen bytes per rank, the frozen parameters' bytes)."""
    import io
    import re
    import zipfile
    import torch
    with zipfile.ZipFile(sharded) as z:
        name = next(n for n in z.namelist() if n.endswith("/bmt/plan.pkl"))
        plan = torch.load(io.BytesIO(z.read(name)), weights_only=False)
    size = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
    frozen = [t for t in plan["tensors"] if t["is_parameter"] and not t["requires_grad"]]
    whole = sum(math.prod(t["shape"]) * size[t["dtype"]] for t in frozen)
    assert frozen and all(t["group"] >= 0 and plan["groups"][t["group"]]["frozen"] for t in frozen)
    groups = [g for g in plan["groups"] if g["frozen"] and g.get("tp_rank", -1) <= 0]
    r = ranks // tp
    m = re.search(r"frozen parameters (\d+) bytes per rank", stdout)
    assert m, stdout
    per_rank = int(m.group(1))
    assert per_rank == sum(-(-g["size"] // r) * size[g["dtype"]] for g in groups), per_rank
    padding = 512 * len(frozen)  # bmt-zero's alignment, at most once per member
    lowest = whole / ranks if tp_split else whole / r
    assert lowest <= per_rank <= (whole + padding) / r + 8 * len(groups), (per_rank, whole, r)
    if tp_split:  # the split base: less than a whole copy over the data-parallel ranks
        assert per_rank < whole / r, (per_rank, whole, r)
    if ranks > 1 and tp == 1:
        m = re.search(r"weights (\d+) bytes; bytes read per rank: ([\d ]+)", stdout)
        assert m, stdout
        total, reads = int(m.group(1)), [int(x) for x in m.group(2).split()]
        chunks = sum(2 * g["chunk_bytes"] for g in plan["groups"])
        assert all(b <= total / ranks * 1.01 + chunks for b in reads), (reads, total)
    return per_rank, whole
