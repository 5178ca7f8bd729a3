"""The optimizer writing the bf16 ZeRO shards in its update (AdamW/Adam on
CUDA, runtime/optim/kernels/Adam.cu; docs/runtime/mixed-precision.md).

The kernel needs a GPU (test/unit/runtime/optim/AdamCudaTest.cpp compares it with ATen's
fused step there). On these CPU ranks the test hook
BMT_DEBUG_ADAM_COPIES=aten makes AdamW take the shards anyway and serve
them with ATen ops (the bf16 gradient sum cast to float32 and multiplied
by 1 / ranks, ATen's fused step, a copy_ into the shard), so that the rest
of the exchange runs here: ZeroStorage keeps the masters' gradients as
reduced (the reduce dtype, not divided), computes the norm over them in
float32 with the divisor and leaves those shards to the optimizer after a
step; a resumed run continues bit for bit (test_checkpoint.py's
gpt2-bf16-writes-shards-n2).

With 2 or 4 data-parallel ranks the division is by a power of two, exact in
both orders, and so is the norm's scaling: such a run must be bit-identical
to the default one (losses, gradient norms, parameters), with clipping on.
Cases: ZeRO-3 with bf16 and with float32 reduction (float32 sums), Adam,
hybrid sharding (2 shard ranks x 2 replicas: the replicas' all-reduce
first), tensor parallelism 2 x 2 (the norm's split and replicated ranges).
And the Trainer's rule: with --grad-accum 2, loss scaling or inspection the
shards are copied from the masters as before (no message, same run).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from bmt_paths import binary
from numerics import assert_identical
from eager import build

SEQ = 8
GLOBAL_BATCH = 8
STEPS = 6
HOOK = {"BMT_DEBUG_ADAM_COPIES": "aten"}
MESSAGE = "the optimizer writes the BFloat16 shards in its update"


def torchrun(n, *args, env=None):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", "--no-python", binary("bmt-run"), *map(str, args),
           "--device", "cpu"]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", BMT_COMM_TIMEOUT_S="120", **(env or {}))
    full_env.pop("BMT_DEBUG_ADAM_COPIES", None)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=600)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("writes_shards")
    model = build("gpt2").to(torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                        strict=False).save(str(tmp / "gpt2_bf16.pt"))
    torch.save(torch.randint(0, model.config.vocab_size, (STEPS, GLOBAL_BATCH, SEQ + 1),
                             generator=torch.Generator().manual_seed(3)), tmp / "batches.pt")
    return tmp


def compile_plan(tmp, name, flags):
    out = tmp / f"{name}.sharded.pt"
    if not out.exists():
        r = subprocess.run([binary("bmt-opt"), str(tmp / "gpt2_bf16.pt"), "-o", str(out), *flags],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    return out


def run(tmp, sharded, ranks, name, flags, env=None):
    log, params = tmp / f"{name}.jsonl", tmp / f"{name}.safetensors"
    r = torchrun(ranks, sharded, "--batches", tmp / "batches.pt", "--steps", STEPS, "--lr", "1e-3",
                 "--clip-grad", "0.05", "--log-file", log, "--save-params", params, *flags, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    train = [x for x in (json.loads(line) for line in open(log)) if x["kind"] == "train"]
    assert [x["step"] for x in train] == list(range(1, STEPS + 1))
    from safetensors.torch import load_file
    return r.stdout, train, load_file(params)


CASES = {
    # name: (ranks, bmt-opt flags, bmt-run flags)
    "zero3-n2": (2, ["--world-size", "2"], []),
    "zero3-n2-reduce-float32-adam": (2, ["--world-size", "2"],
                                     ["--reduce-dtype", "float32", "--optimizer", "adam",
                                      "--weight-decay", "0.1"]),
    "hybrid-g2-n4": (4, ["--world-size", "4", "--shard-group-size", "2"], []),
    "tp2-n4": (4, ["--world-size", "4", "--tensor-parallel", "2"], []),
}


@pytest.mark.parametrize("case", list(CASES))
def test_writing_the_shards_is_bit_identical_to_copying_them(gpt2, case):
    ranks, opt_flags, flags = CASES[case]
    sharded = compile_plan(gpt2, case, opt_flags)
    out_a, a, pa = run(gpt2, sharded, ranks, case + "-default", flags)
    out_b, b, pb = run(gpt2, sharded, ranks, case + "-hook", flags, env=HOOK)
    assert MESSAGE not in out_a, out_a
    assert MESSAGE in out_b, out_b
    clipped = [x["grad_norm"] > 0.05 for x in a]
    assert all(clipped), [x["grad_norm"] for x in a]  # the clip factor is in play every step
    for x, y in zip(a, b):
        assert (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"]), (x, y)
    assert_identical(pb, pa, f"{case}: parameters")


@pytest.mark.parametrize("flags", [["--grad-accum", "2"],
                                   ["--loss-scale", "1024"], ["--inspect-every", "2"]])
def test_the_trainer_keeps_copying_when_others_read_the_gradients(gpt2, flags):
    sharded = compile_plan(gpt2, "zero3-n2", ["--world-size", "2"])
    name = "rule" + "".join(flags).replace("-", "_")
    out, _, _ = run(gpt2, sharded, 2, name, flags, env=HOOK)
    assert MESSAGE not in out, out
