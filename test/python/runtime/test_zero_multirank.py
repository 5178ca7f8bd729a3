"""ZeRO across ranks, on CPU: `torchrun --nproc_per_node=N --no-python bmt-run`
trains tiny GPT-2 and LLaMA for 20 steps and must give the same losses and
final parameters (within numerics.py's bounds) as single-process eager
PyTorch (torch.optim.AdamW) on the same global batches, for N = 1..4 (3 gives
uneven shards), ZeRO-3 and ZeRO-2, with and without checkpointing, hybrid
sharding (G = 2 with N = 4) and prefetch depths 0 and 2. Each rank must read
at most 1/N of the weights (+1 %). The plans have the default pipeline's
elementwise fusion; one config compiles without it (--fuse-elementwise=false).
"""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from bmt_paths import binary
from numerics import assert_identical, assert_loss_close, assert_trained_close
from eager import build, eager_training

STEPS = 20
GLOBAL_BATCH = 12  # rows per step, split over the ranks (divisible by 1..4)
SEQ = 8

CONFIGS = {
    # name: (ranks, bmt-opt flags, grad accumulation)
    "zero3-recompute-n1": (1, [], 1),
    "zero3-recompute-n2": (2, [], 1),
    "zero3-recompute-n3": (3, [], 1),
    "zero3-recompute-n4": (4, [], 1),
    "zero3-n2": (2, ["--checkpoint", "none"], 1),
    "zero3-n3-accum2": (3, ["--checkpoint", "none"], 2),
    "zero2-recompute-n2": (2, ["--zero-stage", "2"], 1),
    "zero2-n3": (3, ["--zero-stage", "2", "--checkpoint", "none"], 1),
    "hybrid-g2-n4": (4, ["--shard-group-size", "2"], 1),
    "prefetch0-n2": (2, ["--prefetch-depth", "0"], 1),
    "prefetch2-n3": (3, ["--prefetch-depth", "2", "--checkpoint", "none"], 1),
    "plain-recompute-n3": (3, ["--fuse-elementwise=false"], 1),
}


def torchrun(n, *args, timeout=600, device="cpu"):
    """bmt-run under torchrun (standalone rendezvous on a free port) on CPU
    ranks (device "cuda": rank r on GPU r); subprocess.TimeoutExpired past
    `timeout` seconds."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", "--no-python", binary("bmt-run"), *map(str, args),
           "--device", device]
    # Values a recompute does not compute are NaN: one read after all would show.
    env = dict(os.environ, OMP_NUM_THREADS="1", BMT_COMM_TIMEOUT_S="120", BMT_DEBUG_RECOMPUTE_NAN="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def traced(request, tmp_path_factory):
    """The fixture model, its TorchScript trace, the batches and the eager
    reference runs (by grad accumulation)."""
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    model = build(name)
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, SEQ, dtype=torch.long)}
    pt = tmp / f"{name}.pt"
    torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(str(pt))
    batches = torch.randint(0, vocab, (2 * STEPS, GLOBAL_BATCH, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp / "batches.pt")
    return {"name": name, "model": model, "pt": pt, "batches": batches, "tmp": tmp, "eager": {}}


def slot_weights(model):
    """Distinct weights of nn.Linear, HF Conv1D and nn.Embedding modules:
    the gradients their backwards write into ZeRO's flat gradient (a tied
    embedding adds into its LM head's)."""
    return len({id(m.weight) for m in model.modules()
                if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)) or type(m).__name__ == "Conv1D"})


def eager_reference(traced, accum, lrs):
    """Losses and final parameters of eager PyTorch on the global batches."""
    if accum not in traced["eager"]:
        model = build(traced["name"])  # fresh weights, same seed
        losses = eager_training(model, traced["batches"], STEPS, accum, lambda s: lrs[s], 0.5, 0.01)
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        traced["eager"][accum] = (losses, params)
    return traced["eager"][accum]


@pytest.mark.parametrize("config", list(CONFIGS))
def test_training_matches_eager(traced, config):
    ranks, flags, accum = CONFIGS[config]
    tmp = traced["tmp"] / config
    tmp.mkdir()
    sharded = tmp / "sharded.pt"
    compiled = subprocess.run([binary("bmt-opt"), str(traced["pt"]), "-o", str(sharded),
                               "--world-size", str(ranks), *flags], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    fused = "--fuse-elementwise=false" not in flags
    assert ("bmt-fuse-elementwise:" in compiled.stderr) == fused, compiled.stderr
    log, params = tmp / "log.jsonl", tmp / "params.safetensors"
    r = torchrun(ranks, sharded, "--batches", traced["tmp"] / "batches.pt", "--steps", STEPS,
                 "--grad-accum", accum, "--lr", "1e-3", "--schedule", "cosine", "--warmup", 2,
                 "--clip-grad", 0.5, "--weight-decay", 0.01, "--log-file", log, "--save-params", params)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    # Rank-local loading: every rank read at most 1/N of the weights (+1 %),
    # its ranges widened to the checksummed chunks that cover them (a chunk
    # more at either end of a group at most).
    if ranks > 1:
        m = re.search(r"weights (\d+) bytes; bytes read per rank: ([\d ]+)", r.stdout)
        assert m, r.stdout
        total, per_rank = int(m.group(1)), [int(x) for x in m.group(2).split()]
        assert len(per_rank) == ranks
        import io
        import zipfile
        with zipfile.ZipFile(sharded) as z:
            name = next(n for n in z.namelist() if n.endswith("/bmt/plan.pkl"))
            plan = torch.load(io.BytesIO(z.read(name)), weights_only=False)
        chunks = sum(2 * g["chunk_bytes"] for g in plan["groups"])
        for b in per_rank:
            assert b <= total / ranks * 1.01 + chunks, (b, total, ranks, chunks)

    records = [json.loads(line) for line in open(log) if line.strip()]
    train = [x for x in records if x["kind"] == "train"]
    assert [x["step"] for x in train] == list(range(1, STEPS + 1))
    lrs = {x["step"]: x["lr"] for x in train}
    # Every linear and embedding weight's gradient was written by its
    # backward into the group's flat gradient, in every micro-batch (the
    # last record counts all of rank 0's); a tied embedding added into its
    # LM head's, so the sum is not copied either.
    assert train[-1]["gradients_in_place"] == STEPS * accum * slot_weights(traced["model"]), train[-1]
    # A recomputed block does not compute what only its output's value
    # needs: the MLP's last matmul and the residual add after it.
    recomputed = "none" not in flags
    layers = traced["model"].config.num_hidden_layers
    assert train[-1]["recompute_skipped"] == (STEPS * accum * layers * 2 if recomputed else 0), train[-1]
    losses, want = eager_reference(traced, accum, lrs)
    for x, loss in zip(train, losses):
        assert_loss_close(x["loss"], loss, what=f"{config}: loss of step {x['step']}")
    from safetensors.torch import load_file
    stats = assert_trained_close(load_file(params), want, sum(lrs.values()))
    print(f"{config}: parameters max {stats[0]:.2e}, mean {stats[1]:.2e}, differing {stats[2]:.1%}")


def test_world_size_not_divisible_by_shard_group(traced):
    if traced["name"] != "gpt2":
        pytest.skip("one model is enough")
    tmp = traced["tmp"]
    sharded = tmp / "hybrid.sharded.pt"
    subprocess.run([binary("bmt-opt"), str(traced["pt"]), "-o", str(sharded),
                    "--shard-group-size", "2"], check=True, capture_output=True)
    r = torchrun(3, sharded, "--batches", tmp / "batches.pt", "--steps", 1)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors, r.stderr[-2000:]
    assert all("world size 3 is not a multiple of the plan's shard group size 2" in e
               for e in errors), errors


def test_same_run_twice_is_bit_identical(traced):
    """bmt's determinism promise (docs/runtime/numerics.md): the same plan, data,
    options, world size and thread count on the same machine give the same
    losses and parameters to the bit; a run on another world size only
    agrees within numerics.py's bounds (test_training_matches_eager)."""
    if traced["name"] != "gpt2":
        pytest.skip("one model is enough")
    from safetensors.torch import load_file
    tmp = traced["tmp"] / "twice"
    tmp.mkdir()
    sharded = tmp / "sharded.pt"
    subprocess.run([binary("bmt-opt"), str(traced["pt"]), "-o", str(sharded), "--world-size", "3"],
                   check=True, capture_output=True)
    runs = []
    for k in range(2):
        log, params = tmp / f"log{k}.jsonl", tmp / f"params{k}.safetensors"
        r = torchrun(3, sharded, "--batches", traced["tmp"] / "batches.pt", "--steps", 4,
                     "--lr", "1e-3", "--clip-grad", 0.5, "--log-file", log, "--save-params", params)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        train = [json.loads(x) for x in open(log) if '"train"' in x]
        runs.append(([(x["loss"], x["grad_norm"]) for x in train], load_file(params)))
    assert len(runs[0][0]) == 4 and runs[0][0] == runs[1][0]
    assert_identical(runs[1][1], runs[0][1], "parameters of the second run")
