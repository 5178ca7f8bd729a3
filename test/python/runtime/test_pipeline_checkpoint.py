"""Checkpoints of pipelined runs (docs/checkpoint-format.md, versions 4
and 5; docs/runtime/pipeline.md) on CPU ranks under torchrun: the 4-block
GPT-2 fixture (tied wte) compiled with bmt-opt --pipeline-parallel, 10 AdamW
steps on fixed batches (8 rows of 8 tokens a step).

- The uninterrupted P = 2 N = 4 run saves after steps 3, 6, 9 and 10: each
  rank's file holds only its stage's groups (the tied group once, by stage
  0), checkpoint.json names the stage of each space.
- A run of the same layout stopped by SIGTERM (time-based saves, --keep 2)
  resumed with --resume auto: losses and parameters bit-identical.
- Other layouts: P = 2 N = 4 -> P = 2 N = 2, -> P = 4 N = 4, -> the plan
  without stages on 1 rank, and that run's checkpoint -> P = 2 N = 2: losses
  and parameters against the uninterrupted run within numerics.py's bounds,
  each rank reading at most what its stage holds (+ chunk rounding).
- bmt-to-hf of the step-10 checkpoint: from_pretrained loads it, the tensors
  equal --save-params bit for bit.
- A corrupt byte in a stage's file, a stage's files missing: one error line,
  nothing trained.
- With tensor parallelism (P = 2 x T = 2 on N = 4, version 5): the
  uninterrupted run within numerics.py's bounds of P = 2 N = 4; stopped by
  SIGTERM and resumed bit-identically; step 6 resumed on P = 2 N = 2, on
  T = 2 N = 2 without stages (whose version-2 checkpoint goes back into
  P = 2 x T = 2) and on 1 rank; bmt-to-hf; a corrupt byte of a TP slice.
- With virtual stages (P = 2 x V = 2 on N = 2, version 5, each space's
  chunk recorded): step 6 resumed on P = 2 V = 1 and without stages;
  bmt-to-hf.
"""
import json
import os
import re
import shutil
import signal
import subprocess

import pytest
import torch

from bmt_paths import binary
from eager import compile_model
from numerics import assert_identical, assert_loss_close, assert_trained_close
from test_checkpoint import (compile, errors, launch, rank_file, steps_logged, torchrun,
                             train_log, wait_for)

STEPS = 10
ROWS = 8
SEQ = 8
CHUNK = 64  # bytes of a checksummed chunk: the bytes a resume reads stay near its share
ENV = {"BMT_DEBUG_CHECKPOINT_CHUNK_BYTES": str(CHUNK)}
TIED = "transformer.wte.weight"


def gpt2_4():
    import transformers
    import make_fixtures
    cls, config = make_fixtures.MODELS["gpt2"](transformers)
    config.n_layer = 4
    torch.manual_seed(0)
    return cls(config).eval(), config


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The plans, the batches and the uninterrupted P = 2 N = 4 run."""
    from safetensors.torch import load_file
    tmp = tmp_path_factory.mktemp("ppck")
    model, config = gpt2_4()
    config.save_pretrained(tmp / "config")
    plain = compile_model(model, tmp, "gpt2")  # the trace gpt2.pt; without stages, 1 rank
    torch.save(torch.randint(0, config.vocab_size, (STEPS, ROWS, SEQ + 1),
                             generator=torch.Generator().manual_seed(3)), tmp / "batches.pt")
    plans = {(1, 1): plain}
    for p, n in ((2, 4), (2, 2), (4, 4)):
        plans[p, n] = compile(tmp / "gpt2.pt", tmp / f"p{p}n{n}.pt", "--pipeline-parallel", str(p),
                              "--world-size", str(n))
    common = ["--batches", tmp / "batches.pt", "--steps", STEPS, "--lr", "1e-3", "--schedule",
              "cosine", "--warmup", 2, "--clip-grad", 0.5, "--weight-decay", 0.01]
    out = tmp / "straight"
    out.mkdir()
    r = torchrun(4, plans[2, 4], *common, "--checkpoint-dir", out / "ck", "--checkpoint-every", 3,
                 "--log-file", out / "log.jsonl", "--save-params", out / "params.safetensors",
                 env=ENV)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return {"tmp": tmp, "plans": plans, "common": common, "ck": out / "ck",
            "records": train_log(out / "log.jsonl"),
            "params": load_file(out / "params.safetensors")}


def step_folder(ck, step):
    return ck / f"step-{step:08d}"


def test_each_stage_writes_its_own_groups(work):
    folder = step_folder(work["ck"], 6)
    assert sorted(p.name for p in work["ck"].iterdir()) == [
        f"step-{s:08d}" for s in (3, 6, 9, 10)]
    meta = json.load(open(folder / "checkpoint.json"))
    assert meta["version"] == 4 and meta["pipeline_stages"] == 2 and meta["world_size"] == 4
    assert (folder / "COMPLETE").read_text().startswith("bmt-checkpoint 4 step 6 ")
    stage_of = {}
    for k, s in enumerate(meta["spaces"]):
        assert s["shards"] == 2, s["name"]  # over a stage's D = 2 ranks
        for m in s["members"]:
            stage_of[m["tensor"]] = s["stage"]
    # Blocks 0, 1 on stage 0, blocks 2, 3 on stage 1; outside the blocks,
    # wpe on stage 0, ln_f on stage 1, and the tied wte, read by both ends,
    # written by stage 0 only.
    assert stage_of[TIED] == 0 and stage_of["transformer.wpe.weight"] == 0
    assert stage_of["transformer.ln_f.weight"] == 1
    assert {stage_of[f"transformer.h.{b}.attn.c_attn.weight"] for b in (0, 1)} == {0}
    assert {stage_of[f"transformer.h.{b}.attn.c_attn.weight"] for b in (2, 3)} == {1}
    for rank in range(4):
        _, _, header = rank_file(folder / f"rank-{rank:05d}.safetensors")
        spaces = {int(re.match(r"s(\d+)\.", n).group(1)) for n in header if n.startswith("s")}
        assert spaces == {k for k, s in enumerate(meta["spaces"]) if s["stage"] == rank // 2}, \
            (rank, spaces)
        assert "rng.cpu" in header


@pytest.mark.parametrize("layout", ["p2n4", "p2t2n4"])
def test_stopped_by_sigterm_resumes_bit_identically(work, tp_work, layout, tmp_path):
    """Time-based saves every ~30 ms (slowed saves hold the steps back) and
    --keep 2; SIGTERM to torchrun after 3 steps: every rank stops after the
    same step s, saved; --resume auto continues to the uninterrupted run's
    losses and parameters bit for bit (P = 2 N = 4, and P = 2 x T = 2)."""
    from safetensors.torch import load_file
    straight = work if layout == "p2n4" else tp_work
    plan = work["plans"][2, 4] if layout == "p2n4" else tp_work["plan"]
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    proc, _ = launch(4, plan, *work["common"], "--checkpoint-dir", ck,
                     "--checkpoint-every-minutes", 0.0005, "--keep", 2, "--log-file", log,
                     env={**ENV, "BMT_DEBUG_CHECKPOINT_SLOW_MS": "20"})
    try:
        assert wait_for(lambda: len(steps_logged(log)) >= 3), steps_logged(log)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not errors(subprocess.CompletedProcess([], 0, out, err)), err[-3000:]
    s = steps_logged(log)[-1]
    assert 3 <= s < STEPS, s
    assert f"bmt-run: stopped by SIGTERM after step {s} of {STEPS}; checkpoint step {s} saved" \
        in out, out[-2000:]
    complete = sorted(p.name for p in ck.iterdir() if (p / "COMPLETE").is_file())
    assert complete[-1] == f"step-{s:08d}" and len(complete) <= 2, complete
    assert not any(".tmp-" in p.name for p in ck.iterdir())
    r = torchrun(4, plan, *work["common"], "--checkpoint-dir", ck, "--resume",
                 "auto", "--log-file", tmp_path / "resumed.jsonl", "--save-params",
                 tmp_path / "params.safetensors", env=ENV)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    saved_by = "4 ranks" + (", tensor parallel 2" if layout == "p2t2n4" else "")
    assert f"resumed from {ck}/step-{s:08d} at step {s} (saved by {saved_by}, 2 pipeline " \
        "stages)" in r.stdout, r.stdout
    resumed = train_log(tmp_path / "resumed.jsonl")
    assert [(x["step"], x["loss"], x["grad_norm"]) for x in resumed] == \
        [(x["step"], x["loss"], x["grad_norm"]) for x in straight["records"][s:]]
    assert_identical(load_file(tmp_path / "params.safetensors"), straight["params"],
                     f"{layout}: parameters after SIGTERM and --resume auto")


def stage_needs(meta, rank):
    """Bytes of parameters and AdamW moments that `rank` holds in the layout
    of checkpoint.json `meta` (its stage's spaces, the tied one on both ends)."""
    stages, tp = meta.get("pipeline_stages", 1), meta.get("tensor_parallel", 1)
    d = meta["world_size"] // stages
    stage = rank // d
    total = 0
    for s in meta["spaces"]:
        if s.get("tp_rank", 0) != rank % tp:
            continue
        tied = any(m["tensor"] == TIED for m in s["members"])
        if s.get("stage", 0) == stage or (tied and stage == stages - 1):
            total += 3 * 4 * s["shard_size"] + 4  # param, exp_avg, exp_avg_sq; step
    return total


def ranks(n, plan, *args):
    """bmt-run on n CPU ranks: under torchrun, or alone for one (torchrun's
    start costs seconds)."""
    if n > 1:
        return torchrun(n, plan, *args, env=ENV)
    return subprocess.run([binary("bmt-run"), plan, *map(str, args), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **ENV, "OMP_NUM_THREADS": "1"})


def resume(work, p, n, folder, out, *flags):
    """Resumes `folder` with plan work["plans"][p, n] (or the plan `p`) on
    n ranks to step 10."""
    from safetensors.torch import load_file
    out.mkdir()
    plan = work["plans"][p, n] if isinstance(p, int) else p
    r = ranks(n, plan, *work["common"], "--resume", folder, "--checkpoint-dir",
              out / "ck", "--checkpoint-every", 3, "--log-file", out / "log.jsonl",
              "--save-params", out / "params.safetensors", *flags)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "resharded to this run's layout" in r.stdout, r.stdout
    meta = json.load(open(step_folder(out / "ck", STEPS) / "checkpoint.json"))
    m = re.search(r"resumed from .*; bytes read per rank: ([\d ]+)", r.stdout)
    read = [int(x) for x in m.group(1).split()]
    # Each rank reads at most its stage's share (+ at most a chunk at each
    # end of a piece): never another stage's groups.
    for rank, got in enumerate(read):
        need = stage_needs(meta, rank)
        assert got <= need * 1.1 + 4096, (rank, read, need)
    return train_log(out / "log.jsonl"), load_file(out / "params.safetensors"), read


def assert_continues(work, records, params, after, what):
    """Steps after+1..10 of `records` and the final `params` against the
    uninterrupted P = 2 N = 4 run, within numerics.py's bounds."""
    straight = work["records"]
    assert [x["step"] for x in records] == list(range(after + 1, STEPS + 1)), what
    for x, y in zip(records, straight[after:]):
        assert_loss_close(x["loss"], y["loss"], what=f"{what}: loss of step {x['step']}")
    lr_sum = sum(x["lr"] for x in straight)
    stats = assert_trained_close(params, work["params"], lr_sum)
    loss = max(abs(x["loss"] - y["loss"]) for x, y in zip(records, straight[after:]))
    print(f"{what}: losses within {loss:.1e}, parameters max {stats[0]:.1e}")


@pytest.mark.parametrize("p, n", [(2, 2), (4, 4)], ids=["p2n4-to-p2n2", "p2n4-to-p4n4"])
def test_resume_on_other_stages(work, p, n, tmp_path):
    records, params, read = resume(work, p, n, step_folder(work["ck"], 6), tmp_path / "run")
    assert_continues(work, records, params, 6, f"P = 2 N = 4 -> P = {p} N = {n}")
    print(f"bytes read per rank {read}")


def test_resume_without_stages_and_back(work, tmp_path):
    """P = 2 N = 4 step 3 -> the plan without stages on 1 rank, whose step-6
    checkpoint (version 1) -> P = 2 N = 2."""
    records, params, _ = resume(work, 1, 1, step_folder(work["ck"], 3), tmp_path / "plain")
    assert_continues(work, records, params, 3, "P = 2 N = 4 -> no stages N = 1")
    plain = step_folder(tmp_path / "plain" / "ck", 6)
    assert json.load(open(plain / "checkpoint.json"))["version"] == 1
    records, params, _ = resume(work, 2, 2, plain, tmp_path / "back")
    assert_continues(work, records, params, 6, "no stages N = 1 -> P = 2 N = 2")


def test_to_hf_of_a_pipelined_checkpoint(work, tmp_path):
    import transformers
    from safetensors.torch import load_file
    from bmt.to_hf import main as to_hf
    assert to_hf([str(step_folder(work["ck"], STEPS)), "-o", str(tmp_path / "hf"), "--config",
                  str(work["tmp"] / "config" / "config.json")]) == 0
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    params = work["params"]
    assert "transformer.h.3.mlp.c_proj.weight" in exported and TIED in exported
    assert_identical(exported, {k: v for k, v in params.items() if k in exported},
                     "bmt-to-hf of the P = 2 N = 4 checkpoint")
    model, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf",
                                                              output_loading_info=True)
    assert not any(info.values()), info
    loaded = dict(model.named_parameters())
    assert_identical({k: loaded[k].detach() for k in exported}, exported, "from_pretrained")


def refused(work, folder, tmp_path):
    """A resume of `folder` by the plan without stages on 1 rank (bmt-run
    alone: it reads every stage's files) that fails before training."""
    r = subprocess.run([binary("bmt-run"), work["plans"][1, 1], *map(str, work["common"]),
                        "--resume", folder, "--log-file", tmp_path / "log.jsonl", "--device",
                        "cpu"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **ENV, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1, r.stderr[-3000:]
    assert not steps_logged(tmp_path / "log.jsonl"), "nothing is trained"
    return r


def test_corrupt_stage_file_is_an_error(work, tmp_path):
    """A byte flipped in the first member of a block of stage 1's first file:
    the resume reads it and names it."""
    folder = tmp_path / "step-00000006"
    shutil.copytree(step_folder(work["ck"], 6), folder)
    meta = json.load(open(folder / "checkpoint.json"))
    k, space = next((k, s) for k, s in enumerate(meta["spaces"]) if s["stage"] == 1)
    member = min(space["members"], key=lambda m: m["offset"])  # in shard 0, rank 2's
    path = folder / "rank-00002.safetensors"
    data, n, header = rank_file(path)
    data[8 + n + header[f"s{k}.param"]["data_offsets"][0] + 4 * (member["offset"] + 7) + 1] ^= 0x10
    path.write_bytes(bytes(data))
    r = refused(work, folder, tmp_path)
    found = errors(r)
    assert len(found) == 1, r.stderr[-3000:]  # one line
    line = found.pop()
    assert line.startswith(f"error: {path}: corrupt tensor s{k}.param (chunk ") and \
        member["tensor"] in line and line.endswith("checksum mismatch; resume another checkpoint"), line


def test_missing_stage_files_are_an_error(work, tmp_path):
    folder = tmp_path / "step-00000006"
    shutil.copytree(step_folder(work["ck"], 6), folder)
    for rank in (2, 3):
        (folder / f"rank-{rank:05d}.safetensors").unlink()
    r = refused(work, folder, tmp_path)
    assert errors(r) == [
        f"error: {folder}/rank-00002.safetensors: missing (the checkpoint of 2 pipeline stages "
        "on 4 ranks has no file of rank 2, of stage 1): resume another checkpoint"], r.stderr[-3000:]


# --- tensor parallelism: P = 2 x T = 2 on N = 4 ------------------------------------------------

def straight_run(work, plan, ranks, folder, what):
    """The uninterrupted run of `plan` on `ranks` ranks (saves after steps
    3, 6, 9, 10), checked within numerics.py's bounds of P = 2 N = 4."""
    from safetensors.torch import load_file
    out = work["tmp"] / folder
    out.mkdir()
    r = torchrun(ranks, plan, *work["common"], "--checkpoint-dir", out / "ck",
                 "--checkpoint-every", 3, "--log-file", out / "log.jsonl", "--save-params",
                 out / "params.safetensors", env=ENV)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    records, params = train_log(out / "log.jsonl"), load_file(out / "params.safetensors")
    assert_continues(work, records, params, 0, what + " against P = 2 N = 4")
    return {"plan": plan, "ck": out / "ck", "records": records, "params": params}


@pytest.fixture(scope="module")
def tp_work(work):
    """The plans of P = 2 x T = 2 (N = 4) and of T = 2 without stages
    (N = 2), and the uninterrupted P = 2 x T = 2 run (saves after steps 3,
    6, 9, 10), which stays within numerics.py's bounds of P = 2 N = 4."""
    tmp = work["tmp"]
    plan = compile(tmp / "gpt2.pt", tmp / "p2t2n4.pt", "--pipeline-parallel", "2",
                   "--tensor-parallel", "2", "--world-size", "4")
    t2 = compile(tmp / "gpt2.pt", tmp / "t2n2.pt", "--tensor-parallel", "2", "--world-size", "2")
    return dict(straight_run(work, plan, 4, "straight-tp", "P = 2 x T = 2"), t2=t2)


def test_tp_stage_files_hold_their_tp_ranks_slices(tp_work):
    """Version 5: every group once per TP rank (tp_rank, shards over the
    stage's D = 1), written by the rank of its stage and TP rank only."""
    folder = step_folder(tp_work["ck"], 6)
    meta = json.load(open(folder / "checkpoint.json"))
    assert (meta["version"], meta["tensor_parallel"], meta["pipeline_stages"]) == (5, 2, 2)
    assert (folder / "COMPLETE").read_text().startswith("bmt-checkpoint 5 step 6 ")
    spaces = meta["spaces"]
    assert [s["tp_rank"] for s in spaces] == [0, 1] * (len(spaces) // 2)
    assert all(s["shards"] == 1 for s in spaces)
    for rank in range(4):
        _, _, header = rank_file(folder / f"rank-{rank:05d}.safetensors")
        have = {int(re.match(r"s(\d+)\.", n).group(1)) for n in header if n.startswith("s")}
        assert have == {k for k, s in enumerate(spaces)
                        if s["stage"] == rank // 2 and s["tp_rank"] == rank % 2}, (rank, have)


@pytest.mark.parametrize("to", ["p2n2", "t2n2-and-back", "n1"])
def test_tp_resume_on_other_layouts(work, tp_work, to, tmp_path):
    """P = 2 x T = 2 step 6 -> P = 2 N = 2 (T = 1), -> T = 2 N = 2 without
    stages (whose step-9 checkpoint, version 2, -> P = 2 x T = 2), -> 1 rank."""
    folder = step_folder(tp_work["ck"], 6)
    p, n = {"p2n2": (2, 2), "t2n2-and-back": (tp_work["t2"], 2), "n1": (1, 1)}[to]
    records, params, read = resume(work, p, n, folder, tmp_path / "run")
    assert_continues(work, records, params, 6, f"P = 2 x T = 2 -> {to}")
    print(f"{to}: bytes read per rank {read}")
    if to == "t2n2-and-back":
        plain = step_folder(tmp_path / "run" / "ck", 9)
        assert json.load(open(plain / "checkpoint.json"))["version"] == 2
        records, params, read = resume(work, tp_work["plan"], 4, plain, tmp_path / "back")
        assert_continues(work, records, params, 9, "T = 2 N = 2 -> P = 2 x T = 2")
        print(f"T = 2 N = 2 -> P = 2 x T = 2: bytes read per rank {read}")


def test_to_hf_of_pipelined_checkpoints(work, tp_work, v_work, tmp_path):
    """bmt-to-hf of the P = 2 x T = 2 and P = 2 x V = 2 step-10
    checkpoints: each run's --save-params bit for bit."""
    from safetensors.torch import load_file
    from bmt.to_hf import main as to_hf
    for name, run in (("tp", tp_work), ("v", v_work)):
        out = tmp_path / name
        assert to_hf([str(step_folder(run["ck"], STEPS)), "-o", str(out), "--config",
                      str(work["tmp"] / "config" / "config.json")]) == 0
        exported = load_file(out / "model.safetensors")
        assert TIED in exported and "transformer.h.3.attn.c_attn.weight" in exported
        assert_identical(exported, {k: v for k, v in run["params"].items() if k in exported},
                         f"bmt-to-hf of the {name} checkpoint")


def test_corrupt_tp_slice_is_an_error(work, tp_work, tmp_path):
    """A byte flipped in a split member of TP rank 1's slice on stage 1
    (rank 3's file): a resume on 1 rank reads it and names it in one line."""
    folder = tmp_path / "step-00000006"
    shutil.copytree(step_folder(tp_work["ck"], 6), folder)
    meta = json.load(open(folder / "checkpoint.json"))
    k, space, member = next((k, s, m) for k, s in enumerate(meta["spaces"])
                            if s["stage"] == 1 and s["tp_rank"] == 1
                            for m in s["members"] if "split" in m)
    path = folder / "rank-00003.safetensors"
    data, n, header = rank_file(path)
    data[8 + n + header[f"s{k}.param"]["data_offsets"][0] + 4 * (member["offset"] + 7) + 1] ^= 0x10
    path.write_bytes(bytes(data))
    found = errors(refused(work, folder, tmp_path))
    assert len(found) == 1, found
    line = found.pop()
    assert line.startswith(f"error: {path}: corrupt tensor s{k}.param (chunk ") and \
        member["tensor"] in line and line.endswith("checksum mismatch; resume another checkpoint"), line


# --- virtual stages: P = 2 x V = 2 on N = 2 -------------------------------------------------


@pytest.fixture(scope="module")
def v_work(work):
    """The P = 2 x V = 2 plan (chunk c = block c, on stage c % 2) and its
    uninterrupted run on N = 2 (saves after steps 3, 6, 9, 10), within
    numerics.py's bounds of P = 2 N = 4."""
    tmp = work["tmp"]
    plan = compile(tmp / "gpt2.pt", tmp / "p2v2n2.pt", "--pipeline-parallel", "2",
                   "--virtual-stages", "2", "--world-size", "2")
    return straight_run(work, plan, 2, "straight-v", "P = 2 x V = 2")


@pytest.mark.parametrize("p, n", [(2, 2), (1, 1)], ids=["to-p2v1", "to-no-stages"])
def test_virtual_stages_resume_elsewhere(work, v_work, p, n, tmp_path):
    """Version 5 records each space's chunk (block b's on chunk b, stage
    b % 2; the tied group on chunk 0); step 6 resumes on P = 2 V = 1 and
    without stages."""
    folder = step_folder(v_work["ck"], 6)
    meta = json.load(open(folder / "checkpoint.json"))
    assert (meta["version"], meta["virtual_stages"]) == (5, 2) and "tensor_parallel" not in meta
    chunk = {m["tensor"]: (s["chunk"], s["stage"]) for s in meta["spaces"] for m in s["members"]}
    assert chunk[TIED] == (0, 0)
    assert [chunk[f"transformer.h.{b}.attn.c_attn.weight"] for b in range(4)] == \
        [(0, 0), (1, 1), (2, 0), (3, 1)]
    records, params, read = resume(work, p, n, folder, tmp_path / "run")
    assert_continues(work, records, params, 6, f"P = 2 x V = 2 -> P = {p} N = {n}")
    print(f"V = 2 -> P = {p} N = {n}: bytes read per rank {read}")
