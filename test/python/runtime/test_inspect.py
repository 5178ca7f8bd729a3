"""Inspection (train/Inspect.h): bmt-run --inspect-every and the source of a
non-finite loss or gradient.

1. --inspect-every N: the inspect JSON lines against eager PyTorch on the same
   weights and batch. At step 1 of a run the parameters are the initial ones,
   the gradients those of the first batch: per block (transformer.h.i) and for
   the parameters outside blocks, the L2 norm and max-abs of the parameters and
   gradients and the max-abs of the block's output (a forward hook on the
   eager block) must agree within numerics.py's bounds, on 1 rank (GPT-2,
   LLaMA) and 2 ranks with gradient accumulation 2 under ZeRO-3 (global
   values from the shards and from each rank's rows), and under hybrid
   sharding (2 replicas of one shard). The lines come every N steps, after
   that step's train line.
2. A non-finite loss or gradient norm: one error line, exit status 1, naming
   the first block (and operator with its source location) that produced a
   non-finite value. A NaN in one weight (the parameter and the addmm reading
   it); an overflow that only rank 1's rows reach (a huge embedding row: the
   first eager module whose output is not finite, the same message on both
   ranks); a gradient that only the backward makes infinite (sqrt at 0 in a
   block of a small custom model, recomputed in backward: the backward of
   aten::sqrt, or of the fused region that holds it in the default plan); an
   inf injected after the gradients' synchronisation
   (BMT_DEBUG_INJECT_INF_STEP), which a replay cannot reproduce. The
   operator-level cases compile plans of plain ATen ops
   (--fuse-elementwise=false) as well as the default pipeline's.
3. Bad --inspect-every values and combinations: one clear error.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from bmt_paths import binary
from numerics import PARITY_ULPS, assert_close, eps
from eager import build

SEQ = 8


def bmt_run(ranks, *args, env=None):
    """bmt-run alone (1 rank) or under torchrun on CPU ranks."""
    run = [binary("bmt-run"), *map(str, args), "--device", "cpu"]
    if ranks > 1:
        run = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={ranks}", "--no-python", *run]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", BMT_COMM_TIMEOUT_S="120", **(env or {}))
    return subprocess.run(run, capture_output=True, text=True, env=full_env, timeout=600)


def compile_model(model, path, *flags):
    """Traces `model` (batch 2 x SEQ) and compiles it with the default pipeline."""
    vocab = model.config.vocab_size if hasattr(model, "config") else model.vocab
    inputs = {"input_ids": torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, SEQ, dtype=torch.long)}
    pt = path.with_suffix(".pt")
    torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(str(pt))
    sharded = path.with_suffix(".sharded.pt")
    r = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(sharded), *map(str, flags)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return sharded


def records(log, kind):
    return [x for x in (json.loads(line) for line in open(log) if line.strip()) if x["kind"] == kind]


def error_lines(r):
    return [line for line in r.stderr.splitlines() if line.startswith("error:")]


def blocks_of(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def eager_inspection(model, micro_batches):
    """What bmt-run --inspect-every reports for step 1, computed by eager
    PyTorch: forward and backward of each micro-batch (loss / their number),
    then per block and outside blocks the statistics of parameters (tied
    ones once), gradients and block outputs."""
    blocks = blocks_of(model)
    outputs = [0.0] * len(blocks)

    def record(i):
        def hook(module, args, out):
            o = out[0] if isinstance(out, tuple) else out
            outputs[i] = max(outputs[i], o.detach().abs().max().item())
        return hook

    handles = [b.register_forward_hook(record(i)) for i, b in enumerate(blocks)]
    for w in micro_batches:
        logits = model(input_ids=w[:, :-1], attention_mask=torch.ones_like(w[:, :-1])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1))
        (loss / len(micro_batches)).backward()
    for h in handles:
        h.remove()

    def stats(params):
        values = torch.cat([p.detach().double().flatten() for p in params])
        grads = torch.cat([p.grad.double().flatten() for p in params])
        return {"param_norm": values.norm().item(), "param_max_abs": values.abs().max().item(),
                "grad_norm": grads.norm().item(), "grad_max_abs": grads.abs().max().item()}

    prefix = "transformer.h." if hasattr(model, "transformer") else "model.layers."
    want = [dict(name=prefix + str(i), output_max_abs=outputs[i], **stats(list(b.parameters())))
            for i, b in enumerate(blocks)]
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    outside = [p for p in model.parameters() if id(p) not in in_blocks]  # tied ones once
    want.append(dict(name="outside_blocks", output_max_abs=None, **stats(outside)))
    return want


def check_against_eager(got, want, train_line):
    assert [b["name"] for b in got] == [b["name"] for b in want]
    # Gradients norm-wise (numerics.py): the floor is the largest of the model.
    floor = {"grad_norm": max(b["grad_norm"] for b in want),
             "grad_max_abs": max(b["grad_max_abs"] for b in want)}
    worst = {}
    for g, w in zip(got, want):
        for key in ("param_norm", "param_max_abs", "grad_norm", "grad_max_abs", "output_max_abs"):
            if w[key] is None:
                assert g[key] is None, (w["name"], key, g[key])
                continue
            diff = assert_close(g[key], w[key], PARITY_ULPS, floor=floor.get(key, 0.0),
                                what=f"{w['name']} {key}")
            ulps = diff / (eps(torch.float32) * max(abs(w[key]), floor.get(key, 0.0)))
            worst[key] = max(worst.get(key, 0.0), ulps)
    print("largest differences in ulps: " + ", ".join(f"{k} {v:.2f}" for k, v in worst.items()))
    # The blocks' gradient norms make up the step's global gradient norm.
    total = sum(b["grad_norm"] ** 2 for b in got) ** 0.5
    assert_close(total, train_line["grad_norm"], PARITY_ULPS, what="global gradient norm")


def inspection_against_eager(name, ranks, accum, tmp_path, *flags):
    model = build(name)
    sharded = compile_model(model, tmp_path / name, "--world-size", ranks, *flags)
    batches = torch.randint(0, model.config.vocab_size, (accum, 4, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    log = tmp_path / "log.jsonl"
    r = bmt_run(ranks, sharded, "--batches", tmp_path / "batches.pt", "--steps", 1,
                "--grad-accum", accum, "--inspect-every", 1, "--log-file", log)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    [inspect] = records(log, "inspect")
    [train] = records(log, "train")
    assert inspect["step"] == 1
    want = eager_inspection(model, list(batches))
    check_against_eager(inspect["blocks"], want, train)


@pytest.mark.parametrize("name,ranks,accum", [("gpt2", 1, 1), ("llama", 1, 1), ("gpt2", 2, 2)])
def test_inspection_matches_eager(name, ranks, accum, tmp_path):
    inspection_against_eager(name, ranks, accum, tmp_path)


def test_inspection_under_hybrid_sharding(tmp_path):
    """Shard group size 1 on 2 ranks: each rank holds every shard (two
    replicas), so only the first shard group's rank may count them."""
    inspection_against_eager("gpt2", 2, 1, tmp_path, "--shard-group-size", 1)


def test_inspection_every_n_steps(tmp_path):
    model = build("gpt2")
    sharded = compile_model(model, tmp_path / "gpt2")
    batches = torch.randint(0, model.config.vocab_size, (5, 2, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    log = tmp_path / "log.jsonl"
    r = bmt_run(1, sharded, "--batches", tmp_path / "batches.pt", "--steps", 5,
                "--inspect-every", 2, "--log-file", log)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [json.loads(line) for line in open(log) if line.strip()]
    assert [(x["kind"], x["step"]) for x in lines] == [
        ("train", 1), ("train", 2), ("inspect", 2), ("train", 3), ("train", 4), ("inspect", 4),
        ("train", 5)]
    train = {x["step"]: x for x in lines if x["kind"] == "train"}
    for x in lines:
        if x["kind"] == "inspect":
            total = sum(b["grad_norm"] ** 2 for b in x["blocks"]) ** 0.5
            assert_close(total, train[x["step"]]["grad_norm"], PARITY_ULPS)
    # The parameters move between inspected steps (the norms are not frozen).
    first, second = [x["blocks"] for x in lines if x["kind"] == "inspect"]
    assert any(a["param_norm"] != b["param_norm"] for a, b in zip(first, second))


def test_nan_weight_names_block_parameter_and_operator(tmp_path):
    model = build("gpt2")
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight[3, 5] = float("nan")
    sharded = compile_model(model, tmp_path / "nan")
    batches = torch.randint(0, model.config.vocab_size, (3, 2, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    saved = tmp_path / "params.safetensors"
    r = bmt_run(1, sharded, "--batches", tmp_path / "batches.pt", "--steps", 3,
                "--save-params", saved)
    assert r.returncode == 1
    [error] = error_lines(r)
    assert error.startswith("error: the loss is NaN at step 1 "), error
    # The first non-finite value is the parameter, read by Conv1D's addmm
    # (transformers' pytorch_utils.py) in block 1's MLP.
    assert ("the parameter transformer.h.1.mlp.c_fc.weight of block transformer.h.1, read by "
            "aten::addmm in transformer.h.1.mlp.c_fc.forward (") in error, error
    assert "pytorch_utils.py:" in error, error
    assert not saved.exists()


def first_non_finite_module(model, ids):
    """The first leaf module (in execution order) of eager `model` whose
    output is not finite on `ids`, and which rows are affected."""
    found = []

    def hook(name):
        def check(module, args, out):
            o = out[0] if isinstance(out, tuple) else out
            if not found and not torch.isfinite(o).all():
                found.append((name, [bool(torch.isfinite(o[r]).all()) for r in range(o.size(0))]))
        return check

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
               if not list(m.children())]
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    for h in handles:
        h.remove()
    return found[0] if found else (None, None)


@pytest.mark.parametrize("plan", ["plain", "default"])
def test_overflow_on_one_rank_is_found_on_every_rank(plan, tmp_path):
    """A finite but huge embedding row overflows a block's layer norm only in
    the rows that hold its token, which only rank 1 trains on. In the
    default plan each LayerNorm is a fused row region, whose variance
    overflows to inf and normalizes the row to 0 where ATen's layer_norm
    gives NaN: the forward stays finite, and the backward of a region is
    blamed."""
    model = build("gpt2")
    token = model.config.vocab_size - 1
    with torch.no_grad():
        model.transformer.wte.weight[token].mul_(1e30)
    assert torch.isfinite(model.transformer.wte.weight).all()
    batches = torch.randint(0, token, (2, 4, SEQ + 1), generator=torch.Generator().manual_seed(3))
    batches[0, 3, 4] = token  # global row 3: rank 1's rows are 2 and 3
    module, finite_rows = first_non_finite_module(model, batches[0, :, :-1])
    assert module is not None and finite_rows == [True, True, True, False], (module, finite_rows)
    sharded = compile_model(model, tmp_path / "big", "--world-size", 2,
                            *(["--fuse-elementwise=false"] if plan == "plain" else []))
    torch.save(batches, tmp_path / "batches.pt")
    r = bmt_run(2, sharded, "--batches", tmp_path / "batches.pt", "--steps", 2)
    assert r.returncode != 0
    errors = error_lines(r)
    assert len(errors) == 2 and errors[0] == errors[1], errors  # one line per rank, the same
    if plan == "default":
        assert errors[0].startswith("error: the gradient norm is not finite at step 1; the forward "
                                    "is finite; the first non-finite gradient of the backward comes "
                                    "from "), errors[0]
        assert ": the backward of the fused row region of aten::layer_norm in " in errors[0], errors[0]
        return
    block = ".".join(module.split(".")[:3])  # transformer.h.<i>
    assert errors[0].startswith("error: the loss is NaN at step 1 "), errors[0]
    assert f"comes from block {block}: " in errors[0] and f" in {module}.forward (" in errors[0], \
        (module, errors[0])
    assert errors[0].endswith("whose inputs are finite; stopping"), errors[0]


class _Layer(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = torch.nn.Linear(d, d)
        self.gate = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x + self.lin(x) * torch.sqrt(self.gate)


class _GatedModel(torch.nn.Module):
    """Three identical blocks (bmt-find-blocks finds them) whose gates go
    through sqrt: finite forward at a gate of 0, infinite gradient."""

    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.vocab = vocab
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList([_Layer(d) for _ in range(3)])
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, input_ids, attention_mask):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return {"logits": self.head(x)}


@pytest.mark.parametrize("plan", ["plain", "default"])
def test_backward_only_overflow_names_the_operator(plan, tmp_path):
    torch.manual_seed(0)
    model = _GatedModel()
    with torch.no_grad():
        model.layers[1].gate[3] = 0.0
    batches = torch.randint(0, model.vocab, (2, 4, SEQ + 1), generator=torch.Generator().manual_seed(3))
    # Eager: the forward is finite, the first block of the backward whose
    # gradients are not finite is layers.1 (layers.2's are finite).
    logits = model(input_ids=batches[0, :, :-1], attention_mask=None)["logits"]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, model.vocab), batches[0, :, 1:].reshape(-1))
    assert torch.isfinite(loss)
    loss.backward()
    assert not torch.isfinite(model.layers[1].gate.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.layers[2].parameters())
    # every block recomputed in backward
    sharded = compile_model(model, tmp_path / "gated",
                            *(["--fuse-elementwise=false"] if plan == "plain" else []))
    torch.save(batches, tmp_path / "batches.pt")
    r = bmt_run(1, sharded, "--batches", tmp_path / "batches.pt", "--steps", 2)
    assert r.returncode == 1
    [error] = error_lines(r)
    # The default plan has x + lin(x) * sqrt(gate) as one fused region.
    op = ("aten::sqrt" if plan == "plain" else
          "the fused pointwise region of aten::sqrt, aten::mul.Tensor, aten::add.Tensor")
    assert error.startswith("error: the gradient norm is not finite at step 1; the forward is "
                            "finite; the first non-finite gradient of the backward comes from block "
                            f"layers.1: the backward of {op} in layers.1.forward ("), error


def test_injected_gradient_does_not_recur(tmp_path):
    model = build("gpt2")
    sharded = compile_model(model, tmp_path / "gpt2")
    batches = torch.randint(0, model.config.vocab_size, (3, 2, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    r = bmt_run(1, sharded, "--batches", tmp_path / "batches.pt", "--steps", 3,
                env={"BMT_DEBUG_INJECT_INF_STEP": "2"})
    assert r.returncode == 1
    [error] = error_lines(r)
    assert error == ("error: the gradient norm is not finite at step 2; replaying the step with the "
                     "weights it ran with gives finite values and gradients (the failure did not "
                     "recur); stopping"), error
    assert "step 1/3" in r.stdout and "step 2/3" not in r.stdout


@pytest.mark.parametrize("args,message", [
    (["--inspect-every", "0", "--log-file", "x.jsonl"], "--inspect-every must be at least 1, got 0"),
    (["--inspect-every", "-3", "--log-file", "x.jsonl"], "--inspect-every must be at least 1, got -3"),
    (["--inspect-every", "two", "--log-file", "x.jsonl"], "--inspect-every expects an integer, got 'two'"),
    (["--inspect-every", "5"], "--inspect-every writes its lines to the JSON log: give --log-file FILE"),
    (["--inspect-every", "5", "--log-file", "x.jsonl", "--eval-only", "--eval-data", "v.bin"],
     "--inspect-every inspects training steps; it has no effect with --eval-only"),
])
def test_bad_inspect_every(args, message, tmp_path):
    r = subprocess.run([binary("bmt-run"), str(tmp_path / "m.sharded.pt"), "--steps", "1",
                        "--data", "d.bin", *args], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == "error: " + message, r.stderr
