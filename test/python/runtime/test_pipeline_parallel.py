"""Pipeline stages (bmt-opt --pipeline-parallel P; docs/passes/pipeline.md,
docs/runtime/pipeline.md) on the tiny GPT-2 and LLaMA fixtures: the cut,
each stage's parameter count against the eager model's own parameters (the
embedding on stage 0, the final norm and head on the last, GPT-2's tied
wte on both), the head's FLOPs on the last stage (GPT-2 passes its tied
weight to @lm_head.forward as an argument), the plan's format version, and one error line for what is
refused: P larger than the blocks, a world size P x T does not divide,
and bmt-run given a pipelined plan on a world size P does not divide.

Then bmt-run trains the stages under torchrun on CPU ranks (1F1B over
--micro-batches M, ZeRO over each stage's D ranks): 5 AdamW steps of GPT-2
(tied wte) at P = 2 on N = 2 and 4, LLaMA without recompute at P = 2, GPT-2
(recompute) and LLaMA (without) at P = 2 x T = 2 on N = 4 (TP innermost),
against eager transformers (numerics.py's bounds) and against the same plan
compiled without stages at the same accumulation (M micro-batches); and
what a pipeline does not run is one error line before training."""
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
import torch

from bmt_paths import binary
from eager import build, compile_model, eager_training
from numerics import (OPTIMIZER_LOSS_TOL, OPTIMIZER_PARAM_TOL, assert_loss_close,
                      assert_trained_close)


def stage_lines(remarks):
    return re.findall(r"stage (\d+): blocks (\d+)\.\.(\d+).*?, (\d+) parameters", remarks)


def error_lines(text):
    return [l[l.index("error:"):].strip() for l in text.splitlines() if "error:" in l]


@pytest.mark.parametrize("name, prefix, before, after", [
    ("gpt2", "transformer.h.", ("transformer.wte.", "transformer.wpe."),
     ("transformer.ln_f.", "transformer.wte.")),
    ("llama", "model.layers.", ("model.embed_tokens.",), ("model.norm.", "lm_head.")),
])
def test_stages_hold_their_parameters(name, prefix, before, after, tmp_path):
    model = build(name)
    sharded = compile_model(model, tmp_path, name,
                            ["--pipeline-parallel", "2", "--world-size", "4"])
    remarks = (tmp_path / f"{name}.remarks").read_text()
    assert re.search(r"pipeline: 2 stages of \S+ over world size 4 \(stage = rank / 2\), 1F1B",
                     remarks), remarks
    # Two blocks, one per stage; the parameters each stage reads, from the
    # eager model's named parameters (a tied weight counts on both stages).
    params = dict(model.named_parameters(remove_duplicate=False))
    def count(prefixes):
        return sum(p.numel() for n, p in params.items() if n.startswith(prefixes))
    want = [count(before + (prefix + "0.",)), count(after + (prefix + "1.",))]
    if name == "llama" and model.config.tie_word_embeddings:
        want[1] -= count(("lm_head.",))  # the tie reads embed_tokens' weight
        want[1] += count(("model.embed_tokens.",))
    got = [(int(s), int(a), int(b), int(n)) for s, a, b, n in stage_lines(remarks)]
    assert got == [(0, 0, 0, want[0]), (1, 1, 1, want[1])], remarks
    tied = "transformer.wte.weight" if name == "gpt2" else None
    if tied:
        assert f"tied across stages 0 and 1 (gradient summed): {tied}" in remarks, remarks
    # The cost model: equal blocks, so the last stage's extra FLOPs are the
    # head's matmul, forward and backward (3 x 2 x V x H per token) over
    # the default micro-batch of 1 x 1024 tokens (the embedding has none).
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / f"{name}.pt"),
                        "--bmt-default-pipeline=pipeline-parallel=2 world-size=4 summary=false"],
                       capture_output=True, text=True, check=True, timeout=300)
    flops = [int(x) for x in re.search(r"flops = array<i64: (\d+), (\d+)>", r.stdout).groups()]
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    assert flops[1] - flops[0] == 6 * vocab * hidden * 1024
    with zipfile.ZipFile(sharded) as z:
        version = [z.read(n) for n in z.namelist() if n.endswith("bmt/version")]
    assert version == [b"bmt-sharded 8\n"]
    # bmt-run: one line, exit status 1, before any rank connects (4 ranks'
    # plan on 1 rank).
    r = subprocess.run([binary("bmt-run"), sharded, "--data", tmp_path / "none.bin", "--steps", "1",
                        "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert error_lines(r.stderr) == [
        f"error: {sharded} is cut into 2 pipeline stages, which need a world size that is a "
        "multiple of 2, not 1"], r.stderr


def test_sizes_the_model_cannot_take_are_refused(tmp_path):
    model = build("llama")
    def refused(*flags):
        r = subprocess.run([binary("bmt-opt"), *flags], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 1, r.stderr
        lines = error_lines(r.stderr)
        assert len(lines) == 1, r.stderr
        return lines[0]
    compile_model(model, tmp_path, "llama")  # the trace, llama.pt
    pt = str(tmp_path / "llama.pt")
    out = str(tmp_path / "refused.sharded.pt")
    assert refused(pt, "-o", out, "--pipeline-parallel", "3", "--world-size", "3") == (
        "error: bmt-pipeline-parallel: pipeline-parallel 3 exceeds the 2 blocks of "
        "model.layers; each stage needs at least one block")
    assert refused(pt, "-o", out, "--pipeline-parallel", "2", "--world-size", "3") == (
        "error: --world-size 3 is not a multiple of --pipeline-parallel 2")
    assert refused(pt, "-o", out, "--pipeline-parallel", "2", "--tensor-parallel", "2",
                   "--world-size", "6") == (
        "error: --world-size 6 is not a multiple of --pipeline-parallel 2 x --tensor-parallel 2")


STEPS = 5
ROWS = 8  # global rows of a step's micro-batch
SEQ = 8
# Evaluation on a held-out token file after steps 2, 4 and 5: 4 windows of
# 4 x (SEQ + 1) tokens (a pipeline's in pieces of 4 / M rows).
EVAL_TOKENS = 4 * 4 * (SEQ + 1)
TRAIN = ["--steps", STEPS, "--lr", "1e-3", "--schedule", "cosine", "--warmup", 2,
         "--clip-grad", 0.5, "--weight-decay", 0.01]


def torchrun(n, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "--no-python", binary("bmt-run"), *map(str, args), "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1", BMT_COMM_TIMEOUT_S="120",
               BMT_DEBUG_RECOMPUTE_NAN="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def pieces(batches, d, m):
    """The micro-batches a pipeline runs, as gradient accumulation's: piece k
    of a step is every data-parallel rank's k-th m-th of its rows."""
    r = ROWS // d
    out = []
    for window in batches:
        for k in range(m):
            out.append(torch.cat([window[i * r + k * r // m: i * r + (k + 1) * r // m]
                                  for i in range(d)]))
    return torch.stack(out)


def build_model(name):
    """The fixture model; "gpt2-4" is GPT-2 with 4 blocks (for P = 4)."""
    if name != "gpt2-4":
        return build(name)
    import transformers
    import make_fixtures
    cls, config = make_fixtures.MODELS["gpt2"](transformers)
    config.n_layer = 4
    torch.manual_seed(0)
    model = cls(config)
    model.eval()
    return model


@pytest.fixture(scope="module", params=["gpt2", "llama", "gpt2-4"])
def traced(request, tmp_path_factory):
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    model = build_model(name)
    compile_model(model, tmp, name)  # the trace, NAME.pt
    batches = torch.randint(0, model.config.vocab_size, (STEPS, ROWS, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp / "batches.pt")
    write_tokens(tmp / "val", torch.randint(0, model.config.vocab_size, (EVAL_TOKENS,),
                                            generator=torch.Generator().manual_seed(4)),
                 model.config.vocab_size)
    return {"name": name, "tmp": tmp, "batches": batches, "eager": {}}


def write_tokens(prefix, tokens, vocab):
    """A token file as bmt-prepare-data writes it (uint16, one document)."""
    tokens.to(torch.int16).numpy().tofile(f"{prefix}.bin")
    meta = {"format": "bmt-tokens", "version": 1, "dtype": "uint16", "num_tokens": len(tokens),
            "num_documents": 1, "vocab_size": vocab, "eos_id": 0, "mask_id": None,
            "pad_id": None, "tokenizer": "synthetic", "source": []}
    with open(f"{prefix}.json", "w") as f:
        json.dump(meta, f)


def train(traced, tag, ranks, flags, batches, *extra):
    tmp = traced["tmp"] / tag
    tmp.mkdir()
    sharded = tmp / "sharded.pt"
    subprocess.run([binary("bmt-opt"), traced["tmp"] / f"{traced['name']}.pt", "-o", sharded,
                    "--world-size", str(ranks), *flags], check=True, capture_output=True)
    torch.save(batches, tmp / "batches.pt")
    log, params = tmp / "log.jsonl", tmp / "params.safetensors"
    r = torchrun(ranks, sharded, "--batches", tmp / "batches.pt", *TRAIN, "--log-file", log,
                 "--save-params", params, *extra)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    from safetensors.torch import load_file
    records = [json.loads(x) for x in open(log) if '"train"' in x]
    traced.setdefault("evals", {})[tag] = [json.loads(x) for x in open(log) if '"eval"' in x]
    return records, load_file(params), r.stdout


@pytest.mark.parametrize("name, stages, ranks, m, flags", [
    ("gpt2", 2, 2, 2, []),
    ("gpt2", 2, 4, 2, []),
    ("llama", 2, 2, 2, ["--checkpoint", "none"]),
    ("gpt2-4", 4, 4, 4, ["--checkpoint", "none"]),
    # P x T x D = 2 x 2 x 1: GPT-2's tied wte vocab-split on stages 0 and 1
    ("gpt2", 2, 4, 2, ["--tensor-parallel", "2"]),
    ("llama", 2, 4, 2, ["--tensor-parallel", "2", "--checkpoint", "none"]),
], ids=["gpt2-p2-n2", "gpt2-p2-n4", "llama-p2-n2-no-recompute", "gpt2-4blocks-p4-n4",
        "gpt2-p2-t2-n4", "llama-p2-t2-n4-no-recompute"])
def test_pipeline_trains_as_eager(traced, name, stages, ranks, m, flags):
    if traced["name"] != name:
        pytest.skip("another model's cell")
    tp = int(flags[flags.index("--tensor-parallel") + 1]) if "--tensor-parallel" in flags else 1
    d = ranks // (stages * tp)  # data-parallel ranks of a stage (and TP rank)
    tag = f"p{stages}-t{tp}-n{ranks}"
    evaluation = ["--eval-data", traced["tmp"] / "val.bin", "--eval-every", 2, "--micro-batch", 4,
                  "--seq-len", SEQ]
    records, params, stdout = train(traced, tag, ranks,
                                    ["--pipeline-parallel", str(stages), *flags],
                                    traced["batches"], "--micro-batches", m, *evaluation)
    assert [x["step"] for x in records] == list(range(1, STEPS + 1))
    lrs = {x["step"]: x["lr"] for x in records}
    # The same plan without stages, M micro-batches accumulated on T x D ranks.
    split = pieces(traced["batches"], d, m)
    plain, plain_params, _ = train(traced, tag + "-plain", d * tp, flags, split,
                                   "--grad-accum", m, *evaluation)
    # Eager transformers on the same micro-batches.
    model = build_model(name)
    want = eager_training(model, split, STEPS, m, lambda s: lrs[s], 0.5, 0.01, ranks=d)
    eager_params = {n: p.detach().clone() for n, p in model.named_parameters()}
    for x, plain_x, loss in zip(records, plain, want):
        assert_loss_close(x["loss"], loss, what=f"{tag}: loss of step {x['step']}")
    stats = assert_trained_close(params, eager_params, sum(lrs.values()))
    loss_diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(records, plain))
    norm_diff = max(abs(x["grad_norm"] - y["grad_norm"]) for x, y in zip(records, plain))
    assert params.keys() == plain_params.keys()
    param_diff = max((params[k] - plain_params[k]).abs().max().item() for k in params)
    # Against the plan without stages: the same arithmetic but for the order
    # of two sums (the tied embedding's two gradients, the norm's squares).
    assert loss_diff <= 1e-6 and param_diff <= 1e-6, (loss_diff, norm_diff, param_diff)
    # Evaluation: the windows' forward through the stages, the loss agreed
    # on every rank, as the plan without stages evaluates them.
    evals, plain_evals = traced["evals"][tag], traced["evals"][tag + "-plain"]
    assert [x["step"] for x in evals] == [2, 4, 5] == [x["step"] for x in plain_evals]
    for x, y in zip(evals, plain_evals):
        assert x["tokens"] == y["tokens"] == 4 * 4 * SEQ
        assert_loss_close(x["val_loss"], y["val_loss"], what=f"{tag}: val loss of step {x['step']}")
    val_diff = max(abs(x["val_loss"] - y["val_loss"]) for x, y in zip(evals, plain_evals))
    print(f"{name} {tag}: eager parameters max {stats[0]:.2e}; against no stages: loss "
          f"{loss_diff:.1e}, grad norm {norm_diff:.1e}, parameters {param_diff:.1e}, "
          f"val loss {val_diff:.1e}")


def test_pipeline_adafactor_matches_torch(traced):
    """--optimizer adafactor over stages (GPT-2, P = 2 on 2 ranks): each
    stage's factored statistics are summed over its own shard group, the
    tied wte updated alike on stage 0 and 1; against torch.optim.Adafactor
    on eager transformers with the same pieces (test_optimizers.py's
    bounds)."""
    if traced["name"] != "gpt2":
        pytest.skip("one model is enough")
    records, params, _ = train(traced, "adafactor", 2, ["--pipeline-parallel", "2"],
                               traced["batches"], "--micro-batches", 2,
                               "--optimizer", "adafactor")
    lrs = {x["step"]: x["lr"] for x in records}
    model = build_model("gpt2")
    want = eager_training(model, pieces(traced["batches"], 1, 2), STEPS, 2, lambda s: lrs[s],
                          0.5, 0.01, optimizer=lambda g: torch.optim.Adafactor(g, lr=1.0))
    assert [x["step"] for x in records] == list(range(1, STEPS + 1))
    for x, loss in zip(records, want):
        assert abs(x["loss"] - loss) <= OPTIMIZER_LOSS_TOL, (x["step"], x["loss"], loss)
    worst = max((params[n].double() - p.detach().double()).abs().max().item()
                for n, p in model.named_parameters())
    moved = max((p.detach().double() - q.detach().double()).abs().max().item()
                for p, q in zip(model.parameters(), build_model("gpt2").parameters()))
    print(f"adafactor p2-n2: parameters max {worst:.2e} (moved up to {moved:.2e})")
    assert worst <= OPTIMIZER_PARAM_TOL and worst < 0.1 * moved, (worst, moved)


def test_exported_program_runs_in_pieces_of_its_shape(traced):
    """A torch.export program is fixed to its example's rows: a pipeline
    runs pieces of a micro-batch's rows / M, so the probe runs one piece.
    GPT-2 exported at 2 x 8, P = 2 on 2 ranks: 8 rows in M = 4 pieces of 2
    train; in M = 8 pieces of 1 they are refused in one line before step 1
    (not an aten::view error inside the step)."""
    if traced["name"] != "gpt2":
        pytest.skip("one model is enough")
    tmp = traced["tmp"] / "pt2"
    tmp.mkdir()
    model = build_model("gpt2")
    ids = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    program = torch.export.export(model, args=(), kwargs={"input_ids": ids,
                                  "attention_mask": torch.ones_like(ids)}, strict=False)
    torch.export.save(program, str(tmp / "gpt2.pt2"))
    sharded = tmp / "sharded.pt"
    subprocess.run([binary("bmt-opt"), tmp / "gpt2.pt2", "-o", sharded, "--pipeline-parallel", "2",
                    "--world-size", "2"], check=True, capture_output=True)
    batches = traced["tmp"] / "batches.pt"
    r = torchrun(2, sharded, "--batches", batches, "--steps", 1, "--micro-batches", 4)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "step 1/1" in r.stdout, r.stdout
    r = torchrun(2, sharded, "--batches", batches, "--steps", 1, "--micro-batches", 8)
    assert r.returncode != 0
    lines = set(error_lines(r.stderr))
    assert len(lines) == 1, r.stderr
    assert next(iter(lines)).startswith(
        f"error: {batches} in pieces of 1 row (--micro-batches 8): the model cannot run a "
        f"micro-batch of 1 x {SEQ} tokens"), lines


def test_what_a_pipeline_does_not_run_is_refused(traced):
    """One error line each, before any rank connects (rank 0 of 2 alone),
    and --micro-batches M not dividing a rank's rows at the first step."""
    if traced["name"] != "gpt2":
        pytest.skip("one model is enough")
    tmp = traced["tmp"] / "refused"
    tmp.mkdir()
    sharded, plain = tmp / "p2.sharded.pt", tmp / "plain.sharded.pt"
    pt = traced["tmp"] / "gpt2.pt"
    subprocess.run([binary("bmt-opt"), pt, "-o", sharded, "--pipeline-parallel", "2",
                    "--world-size", "2"], check=True, capture_output=True)
    subprocess.run([binary("bmt-opt"), pt, "-o", plain], check=True, capture_output=True)
    batches = traced["tmp"] / "batches.pt"
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT="1", BMT_COMM_TIMEOUT_S="5")

    def refused(plan, *flags):
        r = subprocess.run([binary("bmt-run"), plan, "--batches", batches, "--steps", "1",
                            "--device", "cpu", *map(str, flags)], capture_output=True, text=True,
                           env=env, timeout=120)
        assert r.returncode != 0, r.stdout + r.stderr
        lines = error_lines(r.stderr)
        assert len(lines) == 1, r.stderr
        return lines[0]

    cut = f"error: {sharded} is cut into 2 pipeline stages, which this bmt-run does not run with "
    assert refused(sharded, "--micro-batches", 1) == (
        f"error: --micro-batches 1 is fewer than the 2 pipeline stages of {sharded} (1F1B needs "
        "at least one micro-batch per stage)")
    assert refused(sharded, "--inspect-every", 1, "--log-file", tmp / "log") == cut + "--inspect-every"
    assert refused(sharded, "--offload-optimizer") == cut + "--offload-optimizer"
    assert refused(sharded, "--eval-data", traced["tmp"] / "val.bin", "--micro-batch", 3) == (
        "error: --micro-batches 2 does not divide the 3 rows of an evaluation micro-batch "
        "(--micro-batch), which a pipeline evaluates in pieces as it trains")
    assert refused(plain, "--micro-batches", 2) == (
        f"error: --micro-batches splits micro-batches for a pipeline, and {plain} is not cut "
        "into stages (bmt-opt --pipeline-parallel); use --grad-accum")
    # P x T = 2 x 2: 2 ranks are too few.
    tp = tmp / "p2t2.sharded.pt"
    subprocess.run([binary("bmt-opt"), pt, "-o", tp, "--pipeline-parallel", "2",
                    "--tensor-parallel", "2", "--world-size", "4"], check=True,
                   capture_output=True)
    assert refused(tp) == (
        f"error: {tp} is cut into 2 pipeline stages, which need a world size that is a "
        "multiple of 4 (2 x tensor-parallel 2), not 2")
    # 8 rows a rank (D = 1) in 3 micro-batches: before training, on every rank.
    r = torchrun(2, sharded, "--batches", batches, "--steps", 1, "--micro-batches", 3)
    assert r.returncode != 0
    lines = error_lines(r.stderr)
    assert lines and all("--micro-batches 3 does not divide this rank's 8 rows" in x
                         for x in lines), r.stderr[-2000:]
