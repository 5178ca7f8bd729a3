"""bmt-opt --lora against peft on eager transformers: 5 AdamW steps of the
tiny GPT-2 (Conv1D c_attn: peft's fan_in_fan_out), LLaMA, Qwen3, BERT
(next-token objective) and T5 (source/target pairs) of
scripts/architectures.py on 1 and 2 CPU ranks, GPT-2 and LLaMA also with
tensor parallelism (T = 2 on 2 ranks; LLaMA also T = 2 x D = 2 on 4 and T = 2
with sequence parallelism: the adapters follow their base's column/row
split), the adapters' initial A
values copied into the peft model (bmt's exporter draws them reproducibly:
docs/passes/lora.md); every loss and the trained adapters within
numerics.py's bounds, the base bit-identical to the start. Dropout 0 there;
dropout 0.1 trains bit for bit alike with and without recompute. A T = 2
checkpoint resumes on one rank as the uninterrupted run; bmt-to-hf
--adapter's folder of a T = 2 run loads in peft, --merge's model is peft's
merge.
"""
import json
import math
import os
import re
import subprocess
import sys
import zlib

import pytest
import torch

from bmt_paths import REPO, binary
from eager import assert_frozen_sharded, train_on_batches as train
from numerics import assert_close, assert_identical, assert_loss_close, assert_trained_close

sys.path.insert(0, os.path.join(REPO, "scripts"))
import parallel_matrix  # noqa: E402
from parallel_matrix import CLIP, STEPS, TRAIN_FLAGS, WEIGHT_DECAY  # noqa: E402

peft = pytest.importorskip("peft")

R, ALPHA = 4, 8
TARGETS = {"gpt2": (["c_attn"], True), "llama": (["q_proj", "v_proj", "down_proj"], False),
           "qwen3": (["q_proj", "v_proj", "down_proj"], False),
           "bert (masked LM)": (["query", "value"], False), "t5": (["q", "v"], False)}
# mode: (ranks, bmt-opt flags, the models it runs)
MODES = {"n1": (1, [], set(TARGETS)), "n2": (2, [], set(TARGETS)),
         "tp2": (2, ["--tensor-parallel", "2"], {"gpt2", "llama"}),
         "tp2-n4": (4, ["--tensor-parallel", "2"], {"llama"}),
         "tp2-sp": (2, ["--tensor-parallel", "2", "--sequence-parallel"], {"llama"}),
         # 2 pipeline stages (2 pieces of each step's rows): GPT-2's frozen
         # tied wte read on both, LLaMA's untied head
         "p2": (2, ["--pipeline-parallel", "2"], {"gpt2", "llama"})}


@pytest.fixture(scope="module", params=list(TARGETS))
def prepared(request, tmp_path_factory):
    stem = re.sub(r"\W+", "_", request.param).strip("_")
    prep = parallel_matrix.prepare(request.param, tmp_path_factory.mktemp(stem))
    prep["reference"] = None
    return prep


def spec(name, dropout=0.0):
    return f"r={R},alpha={ALPHA},dropout={dropout},targets=" + ",".join(TARGETS[name][0])


def initial_a(name, shape):
    """lora_A's value as bmt's exporter draws it (uniform in +-1/sqrt(in))."""
    bound = 1.0 / math.sqrt(shape[1])
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.empty(shape).uniform_(-bound, bound, generator=g)


def bmt_seed(seed=0, rank=0):
    """The seed bmt-run gives the default generators of data-parallel rank
    `rank` for --seed `seed` (Model::seedGenerators: SplitMix64)."""
    mask = (1 << 64) - 1
    z = (seed + 0x9E3779B97F4A7C15 * (rank + 1) + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def peft_reference(prep, lrs, dropout=0.0):
    """peft's LoRA model on the same base, A copied from bmt's rule, trained
    by eager_training; (losses, base start, trained adapters by bmt name).
    With dropout > 0 the default generator starts where bmt-run's rank 0
    starts, so that peft's dropout layers draw bmt's masks."""
    key = "reference" if dropout == 0 else f"reference-dropout-{dropout}"
    if prep.get(key) is None:
        from architectures import build
        from eager import eager_training
        targets, fan_in_fan_out = TARGETS[prep["name"]]
        base = build(prep["name"])
        start = {n: p.detach().clone() for n, p in base.named_parameters()}
        config = peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=dropout, target_modules=targets,
                                 fan_in_fan_out=fan_in_fan_out)
        model = peft.get_peft_model(base, config)
        adapters = {}
        for n, p in model.named_parameters():
            if "lora_" not in n:
                continue
            bmt_name = n.removeprefix("base_model.model.").replace(".default.weight", ".weight")
            with torch.no_grad():
                if ".lora_A." in n:
                    p.copy_(initial_a(bmt_name, p.shape))
                else:
                    assert torch.count_nonzero(p) == 0
            adapters[bmt_name] = p
        for name, module in model.named_modules():  # the base stays as traced (eval)
            if name.endswith("lora_dropout"):
                module.train()
        torch.manual_seed(bmt_seed())
        if parallel_matrix.is_seq2seq(prep["name"]):  # teacher forcing on the pairs
            from test_seq2seq import eager_pairs_training
            losses = eager_pairs_training(model, prep["ids"], prep["labels"], STEPS, 1, lrs, CLIP)
            norms = None
        else:  # BERT too: the encoder predicting the next token, no masks drawn
            norms = []  # the adapters' gradient norm of each step (none is clipped)
            losses = eager_training(model, prep["batches"], STEPS, 1, lambda s: lrs[s], CLIP,
                                    WEIGHT_DECAY, after_step=lambda step: norms.append(
                                        torch.cat([p.grad.flatten() for p in adapters.values()])
                                        .norm().item()))
        prep[key] = (losses, start, {n: p.detach().clone() for n, p in adapters.items()})
        prep["norms" if dropout == 0 else key + "-norms"] = norms
    return prep[key]


def compile_lora(prep, out, ranks, *flags):
    return subprocess.run([binary("bmt-opt"), prep["archive"], "-o", out, "--world-size",
                           str(ranks), *flags], capture_output=True, text=True, timeout=300)


def train_lora(prep, sharded, ranks, tag, *extra):
    """eager.train_on_batches; an encoder-decoder trains on its source/target
    pairs (bmt-run's default objective for them) instead of causal-lm windows."""
    if not parallel_matrix.is_seq2seq(prep["name"]):
        return train(prep, sharded, ranks, tag, *extra)
    from test_zero_multirank import torchrun
    log = os.path.join(prep["tmp"], f"{tag}.jsonl")
    saved = os.path.join(prep["tmp"], f"{tag}.safetensors")
    r = torchrun(ranks, sharded, "--batches", os.path.join(prep["tmp"], "batches.pt"),
                 "--steps", STEPS, *TRAIN_FLAGS, "--log-file", log, "--save-params", saved,
                 *extra, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    prep.setdefault("stdout", {})[tag] = r.stdout
    return [x for x in map(json.loads, open(log)) if x["kind"] == "train"], saved


@pytest.mark.parametrize("mode", list(MODES))
def test_lora_training_matches_peft(prepared, mode):
    from safetensors.torch import load_file
    ranks, flags, models = MODES[mode]
    if prepared["name"] not in models:
        pytest.skip(f"{mode} runs {', '.join(sorted(models))}")
    tp = 2 if "--tensor-parallel" in flags else 1
    sharded = os.path.join(prepared["tmp"], f"lora-{mode}.sharded.pt")
    r = compile_lora(prepared, sharded, ranks, "--lora", spec(prepared["name"]), *flags)
    assert r.returncode == 0, r.stderr
    extra = []
    if mode in ("n2", "tp2", "p2"):  # checkpoints for the resume and adapter export tests
        extra = ["--checkpoint-dir", os.path.join(prepared["tmp"], f"ck-{mode}"),
                 "--checkpoint-every", 3]
    log, saved = train_lora(prepared, sharded, ranks, f"lora-{mode}", *extra)
    prepared.setdefault("runs", {})[mode] = (sharded, saved, log)
    # The frozen base is ZeRO-sharded (and TP-split): a rank holds 1/N of it
    # (a pipeline's rank: its stage's part).
    per_rank, whole = (None, None) if mode == "p2" else assert_frozen_sharded(
        prepared["stdout"][f"lora-{mode}"], sharded, ranks, tp, tp_split=tp > 1)
    assert [x["step"] for x in log] == list(range(1, STEPS + 1))
    lrs = {x["step"]: x["lr"] for x in log}
    losses, start, adapters = peft_reference(prepared, lrs)
    for x, want in zip(log, losses):
        assert_loss_close(x["loss"], want, what=f"loss of step {x['step']}")
    # The gradient norms too: AdamW's update is nearly blind to a gradient
    # scaled by 2 (an adapter's TP partial sums added twice), the norm not.
    norm_d = 0.0
    for x, want in zip(log, prepared["norms"] or []):
        assert want < CLIP
        norm_d = max(norm_d, assert_close(x["grad_norm"], want, what=f"grad norm of step {x['step']}"))
    got = load_file(saved)
    assert {n for n in got if ".lora_" in n} == set(adapters)  # the layers peft adapts
    for n, value in start.items():  # the base did not move
        assert_identical(got[n], value, n)
    stats = assert_trained_close(got, adapters, sum(lrs.values()))
    print(f"{prepared['name']} {mode}: loss max |d| "
          f"{max(abs(x['loss'] - w) for x, w in zip(log, losses)):.2g}, grad norm max |d| "
          f"{norm_d:.2g}, adapters max |d| "
          f"{stats[0]:.2g} ({len(adapters)} tensors)" +
          (f"; base {per_rank} of {whole} bytes per rank" if per_rank else ""))


def run_of(prepared, mode):
    if mode not in prepared.get("runs", {}):
        test_lora_training_matches_peft(prepared, mode)
    return prepared["runs"][mode]


def test_tensor_parallel_checkpoint_resumes_on_one_rank(prepared, tmp_path):
    """The T = 2 run's checkpoint of step 3 resumed by the one-rank plan
    (the adapters' slices put together): steps 4 and 5 as the
    uninterrupted T = 2 run's, within the bounds across layouts."""
    from safetensors.torch import load_file
    from test_zero_multirank import torchrun
    if prepared["name"] != "llama":
        pytest.skip("one model is enough (LLaMA: column and row-parallel adapters)")
    _, saved_tp, log_tp = run_of(prepared, "tp2")
    one = run_of(prepared, "n1")[0]
    log1, saved1 = tmp_path / "one.jsonl", tmp_path / "one.safetensors"
    r = torchrun(1, one, "--batches", os.path.join(prepared["tmp"], "batches.pt"), "--steps",
                 STEPS, "--objective", "causal-lm", *TRAIN_FLAGS, "--resume",
                 os.path.join(prepared["tmp"], "ck-tp2", "step-00000003"), "--log-file",
                 str(log1), "--save-params", str(saved1), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "resharded to this run's layout" in r.stdout, r.stdout
    log = [x for x in map(json.loads, open(log1)) if x["kind"] == "train" and x["step"] > 3]
    assert [x["step"] for x in log] == [4, 5]
    for x in log:
        assert_loss_close(x["loss"], log_tp[x["step"] - 1]["loss"],
                          what=f"resumed loss of step {x['step']}")
    got, want = load_file(str(saved1)), load_file(saved_tp)
    assert set(got) == set(want)
    lora = [n for n in want if ".lora_" in n]
    for n in want:
        if n not in lora:
            assert_identical(got[n], want[n], n)
    stats = assert_trained_close(got, {n: want[n] for n in lora},
                                 sum(x["lr"] for x in log_tp))
    print(f"llama tp2 -> n1 resume: loss max |d| "
          f"{max(abs(x['loss'] - log_tp[x['step'] - 1]['loss']) for x in log):.2g}, "
          f"adapters max |d| {stats[0]:.2g}")


def test_pipeline_checkpoint_holds_the_adapters_and_resumes(prepared, tmp_path):
    """P = 2 (GPT-2: the frozen tied wte on both stages): the checkpoint of
    step 3 holds the adapters only, and resumed on the same layout ends bit
    for bit as the uninterrupted run."""
    from safetensors.torch import load_file
    if prepared["name"] != "gpt2":
        pytest.skip("one model is enough")
    sharded, saved, log = run_of(prepared, "p2")
    ck = os.path.join(prepared["tmp"], "ck-p2", "step-00000003")
    with open(os.path.join(ck, "checkpoint.json")) as f:
        spaces = json.load(f)["spaces"]
    members = [m["tensor"] for s in spaces for m in s["members"]]
    assert members and all(".lora_" in n for n in members), members
    resumed, resumed_saved = train_lora(prepared, sharded, 2, "lora-p2-resumed", "--resume", ck)
    assert [x["loss"] for x in resumed if x["step"] > 3] == [x["loss"] for x in log[3:]]
    assert_identical(load_file(resumed_saved), load_file(saved))


def test_adapter_export_loads_in_peft(prepared, tmp_path, capsys):
    """bmt-to-hf --adapter of the 2-rank run's last checkpoint: what
    PeftModel.from_pretrained loads onto the base holds bmt's trained
    adapters bit for bit and gives the logits of the base with those
    adapters applied by peft (so r, alpha, targets and fan_in_fan_out are
    right)."""
    from architectures import build
    from safetensors.torch import load_file
    if prepared["name"] not in ("gpt2", "llama"):
        pytest.skip("GPT-2 (Conv1D, fan_in_fan_out, fused q/k/v) and LLaMA (row-parallel too)")
    sharded, saved, _ = run_of(prepared, "tp2")  # T = 2: the base and adapters split
    out = tmp_path / "adapter"
    from bmt.to_hf import main as to_hf  # in process: no second interpreter start
    ck = os.path.join(prepared["tmp"], "ck-tp2", f"step-{STEPS:08d}")
    assert to_hf([ck, "-o", str(out), "--adapter", "--sharded", sharded]) == 0
    got = load_file(saved)
    loaded = peft.PeftModel.from_pretrained(build(prepared["name"]), str(out))
    lora = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
    assert lora
    for n, p in lora.items():
        assert_identical(p.detach(), got[n.removeprefix("base_model.model.").replace(
            ".default.weight", ".weight")], n)
    targets, fan_in_fan_out = TARGETS[prepared["name"]]
    ref = peft.get_peft_model(build(prepared["name"]), peft.LoraConfig(
        r=R, lora_alpha=ALPHA, target_modules=targets, fan_in_fan_out=fan_in_fan_out))
    with torch.no_grad():
        for n, p in ref.named_parameters():
            if "lora_" in n:
                p.copy_(lora[n])
    ids = prepared["batches"][0][:2, :-1]
    loaded.eval()
    ref.eval()
    with torch.no_grad():
        assert_identical(loaded(input_ids=ids).logits, ref(input_ids=ids).logits, "logits")
        base = build(prepared["name"])(input_ids=ids).logits
    assert not torch.equal(base, ref(input_ids=ids).logits)  # the adapters do something
    # --merge: the full model with the adapters merged, as merge_and_unload.
    import transformers
    config = tmp_path / "config.json"
    build(prepared["name"]).config.to_json_file(str(config))
    merged = tmp_path / "merged"
    assert to_hf([ck, "-o", str(merged), "--merge", "--sharded", sharded, "--config",
                  str(config)]) == 0
    want = ref.merge_and_unload().state_dict()
    got = transformers.AutoModelForCausalLM.from_pretrained(str(merged)).state_dict()
    assert set(got) == set(want)
    merged_d = 0.0
    for n in want:  # one matmul, one scale, one add: a few ulps
        torch.testing.assert_close(got[n], want[n], rtol=1e-6, atol=1e-7, msg=n)
        merged_d = max(merged_d, (got[n] - want[n]).abs().max().item())
    print(f"{prepared['name']} tp2 export: adapters bit-identical, merged max |d| {merged_d:.2g}",
          file=sys.__stdout__)  # past capsys
    if prepared["name"] != "gpt2":
        return
    # A plan with other LoRA settings (alpha) is not the run's: bmt-to-hf
    # and a resume refuse it, each in one line, writing nothing.
    other = tmp_path / "alpha16.sharded.pt"
    r = compile_lora(prepared, str(other), 1, "--lora", spec(prepared["name"]).replace(
        f"alpha={ALPHA}", "alpha=16"))
    assert r.returncode == 0, r.stderr
    for flag in ["--adapter", "--merge"]:
        capsys.readouterr()
        assert to_hf([ck, "-o", str(tmp_path / "refused"), flag, "--sharded", str(other),
                      "--config", str(config)]) == 1
        assert "was trained with LoRA settings" in capsys.readouterr().err
        assert not (tmp_path / "refused").exists()
    # Without either, a LoRA checkpoint is no whole model: the line says how.
    capsys.readouterr()
    assert to_hf([ck, "-o", str(tmp_path / "refused"), "--config", str(config)]) == 1
    assert "--adapter --sharded" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()
    r = subprocess.run([binary("bmt-run"), str(other), "--batches",
                        os.path.join(prepared["tmp"], "batches.pt"), "--steps", str(STEPS + 1),
                        "--resume", ck, "--device", "cpu"], capture_output=True, text=True,
                       timeout=300)
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 1 and len(errors) == 1, r.stderr
    assert "was trained with LoRA settings" in errors[0], errors[0]


def test_dropout_is_drawn_alike_by_the_recompute(prepared):
    """Dropout 0.1 with every block recomputed in backward (the default)
    trains bit for bit as without recompute (--checkpoint none): the
    recompute restores the generator and draws the same masks, and each
    adapter's backward draws its mask again from the state it saved. On one
    rank it matches peft with lora_dropout=0.1 from the generator state
    bmt-run starts from (the same masks: each step's loss, the adapters and
    their gradient norms), so the masks are drawn, applied and scaled as
    torch.nn.Dropout does; and at T = 2 too, where down_proj's row-parallel
    adapter takes its rank's part of the mask drawn for the whole input.
    Both evaluate every 2 steps: evaluation applies no adapter dropout (as
    peft's model.eval()), so it draws nothing (the training still matches
    peft) and 1 rank and T = 2 give one validation loss."""
    from safetensors.torch import load_file
    if prepared["name"] != "llama":
        pytest.skip("one model is enough")
    from test_pipeline_parallel import write_tokens
    val = os.path.join(prepared["tmp"], "lora-val")
    write_tokens(val, torch.randint(0, 128, (200,), generator=torch.Generator().manual_seed(5)), 128)
    evaluation = ["--eval-data", val + ".bin", "--eval-every", 2, "--micro-batch", 4, "--seq-len", 8]
    runs = {}
    # (recompute, ranks, bmt-opt flags, evaluated and compared with peft)
    for mode, ranks, flags, peft_run in [("all", 2, [], False), ("none", 2, [], False),
                                         ("all", 1, [], True),
                                         ("all", 2, ["--tensor-parallel", "2"], True)]:
        tag = f"lora-dropout-{mode}-n{ranks}{'-tp2' if flags else ''}"
        sharded = os.path.join(prepared["tmp"], f"{tag}.sharded.pt")
        r = compile_lora(prepared, sharded, ranks, "--lora", spec("llama", 0.1),
                         "--checkpoint", mode, *flags)
        assert r.returncode == 0, r.stderr
        runs[mode, ranks, bool(flags)] = train(prepared, sharded, ranks, tag,
                                               *(evaluation if peft_run else []))
    (log, saved), (log_none, saved_none) = runs["all", 2, False], runs["none", 2, False]
    assert [x["loss"] for x in log] == [x["loss"] for x in log_none]
    assert_identical(load_file(saved), load_file(saved_none))
    # Each recompute of a block (2 a step) skips the residual add after the
    # MLP, down_proj's adapter (B's matmul) and its frozen matmul, whose
    # values only the graph needs (NaN-filled here: BMT_DEBUG_RECOMPUTE_NAN).
    assert log[-1]["recompute_skipped"] == STEPS * 2 * 3, log[-1]

    for key in [("all", 1, False), ("all", 2, True)]:
        log, saved = runs[key]
        lrs = {x["step"]: x["lr"] for x in log}
        losses, _, adapters = peft_reference(prepared, lrs, dropout=0.1)
        no_dropout, _, _ = peft_reference(prepared, lrs)
        assert losses[1:] != no_dropout[1:]  # the masks change the steps after the first
        for x, want in zip(log, losses):
            assert_loss_close(x["loss"], want, what=f"{key}: loss of step {x['step']}")
        for x, want in zip(log, prepared["reference-dropout-0.1-norms"]):
            assert_close(x["grad_norm"], want, what=f"{key}: grad norm of step {x['step']}")
        assert_trained_close(load_file(saved), adapters, sum(lrs.values()))
    evals = [[x["val_loss"] for x in map(json.loads, open(os.path.join(prepared["tmp"], tag + ".jsonl")))
              if x["kind"] == "eval"] for tag in ["lora-dropout-all-n1", "lora-dropout-all-n2-tp2"]]
    assert len(evals[0]) == 3, evals  # steps 2, 4 and the last
    for one, tp2 in zip(*evals):
        assert_loss_close(tp2, one, what="validation loss at T = 2")


@pytest.mark.parametrize("value,flags,message", [
    ("r=4,targets=nothing", [], "no linear layer matches targets 'nothing'"),
    ("r=4,targets=q_prj,v_proj", [], "target 'q_prj' matches no linear layer"),
    ("", [], "--lora was given an empty value"),
    ("alpha=8,targets=q_proj", [], "r=N is required"),
    ("r=4,targets=q_proj,foo=1", [], "unknown key 'foo'"),
    ("r=4,r=8,targets=q_proj", [], "'r' is given twice"),
    # T = 4 > 2 kv heads: k_proj replicated, its input maybe a sequence part
    ("r=4,dropout=0.1,targets=k_proj", ["--tensor-parallel", "4", "--sequence-parallel"],
     "with dropout > 0 and --sequence-parallel"),
    ("r=4,targets=q_proj", ["--freeze", "model.norm.weight"], "--freeze with --lora is not supported"),
    ("r=4,targets=q_proj", ["--tensor-parallel", "2", "--freeze", "model.norm.weight"],
     "--freeze with --lora is not supported"),
])
def test_lora_errors(prepared, tmp_path, value, flags, message):
    """One error line, no output."""
    if prepared["name"] != "llama":
        pytest.skip("one model is enough")
    out = tmp_path / "x.pt"
    ranks = 4 if "4" in flags else 2  # a multiple of --tensor-parallel
    r = compile_lora(prepared, str(out), ranks, "--lora", value, *flags)
    errors = [l for l in r.stderr.splitlines() if "error:" in l]
    assert r.returncode == 1 and len(errors) == 1 and message in errors[0], r.stderr
    assert not out.exists()
