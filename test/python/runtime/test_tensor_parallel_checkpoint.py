"""Checkpoints of tensor parallelism (docs/checkpoint-format.md, version 2),
on CPU ranks under torchrun: the fixture GPT-2 and LLaMA compiled with
bmt-opt --tensor-parallel, trained with AdamW on fixed batches.

- Same layout (T = 2, N = 2): 10 steps straight against a fresh process
  resumed from the straight run's step-5 checkpoint: every loss and the
  final parameters bit-identical; the straight run against eager PyTorch
  (numerics.py's bounds). bmt-to-hf of its step-10 checkpoint is the global
  model: from_pretrained loads it, and it equals --save-params bit for bit.
- Other layouts: T = 2 N = 2 -> T = 1 N = 1, T = 1 N = 2, T = 2 N = 4;
  T = 1 N = 2 -> T = 2 N = 2; LLaMA T = 2 N = 4 -> T = 4 N = 4 (its k/v
  projections split, then replicated); T = 2 N = 4 with
  hybrid sharding (G = 1: replicas) -> T = 1 N = 1; and a vocab that
  T = 2 pads (127 -> 128 rows) resumed on T = 1 (no padding): the losses
  after the resume and the final parameters against eager PyTorch and the
  uninterrupted run, each rank reading at most the bytes it holds in the
  new layout (its file in the new layout's checkpoint).
- A rank killed with SIGKILL under torchrun --max-restarts on T = 2 N = 2:
  the job resumes and ends with the parameters of the uninterrupted run.
- Resumes that cannot work: another model, another vocab size (one error
  line, nothing trained).
"""
import json
import re
import shutil
import subprocess
import sys

import zlib

import pytest
import torch

from bmt_paths import binary
from numerics import assert_identical, assert_loss_close, assert_trained_close
from test_checkpoint import (compile, errors, run_killing_rank_1, steps_logged, torchrun,
                             train_log)
from eager import build, eager_training

SEQ = 8
GLOBAL_BATCH = 12  # rows per step of all data-parallel ranks
STEPS = 10
HALF = 5
COMMON = ["--lr", "1e-3", "--clip-grad", 0, "--weight-decay", 0.01, "--seed", 7,
          "--steps", STEPS]


def common_with(flags):
    """COMMON with `flags` (option, value pairs and switches) in place of
    COMMON's values of the options they give: bmt-run takes an option once."""
    given = {f for f in flags if isinstance(f, str) and f.startswith("--")}
    pairs = [COMMON[i:i + 2] for i in range(0, len(COMMON), 2)]
    return [x for pair in pairs if pair[0] not in given for x in pair] + list(flags)


def trace(model, path):
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids,
                                                     "attention_mask": torch.ones_like(ids)},
                        strict=False).save(str(path))
    return path


def gpt2_127():
    """The fixture GPT-2 with a vocab of 127 (T = 2 pads it to 128)."""
    import transformers
    import make_fixtures
    torch.manual_seed(0)
    cls, config = make_fixtures.MODELS["gpt2"](transformers)
    config.vocab_size = 127
    return cls(config).eval()


MODELS = {"gpt2": lambda: build("gpt2"), "llama": lambda: build("llama"), "gpt2-127": gpt2_127}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Traces, plans (by model, T, N), batches and eager references, made on
    first use."""
    tmp = tmp_path_factory.mktemp("tpck")
    state = {"tmp": tmp, "plans": {}, "references": {}, "runs": {}}

    def plan(name, tp, ranks, group=0):
        """The plan of `name` for T = tp, N = ranks (group: a hybrid
        --shard-group-size)."""
        key = (name, tp, ranks, group)
        if key not in state["plans"]:
            pt = tmp / f"{name}.pt"
            if not pt.exists():
                model = MODELS[name]()
                trace(model, pt)
                vocab = model.config.vocab_size
                torch.save(torch.randint(0, vocab, (STEPS, GLOBAL_BATCH, SEQ + 1),
                                         generator=torch.Generator().manual_seed(3)),
                           tmp / f"{name}.batches.pt")
            flags = ["--world-size", ranks, "--tensor-parallel", tp] if tp > 1 else []
            flags += ["--shard-group-size", group] if group else []
            state["plans"][key] = compile(pt, tmp / f"{name}.t{tp}n{ranks}g{group}.pt",
                                          *map(str, flags))
        return state["plans"][key]

    def eager(name, lrs):
        if name not in state["references"]:
            model = MODELS[name]()
            batches = torch.load(tmp / f"{name}.batches.pt")
            losses = eager_training(model, batches, STEPS, 1, lambda s: lrs[s], 0.0, 0.01)
            state["references"][name] = (losses, {n: p.detach().clone()
                                                  for n, p in model.named_parameters()})
        return state["references"][name]

    def straight(name, tp, ranks, group=0):
        """STEPS steps uninterrupted, checkpoints after steps 5 and 10:
        (train records, final parameters, checkpoint folder)."""
        from safetensors.torch import load_file
        key = (name, tp, ranks, group)
        if key not in state["runs"]:
            out = tmp / f"straight-{name}-t{tp}n{ranks}g{group}"
            out.mkdir()
            r = torchrun(ranks, plan(name, tp, ranks, group), "--batches", tmp / f"{name}.batches.pt",
                         *COMMON, "--checkpoint-dir", out / "ck", "--checkpoint-every", HALF,
                         "--log-file", out / "log.jsonl", "--save-params",
                         out / "params.safetensors",
                         # chunks of 64 bytes (many a tensor; the default 64 KiB
                         # is more than these tiny shards): resumes read within a
                         # chunk of what they need
                         env={"BMT_DEBUG_CHECKPOINT_CHUNK_BYTES": "64"})
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
            state["runs"][key] = (train_log(out / "log.jsonl"),
                                  load_file(out / "params.safetensors"), out / "ck")
        return state["runs"][key]

    state.update(plan=plan, eager=eager, straight=straight)
    return state


def resume(work, name, tp, ranks, folder, out, *flags):
    """A fresh run of plan (name, T, N) resumed from checkpoint `folder` to
    step STEPS with bmt-run `flags`, saving a checkpoint at the end: (its
    output, train records of the resumed steps, final parameters, its
    step-STEPS checkpoint.json)."""
    from safetensors.torch import load_file
    out.mkdir()
    r = torchrun(ranks, work["plan"](name, tp, ranks), "--batches",
                 work["tmp"] / f"{name}.batches.pt", *common_with(flags), "--resume", folder,
                 "--checkpoint-dir", out / "ck", "--checkpoint-every", HALF,
                 "--log-file", out / "log.jsonl", "--save-params", out / "params.safetensors")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"resumed from {folder} at step {HALF}" in r.stdout, r.stdout
    meta = json.load(open(out / "ck" / f"step-{STEPS:08d}" / "checkpoint.json"))
    return r, train_log(out / "log.jsonl"), load_file(out / "params.safetensors"), meta


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_resume_on_the_same_layout_is_bit_identical(work, name):
    records, params, ck = work["straight"](name, 2, 2)
    meta = json.load(open(ck / f"step-{HALF:08d}" / "checkpoint.json"))
    assert meta["version"] == 2 and meta["tensor_parallel"] == 2
    assert sorted({s["tp_rank"] for s in meta["spaces"]}) == [0, 1]
    assert (ck / f"step-{HALF:08d}" / "COMPLETE").read_text() == \
        f"bmt-checkpoint 2 step {HALF} checkpoint.json " \
        f"{zlib.crc32((ck / f'step-{HALF:08d}' / 'checkpoint.json').read_bytes()):08x}\n"
    # The uninterrupted run against eager PyTorch.
    lrs = {x["step"]: x["lr"] for x in records}
    assert sorted(lrs) == list(range(1, STEPS + 1))
    losses, want = work["eager"](name, lrs)
    for x, loss in zip(records, losses):
        assert_loss_close(x["loss"], loss, what=f"{name} T=2 N=2: loss of step {x['step']}")
    assert_trained_close(params, want, sum(lrs.values()))
    # A fresh process from its step-5 checkpoint.
    r, resumed, got, _ = resume(work, name, 2, 2, ck / f"step-{HALF:08d}",
                                work["tmp"] / f"same-{name}")
    assert "resharded" not in r.stdout and "tensor parallel 2" in r.stdout, r.stdout
    assert [x["step"] for x in resumed] == list(range(HALF + 1, STEPS + 1))
    for x, y in zip(records[HALF:], resumed):
        assert (x["loss"], x["grad_norm"]) == (y["loss"], y["grad_norm"]), (x, y)
    assert_identical(got, params, f"{name}: parameters of the resumed run")


def test_offloaded_optimizer_checkpoints_and_resumes(work):
    """--offload-optimizer on T = 2 N = 2: the run equals the device
    optimizer's bit for bit (on the CPU both run the same kernels on the same
    values, test_offload.py), and its step-5 checkpoint resumes bit-identically
    with the optimizer offloaded and with it on the device (the masters and
    moments saved are the same either way), and offloaded on T = 2 N = 4
    (resharded: the uninterrupted run within the numerics policy)."""
    from safetensors.torch import load_file
    records, params, _ = work["straight"]("gpt2", 2, 2)
    out = work["tmp"] / "offload-straight"
    out.mkdir()
    r = torchrun(2, work["plan"]("gpt2", 2, 2), "--batches", work["tmp"] / "gpt2.batches.pt", *COMMON,
                 "--offload-optimizer", "--checkpoint-dir", out / "ck", "--checkpoint-every", HALF,
                 "--log-file", out / "log.jsonl", "--save-params", out / "params.safetensors")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "--offload-optimizer: float32 master weights" in r.stdout, r.stdout
    offloaded = train_log(out / "log.jsonl")
    assert [(x["loss"], x["grad_norm"]) for x in offloaded] == \
        [(x["loss"], x["grad_norm"]) for x in records]
    assert_identical(load_file(out / "params.safetensors"), params, "offloaded run's parameters")
    for where, flags in (("host", ["--offload-optimizer"]), ("device", [])):
        _, resumed, got, _ = resume(work, "gpt2", 2, 2, out / "ck" / f"step-{HALF:08d}",
                                    work["tmp"] / f"offload-resumed-{where}", *flags)
        assert [(x["loss"], x["grad_norm"]) for x in resumed] == \
            [(x["loss"], x["grad_norm"]) for x in records[HALF:]], where
        assert_identical(got, params, f"resumed with the optimizer on the {where}: parameters")
    r, resumed, got, _ = resume(work, "gpt2", 2, 4, out / "ck" / f"step-{HALF:08d}",
                                work["tmp"] / "offload-resumed-t2n4", "--offload-optimizer")
    assert "resharded to this run's layout" in r.stdout, r.stdout
    lrs = {x["step"]: x["lr"] for x in records}
    for x, y in zip(resumed, records[HALF:]):
        assert_loss_close(x["loss"], y["loss"], what=f"T = 2 N = 4 offloaded: loss of step {x['step']}")
    assert_trained_close(got, params, sum(lrs.values()))


def test_to_hf_of_a_tensor_parallel_checkpoint(work, tmp_path):
    """bmt-to-hf gathers the TP slices: the directory from_pretrained loads
    holds the global tensors, bit-equal to --save-params of the same run."""
    import transformers
    from safetensors.torch import load_file
    records, params, ck = work["straight"]("gpt2", 2, 2)
    build("gpt2").config.save_pretrained(tmp_path / "config")
    r = subprocess.run([sys.executable, "-m", "bmt.to_hf", str(ck / f"step-{STEPS:08d}"), "-o",
                        str(tmp_path / "hf"), "--config", str(tmp_path / "config" / "config.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    assert exported["transformer.wte.weight"].shape == (128, 32)
    assert exported["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)
    assert_identical(exported, {k: v for k, v in params.items() if k in exported},
                     "bmt-to-hf of the T = 2 checkpoint")
    model, info = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf",
                                                              output_loading_info=True)
    assert not any(info.values()), info
    loaded = dict(model.named_parameters())
    assert_identical({k: loaded[k].detach() for k in exported}, exported, "from_pretrained")


LAYOUT_CASES = {
    # name: (model, saved T, saved N, resumed T, resumed N[, saved shard group size])
    "t2n2-to-t1n1": ("gpt2", 2, 2, 1, 1),
    # Hybrid sharding G = 1: data-parallel rank 1 of each TP rank holds a
    # replica and saves only its generator states.
    "hybrid-t2n4g1-to-t1n1": ("gpt2", 2, 4, 1, 1, 1),
    "t2n2-to-t1n2": ("gpt2", 2, 2, 1, 2),
    "t2n2-to-t2n4": ("gpt2", 2, 2, 2, 4),
    "t1n2-to-t2n2": ("gpt2", 1, 2, 2, 2),
    # LLaMA's 2 kv heads: k/v split at T = 2, replicated (reduce_grad) at T = 4.
    "llama-t2n4-to-t4n4": ("llama", 2, 4, 4, 4),
    "padded-vocab-t2n2-to-t1n1": ("gpt2-127", 2, 2, 1, 1),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_resume_on_another_layout(work, case):
    name, tp, ranks, new_tp, new_ranks, *group = LAYOUT_CASES[case]
    records, params, ck = work["straight"](name, tp, ranks, *group)
    folder = ck / f"step-{HALF:08d}"
    saved = json.load(open(folder / "checkpoint.json"))
    if tp == 1:  # without tensor parallelism: version 1, as before it existed
        assert saved["version"] == 1 and "tensor_parallel" not in saved
        assert not any("tp_rank" in s or any("split" in m for m in s["members"])
                       for s in saved["spaces"])
        assert (folder / "COMPLETE").read_text() == f"bmt-checkpoint 1 step {HALF} checkpoint.json " \
            f"{zlib.crc32((folder / 'checkpoint.json').read_bytes()):08x}\n"
    if group:  # only the first replica of each shard (ranks 0 and 1) saves tensors
        assert saved["shard_group_size"] == group[0]
        assert max(saved["rank_bytes"][2:]) * 10 < min(saved["rank_bytes"][:2]), saved["rank_bytes"]
    if name == "gpt2-127":  # T = 2 pads the vocab to 128 rows
        wte = [m for s in saved["spaces"] for m in s["members"]
               if m["tensor"] == "transformer.wte.weight"]
        assert wte[0]["shape"] == [127, 32] and wte[0]["split"]["padded_size"] == 128, wte
        # Each slice's place in the global tensor (what bmt-to-hf reads):
        # TP rank 1 holds rows 64..126 and one row of padding; of the fused
        # c_attn, the second half of each of q, k and v.
        split = {(s["tp_rank"], m["tensor"]): m["split"] for s in saved["spaces"]
                 for m in s["members"] if "split" in m}
        assert split[1, "transformer.wte.weight"]["local_shape"] == [64, 32]
        assert split[1, "transformer.wte.weight"]["ranges"] == [[0, 64, 63]]
        assert split[0, "transformer.wte.weight"]["ranges"] == [[0, 0, 64]]
        assert split[1, "transformer.h.0.attn.c_attn.weight"]["ranges"] == [
            [0, 16, 16], [16, 48, 16], [32, 80, 16]]
    r, resumed, got, meta = resume(work, name, new_tp, new_ranks, folder,
                                   work["tmp"] / f"layout-{case}")
    assert "resharded to this run's layout" in r.stdout, r.stdout
    assert [x["step"] for x in resumed] == list(range(HALF + 1, STEPS + 1))
    assert meta.get("tensor_parallel", 1) == new_tp and meta["version"] == (2 if new_tp > 1 else 1)
    lrs = {x["step"]: x["lr"] for x in records}
    losses, want = work["eager"](name, lrs)
    for x, loss in zip(resumed, losses[HALF:]):
        assert_loss_close(x["loss"], loss, what=f"{case}: loss of step {x['step']}")
    stats = assert_trained_close(got, want, sum(lrs.values()))
    assert_trained_close(got, params, sum(lrs.values()))  # the uninterrupted run
    if name == "gpt2-127":
        assert got["transformer.wte.weight"].shape == (127, 32)
    # Each rank read at most what it holds in the new layout (its own file
    # of the new layout's checkpoint, written by the same ranks).
    m = re.search(r"resumed from .*; bytes read per rank: ([\d ]+)", r.stdout)
    per_rank = [int(x) for x in m.group(1).split()]
    assert len(per_rank) == new_ranks
    for got_bytes, holds in zip(per_rank, meta["rank_bytes"]):
        assert got_bytes <= holds, (per_rank, meta["rank_bytes"])
    print(f"{case}: parameters against eager max {stats[0]:.1e} mean {stats[1]:.1e}; bytes read "
          f"per rank {per_rank} of {sum(saved['rank_bytes'])} saved")


def test_checkpoint_without_slice_ranges(work, tmp_path):
    """A version 2 checkpoint saved before the members' split recorded
    local_shape and ranges: bmt-run still resumes it (onto T = 1, the
    padded vocab dropped) to the uninterrupted run's parameters; bmt-to-hf,
    which reassembles tensors from the ranges alone, refuses it in one line."""
    records, params, ck = work["straight"]("gpt2-127", 2, 2)
    old = tmp_path / f"step-{HALF:08d}"
    shutil.copytree(ck / f"step-{HALF:08d}", old)
    meta = json.load(open(old / "checkpoint.json"))
    for space in meta["spaces"]:
        for m in space["members"]:
            if "split" in m:
                del m["split"]["local_shape"], m["split"]["ranges"]
    (old / "checkpoint.json").write_text(json.dumps(meta))
    # Such a checkpoint's COMPLETE carries no checksum of checkpoint.json.
    (old / "COMPLETE").write_text(" ".join((old / "COMPLETE").read_text().split()[:4]) + "\n")
    r = subprocess.run([sys.executable, "-m", "bmt.to_hf", str(old), "-o", str(tmp_path / "hf")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and not (tmp_path / "hf").exists()
    e = errors(r)
    assert len(e) == 1 and re.fullmatch(
        re.escape(f"error: {old}/checkpoint.json: ") + r"transformer\.\S+\.weight" + re.escape(
            " is split without its slice ranges (a checkpoint format version 2 written before "
            "bmt-run recorded them): resume it with bmt-run and save again to export it"),
        e[0]), r.stderr
    _, resumed, got, _ = resume(work, "gpt2-127", 1, 1, old, tmp_path / "resumed")
    lrs = {x["step"]: x["lr"] for x in records}
    assert_trained_close(got, params, sum(lrs.values()))


def test_adafactor_checkpoint_resumes_on_the_same_split(work):
    """Adafactor on T = 2 N = 2 (its factored statistics are those of each TP
    rank's slices): a resume from step 5 is bit-identical, on N = 4 (the
    same split, ZeRO over 2) it continues within the numerics policy, and
    on T = 1, where the factors would be another split's, it is one error
    naming both sizes."""
    from safetensors.torch import load_file
    flags = ["--optimizer", "adafactor", "--lr", "1e-2"]
    out = work["tmp"] / "adafactor-straight"
    out.mkdir()
    r = torchrun(2, work["plan"]("gpt2", 2, 2), "--batches", work["tmp"] / "gpt2.batches.pt",
                 *common_with(flags), "--checkpoint-dir", out / "ck", "--checkpoint-every", HALF,
                 "--log-file", out / "log.jsonl", "--save-params", out / "params.safetensors")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    records, params = train_log(out / "log.jsonl"), load_file(out / "params.safetensors")
    folder = out / "ck" / f"step-{HALF:08d}"
    _, resumed, got, _ = resume(work, "gpt2", 2, 2, folder, work["tmp"] / "adafactor-same", *flags)
    assert [(x["loss"], x["grad_norm"]) for x in resumed] == \
        [(x["loss"], x["grad_norm"]) for x in records[HALF:]]
    assert_identical(got, params, "Adafactor resumed on T = 2 N = 2: parameters")
    _, resumed, got, _ = resume(work, "gpt2", 2, 4, folder, work["tmp"] / "adafactor-n4", *flags)
    for x, y in zip(resumed, records[HALF:]):
        assert_loss_close(x["loss"], y["loss"], what=f"Adafactor on N = 4: loss of step {x['step']}")
    assert_trained_close(got, params, sum(x["lr"] for x in records))
    (work["tmp"] / "adafactor-t1").mkdir()
    r = torchrun(1, work["plan"]("gpt2", 1, 1), "--batches", work["tmp"] / "gpt2.batches.pt",
                 *common_with(flags), "--resume", folder, "--log-file", work["tmp"] / "adafactor-t1" / "log.jsonl")
    assert r.returncode != 0
    assert len(errors(r)) == 1, r.stderr[-3000:]
    assert "kept per storage group" in errors(r)[0] and \
        "saved with tensor parallel 2, this run 1" in errors(r)[0], errors(r)


def test_restart_after_a_killed_rank(work):
    """T = 2 N = 2 under torchrun --max-restarts=2: rank 1 killed with
    SIGKILL after step 5; both ranks restart, resume from the newest
    complete checkpoint and end with the uninterrupted run's parameters."""
    from safetensors.torch import load_file
    _, params, _ = work["straight"]("gpt2", 2, 2)
    tmp = work["tmp"] / "killed"
    tmp.mkdir()
    log = tmp / "log.jsonl"
    out = run_killing_rank_1(2, work["plan"]("gpt2", 2, 2), "--batches",
                             work["tmp"] / "gpt2.batches.pt", *COMMON, "--log-file", log,
                             "--checkpoint-dir", tmp / "ck", "--save-params",
                             tmp / "params.safetensors")
    assert "resumed from" in out and "tensor parallel 2" in out, out
    steps = steps_logged(log)
    assert steps[-1] == STEPS and len(steps) > STEPS, steps  # some steps ran twice
    assert_identical(load_file(tmp / "params.safetensors"), params, "parameters after a restart")


@pytest.mark.parametrize("other,message", [
    ("llama", "is a checkpoint of another model: it has no parameter"),
    ("gpt2-127", "is a checkpoint of another model: transformer.wte.weight is [128, 32] there, "
                 "[127, 32] here"),
])
def test_resume_of_another_model_is_an_error(work, other, message, tmp_path):
    _, _, ck = work["straight"]("gpt2", 2, 2)
    r = torchrun(2, work["plan"](other, 2, 2), "--batches", work["tmp"] / f"{other}.batches.pt",
                 *COMMON, "--resume", ck / f"step-{HALF:08d}", "--log-file", tmp_path / "log.jsonl")
    assert r.returncode != 0
    lines = set(errors(r))
    assert len(lines) == 1, r.stderr[-3000:]  # the same line from every rank
    assert message in lines.pop(), r.stderr[-3000:]
    assert not steps_logged(tmp_path / "log.jsonl"), "nothing is trained"


@pytest.mark.parametrize("case", ["t2n2-to-t1n2", "t2n2-to-t2n4"])
def test_corrupt_byte_is_found_on_another_split(work, tmp_path, case):
    """A byte flipped in a parameter of rank 1's file (TP rank 1's slices) of
    a T = 2 checkpoint, resumed on T = 1 (the slices put back together,
    each rank reading half of every tensor) or on 4 ranks: one error naming
    the file, the tensor, its chunk and the model tensor; no step trained."""
    from test_checkpoint import flip_parameter_byte
    _, new_tp, new_ranks = case.partition("-to-")[2].replace("t", " ").replace("n", " ").split(" ")
    _, _, ck = work["straight"]("gpt2", 2, 2)
    folder = tmp_path / f"step-{HALF:08d}"
    shutil.copytree(ck / f"step-{HALF:08d}", folder)
    tensor, member = flip_parameter_byte(folder, 1)
    r = torchrun(int(new_ranks), work["plan"]("gpt2", int(new_tp), int(new_ranks)), "--batches",
                 work["tmp"] / "gpt2.batches.pt", *COMMON, "--resume", folder,
                 "--log-file", tmp_path / "log.jsonl")
    assert r.returncode != 0
    assert not (tmp_path / "log.jsonl").exists() or not train_log(tmp_path / "log.jsonl")
    found = [e for e in errors(r) if "checksum mismatch" in e]
    assert found and f"{folder}/rank-00001.safetensors: corrupt tensor {tensor} (chunk " in found[0] \
        and member in found[0], r.stderr[-3000:]
