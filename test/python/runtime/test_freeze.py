"""Frozen parameters (bmt-opt --freeze) train as eager transformers does with
the same parameters requires_grad=False: 5 AdamW steps of the tiny GPT-2 and
LLaMA of scripts/architectures.py on 1 and 2 CPU ranks and at T = 2, every
loss and the trained parameters within numerics.py's bounds, the frozen ones
bit-identical to the start; the memory estimate drops; a resume continues
bit-exactly and refuses other frozen weights; bmt-opt's errors.

scripts/parallel_matrix.py exports each model once (module fixture) and
draws the batches; the eager reference runs once per model.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bmt_paths import REPO, binary
from eager import assert_frozen_sharded, train_on_batches as train
from numerics import assert_identical, assert_loss_close, assert_trained_close

sys.path.insert(0, os.path.join(REPO, "scripts"))
import parallel_matrix  # noqa: E402
from parallel_matrix import CLIP, STEPS, TRAIN_FLAGS, WEIGHT_DECAY  # noqa: E402

# Frozen: an embedding (GPT-2's position table; LLaMA's token table, untied
# from its head) and the whole first block, so that blocks with and without
# trainable parameters, and frozen linears under tensor parallelism, run.
FREEZE = {"gpt2": "transformer.wpe.weight,transformer.h.0.*",
          "llama": "model.embed_tokens.*,model.layers.[0].*"}
# p2: 2 pipeline stages; LLaMA's stage 0 trains nothing (its output needs no
# gradient), GPT-2's holds the tied wte and a frozen block.
MODES = {"n1": (1, []), "n2": (2, []), "tp2": (2, ["--tensor-parallel", "2"]),
         "p2": (2, ["--pipeline-parallel", "2"])}


def frozen_names(model, patterns):
    import fnmatch
    globs = patterns.split(",")
    return {n for n, _ in model.named_parameters() if any(fnmatch.fnmatchcase(n, g) for g in globs)}


@pytest.fixture(scope="module", params=list(FREEZE))
def prepared(request, tmp_path_factory):
    prep = parallel_matrix.prepare(request.param, tmp_path_factory.mktemp(request.param))
    prep["reference"], prep["runs"] = {}, {}
    return prep


def bmt_opt(prep, out, *flags):
    return subprocess.run([binary("bmt-opt"), prep["archive"], "-o", out, *flags],
                          capture_output=True, text=True, timeout=300)


def eager(prep, lrs):
    """Losses, initial and trained parameters of eager transformers with the
    frozen parameters requires_grad=False (once per model: the LRs agree)."""
    if "eager" not in prep["reference"]:
        from eager import eager_training
        from architectures import build
        model = build(prep["name"])
        frozen = frozen_names(model, FREEZE[prep["name"]])
        for n, p in model.named_parameters():
            p.requires_grad_(n not in frozen)
        start = {n: p.detach().clone() for n, p in model.named_parameters()}
        losses = eager_training(model, prep["batches"], STEPS, 1, lambda s: lrs[s], CLIP,
                                WEIGHT_DECAY)
        trained = {n: p.detach().clone() for n, p in model.named_parameters()}
        prep["reference"]["eager"] = (losses, start, trained, frozen)
    return prep["reference"]["eager"]




@pytest.mark.parametrize("mode", list(MODES))
def test_frozen_training_matches_eager(prepared, mode):
    from safetensors.torch import load_file
    ranks, flags = MODES[mode]
    sharded = os.path.join(prepared["tmp"], f"{mode}.sharded.pt")
    r = bmt_opt(prepared, sharded, "--world-size", str(ranks), *flags,
                "--freeze", FREEZE[prepared["name"]])
    assert r.returncode == 0, r.stderr
    extra = []
    if mode == "n2":  # its checkpoint of step 3 serves the resume test
        extra = ["--checkpoint-dir", os.path.join(prepared["tmp"], "ck"), "--checkpoint-every", 3]
    train_log, saved = train(prepared, sharded, ranks, mode, *extra)
    prepared["runs"][mode] = (sharded, saved)
    # ZeRO-sharded: a rank holds (and read) 1/N of the frozen bytes (a
    # pipeline's rank: its stage's part).
    per_rank, whole = (None, None) if mode == "p2" else assert_frozen_sharded(
        prepared["stdout"][mode], sharded, ranks, 2 if mode == "tp2" else 1)
    assert [x["step"] for x in train_log] == list(range(1, STEPS + 1))
    lrs = {x["step"]: x["lr"] for x in train_log}
    losses, start, trained, frozen = eager(prepared, lrs)
    for x, want in zip(train_log, losses):
        assert_loss_close(x["loss"], want, what=f"loss of step {x['step']}")
    got = load_file(saved)  # the whole model: frozen parameters too
    assert set(got) >= set(trained)
    assert frozen
    for n in frozen:
        assert_identical(got[n], start[n], n)
    stats = assert_trained_close(got, {n: p for n, p in trained.items() if n not in frozen},
                                 sum(lrs.values()))
    print(f"{prepared['name']} {mode}: loss max |d| "
          f"{max(abs(x['loss'] - w) for x, w in zip(train_log, losses)):.2g}, "
          f"trained params max |d| {stats[0]:.2g}" +
          (f"; frozen {per_rank} of {whole} bytes per rank" if per_rank else ""))


def test_memory_estimate_drops(prepared, tmp_path):
    """The summary's per-rank estimate and its state line shrink with
    --freeze, and it lists the frozen bytes a rank holds: half of them (and
    the alignment padding) on 2 ranks."""
    if prepared["name"] != "llama":
        pytest.skip("one model is enough")
    def estimate(*flags):
        r = bmt_opt(prepared, str(tmp_path / "m.pt"), "--world-size", "2", *flags)
        assert r.returncode == 0, r.stderr
        line = next(l for l in r.stderr.splitlines() if "memory per rank" in l)
        return int(line.rsplit("(", 1)[1].split()[0]), r.stderr
    full, _ = estimate()
    frozen, text = estimate("--freeze", FREEZE[prepared["name"]])
    assert frozen < full
    import re
    m = re.search(r"frozen parameters \(sharded over 2 ranks, .*\((\d+) bytes per rank\)", text)
    assert m, text
    from architectures import build
    model = build(prepared["name"])
    names = frozen_names(model, FREEZE[prepared["name"]])
    whole = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n in names)
    assert whole / 2 <= int(m.group(1)) <= (whole + 512 * len(names)) / 2, (m.group(1), whole)


def test_resume_is_bit_exact_and_checks_the_frozen_base(prepared, tmp_path, capsys):
    """A run resumed from step 3's checkpoint (written by the n2 run) ends bit
    for bit as the run that wrote it; bmt-to-hf of the last checkpoint with
    --sharded writes the whole model (frozen parameters from sharded.pt);
    the checkpoint against other frozen weights is refused."""
    if prepared["name"] != "llama":
        pytest.skip("one model is enough (LLaMA: its frozen embedding feeds a recomputed block)")
    from safetensors.torch import load_file
    name = prepared["name"]
    if "n2" not in prepared["runs"]:
        test_frozen_training_matches_eager(prepared, "n2")
    sharded, saved = prepared["runs"]["n2"]
    ck = Path(prepared["tmp"]) / "ck"
    from test_zero_multirank import torchrun
    common = ["--batches", os.path.join(prepared["tmp"], "batches.pt"), "--objective",
              "causal-lm", *TRAIN_FLAGS]
    folder = ck / "step-00000003"
    meta = json.load(open(folder / "checkpoint.json"))
    assert meta["plan"]["frozen_base"]
    resumed = tmp_path / "resumed.safetensors"
    r = torchrun(2, sharded, "--steps", STEPS, *common, "--resume", str(folder),
                 "--save-params", str(resumed), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert_identical(load_file(str(resumed)), load_file(saved))
    # At another world size (1 rank, its own plan): the trainable shards
    # resharded, the frozen ones read from its sharded.pt; steps 4 and 5 as
    # eager's, the frozen parameters untouched.
    if "n1" not in prepared["runs"]:
        test_frozen_training_matches_eager(prepared, "n1")
    log1, saved1 = tmp_path / "one.jsonl", tmp_path / "one.safetensors"
    r = torchrun(1, prepared["runs"]["n1"][0], "--steps", STEPS, *common, "--resume",
                 str(folder), "--log-file", str(log1), "--save-params", str(saved1), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resharded to this run's layout" in r.stdout, r.stdout
    log = [x for x in map(json.loads, open(log1)) if x["kind"] == "train" and x["step"] > 3]
    assert [x["step"] for x in log] == [4, 5]
    lrs = {x["step"]: x["lr"] for x in map(json.loads, open(os.path.join(prepared["tmp"], "n2.jsonl")))
           if x["kind"] == "train"}
    losses, start, trained, frozen_set = eager(prepared, lrs)
    for x in log:
        assert_loss_close(x["loss"], losses[x["step"] - 1], what=f"resumed loss of step {x['step']}")
    got = load_file(str(saved1))
    for n in frozen_set:
        assert_identical(got[n], start[n], n)
    assert_trained_close(got, {n: p for n, p in trained.items() if n not in frozen_set},
                         sum(lrs.values()))
    # bmt-to-hf: the trainable parameters from the checkpoint, the frozen
    # ones from sharded.pt: what from_pretrained loads is the whole model.
    import transformers
    from architectures import build
    config = tmp_path / "config.json"
    build(name).config.to_json_file(str(config))
    hf = tmp_path / "hf"
    from bmt.to_hf import main as to_hf  # in process: no second interpreter start
    assert to_hf([str(ck / "step-00000005"), "-o", str(hf), "--config", str(config),
                  "--sharded", sharded]) == 0
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(hf)).state_dict()
    want = load_file(saved)
    for n, value in loaded.items():
        assert_identical(value, want[n], n)
    # Other frozen weights: the same model with one frozen tensor changed.
    model = build(name)
    frozen = sorted(frozen_names(model, FREEZE[name]))
    with torch.no_grad():
        model.get_parameter(frozen[0]).add_(1.0)
    other_pt = str(tmp_path / "other.pt")
    inputs = {"input_ids": torch.zeros(2, 8, dtype=torch.long),
              "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    with torch.no_grad():
        torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(other_pt)
    other = str(tmp_path / "other.sharded.pt")
    r = subprocess.run([binary("bmt-opt"), other_pt, "-o", other, "--world-size", "2",
                        "--freeze", FREEZE[name]], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = torchrun(2, other, "--steps", STEPS, *common, "--resume", str(folder), timeout=300)
    assert r.returncode != 0
    errors = [l for l in (r.stdout + r.stderr).splitlines() if "error" in l.lower()]
    assert any("was trained against other frozen parameters" in l for l in errors), errors
    # bmt-to-hf refuses that sharded.pt too (its frozen weights would be written).
    capsys.readouterr()
    assert to_hf([str(ck / "step-00000005"), "-o", str(tmp_path / "refused"), "--config",
                  str(config), "--sharded", other]) == 1
    assert "was trained against other frozen parameters" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def test_frozen_member_of_a_group_in_parts(tmp_path):
    """bmt-to-hf's reader of frozen parameters (bmt.sharded_run) finds a
    member of a frozen storage group split into parts (a group over 64 MiB,
    docs/sharded-format.md) across the records it spans: a synthetic
    archive, 10 elements at element 4 of parts of 6."""
    import io
    import zipfile
    from types import SimpleNamespace
    from bmt.sharded_run import frozen_bytes, frozen_parameters
    w = torch.arange(1, 11, dtype=torch.float32)
    buffer = torch.zeros(16)
    buffer[4:14] = w
    parts = [f"bmt/weights/group0.{k}" for k in range(3)]
    plan = {"tensors": [{"name": "w", "aliases": ["v"], "is_parameter": True,
                         "requires_grad": False, "dtype": "float32", "shape": [10], "record": "",
                         "offset": 0, "group": 0}],
            "groups": [{"name": "h.0.frozen.float32", "dtype": "float32", "members": [0],
                        "offsets": [4], "size": 16, "record": "", "parts": parts, "part_size": 6,
                        "frozen": True}]}
    path = str(tmp_path / "parts.sharded.pt")
    pickled = io.BytesIO()
    torch.save(plan, pickled)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("top/bmt/plan.pkl", pickled.getvalue())
        z.writestr("top/bmt/program.mlir", "")
        for k, part in enumerate(parts):
            z.writestr("top/" + part, buffer[6 * k:6 * k + 6].numpy().tobytes())
    found = frozen_parameters(path, torch)
    assert found["w"] == found["v"]
    segments = found["w"][0]
    assert [(r, o, n) for r, o, n in segments] == [
        ("top/" + parts[0], 16, 8), ("top/" + parts[1], 0, 24), ("top/" + parts[2], 0, 8)]
    t = SimpleNamespace(name="w", record=segments)
    assert b"".join(frozen_bytes(path, t)) == w.numpy().tobytes()


@pytest.mark.parametrize("patterns,message", [
    ("model.nothing.*", "pattern 'model.nothing.*' matches no parameter"),
    ("*", "every parameter is frozen, so nothing would train"),
    ("a,,b", "empty pattern"),
    ("", "--freeze was given an empty value"),
])
def test_freeze_errors(prepared, tmp_path, patterns, message):
    """One error line, no output."""
    if prepared["name"] != "gpt2":
        pytest.skip("one model is enough")
    out = tmp_path / "x.pt"
    r = bmt_opt(prepared, str(out), "--freeze", patterns)
    errors = [l for l in r.stderr.splitlines() if "error:" in l]
    assert r.returncode == 1 and len(errors) == 1 and message in errors[0], r.stderr
    assert not out.exists()
