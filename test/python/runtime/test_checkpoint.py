"""Sharded checkpoints (docs/checkpoint-format.md), on CPU ranks under torchrun.

- Resume is bit-identical: 10 steps straight against 5 steps, a checkpoint,
  the process gone, and a resumed run of the other 5 (losses and final
  parameters equal to the bit), for grad accumulation, fp16 loss scaling
  with a skipped step, bf16 with the optimizer offloaded, bf16 with the
  optimizer writing the shards, masked LM and span corruption on random
  windows of a token file.
- Resume on another layout (2 -> 3 ranks with ZeRO-3 -> ZeRO-2, 4 -> 2 with
  hybrid -> flat, 1 -> 4 with ZeRO-2 -> ZeRO-3): losses within 1e-5 of a run on the new
  layout from the start (on the same global batches and the same windows of
  the token file: the data position carries over), each rank reading at
  most 1/M of the checkpoint (+1 %).
- Failures: a rank killed with SIGKILL under torchrun --max-restarts (the
  job resumes from the last complete checkpoint and ends with the
  parameters of a run never interrupted); a kill during a save (the
  previous checkpoint stays complete and is chosen); bad checkpoints and
  folders (one clear error each); a full disk (a small tmpfs: the save
  fails, the previous checkpoint stays, training goes on).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zlib

import pytest
import torch

from bmt_paths import binary
from numerics import assert_identical
from test_bmt_run import write_tokens
from eager import build

SEQ = 8
GLOBAL_BATCH = 12  # rows per micro-batch of all ranks (divisible by 1..4)
STEPS = 10
HALF = 5
CHUNK = 64  # bytes of a checksummed chunk in the tests that count bytes read


def torchrun(n, *args, env=None, extra=()):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", *extra, "--no-python", binary("bmt-run"),
           *map(str, args), "--device", "cpu"]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", BMT_COMM_TIMEOUT_S="120", **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=600)


def errors(r):
    return [line for line in r.stderr.splitlines() if line.startswith("error:")]


def trace(model, path, inputs):
    with torch.no_grad():
        torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(str(path))


def test_a_resume_names_the_settings_it_changes(models, tmp_path):
    """A resume with another --lr, --steps and batch trains on with them,
    and says so (a changed --lr or --steps is often meant, a slip should not
    go unnoticed): one rank, 4 windows a step for 4 steps, resumed at step 2
    with 2 windows a step at --lr 5e-4 to step 6."""
    sharded = compile(models["tmp"] / "gpt2.pt", tmp_path / "sharded.pt")
    data = ["--data", models["tokens"], "--seq-len", SEQ]
    ck = tmp_path / "ck"
    r = torchrun(1, sharded, *data, "--micro-batch", 4, "--steps", 4, "--checkpoint-dir", ck,
                 "--checkpoint-every", 2)
    assert r.returncode == 0, r.stderr[-3000:]
    meta = json.load(open(ck / "step-00000002" / "checkpoint.json"))
    assert meta["batch"] == {"sequences_per_step": 4, "seq_len": SEQ}, meta["batch"]
    r = torchrun(1, sharded, *data, "--micro-batch", 2, "--steps", 6, "--lr", "5e-4",
                 "--resume", ck / "step-00000002", "--log-file", tmp_path / "log.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    notes = [x for x in r.stdout.splitlines() if "note: this run changes" in x]
    assert len(notes) == 1, r.stdout
    for phrase in ["--lr 0.0005 (saved: 0.0003)", "--steps 6 (saved: 4)",
                   "the batch to 2 sequences a step", "saved: 4)"]:
        assert phrase in notes[0], notes[0]
    assert "--seq-len" not in notes[0] and "--warmup" not in notes[0], notes[0]
    assert [x["step"] for x in train_log(tmp_path / "log.jsonl")] == [3, 4, 5, 6]
    # Resumed at its last step with the same --steps: nothing to train, and it says so.
    r = torchrun(1, sharded, *data, "--micro-batch", 4, "--steps", 4, "--resume", ck / "step-00000004",
                 "--log-file", tmp_path / "done.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "note: the checkpoint is at step 4, --steps is 4: nothing to train" in r.stdout, r.stdout
    assert train_log(tmp_path / "done.jsonl") == []
    # Past --steps with other settings and a --checkpoint-dir: that one note
    # only, no "training goes on" with changed settings, no checkpoint line.
    before = sorted(p.name for p in ck.iterdir())
    r = torchrun(1, sharded, *data, "--micro-batch", 2, "--steps", 3, "--lr", "5e-4",
                 "--resume", ck / "step-00000004", "--checkpoint-dir", ck,
                 "--log-file", tmp_path / "past.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    notes = [x for x in r.stdout.splitlines() if "note:" in x or "resumed from" in x or
             "checkpoints in" in x or "goes on" in x]
    assert notes == ["bmt-run: note: the checkpoint is at step 4, --steps is 3: nothing to train "
                     "(a larger --steps goes on)"], r.stdout
    assert train_log(tmp_path / "past.jsonl") == []
    assert sorted(p.name for p in ck.iterdir()) == before


def compile(pt, out, *flags):
    r = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(out), *flags],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Traces of the tiny fixtures (GPT-2 in float32, float16 and bfloat16,
    BERT, T5), fixed batches and a token file."""
    tmp = tmp_path_factory.mktemp("ckpt")
    out = {"tmp": tmp}
    ids = torch.randint(0, 100, (2, SEQ), generator=torch.Generator().manual_seed(1))
    lm_inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        name = {torch.float32: "gpt2", torch.float16: "gpt2-fp16", torch.bfloat16: "gpt2-bf16"}[dtype]
        trace(build("gpt2").to(dtype), tmp / f"{name}.pt", lm_inputs)
    trace(build("llama"), tmp / "llama.pt", lm_inputs)
    trace(build("bert"), tmp / "bert.pt", lm_inputs)
    labels = torch.randint(0, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    decoder = torch.cat([torch.zeros(2, 1, dtype=torch.long), labels[:, :-1]], 1)
    trace(build("t5"), tmp / "t5.pt", {**lm_inputs, "decoder_input_ids": decoder})
    vocab = build("gpt2").config.vocab_size
    torch.save(torch.randint(0, vocab, (2 * STEPS, GLOBAL_BATCH, SEQ + 1),
                             generator=torch.Generator().manual_seed(3)), tmp / "batches.pt")
    out["tokens"] = write_tokens(tmp / "tokens", [5 + (i * 7 + i // 13) % 90 for i in range(20000)],
                                 100, eos_id=1, mask_id=3)
    return out


def train_log(path):
    return [json.loads(x) for x in open(path) if '"kind": "train"' in x]


def straight_and_resumed(tmp, ranks, sharded, common, env=None, resume_ranks=None,
                         resumed_sharded=None):
    """Runs STEPS steps straight, and HALF steps + death + a resumed run of the
    rest (on resume_ranks ranks and resumed_sharded, default the same).
    Returns both logs' train records, the saved parameters of both, and the
    resumed run's output."""
    from safetensors.torch import load_file
    resume_ranks = resume_ranks or ranks
    resumed_sharded = resumed_sharded or sharded
    a = torchrun(resume_ranks, resumed_sharded, *common, "--steps", STEPS, "--log-file",
                 tmp / "a.jsonl", "--save-params", tmp / "a.safetensors", env=env)
    assert a.returncode == 0, a.stdout[-2000:] + a.stderr[-3000:]
    ck = tmp / "ck"
    b1 = torchrun(ranks, sharded, *common, "--steps", STEPS, "--checkpoint-dir", ck,
                  "--checkpoint-every", HALF, "--log-file", tmp / "b.jsonl",
                  env={**(env or {}), "BMT_DEBUG_EXIT_AFTER_STEP": str(HALF)})
    assert b1.returncode != 0 and not errors(b1), b1.stderr[-3000:]
    assert (ck / f"step-{HALF:08d}" / "COMPLETE").is_file()
    b2 = torchrun(resume_ranks, resumed_sharded, *common, "--steps", STEPS, "--checkpoint-dir", ck,
                  "--resume", "auto", "--log-file", tmp / "b.jsonl",
                  "--save-params", tmp / "b.safetensors", env=env)
    assert b2.returncode == 0, b2.stdout[-2000:] + b2.stderr[-3000:]
    assert f"resumed from {ck}/step-{HALF:08d} at step {HALF}" in b2.stdout, b2.stdout
    assert "note: this run changes" not in b2.stdout, b2.stdout
    return (train_log(tmp / "a.jsonl"), train_log(tmp / "b.jsonl"),
            load_file(tmp / "a.safetensors"), load_file(tmp / "b.safetensors"), b2)


RESUME_CASES = {
    # name: (model, ranks, bmt-run flags, environment)
    "gpt2-zero3-n2-accum2": ("gpt2", 2, ["--batches", "BATCHES", "--grad-accum", 2], None),
    "gpt2-fp16-skip-n2": ("gpt2-fp16", 2, ["--batches", "BATCHES", "--loss-scale", 1024,
                                            "--loss-scale-window", 3],
                          {"BMT_DEBUG_INJECT_INF_STEP": "4"}),
    "gpt2-bf16-offload-n2": ("gpt2-bf16", 2, ["--batches", "BATCHES", "--offload-optimizer"], None),
    # The optimizer writing the bf16 shards (its ATen test hook on CPU): the
    # shards are loaded as saved, the masters and moments as the optimizer
    # wrote them.
    "gpt2-bf16-writes-shards-n2": ("gpt2-bf16", 2, ["--batches", "BATCHES"],
                                   {"BMT_DEBUG_ADAM_COPIES": "aten"}),
    "bert-masked-lm-n2": ("bert", 2, ["--data", "TOKENS", "--micro-batch", 3, "--seq-len", 16], None),
    "t5-span-corruption-n1": ("t5", 1, ["--data", "TOKENS", "--micro-batch", 2, "--seq-len", 16], None),
}


def flags_for(models, flags):
    sub = {"BATCHES": models["tmp"] / "batches.pt", "TOKENS": models["tokens"]}
    return [sub.get(f, f) for f in flags] + ["--lr", "1e-3", "--seed", 7]


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_is_bit_identical(models, case):
    name, ranks, flags, env = RESUME_CASES[case]
    tmp = models["tmp"] / case
    tmp.mkdir()
    sharded = compile(models["tmp"] / f"{name}.pt", tmp / "sharded.pt")
    a, b, pa, pb, resumed = straight_and_resumed(tmp, ranks, sharded, flags_for(models, flags), env)
    if "writes-shards" in case:
        assert "the optimizer writes the BFloat16 shards" in resumed.stdout, resumed.stdout
    assert [x["step"] for x in a] == list(range(1, STEPS + 1))
    assert [x["step"] for x in b] == list(range(1, STEPS + 1))
    for x, y in zip(a, b):
        assert (x["loss"], x["grad_norm"], x["loss_scale"]) == (y["loss"], y["grad_norm"], y["loss_scale"]), (x, y)
    if "skip" in case:
        assert [x["step"] for x in a if x["skipped"]] == [4], a
        assert len({x["loss_scale"] for x in a[HALF:]}) > 1, "the scale grows after the resume"
    assert_identical(pb, pa, f"{case}: parameters of the resumed run")


LAYOUT_CASES = {
    # name: (ranks, bmt-opt flags, ranks on resume, bmt-opt flags on resume, data)
    "zero3-n2-to-zero2-n3-tokens": (2, [], 3, ["--zero-stage", "2"], "tokens"),
    "hybrid-g2-n4-to-flat-n2": (4, ["--shard-group-size", "2"], 2, [], "batches"),
    "zero2-n1-to-zero3-n4": (1, ["--zero-stage", "2"], 4, [], "batches"),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_resume_on_another_layout(models, case):
    ranks, opt_flags, new_ranks, new_opt_flags, data = LAYOUT_CASES[case]
    tmp = models["tmp"] / case
    tmp.mkdir()
    sharded = compile(models["tmp"] / "gpt2.pt", tmp / "saved.pt", *opt_flags)
    resumed = compile(models["tmp"] / "gpt2.pt", tmp / "resumed.pt", *new_opt_flags)
    if data == "tokens":  # the same global batch of 12 windows on either world size
        common = ["--data", models["tokens"], "--seq-len", SEQ]
        a_flags = common + ["--micro-batch", GLOBAL_BATCH // new_ranks]
        b_flags = common + ["--micro-batch", GLOBAL_BATCH // ranks]
    else:
        a_flags = b_flags = ["--batches", models["tmp"] / "batches.pt"]
    a_flags, b_flags = flags_for(models, a_flags), flags_for(models, b_flags)
    # The reference: the new layout from the start.
    a = torchrun(new_ranks, resumed, *a_flags, "--steps", STEPS, "--log-file", tmp / "a.jsonl")
    assert a.returncode == 0, a.stderr[-3000:]
    ck = tmp / "ck"
    # Checksummed chunks of CHUNK bytes (the default 64 KiB is more than
    # these tiny shards): a rank reads at most a chunk more at each end of
    # each piece it needs.
    b1 = torchrun(ranks, sharded, *b_flags, "--steps", STEPS, "--checkpoint-dir", ck,
                  "--checkpoint-every", HALF, "--log-file", tmp / "b.jsonl",
                  env={"BMT_DEBUG_EXIT_AFTER_STEP": str(HALF),
                       "BMT_DEBUG_CHECKPOINT_CHUNK_BYTES": str(CHUNK)})
    assert b1.returncode != 0 and not errors(b1), b1.stderr[-3000:]
    b2 = torchrun(new_ranks, resumed, *a_flags, "--steps", STEPS, "--checkpoint-dir", ck,
                  "--resume", ck / f"step-{HALF:08d}", "--log-file", tmp / "b.jsonl")
    assert b2.returncode == 0, b2.stdout[-2000:] + b2.stderr[-3000:]
    assert "resharded to this run's layout" in b2.stdout, b2.stdout
    assert "note: this run changes" not in b2.stdout, b2.stdout  # the same global batch
    la, lb = train_log(tmp / "a.jsonl"), train_log(tmp / "b.jsonl")
    assert [x["step"] for x in lb] == list(range(1, STEPS + 1))
    worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(la[HALF:], lb[HALF:]))
    assert worst <= 1e-5, (worst, [x["loss"] for x in la], [x["loss"] for x in lb])
    # The data position: HALF steps of GLOBAL_BATCH windows drawn.
    meta = json.load(open(ck / f"step-{HALF:08d}" / "checkpoint.json"))
    if data == "tokens":
        assert meta["data"]["kind"] == "random-windows"
        assert meta["data"]["windows"] == HALF * GLOBAL_BATCH, meta["data"]
    else:
        assert meta["data"] == {"kind": "fixed-batches", "micro_batches": HALF}, meta["data"]
    # Each rank read only its slices: at most 1/M of what was saved (+1 %),
    # and two chunks a piece: a piece per field (4) of each saved shard its
    # range of a space overlaps.
    total = sum(meta["rank_bytes"])
    m = re.search(r"resumed from .*; bytes read per rank: ([\d ]+)", b2.stdout)
    per_rank = [int(x) for x in m.group(1).split()]
    assert len(per_rank) == new_ranks
    pieces = 4 * len(meta["spaces"]) * (-(-ranks // new_ranks) + 1)
    for got in per_rank:
        assert got <= total / new_ranks * 1.01 + pieces * 2 * CHUNK, (got, total, new_ranks)
    print(f"{case}: max loss difference {worst:.1e}; bytes read per rank {per_rank} of {total}")


def test_resume_with_the_optimizer_offloaded(models):
    """A bf16 checkpoint of AdamW on the device resumes under
    --offload-optimizer (the masters and moments move to host memory) and
    trains on as the device optimizer would."""
    tmp = models["tmp"] / "offload-toggle"
    tmp.mkdir()
    sharded = compile(models["tmp"] / "gpt2-bf16.pt", tmp / "sharded.pt")
    common = flags_for(models, ["--batches", "BATCHES"]) + ["--steps", STEPS]
    a = torchrun(2, sharded, *common, "--log-file", tmp / "a.jsonl")
    assert a.returncode == 0, a.stderr[-3000:]
    b1 = torchrun(2, sharded, *common, "--checkpoint-dir", tmp / "ck", "--checkpoint-every", HALF,
                  env={"BMT_DEBUG_EXIT_AFTER_STEP": str(HALF)})
    assert b1.returncode != 0 and not errors(b1), b1.stderr[-3000:]
    b2 = torchrun(2, sharded, *common, "--offload-optimizer", "--checkpoint-dir", tmp / "ck",
                  "--resume", "auto", "--log-file", tmp / "b.jsonl")
    assert b2.returncode == 0, b2.stderr[-3000:]
    la, lb = train_log(tmp / "a.jsonl"), train_log(tmp / "b.jsonl")
    assert [x["step"] for x in lb] == list(range(HALF + 1, STEPS + 1))
    worst = max(abs(x["loss"] - y["loss"]) for x, y in zip(la[HALF:], lb))
    assert worst <= 1e-5, (worst, la, lb)


def test_a_resharded_resume_draws_new_dropout_masks(tmp_path):
    """GPT-2 traced in training mode (dropout 0.1) at --lr 0 on one batch
    repeated: a step's loss depends on its dropout masks alone. A checkpoint
    of 2 ranks after step 3, resumed on 1 rank (the saved generator states
    are the 2 ranks'): the generators are reseeded from --seed, the
    data-parallel rank and step 3, so steps 4-6 repeat bit for bit on a
    second such resume and equal no step of a 1-rank run from the start
    (the stream --seed starts with, whose masks they repeated when each rank
    was reseeded from --seed alone)."""
    from test_bmt_run import bmt_run
    model = build("gpt2").train()
    ids = torch.randint(0, 100, (2, SEQ), generator=torch.Generator().manual_seed(1))
    pt = tmp_path / "gpt2-dropout.pt"
    with torch.no_grad():
        torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids,
                                                     "attention_mask": torch.ones_like(ids)},
                        strict=False, check_trace=False).save(str(pt))
    sharded = compile(pt, tmp_path / "sharded.pt")
    torch.save(torch.randint(0, 100, (1, 2, SEQ + 1), generator=torch.Generator().manual_seed(3)),
               tmp_path / "batch.pt")
    common = ["--batches", tmp_path / "batch.pt", "--lr", 0, "--schedule", "constant",
              "--seed", 7]

    def losses(r, log):
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        return [x["loss"] for x in train_log(log)]

    start = losses(bmt_run(sharded, *common, "--steps", 6, "--log-file", tmp_path / "a.jsonl"),
                   tmp_path / "a.jsonl")
    assert len(set(start)) == 6, start  # (a new mask every step)
    ck = tmp_path / "ck"
    r = torchrun(2, sharded, *common, "--steps", 3, "--checkpoint-dir", ck)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = []
    for i in range(2):
        log = tmp_path / f"b{i}.jsonl"
        r = bmt_run(sharded, *common, "--steps", 6, "--resume", ck / "step-00000003",
                    "--log-file", log)
        assert "resharded to this run's layout" in r.stdout, r.stdout
        resumed.append(losses(r, log))
    assert resumed[0] == resumed[1], resumed
    assert len(set(resumed[0])) == 3 and not set(resumed[0]) & set(start), (resumed[0], start)


# --- failures -------------------------------------------------------------


def workers_of(launcher_pid):
    """The bmt-run processes torchrun started, by rank (from /proc)."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not cmd or not cmd[0].endswith(b"bmt-run"):
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        except OSError:
            continue
        if env.get(b"BMT_TEST_JOB") == str(launcher_pid).encode():
            found[int(env[b"RANK"])] = int(pid)
    return found


def launch(n, *args, env=None, extra=()):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", *extra, "--no-python", binary("bmt-run"),
           *map(str, args), "--device", "cpu"]
    tag = str(os.getpid()) + str(time.time_ns())
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "BMT_COMM_TIMEOUT_S": "120",
                "BMT_TEST_JOB": tag, **(env or {})}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env), tag


def wait_for(condition, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def steps_logged(path):
    try:
        return [x["step"] for x in train_log(path)]
    except (OSError, json.JSONDecodeError):
        return []


@pytest.fixture(scope="module")
def gpt2_run(models):
    """The sharded GPT-2 on 2 ranks and an uninterrupted 12-step run's parameters."""
    from safetensors.torch import load_file
    tmp = models["tmp"] / "restart"
    tmp.mkdir()
    sharded = compile(models["tmp"] / "gpt2.pt", tmp / "sharded.pt")
    common = ["--batches", models["tmp"] / "batches.pt", "--lr", "1e-3", "--steps", 12]
    r = torchrun(2, sharded, *common, "--save-params", tmp / "straight.safetensors")
    assert r.returncode == 0, r.stderr[-3000:]
    return {"tmp": tmp, "sharded": sharded, "common": common,
            "params": load_file(tmp / "straight.safetensors")}


def run_killing_rank_1(n, sharded, *flags):
    """Trains `sharded` on n ranks under torchrun --max-restarts=2 with
    --checkpoint-every 2 --resume auto and slow saves (a sleep in each, so
    that the kill lands mid-run), kills rank 1 with SIGKILL once the log
    (flags' --log-file) has 5 steps, and waits for the run to finish; asserts
    it succeeded and returns its stdout."""
    log = flags[list(flags).index("--log-file") + 1]
    proc, tag = launch(n, sharded, *flags, "--checkpoint-every", 2, "--resume", "auto",
                       env={"BMT_DEBUG_CHECKPOINT_SLOW_MS": "150"}, extra=["--max-restarts=2"])
    try:
        assert wait_for(lambda: len(steps_logged(log)) >= 5), steps_logged(log)
        ranks = workers_of(tag)
        assert 1 in ranks, ranks
        os.kill(ranks[1], signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    return out


def test_restart_after_a_killed_rank(gpt2_run):
    """torchrun --max-restarts=2: rank 1 killed with SIGKILL after step 5;
    torchrun restarts both ranks, which resume from the newest complete
    checkpoint and end with the parameters of the run never interrupted."""
    from safetensors.torch import load_file
    tmp = gpt2_run["tmp"] / "killed"
    tmp.mkdir()
    log = tmp / "log.jsonl"
    out = run_killing_rank_1(2, gpt2_run["sharded"], *gpt2_run["common"], "--log-file", log,
                             "--checkpoint-dir", tmp / "ck", "--save-params",
                             tmp / "params.safetensors")
    assert "resumed from" in out, out
    steps = steps_logged(log)
    assert steps[-1] == 12 and len(steps) > 12, steps  # some steps ran twice
    # bmt-plot draws each step once, as the resumed run trained it.
    from bmt.plot import read_metrics
    records = train_log(log)
    restart = next(i for i in range(1, len(records)) if records[i]["step"] <= records[i - 1]["step"])
    train, _ = read_metrics(str(log))
    assert [x["step"] for x in train] == list(range(1, 13)), [x["step"] for x in train]
    assert train == records[:records[restart]["step"] - 1] + records[restart:]
    assert_identical(load_file(tmp / "params.safetensors"), gpt2_run["params"],
                     "parameters after a restart")


def test_kill_during_a_save_keeps_the_previous_checkpoint(gpt2_run):
    from safetensors.torch import load_file
    tmp = gpt2_run["tmp"] / "save-killed"
    tmp.mkdir()
    ck = tmp / "ck"
    proc, tag = launch(2, gpt2_run["sharded"], *gpt2_run["common"], "--checkpoint-dir", ck,
                       "--checkpoint-every", 3, env={"BMT_DEBUG_CHECKPOINT_SLOW_MS": "200"})
    try:
        def inside_second_save():
            if not (ck / "step-00000003" / "COMPLETE").is_file():
                return False
            return any(p.name.startswith("step-00000006.tmp-") and any(p.glob("rank-*.safetensors"))
                       for p in ck.iterdir())
        assert wait_for(inside_second_save)
        os.kill(workers_of(tag)[0], signal.SIGKILL)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert not (ck / "step-00000006").exists()
    r = torchrun(2, gpt2_run["sharded"], *gpt2_run["common"], "--checkpoint-dir", ck,
                 "--resume", "auto", "--save-params", tmp / "params.safetensors")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {ck}/step-00000003 at step 3" in r.stdout, r.stdout
    assert not any(".tmp-" in p.name for p in ck.iterdir()), list(ck.iterdir())
    assert_identical(load_file(tmp / "params.safetensors"), gpt2_run["params"],
                     "parameters after resuming from the earlier checkpoint")


SIGNAL_STEPS = {1: 100, 2: 80}  # --steps of the signal tests, by ranks: the signal lands well before


@pytest.mark.parametrize("ranks,sig", [(1, signal.SIGINT), (1, signal.SIGTERM), (2, signal.SIGTERM)],
                         ids=["1-rank-SIGINT", "1-rank-SIGTERM", "torchrun-2-ranks-SIGTERM"])
def test_a_signal_stops_after_a_step_with_a_checkpoint(gpt2_run, ranks, sig, tmp_path):
    """A real signal to a real run (bmt-run alone, or torchrun, which
    forwards it to both ranks) once 25 steps are logged: every rank stops
    after the same step s, saves it, rank 0 says so in one line, bmt-run
    exits 128 + the signal; --resume auto from that checkpoint ends with the
    parameters of a run never interrupted, bit for bit. (--schedule
    constant: the straight run's --steps need not be the stopped one's.)
    With 2 ranks, --checkpoint-every-minutes saves on time too, every rank
    the same steps (each such checkpoint is complete)."""
    from safetensors.torch import load_file
    steps = SIGNAL_STEPS[ranks]
    common = ["--batches", gpt2_run["common"][1], "--lr", "1e-3", "--schedule", "constant",
              "--steps", steps]
    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    timed = ["--checkpoint-every-minutes", 0.002] if ranks == 2 else []
    if ranks == 1:
        cmd = [binary("bmt-run"), gpt2_run["sharded"], *common, "--device", "cpu"]
        run = lambda *more: subprocess.Popen([*map(str, cmd), *map(str, more)], text=True,
                                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    else:
        run = lambda *more: launch(2, gpt2_run["sharded"], *common, *more)[0]
    straight = run("--save-params", tmp_path / "straight.safetensors")
    proc = run("--checkpoint-dir", ck, "--log-file", log, *timed)
    try:
        # With timed saves, at least one of them before the signal (on an idle
        # machine 25 steps take less than a save interval).
        saved = lambda: ck.is_dir() and any((p / "COMPLETE").is_file() for p in ck.iterdir())
        assert wait_for(lambda: len(steps_logged(log)) >= 25 and (not timed or saved())), \
            steps_logged(log)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    if ranks == 1:
        assert proc.returncode == 128 + sig, (proc.returncode, err[-2000:])
    else:
        assert proc.returncode != 0  # torchrun's own, after its workers exited
    assert not errors(subprocess.CompletedProcess([], 0, out, err)), err[-3000:]
    s = steps_logged(log)[-1]
    assert 25 <= s < steps, s
    stop = [x for x in out.splitlines() if x.startswith("bmt-run: stopped by")]
    assert stop == [f"bmt-run: stopped by {sig.name} after step {s} of {steps}; checkpoint step "
                    f"{s} saved in {ck}/step-{s:08d} (continue with --resume auto)"], out[-2000:]
    complete = sorted(p.name for p in ck.iterdir() if (p / "COMPLETE").is_file())
    assert complete[-1] == f"step-{s:08d}", complete
    assert not any(".tmp-" in p.name for p in ck.iterdir())
    if timed:
        assert len(complete) >= 2, complete  # time-based saves before the stop
    out, err = straight.communicate(timeout=300)
    assert straight.returncode == 0, err[-3000:]
    resumed = run("--checkpoint-dir", ck, "--resume", "auto", "--log-file", log,
                  "--save-params", tmp_path / "resumed.safetensors")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert f"resumed from {ck}/step-{s:08d} at step {s}" in out, out
    assert_identical(load_file(tmp_path / "resumed.safetensors"),
                     load_file(tmp_path / "straight.safetensors"),
                     "parameters after a stop by a signal and a resume")


def test_a_second_signal_exits_at_once(gpt2_run, tmp_path):
    """SIGTERM, then SIGTERM again while the stop's checkpoint is written
    (slowed by the test hook): the process exits at once, 143, saying so;
    the unfinished save is no checkpoint, and the next run removes it."""
    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    cmd = [binary("bmt-run"), gpt2_run["sharded"], "--batches", gpt2_run["common"][1],
           "--steps", 1000, "--device", "cpu", "--checkpoint-dir", ck, "--log-file", log]
    proc = subprocess.Popen(list(map(str, cmd)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1",
                                                BMT_DEBUG_CHECKPOINT_SLOW_MS="300"))
    try:
        assert wait_for(lambda: len(steps_logged(log)) >= 3), steps_logged(log)
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: ck.is_dir() and any(".tmp-" in p.name for p in ck.iterdir()))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "bmt-run: a second signal (SIGTERM): stopping at once; a checkpoint in progress is " \
           "left incomplete" in err, err
    assert "stopped by SIGTERM after" not in out
    assert not any((p / "COMPLETE").exists() for p in ck.iterdir())
    r = subprocess.run(list(map(str, cmd[:5] + ["4", *cmd[6:]])), capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, r.stderr
    assert "note: removed 1 incomplete save" in r.stdout, r.stdout


def test_a_stopped_rank_times_out_naming_the_collective(gpt2_run, tmp_path):
    """SIGSTOP on rank 1 mid-run (BMT_COMM_TIMEOUT_S=3): rank 0 stops with
    one error naming the ZeRO collective it waited in, the communicator and
    rank 1 (wherever the wait falls: a forward's all-gather, a backward's
    reduce-scatter, the step's all-reduce), never a tensor-parallel
    instruction of this plan without tensor parallelism."""
    log = tmp_path / "log.jsonl"
    proc, tag = launch(2, gpt2_run["sharded"], "--batches", gpt2_run["common"][1], "--steps", 5000,
                       "--log-file", log, env={"BMT_COMM_TIMEOUT_S": "3"})
    try:
        assert wait_for(lambda: len(steps_logged(log)) >= 3), steps_logged(log)
        rank1 = workers_of(tag)[1]
        os.kill(rank1, signal.SIGSTOP)
        assert wait_for(lambda: proc.poll() is not None or not workers_of(tag).get(0), 60)
        os.kill(rank1, signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    e = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(e) == 1, err[-3000:]
    assert re.search(r"rank 0 of 2 \((shard|world)\): (all_gather|reduce_scatter|all_reduce) "
                     r"#[0-9]+ .*timed out after 3 s waiting for rank 1", e[0]), e[0]
    assert "tensor-parallel" not in e[0], e[0]


def test_a_rank_whose_peer_died_stops_at_torchruns_sigterm(gpt2_run, tmp_path):
    """Rank 1 killed with SIGKILL mid-run: torchrun sends rank 0, which waits
    for rank 1 in a collective, SIGTERM (and SIGKILL 30 s later). Rank 0
    waits BMT_STOP_WAIT_S (1 s) more for its collective, then exits at once
    with one line naming it, instead of waiting for the SIGKILL silently."""
    log = tmp_path / "log.jsonl"
    proc, tag = launch(2, gpt2_run["sharded"], "--batches", gpt2_run["common"][1], "--steps", 5000,
                       "--log-file", log, env={"BMT_STOP_WAIT_S": "1"})
    try:
        assert wait_for(lambda: len(steps_logged(log)) >= 3), steps_logged(log)
        os.kill(workers_of(tag)[1], signal.SIGKILL)
        killed = time.time()
        out, err = proc.communicate(timeout=60)
        took = time.time() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    stop = [x for x in err.splitlines() if x.startswith("bmt-run: ")]
    assert len(stop) == 1 and re.fullmatch(
        r"bmt-run: rank 0 of 2 \((shard|world)\): (all_gather|reduce_scatter|all_reduce) #[0-9]+: "
        r"stopped by SIGTERM while waiting for this collective \(a peer may have died\); no "
        r"checkpoint written \(--resume auto takes the newest complete one\)", stop[0]), err[-3000:]
    assert not errors(subprocess.CompletedProcess([], 0, out, err)), err[-3000:]
    assert took < 20, took  # (torchrun's SIGKILL comes after 30 s)


@pytest.fixture(scope="module")
def saved(gpt2_run):
    """A checkpoint of steps 2 and 4 of GPT-2 on 2 ranks, to be copied and damaged."""
    ck = gpt2_run["tmp"] / "saved"
    r = torchrun(2, gpt2_run["sharded"], "--batches", gpt2_run["common"][1], "--steps", 4,
                 "--checkpoint-dir", ck, "--checkpoint-every", 2, "--keep", 2)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in ck.iterdir()) == ["step-00000002", "step-00000004"]
    return ck


def resume_error(gpt2_run, folder, tmp, sharded=None):
    r = torchrun(2, sharded or gpt2_run["sharded"], *gpt2_run["common"], "--resume", folder,
                 "--log-file", tmp / "log.jsonl")
    assert r.returncode != 0
    errs = errors(r)
    assert errs, r.stderr[-3000:]
    assert not steps_logged(tmp / "log.jsonl"), "nothing is trained"
    return errs[0]


def damaged(saved, tmp, damage):
    folder = tmp / "ck" / "step-00000004"
    shutil.copytree(saved / "step-00000004", folder)
    damage(folder)
    return folder


def test_corrupt_shard_is_an_error(gpt2_run, saved, tmp_path):
    def flip(folder):  # one bit of the first tensor's data
        path = folder / "rank-00001.safetensors"
        data = bytearray(path.read_bytes())
        data[8 + int.from_bytes(data[:8], "little") + 10] ^= 0x01
        path.write_bytes(bytes(data))
    e = resume_error(gpt2_run, damaged(saved, tmp_path, flip), tmp_path)
    assert "rank-00001.safetensors" in e and "checksum mismatch" in e, e


def test_truncated_shard_is_an_error(gpt2_run, saved, tmp_path):
    def cut(folder):
        path = folder / "rank-00000.safetensors"
        path.write_bytes(path.read_bytes()[:-1000])
    e = resume_error(gpt2_run, damaged(saved, tmp_path, cut), tmp_path)
    assert "rank-00000.safetensors" in e and "truncated" in e, e


def test_missing_rank_file_is_an_error(gpt2_run, saved, tmp_path):
    e = resume_error(gpt2_run, damaged(saved, tmp_path,
                                       lambda f: (f / "rank-00001.safetensors").unlink()), tmp_path)
    assert "rank-00001.safetensors: missing" in e, e


def test_incomplete_checkpoint_is_ignored_by_auto_and_refused_by_name(gpt2_run, saved, tmp_path):
    shutil.copytree(saved, tmp_path / "ck")
    (tmp_path / "ck" / "step-00000004" / "COMPLETE").unlink()
    e = resume_error(gpt2_run, tmp_path / "ck" / "step-00000004", tmp_path)
    assert "not a complete checkpoint" in e, e
    r = torchrun(2, gpt2_run["sharded"], *gpt2_run["common"], "--checkpoint-dir", tmp_path / "ck",
                 "--resume", "auto")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from " + str(tmp_path / "ck" / "step-00000002") + " at step 2" in r.stdout


def test_dead_saves_are_removed_and_committed_checkpoints_kept(gpt2_run, saved, tmp_path):
    """What saves killed in earlier runs leave next to the checkpoints of
    steps 2 and 4: a step-5 folder renamed but never completed (no
    COMPLETE), a .tmp- folder with a rank file, a step-3 folder that a
    --keep removal left without its COMPLETE. A run with --keep 2 removes
    them at start and says so; it keeps a committed checkpoint of a format it
    does not read (a COMPLETE of version 9) and files that are not saves,
    and --keep rotates only the complete ones. The log's torn last line is
    dropped before the resumed run appends to it."""
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    shutil.copytree(saved / "step-00000004", ck / "step-00000005")
    (ck / "step-00000005" / "COMPLETE").unlink()
    (ck / "step-00000003").mkdir()
    (ck / "step-00000003" / "checkpoint.json").write_text("{}")
    (ck / "step-00000007.tmp-0000beef").mkdir()
    shutil.copy(saved / "step-00000004" / "rank-00000.safetensors", ck / "step-00000007.tmp-0000beef")
    (ck / "step-00000001").mkdir()
    (ck / "step-00000001" / "COMPLETE").write_text("bmt-checkpoint 9 step 1\n")
    (ck / "notes.txt").write_text("mine\n")
    (ck / "step-later").mkdir()
    # The log line a killed run was writing: dropped, not glued to the next.
    (tmp_path / "log.jsonl").write_text('{"kind": "train", "step": 5, "lo')
    r = torchrun(2, gpt2_run["sharded"], "--batches", gpt2_run["common"][1], "--steps", 8,
                 "--checkpoint-dir", ck, "--checkpoint-every", 2, "--keep", 2,
                 "--resume", "auto", "--log-file", tmp_path / "log.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {ck}/step-00000004 at step 4" in r.stdout, r.stdout
    assert (f"bmt-run: note: removed 3 incomplete saves of an earlier run from {ck}: "
            "step-00000003 step-00000005 step-00000007.tmp-0000beef") in r.stdout, r.stdout
    assert sorted(p.name for p in ck.iterdir()) == [
        "notes.txt", "step-00000001", "step-00000006", "step-00000008", "step-later"]
    assert (ck / "step-00000001" / "COMPLETE").read_text() == "bmt-checkpoint 9 step 1\n"
    for step in (6, 8):
        folder = ck / f"step-{step:08d}"
        assert (folder / "COMPLETE").read_text() == f"bmt-checkpoint 1 step {step} checkpoint.json " \
            f"{zlib.crc32((folder / 'checkpoint.json').read_bytes()):08x}\n"
    assert (f"bmt-run: note: --log-file {tmp_path}/log.jsonl: dropped its incomplete last "
            "line (32 bytes) before appending") in r.stdout, r.stdout
    assert steps_logged(tmp_path / "log.jsonl") == [5, 6, 7, 8]


def test_checkpoint_of_another_model_is_an_error(gpt2_run, saved, tmp_path):
    llama = compile(gpt2_run["tmp"].parent / "llama.pt", tmp_path / "llama.pt")
    e = resume_error(gpt2_run, saved / "step-00000004", tmp_path, sharded=llama)
    assert "is a checkpoint of another model" in e and "has no parameter" in e, e


def test_folder_that_cannot_be_written_is_an_error(gpt2_run, tmp_path):
    (tmp_path / "file").write_text("")
    r = torchrun(1, gpt2_run["sharded"], *gpt2_run["common"], "--checkpoint-dir",
                 tmp_path / "file" / "ck")
    assert r.returncode != 0
    assert any("cannot write checkpoints there" in e for e in errors(r)), r.stderr[-2000:]


def test_two_runs_into_one_folder(gpt2_run, tmp_path):
    """A second run saving into the --checkpoint-dir of a live one (2 ranks,
    stopped with SIGSTOP after step 1, before any save: the folder is empty)
    is refused before training, on every rank (exit 1): its saves would
    replace the first run's and remove its saves in progress as dead. The
    first run then goes on untouched, and once it has ended the folder is
    free (the lock dies with the process: --resume auto goes on)."""
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    first, tag = launch(2, gpt2_run["sharded"], *gpt2_run["common"], "--checkpoint-dir", ck,
                        "--log-file", log)
    ranks = {}
    try:
        assert wait_for(lambda: len(steps_logged(log)) >= 1), steps_logged(log)
        ranks = workers_of(tag)
        for pid in ranks.values():
            os.kill(pid, signal.SIGSTOP)
        assert not any(ck.iterdir())
        r = torchrun(2, gpt2_run["sharded"], *gpt2_run["common"], "--checkpoint-dir", ck)
        assert r.returncode != 0
        assert set(errors(r)) == {
            f"error: {ck}: another run is saving checkpoints into this folder (it holds the "
            "folder's lock); its saves and this run's would replace each other: wait for it "
            "to end, or use another --checkpoint-dir"}, r.stderr[-2000:]
        for pid in ranks.values():
            os.kill(pid, signal.SIGCONT)
        out, err = first.communicate(timeout=300)
    finally:
        for pid in ranks.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0, err[-3000:]
    assert [p.name for p in ck.iterdir()] == ["step-00000012"]
    r = torchrun(2, gpt2_run["sharded"], *gpt2_run["common"][:-1], 14, "--checkpoint-dir", ck,
                 "--resume", "auto")
    assert r.returncode == 0 and "resumed from" in r.stdout, r.stderr[-2000:]


def mount_tmpfs(path, size):
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(size)}", "tmpfs", str(path)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")


def test_full_disk_keeps_the_previous_checkpoint(gpt2_run, saved, tmp_path):
    """A tmpfs that holds one checkpoint but not two: with --keep 1 the
    second save fails (the first is removed only after a newer one is
    complete), the run says so and goes on; the last step's save fails too,
    so the run ends with an error naming the state lost and the newest
    complete checkpoint (exit 1 on every rank), after --save-params (on
    another disk) has saved the parameters."""
    size = sum(p.stat().st_size for p in (saved / "step-00000004").iterdir())
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, size * 1.5)
    try:
        r = torchrun(2, gpt2_run["sharded"], *gpt2_run["common"], "--checkpoint-dir", mnt / "ck",
                     "--checkpoint-every", 4, "--keep", 1, "--log-file", tmp_path / "log.jsonl",
                     "--save-params", tmp_path / "params.safetensors")
        assert r.returncode != 0, r.stderr[-3000:]
        assert "warning: checkpoint step 8 failed" in r.stdout, r.stdout
        assert "No space left on device" in r.stdout + r.stderr, r.stdout + r.stderr
        assert errors(r) == [
            "error: the checkpoint of step 12 (the last) could not be written: "
            + errors(r)[0].split("could not be written: ")[1].split("; the trained")[0]
            + f"; the trained state after step 12 is lost (the newest complete checkpoint is "
            f"{mnt}/ck/step-00000004); --save-params {tmp_path}/params.safetensors holds the "
            "parameters (not the optimizer state)"], r.stderr[-3000:]
        assert "No space left on device" in errors(r)[0]
        records = [json.loads(x) for x in open(tmp_path / "log.jsonl") if '"checkpoint"' in x]
        assert [(x["step"], x["ok"]) for x in records] == [(4, True), (8, False), (12, False)], records
        assert steps_logged(tmp_path / "log.jsonl")[-1] == 12
        assert (mnt / "ck" / "step-00000004" / "COMPLETE").is_file()
        assert not any(".tmp-" in p.name for p in (mnt / "ck").iterdir())
        assert (tmp_path / "params.safetensors").is_file()
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_save_params_without_room_is_refused_before_training(gpt2_run, tmp_path):
    """--save-params onto a folder with less free space than the parameters
    need (the plan's sizes against statvfs) is refused before step 1."""
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, 64 * 1024)  # the fixture's parameters: 93 kB
    try:
        r = subprocess.run([binary("bmt-run"), gpt2_run["sharded"], *map(str, gpt2_run["common"]),
                            "--device", "cpu", "--save-params", str(mnt / "p.safetensors"),
                            "--log-file", str(tmp_path / "log.jsonl")],
                           capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 1
        e = errors(r)
        m = re.fullmatch(f"error: --save-params {mnt}/p.safetensors: the parameters need "
                         f"([0-9]+) bytes and {mnt} has 65536 bytes free; free some space or "
                         "save elsewhere \\(refused before training, so that the trained "
                         "parameters are not lost at the end\\)", e[0] if len(e) == 1 else "")
        assert m, r.stderr
        # The estimate covers the file a run writes, with a margin for its header.
        written = (gpt2_run["tmp"] / "straight.safetensors").stat().st_size
        assert written <= int(m[1]) <= 1.3 * written, (written, m[1])
        assert steps_logged(tmp_path / "log.jsonl") == []
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_save_params_onto_a_disk_filled_during_training_is_an_error(gpt2_run, tmp_path):
    """--save-params onto a tmpfs with room at start-up (the check before
    step 1 passes), filled by another file while the 2 ranks train: the
    write at the end fails, and the run exits non-zero with one error naming
    the file, the reason, the state lost and the last checkpoint that holds
    the parameters; no partial file is left."""
    mnt, ck, log = tmp_path / "small", tmp_path / "ck", tmp_path / "log.jsonl"
    mount_tmpfs(mnt, 256 * 1024)  # the fixture's parameters: 93 kB
    try:
        proc, _ = launch(2, gpt2_run["sharded"], "--batches", gpt2_run["common"][1], "--steps", 40,
                         "--checkpoint-dir", ck, "--checkpoint-every", 20, "--log-file", log,
                         "--save-params", mnt / "p.safetensors")
        try:
            assert wait_for(lambda: len(steps_logged(log)) >= 1), steps_logged(log)
            with open(mnt / "filler", "wb", buffering=0) as f:  # until ENOSPC
                try:
                    while f.write(b"\0" * 4096):
                        pass
                except OSError:
                    pass
            filled_at = steps_logged(log)[-1]
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert filled_at < 40, "the disk was filled after the training"
        assert proc.returncode != 0, out[-2000:] + err[-2000:]
        e = errors(subprocess.CompletedProcess([], 0, out, err))
        assert len(e) == 1 and e[0].startswith(f"error: {mnt}/p.safetensors: cannot write: ") and \
            "No space left on device" in e[0] and e[0].endswith(
                f"; the trained parameters of step 40 are lost (the checkpoint {ck}/step-00000040 "
                "holds them: bmt-to-hf exports it)"), err[-3000:]
        assert steps_logged(log)[-1] == 40 and (ck / "step-00000040" / "COMPLETE").is_file()
        assert sorted(p.name for p in mnt.iterdir()) == ["filler"]
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_log_file_on_a_full_disk_is_an_error(gpt2_run, tmp_path):
    """A --log-file whose disk fills up mid-run (a one-page tmpfs: about 8 of
    the 12 steps' lines fit) is said at the step it fails, training goes on
    to the end and --save-params (on another disk) is written, and the run
    exits 1 with one error: the log is incomplete, not silently cut."""
    mnt = tmp_path / "small"
    mount_tmpfs(mnt, 4096)
    try:
        r = subprocess.run([binary("bmt-run"), gpt2_run["sharded"], *map(str, gpt2_run["common"]),
                            "--device", "cpu", "--log-file", str(mnt / "log.jsonl"),
                            "--save-params", str(tmp_path / "p.safetensors")],
                           capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert r.returncode == 1, r.stdout + r.stderr
        assert errors(r) == [f"error: --log-file {mnt}/log.jsonl: a line could not be written "
                             "(see the warning above); the log is incomplete"], r.stderr
        m = re.search(r"warning: --log-file: the line of step ([0-9]+) could not be written "
                      r"\(No space left on device\); the log is incomplete from there", r.stdout)
        assert m and 1 < int(m[1]) < 12, r.stdout
        assert "step 12/12" in r.stdout and (tmp_path / "p.safetensors").is_file()
        lines = (mnt / "log.jsonl").read_text().split("\n")
        whole = [json.loads(x)["step"] for x in lines[:-1]]  # the last: torn or empty
        assert whole == list(range(1, int(m[1]))), whole
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_overflow_at_the_minimum_loss_scale_stops(models, tmp_path):
    sharded = compile(models["tmp"] / "gpt2-fp16.pt", tmp_path / "sharded.pt")
    r = torchrun(1, sharded, "--batches", models["tmp"] / "batches.pt", "--steps", 20,
                 "--loss-scale", 4, "--min-loss-scale", 1, "--loss-scale-window", 3,
                 env={"BMT_DEBUG_INJECT_INF_STEP": "2-20"})
    assert r.returncode != 0
    e = errors(r)
    assert e and "overflowed at the minimum loss scale 1 in 3 steps in a row (steps 4 to 6)" in e[0] \
        and "stopping at step 6" in e[0], r.stderr[-2000:]


# --- integrity: every byte a resume reads is checked ---------------------------

def rank_file(path):
    """(bytes, header length, header) of a safetensors rank file."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    return data, n, json.loads(data[8:8 + n])


def flip_parameter_byte(folder, rank):
    """Flips one byte in the middle of the member with the most elements in
    rank `rank`'s shard of a parameter space (a region some rank of any
    resume reads); returns (space tensor name, member name)."""
    meta = json.load(open(folder / "checkpoint.json"))
    tp = meta.get("tensor_parallel", 1)
    best = None
    for k, space in enumerate(meta["spaces"]):
        if space.get("tp_rank", 0) != rank % tp or space["shards"] <= rank // tp:
            continue
        begin = rank // tp * space["shard_size"]
        end = begin + space["shard_size"]
        for m in space["members"]:
            shape = list(m["split"]["local_shape"] if "split" in m else m["shape"])
            numel = 1
            for d in shape:
                numel *= d
            lo, hi = max(begin, m["offset"]), min(end, m["offset"] + numel)
            if hi - lo > 0 and (best is None or hi - lo > best[0]):
                best = (hi - lo, k, (lo + hi) // 2 - begin, m["tensor"])
    _, k, element, member = best
    path = folder / f"rank-{rank:05d}.safetensors"
    data, n, header = rank_file(path)
    data[8 + n + header[f"s{k}.param"]["data_offsets"][0] + 4 * element + 1] ^= 0x10
    path.write_bytes(bytes(data))
    return f"s{k}.param", member


def without_chunk_checksums(folder):
    """Rewrites the rank files of `folder` as bmt-run wrote them before
    per-chunk checksums (their headers without crc32_chunk_bytes and
    crc32_chunks; the data as it is), checkpoint.json's rank_bytes, and
    COMPLETE without checkpoint.json's checksum (which came later)."""
    meta = json.load(open(folder / "checkpoint.json"))
    for rank in range(meta["world_size"]):
        path = folder / f"rank-{rank:05d}.safetensors"
        data, n, header = rank_file(path)
        header["__metadata__"].pop("crc32_chunk_bytes", None)
        header["__metadata__"].pop("crc32_chunks", None)
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data[8 + n:]))
        meta["rank_bytes"][rank] = path.stat().st_size
    (folder / "checkpoint.json").write_text(json.dumps(meta, indent=1) + "\n")
    (folder / "COMPLETE").write_text(f"bmt-checkpoint {meta['version']} step {meta['step']}\n")


@pytest.fixture(scope="module")
def old_format(gpt2_run, saved):
    """Step 4 of `saved` as written before per-chunk checksums."""
    folder = gpt2_run["tmp"] / "old-format" / "step-00000004"
    shutil.copytree(saved / "step-00000004", folder)
    without_chunk_checksums(folder)
    return folder


@pytest.fixture(scope="module")
def zero2(gpt2_run):
    return compile(gpt2_run["tmp"].parent / "gpt2.pt", gpt2_run["tmp"] / "zero2.pt",
                   "--zero-stage", "2")


CORRUPT_CASES = {
    # name: (ranks of the resume, its plan, the checkpoint)
    "n2-to-n3": (3, "sharded", "saved"),
    "zero3-n2-to-zero2-n3": (3, "zero2", "saved"),
    "n2-to-n3-written-before-chunk-checksums": (3, "sharded", "old"),
}


@pytest.mark.parametrize("case", list(CORRUPT_CASES))
def test_corrupt_byte_is_found_on_another_layout(gpt2_run, saved, old_format, zero2, tmp_path,
                                                 case):
    """A byte flipped in a parameter of rank 1's file of a 2-rank checkpoint,
    resumed on 3 ranks (whose ranges cut the saved shards: a read of part of
    a saved tensor): one error naming the file, the tensor, the chunk's bytes
    and the model tensor; no step trained. A checkpoint written before
    per-chunk checksums resumes (checked whole), and its flipped byte is
    found the same way."""
    ranks, plan, source = CORRUPT_CASES[case]
    sharded = zero2 if plan == "zero2" else gpt2_run["sharded"]
    origin = old_format if source == "old" else saved / "step-00000004"
    if source == "old":  # it resumes, reading the tensors it touches whole
        r = torchrun(ranks, sharded, *gpt2_run["common"], "--resume", origin,
                     "--log-file", tmp_path / "clean.jsonl")
        assert r.returncode == 0, r.stderr[-3000:]
        assert steps_logged(tmp_path / "clean.jsonl") == list(range(5, 13))
    folder = tmp_path / "step-00000004"
    shutil.copytree(origin, folder)
    tensor, member = flip_parameter_byte(folder, 1)
    r = torchrun(ranks, sharded, *gpt2_run["common"], "--resume", folder,
                 "--log-file", tmp_path / "log.jsonl")
    assert r.returncode != 0
    assert not steps_logged(tmp_path / "log.jsonl"), "nothing is trained"
    found = [e for e in errors(r) if "checksum mismatch" in e]
    assert found, r.stderr[-3000:]
    e = found[0]
    assert f"{folder}/rank-00001.safetensors: corrupt tensor {tensor} (" in e and member in e, e
    assert ("checked whole" if source == "old" else "chunk 0 of 1, bytes [0, ") in e, e


def test_chunks_are_read_and_checked_one_by_one(gpt2_run, tmp_path):
    """Checkpoints with 256-byte chunks (many a tensor): a resume on 3 ranks
    reads within a chunk of each piece it needs, continues exactly as from
    the default chunks, and a flipped byte names its chunk."""
    ck = tmp_path / "ck"
    r = torchrun(2, gpt2_run["sharded"], "--batches", gpt2_run["common"][1], "--steps", 4,
                 "--checkpoint-dir", ck, "--checkpoint-every", 2,
                 env={"BMT_DEBUG_CHECKPOINT_CHUNK_BYTES": "256"})  # as `saved`'s
    assert r.returncode == 0, r.stderr[-3000:]
    folder = ck / "step-00000004"
    data, n, header = rank_file(folder / "rank-00001.safetensors")
    assert header["__metadata__"]["crc32_chunk_bytes"] == "256"
    chunks = json.loads(header["__metadata__"]["crc32_chunks"])
    size = header["s0.param"]["data_offsets"][1] - header["s0.param"]["data_offsets"][0]
    assert len(chunks["s0.param"]) == 8 * -(-size // 256)
    r = torchrun(3, gpt2_run["sharded"], *gpt2_run["common"], "--resume", folder,
                 "--log-file", tmp_path / "a.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"resumed from .*; bytes read per rank: ([\d ]+)", r.stdout)
    per_rank = [int(x) for x in m.group(1).split()]
    meta = json.load(open(folder / "checkpoint.json"))
    total = sum(meta["rank_bytes"])
    # A rank's ranges: one per saved shard and field it reads (<= 2 files x
    # 4 fields x spaces), each at most a chunk longer at either end.
    ranges = 2 * 4 * len(meta["spaces"])
    for got in per_rank:
        assert got <= total / 3 + ranges * 2 * 256, (per_rank, total)
    shutil.copytree(gpt2_run["tmp"] / "saved" / "step-00000004", tmp_path / "default")
    r = torchrun(3, gpt2_run["sharded"], *gpt2_run["common"], "--resume", tmp_path / "default",
                 "--log-file", tmp_path / "b.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    def losses(name):
        return [(x["step"], x["loss"], x["grad_norm"]) for x in train_log(tmp_path / name)]
    assert losses("a.jsonl") == losses("b.jsonl") and len(losses("a.jsonl")) == 8
    tensor, member = flip_parameter_byte(folder, 1)
    r = torchrun(3, gpt2_run["sharded"], *gpt2_run["common"], "--resume", folder,
                 "--log-file", tmp_path / "c.jsonl")
    assert r.returncode != 0 and not steps_logged(tmp_path / "c.jsonl")
    found = [e for e in errors(r) if "checksum mismatch" in e]
    assert found and re.search(rf"corrupt tensor {re.escape(tensor)} \(chunk \d+ of \d+, bytes "
                               rf"\[\d+, \d+\) of its data, file bytes \[\d+, \d+\), holding "
                               rf".*{re.escape(member)}", found[0]), r.stderr[-3000:]


def test_a_checkpoint_is_known_by_its_files_and_later_ones_are_kept(gpt2_run, saved, tmp_path):
    """A checkpoint folder copied under another name resumes (its identity is
    its COMPLETE file and checkpoint.json); a run that would save into a
    --checkpoint-dir holding checkpoints of later steps than it starts from
    (a resume of step 2, or a new run) is refused before training, naming
    them, and leaves them as they were; no line says the run resumed."""
    args = ["--batches", gpt2_run["common"][1], "--lr", "1e-3", "--steps", 5]
    copy = tmp_path / "kept-copy"
    shutil.copytree(saved / "step-00000004", copy)
    r = torchrun(2, gpt2_run["sharded"], *args, "--resume", copy, "--log-file", tmp_path / "a.jsonl")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {copy} at step 4" in r.stdout, r.stdout
    assert steps_logged(tmp_path / "a.jsonl") == [5]
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    before = {p.name: p.stat().st_mtime_ns for p in ck.rglob("*")}
    for resume in (["--resume", ck / "step-00000002"], []):
        r = torchrun(2, gpt2_run["sharded"], *args, *resume, "--checkpoint-dir", ck,
                     "--checkpoint-every", 1, "--log-file", tmp_path / "b.jsonl")
        assert r.returncode != 0
        e = errors(r)
        assert e and f"{ck} holds checkpoints of steps after step {2 if resume else 0}" in e[0] \
            and "step-00000004" in e[0] and "--resume auto" in e[0], r.stderr[-3000:]
        assert (not resume) == ("step-00000002" in e[0]), e[0]
        assert "resumed from" not in r.stdout, r.stdout  # (the refusal first)
        assert not steps_logged(tmp_path / "b.jsonl")
        assert {p.name: p.stat().st_mtime_ns for p in ck.rglob("*")} == before


@pytest.mark.parametrize("record", ["bmt/plan.pkl", "bmt/program.mlir"])
def test_a_flipped_byte_in_a_plan_record_is_an_error(gpt2_run, tmp_path, record):
    """One byte of a tensor name in plan.pkl, or of the program text, flipped
    in place in sharded.pt: one error naming the record (the zip's CRC-32)."""
    import zipfile
    data = bytearray(gpt2_run["sharded"].read_bytes())
    with zipfile.ZipFile(gpt2_run["sharded"]) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(record))
    local = info.header_offset
    start = local + 30 + int.from_bytes(data[local + 26:local + 28], "little") + \
        int.from_bytes(data[local + 28:local + 30], "little")
    body = bytes(data[start:start + info.file_size])
    at = start + body.index(b".mlp.c_fc.weight" if record.endswith("pkl") else b"module attributes")
    data[at] ^= 0x04
    broken = tmp_path / "sharded.pt"
    broken.write_bytes(bytes(data))
    r = torchrun(1, broken, *gpt2_run["common"], "--log-file", tmp_path / "log.jsonl")
    assert r.returncode != 0 and not steps_logged(tmp_path / "log.jsonl")
    e = errors(r)
    assert len(e) == 1 and f"{broken}: corrupt record {record}" in e[0] and "CRC-32" in e[0], \
        r.stderr[-3000:]


def archive_plan(sharded):
    """sharded.pt's plan (a dict) and its zip's top folder."""
    import io
    import zipfile
    with zipfile.ZipFile(sharded) as z:
        top = z.namelist()[0].split("/")[0]
        return torch.load(io.BytesIO(z.read(f"{top}/bmt/plan.pkl")), weights_only=False), top


def record_start(sharded, record):
    """Byte offset in the file of the data of zip record `record`."""
    import zipfile
    data = sharded.read_bytes()
    with zipfile.ZipFile(sharded) as z:
        info = next(i for i in z.infolist() if i.filename.endswith("/" + record))
    local = info.header_offset
    return local + 30 + int.from_bytes(data[local + 26:local + 28], "little") + \
        int.from_bytes(data[local + 28:local + 30], "little")


def test_a_flipped_weight_byte_is_found_by_the_rank_that_reads_it(gpt2_run, tmp_path):
    """Per-chunk checksums of sharded.pt's weights (docs/sharded-format.md):
    a byte flipped in a member that rank 1's and rank 2's ranges of a 3-rank
    run both cut, inside rank 2's range and past the chunks covering rank
    1's: one error, from rank 2 only (the others do not read it), naming the
    file, the record, the byte range and the member; no step trained. Before
    chunk checksums neither rank checked a member it cut: it trained."""
    sharded = gpt2_run["sharded"]
    plan, _ = archive_plan(sharded)
    # The largest group in one record; the member that rank 2's range starts in.
    g = max((k for k, x in enumerate(plan["groups"]) if x["record"]),
            key=lambda k: plan["groups"][k]["size"])
    group = plan["groups"][g]
    assert group["dtype"] == "float32" and group["chunk_bytes"] >= 64, group
    chunk = group["chunk_bytes"]
    assert len(group["chunk_crc32s"]) == -(-group["size"] * 4 // chunk)
    shard = -(-group["size"] // 3)
    begin2 = 2 * shard  # rank 2's first element
    m = next(i for i, off in enumerate(group["offsets"])
             if off < begin2 < off + torch.Size(plan["tensors"][group["members"][i]]["shape"]).numel())
    member = plan["tensors"][group["members"][m]]
    end = group["offsets"][m] + torch.Size(member["shape"]).numel()
    # Past the chunk that holds rank 1's last byte (rank 1 reads up to its end).
    byte = (begin2 * 4 // chunk + 1) * chunk + 5
    assert byte < end * 4 and byte < group["size"] * 4, (byte, end, group)
    broken = tmp_path / "sharded.pt"
    data = bytearray(sharded.read_bytes())
    data[record_start(sharded, group["record"]) + byte] ^= 0x08
    broken.write_bytes(bytes(data))
    r = torchrun(3, broken, *gpt2_run["common"], "--log-file", tmp_path / "log.jsonl",
                 extra=["--tee", "3"])
    assert r.returncode != 0 and not steps_logged(tmp_path / "log.jsonl"), r.stderr[-3000:]
    lines = [x for x in (r.stdout + r.stderr).splitlines() if "error:" in x]
    found = [x for x in lines if "checksum mismatch" in x]
    assert len(found) == 1 and found[0].startswith("[default2]:error: "), lines
    first = byte // chunk * chunk
    assert (f"{broken}: corrupt record {group['record']} of storage group {group['name']} "
            f"(chunk {byte // chunk} of {len(group['chunk_crc32s'])}, bytes [{first}, "
            f"{first + chunk}) of its buffer, holding ") in found[0] and member["name"] in found[0], \
        found[0]


def test_a_changed_checkpoint_json_is_an_error(gpt2_run, saved, tmp_path):
    """checkpoint.json's CRC-32 is in COMPLETE: one digit of the data
    position changed (still valid JSON, a value nothing else checks) is one
    error on resume, naming the file; nothing is trained."""
    def change(folder):
        path = folder / "checkpoint.json"
        text = path.read_text()
        m = re.search(r'"micro_batches": (\d+)', text)
        assert m, text
        path.write_text(text[:m.start(1)] + str(int(m.group(1)) + 1) + text[m.end(1):])
    folder = damaged(saved, tmp_path, change)
    r = torchrun(2, gpt2_run["sharded"], *gpt2_run["common"], "--resume", folder,
                 "--log-file", tmp_path / "log.jsonl")
    assert r.returncode != 0 and not steps_logged(tmp_path / "log.jsonl"), r.stderr[-3000:]
    e = sorted(set(errors(r)))  # every rank reads checkpoint.json: the same line from each
    assert len(e) == 1 and f"{folder}/checkpoint.json: checksum mismatch (CRC-32 " in e[0] \
        and "its COMPLETE file says" in e[0], r.stderr[-3000:]
