"""bmt-run --offload-optimizer on CPU, 2 ranks under torchrun (ZeRO-3).

Offloading moves each rank's float32 master shards and AdamW moments to host
memory, copies the gradients there during the backward (on a copy stream on
CUDA; plain copies on the CPU, through the same code) and runs AdamW on the
host copies, unscaled and clipped as on the device. On the CPU
both paths run the same kernels on the same values, so a run with
--offload-optimizer must equal the run without it: the same losses (within
1e-6; they agree to the bit) and the same final parameters (bit-identical),
with clipping active at every step (--clip-grad far below the gradient norm)
and gradient accumulation 2 (the host copy must wait for the second
micro-batch), for

1. float32 GPT-2; bf16 GPT-2 (fp32 masters); bf16 with float32 reduction
   and hybrid sharding (shard group size 1: the replica all-reduce runs on
   the offload path too); float32 under ZeRO-2 without recompute;
2. fp16 with dynamic loss scaling and an injected overflow
   (BMT_DEBUG_INJECT_INF_STEP, as test_mixed_precision.py): the step is
   skipped identically (same skipped flags and loss scales, same losses and
   parameters: the host copies still carry the loss scale and are unscaled
   on the host; the injected inf reaches the host only through the flag);
3. tensor parallelism (T = 2 on 2 and 4 ranks): the host copies are taken
   after the TP group's sum of the replicated members' gradients;
4. the usage errors: a plan without storage groups, --eval-only.
"""
import re
import subprocess

import pytest
import torch

from bmt_paths import binary
from numerics import assert_identical
from test_mixed_precision import torchrun, train_records
from eager import build

SEQ = 8
GLOBAL_BATCH = 4
STEPS = 6
ACCUM = 2
RANKS = 2
CLIP = 0.05  # the tiny models' gradient norms are ~1-5: every step clips

OFFLOAD_LINE = re.compile(r"--offload-optimizer: float32 master weights, Adam moments and "
                          r"gradient copies of (\d+) elements in host memory")


def trace(model, path):
    vocab = model.config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, SEQ, dtype=torch.long)}
    pt = path.with_suffix(".pt")
    torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(str(pt))
    return pt


def compile_plan(pt, out, *flags):
    r = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(out), *map(str, flags)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def train_pair(tmp, sharded, batches, steps, common, env=None, ranks=RANKS):
    """Trains with and without --offload-optimizer on `ranks` ranks; returns
    both runs' (stdout, train records, saved parameters)."""
    from safetensors.torch import load_file
    runs = {}
    for offload in (False, True):
        name = "offload" if offload else "device"
        log, params = tmp / f"{name}.jsonl", tmp / f"{name}.safetensors"
        r = torchrun(ranks, sharded, "--batches", batches, "--steps", steps, "--grad-accum", ACCUM,
                     *common, *(["--offload-optimizer"] if offload else []),
                     "--log-file", log, "--save-params", params, env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        runs[name] = (r.stdout, train_records(log), load_file(params))
    device_out, offload_out = runs["device"][0], runs["offload"][0]
    assert not OFFLOAD_LINE.search(device_out), device_out
    m = OFFLOAD_LINE.search(offload_out)
    assert m and int(m.group(1)) > 0, offload_out
    return runs


def assert_same_training(runs, label):
    (_, train_d, params_d), (_, train_o, params_o) = runs["device"], runs["offload"]
    assert [x["step"] for x in train_o] == [x["step"] for x in train_d]
    assert [x["skipped"] for x in train_o] == [x["skipped"] for x in train_d]
    assert [x["loss_scale"] for x in train_o] == [x["loss_scale"] for x in train_d]
    worst = max(abs(o["loss"] - d["loss"]) for o, d in zip(train_o, train_d))
    norms = max(abs(o["grad_norm"] - d["grad_norm"]) for o, d in zip(train_o, train_d)
                if not d["skipped"])
    assert set(params_o) == set(params_d)
    diff = max((params_o[n].double() - params_d[n].double()).abs().max().item() for n in params_d)
    print(f"{label}: {len(train_d)} steps, max loss difference {worst:.1e}, grad norm "
          f"{norms:.1e}, parameters {diff:.1e}")
    assert worst <= 1e-6, [(o["loss"], d["loss"]) for o, d in zip(train_o, train_d)]
    assert norms <= 1e-6 * max(d["grad_norm"] for d in train_d if not d["skipped"])
    # Bit equality: bmt guarantees it for the same kernels on the same values
    # (numerics.py).
    assert_identical(params_o, params_d, f"{label}: parameters")
    # Training happened, with clipping active at every step that was not skipped.
    assert train_d[-1]["loss"] < train_d[0]["loss"]
    assert all(d["grad_norm"] > 2 * CLIP for d in train_d if not d["skipped"]), \
        [d["grad_norm"] for d in train_d]


CONFIGS = {
    # name: (model dtype, bmt-opt flags, bmt-run flags, ranks)
    "fp32": (torch.float32, [], [], RANKS),
    "bf16": (torch.bfloat16, [], [], RANKS),
    "bf16-reduce-fp32-hybrid": (torch.bfloat16, ["--shard-group-size", 1], ["--reduce-dtype", "float32"],
                                RANKS),
    "fp32-zero2-no-recompute": (torch.float32, ["--zero-stage", 2, "--checkpoint", "none"], [], RANKS),
    # Tensor parallelism (T = 2): ZeRO shards over the N / T data-parallel
    # ranks; GPT-2's row biases, norm weights and position embedding are
    # replicated over the TP group (their gradients all-reduced over it
    # before the reduce-scatter: the host copies must see that sum).
    "tp2-n2-bf16": (torch.bfloat16, ["--tensor-parallel", 2], [], 2),
    "tp2-n4-fp32": (torch.float32, ["--tensor-parallel", 2], [], 4),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Traces per dtype and the batches (STEPS * ACCUM micro-batches)."""
    tmp = tmp_path_factory.mktemp("offload")
    traces = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        traces[dtype] = trace(build("gpt2").to(dtype), tmp / f"gpt2_{str(dtype)[6:]}")
    vocab = build("gpt2").config.vocab_size
    batches = torch.randint(0, vocab, (STEPS * ACCUM, GLOBAL_BATCH, SEQ + 1),
                            generator=torch.Generator().manual_seed(5))
    torch.save(batches, tmp / "batches.pt")
    return {"tmp": tmp, "traces": traces, "batches": tmp / "batches.pt"}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_offload_matches_device_optimizer(models, config):
    dtype, opt_flags, run_flags, ranks = CONFIGS[config]
    tmp = models["tmp"] / config
    tmp.mkdir()
    sharded = compile_plan(models["traces"][dtype], tmp / "sharded.pt", "--world-size", ranks,
                           *opt_flags)
    common = ["--lr", "1e-3", "--schedule", "cosine", "--warmup", 2, "--clip-grad", CLIP,
              "--weight-decay", 0.01, *run_flags]
    runs = train_pair(tmp, sharded, models["batches"], STEPS, common, ranks=ranks)
    if dtype != torch.float32:
        assert "float32 master weights" in runs["offload"][0]
    assert_same_training(runs, config)


def test_offload_fp16_overflow_skips_the_step_identically(models):
    tmp = models["tmp"] / "fp16"
    tmp.mkdir()
    sharded = compile_plan(models["traces"][torch.float16], tmp / "sharded.pt", "--world-size", RANKS)
    bad = 3
    common = ["--lr", "1e-3", "--schedule", "constant", "--clip-grad", CLIP, "--weight-decay", 0.01,
              "--loss-scale-window", 3]
    runs = train_pair(tmp, sharded, models["batches"], STEPS, common,
                      env={"BMT_DEBUG_INJECT_INF_STEP": str(bad), "BMT_DEBUG_INJECT_INF_RANK": "1"})
    for name in ("device", "offload"):
        out, train, _ = runs[name]
        assert [x["skipped"] for x in train] == [s == bad for s in range(1, STEPS + 1)], name
        assert "skipped: inf/NaN gradients, loss scale 65536 -> 32768" in out, out
        # 2 clean steps, the overflow (/2), 3 clean steps (window 3).
        assert [x["loss_scale"] for x in train] == [65536] * 3 + [32768] * 3, train
    assert_same_training(runs, "fp16 overflow")


def test_offload_usage_errors(models, tmp_path):
    pt = models["traces"][torch.float32]
    # A plan without storage groups (pass flags replace the default
    # pipeline: blocks found, no ZeRO layout).
    plain = compile_plan(pt, tmp_path / "plain.sharded.pt", "--bmt-find-blocks")
    r = subprocess.run([binary("bmt-run"), str(plain), "--batches", str(models["batches"]),
                        "--steps", "1", "--offload-optimizer", "--device", "cpu"],
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.startswith("error: --offload-optimizer"), r.stderr
    assert "needs a plan with ZeRO storage groups" in r.stderr, r.stderr
    assert "step 1" not in r.stdout
    # The same plan trains without the option (the error is the option's).
    r = subprocess.run([binary("bmt-run"), str(plain), "--batches", str(models["batches"]),
                        "--steps", "1", "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([binary("bmt-run"), str(plain), "--eval-only", "--eval-data", "x.bin",
                        "--offload-optimizer"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "error: --offload-optimizer" in r.stderr and "--eval-only" in r.stderr, r.stderr
