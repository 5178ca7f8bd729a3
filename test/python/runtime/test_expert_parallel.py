"""Expert parallelism (bmt-opt --expert-parallel E; docs/passes/moe-layers.md,
"Expert parallelism"): Qwen3-MoE, Mixtral and gpt-oss (its expert biases
indexed by the received rows' expert ids; 4 experts, top-2, 2 layers;
scripts/architectures.py) trained 5 AdamW steps under torchrun on N CPU
ranks with expert groups of E consecutive ranks, against eager transformers
on the same weights and global batches (scripts/parallel_matrix.py's
export, batches and training flags): every loss within LOSS_ULPS and the
final parameters by assert_trained_close and within 1e-4 (DESIGN.md's bar);
each step's logged expert_tokens_min / _max equal the counts of eager's
router top-k ids over the step's rows exactly (each rank counts the tokens
it routes, before the all-to-all). One plan per (E, recompute, split)
serves N = 2 and 4 (a plan without --world-size runs on any multiple of E).
Cells, the experts' weights split over the expert group (the default):
(N, E) = (2, 2), (4, 2) for Qwen3-MoE, (4, 4) for Mixtral, (2, 2) for
gpt-oss; stored whole on every rank (--split-expert-weights=false): (4, 4)
for Qwen3-MoE; recomputing every block or none. Checkpoints (format
version 3 when split): the Mixtral (4, 4) cell's, saved at step 2, resumed
at (4, 4) bit for bit and at (2, 2) and (1, 1) against eager, and refused
with one line when a slice is corrupt; the replicated Qwen3-MoE (4, 4)
cell's resumed split at (2, 2), and its split (4, 2) cell's resumed
replicated at (4, 4), against eager; bmt-to-hf of a split one.

The errors, each one line: E not dividing a layer's experts, E > 1 on a
model without MoE layers, E with tensor parallelism, hybrid sharding of
split experts (bmt-opt), a world size that is not a multiple of E, and
optimizer offload and Adafactor with split experts (bmt-run).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest
import torch

from bmt_paths import REPO, binary

sys.path.insert(0, os.path.join(REPO, "scripts"))
import architectures  # noqa: E402
import parallel_matrix  # noqa: E402
from eager import eager_training  # noqa: E402
from numerics import assert_loss_close, assert_trained_close  # noqa: E402
from test_zero_multirank import torchrun  # noqa: E402

# (model, N, E, recompute, split): split, the experts' weights split over
# the expert group (bmt-opt's default); else --split-expert-weights=false
CELLS = [("qwen3_moe", 2, 2, True, True), ("qwen3_moe", 4, 2, False, True),
         ("qwen3_moe", 4, 4, True, False), ("mixtral", 4, 4, False, True),
         ("gpt_oss", 2, 2, True, True)]


_PREPARED = {}  # model -> its preparation, shared by every test of the module


@pytest.fixture(scope="module")
def prepared(request, tmp_path_factory):
    """The model traced once, its batches, its plans by (E, recompute), its
    runs by cell and (lazily) the eager run with its router counts."""
    name = request.param
    if name not in _PREPARED:
        prep = parallel_matrix.prepare(name, tmp_path_factory.mktemp(name))
        prep.update(plans={}, runs={})
        _PREPARED[name] = prep
    return _PREPARED[name]


def plan(prep, experts, recompute, split=True):
    key = (experts, recompute, split)
    if key not in prep["plans"]:
        sharded = os.path.join(prep["tmp"], f"ep{experts}{'' if recompute else '-none'}"
                               f"{'' if split else '-replicated'}.sharded.pt")
        r = subprocess.run([binary("bmt-opt"), prep["archive"], "-o", sharded, "--expert-parallel",
                            str(experts), "--checkpoint", "all" if recompute else "none",
                            *([] if split else ["--split-expert-weights=false"])],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        if experts > 1:
            assert f"experts split over expert groups of {experts} ranks" in r.stderr, r.stderr
            assert f"expert parallel: {experts} ranks per expert group" in r.stderr, r.stderr
            assert ("expert parameters split over the expert group" in r.stderr) == split, \
                r.stderr
        prep["plans"][key] = sharded
    return prep["plans"][key]


def eager_reference(prep, lrs):
    """Losses, final parameters and each step's [layers, experts] counts of
    the routers' top-k ids (one forward of the global batch a step)."""
    if "eager" not in prep or prep["eager"] is None:
        model = architectures.build(prep["name"])
        gates = [m for n, m in model.named_modules() if n.endswith(("mlp.gate", "mlp.router"))]
        experts = model.config.num_experts if hasattr(model.config, "num_experts") \
            else model.config.num_local_experts
        counts = []
        hooks = [g.register_forward_hook(lambda _m, _i, out: counts.append(
            torch.bincount(out[2].reshape(-1), minlength=experts))) for g in gates]
        losses = eager_training(model, prep["batches"], parallel_matrix.STEPS, 1,
                                lambda s: lrs[s], parallel_matrix.CLIP,
                                parallel_matrix.WEIGHT_DECAY)
        for h in hooks:
            h.remove()
        assert len(counts) == parallel_matrix.STEPS * len(gates) == parallel_matrix.STEPS * 2
        steps = [torch.stack(counts[s * len(gates):(s + 1) * len(gates)])
                 for s in range(parallel_matrix.STEPS)]
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        prep["eager"] = (losses, params, steps)
    return prep["eager"]


def train(prep, ranks, experts, recompute, *more, name=None, split=True):
    """bmt-run under torchrun on the cell's plan with the matrix's training
    flags: (train records, saved parameters, stdout). Without `more`, the
    cell's run, once (it also saves a checkpoint at step 2, in
    `ck-<cell>`)."""
    from safetensors.torch import load_file
    cell = name or (f"n{ranks}-ep{experts}-{'recompute' if recompute else 'none'}"
                    f"{'' if split else '-replicated'}")
    if not more and cell in prep["runs"]:
        return prep["runs"][cell]
    log = os.path.join(prep["tmp"], f"{cell}.jsonl")
    saved = os.path.join(prep["tmp"], f"{cell}.safetensors")
    if not more:
        more = ("--checkpoint-dir", os.path.join(prep["tmp"], f"ck-{cell}"),
                "--checkpoint-every", 2)
    r = torchrun(ranks, plan(prep, experts, recompute, split), "--batches",
                 os.path.join(prep["tmp"], "batches.pt"), "--steps", parallel_matrix.STEPS,
                 "--objective", "causal-lm", *parallel_matrix.TRAIN_FLAGS, "--log-file", log,
                 "--save-params", saved, *more, timeout=parallel_matrix.TIMEOUT_S)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = ([x for x in map(json.loads, open(log)) if x["kind"] == "train"], load_file(saved),
           r.stdout)
    if name is None:
        prep["runs"][cell] = out
    return out


@pytest.mark.parametrize("prepared,ranks,experts,recompute,split",
                         [((m, n, e, rc, sp)) for m, n, e, rc, sp in CELLS], indirect=["prepared"],
                         ids=[f"{m}-n{n}-ep{e}-{'recompute' if rc else 'none'}"
                              f"{'' if sp else '-replicated'}" for m, n, e, rc, sp in CELLS])
def test_training_matches_eager(prepared, ranks, experts, recompute, split):
    """Losses, final parameters and the logged expert load against eager.
    Split: each rank's blocks gather only its position's X/E experts (the
    run line's count: every parameter but (E-1)/E of the experts'), and
    --save-params puts the experts back together."""
    train_records, params, stdout = train(prepared, ranks, experts, recompute, split=split)
    assert (f"expert parallel: {ranks // experts} expert groups of {experts} ranks"
            in stdout), stdout
    model = architectures.build(prepared["name"])
    total = sum(p.numel() for p in model.parameters())
    expert = sum(p.numel() for n, p in model.named_parameters() if ".mlp.experts." in n)
    assert expert > 0
    gathered = f"(expert weights split: a rank gathers {total - expert + expert // experts} " \
               "parameters)"
    assert (gathered in stdout) == split, stdout
    assert [x["step"] for x in train_records] == list(range(1, parallel_matrix.STEPS + 1))
    losses, want, counts = eager_reference(prepared, {x["step"]: x["lr"] for x in train_records})
    loss_diff = max(assert_loss_close(x["loss"], l, what=f"loss of step {x['step']}")
                    for x, l in zip(train_records, losses))
    stats = assert_trained_close(params, want, sum(x["lr"] for x in train_records))
    assert stats[0] <= 1e-4, f"max parameter difference {stats[0]:.3g}"
    for x, c in zip(train_records, counts):
        assert (x["expert_tokens_min"], x["expert_tokens_max"]) == (c.min().item(),
                                                                    c.max().item()), (x, c)
    print(f"{prepared['name']} N={ranks} E={experts} recompute={recompute} split={split}: loss "
          f"max diff {loss_diff:.2e}, parameters max {stats[0]:.2e}")


def error_lines(text):
    return [l[l.index("error:"):].strip() for l in text.splitlines() if "error:" in l]


@pytest.mark.parametrize("prepared", ["qwen3_moe"], indirect=True)
def test_bad_expert_groups_are_refused(prepared, tmp_path):
    """One error line each, no plan written."""
    def refused(*flags):
        out = tmp_path / "refused.sharded.pt"
        r = subprocess.run([binary("bmt-opt"), prepared["archive"], "-o", str(out), *flags],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 1 and not out.exists(), r.stderr
        lines = error_lines(r.stderr)
        assert len(lines) == 1, r.stderr
        return lines[0]

    assert refused("--expert-parallel", "3") == (
        "error: bmt-moe-layers: model.layers.0.mlp.experts.forward has 4 experts, not a "
        "multiple of expert-parallel 3")
    assert refused("--expert-parallel", "2", "--tensor-parallel", "2", "--world-size", "6") == (
        "error: --world-size 6 is not a multiple of --expert-parallel 2 x --tensor-parallel 2")
    assert refused("--expert-parallel", "2", "--tensor-parallel", "2", "--sequence-parallel",
                   "--world-size", "4") == (
        "error: --expert-parallel 2 with --sequence-parallel is not supported (drop "
        "--sequence-parallel)")
    assert refused("--expert-parallel", "2", "--world-size", "3") == (
        "error: --world-size 3 is not a multiple of --expert-parallel 2")
    assert refused("--split-expert-weights") == (
        "error: --split-expert-weights needs --expert-parallel > 1")
    assert refused("--expert-parallel", "2", "--shard-group-size", "2") == (
        "error: --shard-group-size with --expert-parallel 2: hybrid sharding of experts split "
        "over the expert group is not supported (add --split-expert-weights=false to store "
        "every expert on every rank)")
    # A world size that is not a multiple of E, at bmt-run's start.
    sharded = plan(prepared, 2, True)
    r = torchrun(3, sharded, "--batches", os.path.join(prepared["tmp"], "batches.pt"),
                 "--steps", 1, timeout=parallel_matrix.TIMEOUT_S)
    assert r.returncode != 0
    assert ("expert parallelism (2 ranks per expert group) needs a world size that is a "
            "multiple of 2, not 3 ranks") in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    # With T = 2 the expert groups are among the data-parallel ranks: E must
    # divide N / T, at bmt-run's start; checkpoints of such a plan are refused.
    tp_ep = tmp_path / "tp2-ep2.sharded.pt"
    subprocess.run([binary("bmt-opt"), prepared["archive"], "-o", str(tp_ep), "--tensor-parallel",
                    "2", "--expert-parallel", "2", "--world-size", "4"], check=True, capture_output=True, timeout=300)
    r = torchrun(2, tp_ep, "--batches", os.path.join(prepared["tmp"], "batches.pt"),
                 "--steps", 1, timeout=parallel_matrix.TIMEOUT_S)
    assert r.returncode != 0
    assert ("expert parallelism (2 ranks per expert group of the data-parallel ranks, tensor "
            "parallel 2) needs a world size that is a multiple of 4, not 2 ranks") in (
        r.stdout + r.stderr), r.stdout[-2000:] + r.stderr[-2000:]
    r = torchrun(4, tp_ep, "--batches", os.path.join(prepared["tmp"], "batches.pt"),
                 "--steps", 1, "--checkpoint-dir", tmp_path / "ck", timeout=parallel_matrix.TIMEOUT_S)
    assert r.returncode != 0
    lines = set(error_lines(r.stdout + r.stderr))
    assert len(lines) == 1 and ("checkpoints of expert weights split over the expert group with "
                                "tensor parallelism (2 ranks per TP group) are not supported yet "
                                "(recompile with --split-expert-weights=false to save and "
                                "resume them)") in next(iter(lines)), r.stderr[-2000:]
    # What split experts cannot do yet, each naming the flag that avoids it.
    for flags, message in (
            (["--offload-optimizer"], "--offload-optimizer with expert parameters split over "
             "the expert group is not supported: drop --offload-optimizer, or recompile with "
             "--split-expert-weights=false"),
            (["--optimizer", "adafactor"], "--optimizer adafactor factors each parameter over "
             "its shard group, and this plan splits expert parameters over the expert group: use "
             "another optimizer or recompile with --split-expert-weights=false")):
        r = torchrun(2, sharded, "--batches", os.path.join(prepared["tmp"], "batches.pt"),
                     "--steps", 1, *flags, timeout=parallel_matrix.TIMEOUT_S)
        assert r.returncode != 0
        lines = set(error_lines(r.stdout + r.stderr))
        assert len(lines) == 1 and message in next(iter(lines)), r.stderr[-2000:]


def test_a_model_without_moe_layers_is_refused(tmp_path):
    model = architectures.build("llama")
    ids = torch.randint(0, architectures.VOCAB, (2, 8))
    with torch.no_grad():
        torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids,
                                                     "attention_mask": torch.ones_like(ids)},
                        strict=False).save(str(tmp_path / "m.pt"))
    out = tmp_path / "m.sharded.pt"
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / "m.pt"), "-o", str(out),
                        "--expert-parallel", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and not out.exists(), r.stderr
    assert error_lines(r.stderr) == [
        "error: bmt-moe-layers: expert-parallel 2 but the model has no mixture-of-experts "
        "layer this pass lowers"], r.stderr


def resumed_as_eager(prep, cell, records, params, what):
    """The resumed run's steps 3..5 against eager's: losses within LOSS_ULPS
    and parameters within 1e-4 (DESIGN.md's bar)."""
    assert [x["step"] for x in records] == [3, 4, 5], records
    losses, want, _ = eager_reference(prep, {x["step"]: x["lr"] for x in cell})
    worst = max(assert_loss_close(x["loss"], l, what=f"loss of step {x['step']}")
                for x, l in zip(records, losses[2:]))
    stats = assert_trained_close(params, want, sum(x["lr"] for x in cell))
    assert stats[0] <= 1e-4, f"{what}: max parameter difference {stats[0]:.3g}"
    print(f"{what}: loss diff {worst:.1e}, parameters {stats[0]:.1e}")


@pytest.mark.parametrize("prepared", ["mixtral"], indirect=True)
def test_checkpoints_resume_at_the_same_and_another_expert_group(prepared):
    """The checkpoint the (N, E) = (4, 4) cell saved at step 2, its experts
    split over the expert group (format version 3: each rank wrote its shard
    of its position's experts), resumes there bit for bit (the last 3
    losses and the final parameters equal the cell's), and on (2, 2) and
    (1, 1) (E = 1: the experts stored whole) as eager trains. A corrupt byte
    in an expert slice is refused in one line before any step."""
    cell, params, _ = train(prepared, 4, 4, False)
    folder = os.path.join(prepared["tmp"], "ck-n4-ep4-none", "step-00000002")
    meta = json.load(open(os.path.join(folder, "checkpoint.json")))
    assert (meta["version"], meta["expert_parallel"]) == (3, 4)
    experts = [s for s in meta["spaces"] if "ep_rank" in s]
    assert [s["ep_rank"] for s in experts] == [0, 1, 2, 3] * 2 and \
        all(s["shards"] == 1 for s in experts), experts
    # Each rank's file holds its own position's experts and no other's.
    for rank in range(4):
        with open(os.path.join(folder, f"rank-{rank:05d}.safetensors"), "rb") as f:
            names = set(json.loads(f.read(struct.unpack("<Q", f.read(8))[0])))
        held = [s.get("ep_rank") for k, s in enumerate(meta["spaces"])
                if f"s{k}.param" in names and "ep_rank" in s]
        assert held == [rank, rank], (rank, held)
    resume = ("--resume", folder)
    same, same_params, _ = train(prepared, 4, 4, False, *resume, name="resumed-n4-ep4")
    assert [x["step"] for x in same] == [3, 4, 5], same
    assert [x["loss"] for x in same] == [x["loss"] for x in cell[2:]]
    for n, t in params.items():
        assert torch.equal(same_params[n], t), n
    for ranks, ep in ((2, 2), (1, 1)):
        other, other_params, stdout = train(prepared, ranks, ep, False, *resume,
                                            name=f"resumed-n{ranks}-ep{ep}")
        assert ("expert weights split over 4 ranks per expert group, resharded to this run's "
                "layout") in stdout, stdout
        resumed_as_eager(prepared, cell, other, other_params,
                         f"resumed at ({ranks}, {ep}) from (4, 4)")
    # One flipped byte of position 1's experts: rank 1's file, the first
    # expert space of position 1 (its whole shard: shards 1).
    bad = os.path.join(prepared["tmp"], "ck-corrupt")
    shutil.copytree(folder, bad)
    k = next(k for k, s in enumerate(meta["spaces"]) if s.get("ep_rank") == 1)
    path = os.path.join(bad, "rank-00001.safetensors")
    with open(path, "r+b") as f:
        length = struct.unpack("<Q", f.read(8))[0]
        begin = json.loads(f.read(length))[f"s{k}.param"]["data_offsets"][0]
        f.seek(8 + length + begin + 5)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x10]))
    r = torchrun(2, plan(prepared, 2, False), "--batches",
                 os.path.join(prepared["tmp"], "batches.pt"), "--steps", 3, "--resume", bad,
                 "--log-file", os.path.join(prepared["tmp"], "corrupt.jsonl"),
                 timeout=parallel_matrix.TIMEOUT_S)
    assert r.returncode != 0
    log = os.path.join(prepared["tmp"], "corrupt.jsonl")
    assert not os.path.exists(log) or not [x for x in map(json.loads, open(log))
                                           if x["kind"] == "train"]
    found = [e for e in error_lines(r.stdout + r.stderr) if "checksum mismatch" in e]
    assert found and f"{bad}/rank-00001.safetensors: corrupt tensor s{k}.param (chunk 0 " \
        in found[0] and "model.layers.0.mlp.experts." in found[0], r.stderr[-3000:]


@pytest.mark.parametrize("prepared", ["qwen3_moe"], indirect=True)
def test_checkpoints_resume_between_split_and_replicated_experts(prepared):
    """The (4, 4) cell with every expert on every rank (--split-expert-weights
    =false: format version 1) resumed on (2, 2) with the experts split (each
    rank reads its experts' rows from the dense groups' shards), and the
    split (4, 2) cell's checkpoint (each position's experts in 2 shards, in
    the files of ranks p and 2 + p) resumed on (4, 4) with every expert on
    every rank: both as eager trains from step 3."""
    for (ranks, experts, recompute, split), (to_ranks, to_experts, to_split) in (
            ((4, 4, True, False), (2, 2, True)), ((4, 2, False, True), (4, 4, False))):
        cell, _, _ = train(prepared, ranks, experts, recompute, split=split)
        folder = os.path.join(prepared["tmp"], f"ck-n{ranks}-ep{experts}-"
                              f"{'recompute' if recompute else 'none'}"
                              f"{'' if split else '-replicated'}", "step-00000002")
        meta = json.load(open(os.path.join(folder, "checkpoint.json")))
        assert meta["version"] == (3 if split else 1)
        assert all(s["shards"] == ranks // experts for s in meta["spaces"] if "ep_rank" in s)
        other, other_params, stdout = train(
            prepared, to_ranks, to_experts, True, "--resume", folder, split=to_split,
            name=f"resumed-n{to_ranks}-ep{to_experts}{'' if to_split else '-replicated'}")
        assert "resharded to this run's layout" in stdout, stdout
        resumed_as_eager(prepared, cell, other, other_params,
                         f"({ranks}, {experts}) {'split' if split else 'replicated'} resumed at "
                         f"({to_ranks}, {to_experts}) {'split' if to_split else 'replicated'}")


def test_bmt_to_hf_writes_an_expert_parallel_checkpoint(tmp_path, capsys):
    """bmt-export-hf of a Mixtral checkpoint, compiled with --expert-parallel
    2 (the experts split over the expert group: a version-3 checkpoint, each
    rank's file holding its position's experts), trained 2 steps on 2 ranks
    with a checkpoint: bmt-to-hf writes what from_pretrained loads (no key
    missing or unexpected), every tensor equal to bmt-run's --save-params of
    the run (the 3-D experts put back together in transformers' layout), and
    the loaded model's logits equal eager's on those weights within 1e-5
    (sdpa against eager attention). A flipped byte in position 1's experts
    is one error line (its CRC-32) and no output."""
    import transformers
    from safetensors.torch import load_file
    from bmt import to_hf
    from bmt_paths import tool
    architectures.build("mixtral").save_pretrained(tmp_path / "ckpt")
    subprocess.run([*tool("bmt-export-hf"), "--checkpoint", str(tmp_path / "ckpt"),
                    "--load-weights", "-o", str(tmp_path / "m.pt")], check=True,
                   capture_output=True)
    sharded = tmp_path / "m.sharded.pt"
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / "m.pt"), "-o", str(sharded),
                        "--expert-parallel", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    batches = torch.randint(0, architectures.VOCAB, (2, 4, 9),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "b.pt")
    r = torchrun(2, sharded, "--batches", tmp_path / "b.pt", "--steps", 2, "--lr", "1e-2",
                 "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", 2,
                 "--save-params", tmp_path / "p.safetensors")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    folder = tmp_path / "ck" / "step-00000002"
    meta = json.loads((folder / "checkpoint.json").read_text())
    assert (meta["version"], meta["expert_parallel"]) == (3, 2)
    assert to_hf.main([str(folder), "-o", str(tmp_path / "hf")]) == 0
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    want = load_file(tmp_path / "p.safetensors")
    got = model.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    experts = "model.layers.0.mlp.experts.gate_up_proj"
    assert got[experts].dim() == 3 and not torch.equal(
        got[experts], architectures.build("mixtral").state_dict()[experts])
    eager = architectures.build("mixtral")
    eager.load_state_dict(want)
    ids = batches[0][:, :-1]
    with torch.no_grad():
        got_logits = model.eval()(input_ids=ids).logits
        want_logits = eager.eval()(input_ids=ids).logits
    # The same weights; the attention may differ (sdpa as exported, eager in
    # the reference): a few ulps of the logits.
    assert (got_logits - want_logits).abs().max().item() <= 1e-5
    # A flipped byte of position 1's experts (rank 1's file).
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    k = next(k for k, s in enumerate(meta["spaces"]) if s.get("ep_rank") == 1)
    data = bytearray((broken / "rank-00001.safetensors").read_bytes())
    length = struct.unpack("<Q", data[:8])[0]
    data[8 + length + json.loads(data[8:8 + length])[f"s{k}.param"]["data_offsets"][0] + 5] ^= 0x40
    (broken / "rank-00001.safetensors").write_bytes(bytes(data))
    capsys.readouterr()
    assert to_hf.main([str(broken), "-o", str(tmp_path / "hf-broken")]) == 1
    errors = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and f"rank-00001.safetensors: corrupt tensor s{k}.param" in errors[0] \
        and "checksum" in errors[0], errors
    assert not (tmp_path / "hf-broken").exists()
    # Another number of experts (8): another model, refused in one line
    # before anything is read.
    subprocess.run([*tool("bmt-export-hf"), "--config", str(tmp_path / "ckpt" / "config.json"),
                    "--set", "num_local_experts=8", "-o", str(tmp_path / "m8.pt")], check=True,
                   capture_output=True)
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / "m8.pt"), "-o",
                        str(tmp_path / "m8.sharded.pt"), "--expert-parallel", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = torchrun(2, tmp_path / "m8.sharded.pt", "--batches", tmp_path / "b.pt", "--steps", 3,
                 "--resume", folder)
    assert r.returncode != 0
    errors = set(error_lines(r.stdout + r.stderr))
    assert len(errors) == 1, errors
    assert f"error: {folder} is a checkpoint of another model: model.layers.0.mlp." \
        in next(iter(errors)) and "[4, " in next(iter(errors)) and \
        "[8, " in next(iter(errors)), errors
