"""Mixtures of experts: transformers' MoE layers import and run as eager does.

transformers (5.x) computes a layer's experts by default with grouped_mm: a
top-k router, the tokens sorted by expert (aten::sort, aten::histc for the
counts), one aten::_grouped_mm over the experts' 3-D weights, the results
scattered back by index_put_. Traced at 2 x 8, the program must run at other
shapes (other tokens reach other experts, in other numbers): OLMoE (routed
experts, q/k norms over the whole projection), Qwen2-MoE (a gated shared
expert beside the routed ones) and DeepSeek-V3 (a sigmoid router whose
group-limited top-k marks the chosen groups with scatter_, masks the others
with -inf and divides the weights in place; multi-head latent attention),
run by bmt-run --dump at 3 x 12 against the eager model: logits, loss and
every parameter gradient within numerics.py's bounds. The compile must have
lowered every MoE layer's token permutation (bmt-moe-layers' remark: one
per experts module, each with its masks of expert ids >= E dropped), so
the run goes through the runtime's MoeDispatch and MoeCombine.
test_architectures_parallel.py trains Mixtral, Qwen2-MoE, Qwen3-MoE, gpt-oss
and DeepSeek-V3 in parallel; test_pt2_dynamic.py runs Mixtral, gpt-oss and
DeepSeek-V3 from a dynamic torch.export.

A .pt2 of Mixtral with output_router_logits returns aux_loss, logits and a
tuple of router logits: bmt-run --dump writes them by those names
(router_logits.0, ...), each equal to eager's, and trains on the logits;
its MoE layers are lowered as a trace's are.

transformers' other implementation, a Python loop over the experts the batch
hits, traces into a program of the experts hit while tracing: bmt-opt
refuses it with one error line that says so and what to export instead.

Under --tensor-parallel 2 (2 CPU ranks, one TP group) bmt-run's log counts
a step's tokens per expert once, as eager Mixtral's router routes them
(test_model_loss.py checks the counts under data parallelism).

DeepSeek-V3's auxiliary-loss-free balancing (bmt-run --moe-bias-update-rate):
after each step every router's score-correction bias moves by the rate
times sign(mean load - load) per expert, as an eager loop moves
e_score_correction_bias from its routers' top-k counts: 5 AdamW steps on 2
ranks, losses, parameters and the biases (equal) as eager's; a resume from
step 3 ends bit-identical; bmt-to-hf writes the moved biases and
from_pretrained loads them.

bmt-export-hf --checkpoint refuses to stream a mixture of experts (one line
naming --load-weights: transformers routes by its GPU path on the meta
device, and a Mixtral checkpoint stores each expert's matrices apart, which
transformers fuses as it loads them); with --load-weights it exports what
from_pretrained loads.
"""
import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from bmt_paths import REPO, binary, tool
from eager import causal_loss, check_dump_against_eager, eager_training
from numerics import assert_close, assert_identical, assert_loss_close, assert_trained_close

sys.path.insert(0, os.path.join(REPO, "scripts"))
import architectures  # noqa: E402

warnings.filterwarnings("ignore")

MODELS = {
    "olmoe": ("OlmoeForCausalLM", "olmoe", dict(architectures.LLAMA_LIKE, num_experts=4,
                                                num_experts_per_tok=2)),
    "qwen2_moe": architectures.ARCHS["qwen2_moe"],
    "deepseek_v3": architectures.ARCHS["deepseek_v3"],
}


def build(cls_name, model_type, fields, **overrides):
    import transformers
    config = transformers.AutoConfig.for_model(model_type, **fields)
    config.use_cache = False
    config._attn_implementation = "eager"
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(config).eval()


def trace(model, path):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, architectures.VOCAB, (2, 8), generator=g)
    with torch.no_grad():
        torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids,
                                                     "attention_mask": torch.ones_like(ids)},
                        strict=False).save(str(path))


def assert_moe_layers_lowered(model, stderr):
    """bmt-opt's remark says bmt-moe-layers lowered one layer per experts
    module of the eager model."""
    experts = sum(1 for n, _ in model.named_modules() if n.endswith(".mlp.experts"))
    lowered = [line for line in stderr.splitlines() if "bmt-moe-layers:" in line]
    assert len(lowered) == 1 and experts > 0, stderr
    assert f"bmt-moe-layers: {experts} mixture-of-experts layer" in lowered[0], lowered[0]
    # The routers' ids are top-k over E scores: the masks of ids >= E never
    # fire and are dropped (the parity below checks that nothing changed).
    assert f"masks of expert ids >= E dropped in {experts} " in lowered[0], lowered[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_traced_experts_run_at_other_shapes(name, tmp_path):
    model = build(*MODELS[name])
    trace(model, tmp_path / "m.pt")
    sharded = tmp_path / "m.sharded.pt"
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / "m.pt"), "-o", str(sharded)],
                       check=True, capture_output=True, text=True)
    # bmt-moe-layers lowered the token permutation of every MoE layer (the
    # experts modules of the eager model), so the run below checks the
    # runtime's MoeDispatch / MoeCombine.
    assert_moe_layers_lowered(model, r.stderr)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, architectures.VOCAB, (3, 12), generator=g)
    check_dump_against_eager(model, str(sharded), tmp_path, ids, g)


def test_router_outputs_of_a_pt2_are_named(tmp_path):
    model = build(*architectures.ARCHS["mixtral"], output_router_logits=True)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, architectures.VOCAB, (2, 8), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    torch.export.save(torch.export.export(model, (), inputs, strict=False), tmp_path / "m.pt2")
    sharded = tmp_path / "m.sharded.pt"
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / "m.pt2"), "-o", str(sharded)],
                       check=True, capture_output=True, text=True)
    assert_moe_layers_lowered(model, r.stderr)
    torch.save(dict(inputs, labels=ids), tmp_path / "in.pt")
    subprocess.run([binary("bmt-run"), str(sharded), "--dump", str(tmp_path / "in.pt"),
                    str(tmp_path / "out.pt")], check=True, capture_output=True)
    got = torch.load(tmp_path / "out.pt")
    outputs = sorted(k for k in got if not k.startswith("grad/"))
    assert outputs == ["aux_loss", "logits", "loss", "router_logits.0", "router_logits.1"]
    with torch.no_grad():
        want = model(**inputs)
    assert_close(got["logits"], want.logits, what="logits")
    assert_close(got["aux_loss"], want.aux_loss, what="aux_loss")
    for i, router_logits in enumerate(want.router_logits):
        assert_close(got[f"router_logits.{i}"], router_logits, what=f"router_logits.{i}")
    # The loss bmt-run trains on is the language-model loss of the logits.
    assert_loss_close(got["loss"].item(), causal_loss(want.logits, ids).item())


def test_eager_expert_loop_is_refused_with_the_fix(tmp_path):
    model = build(*architectures.ARCHS["mixtral"], _experts_implementation="eager")
    trace(model, tmp_path / "m.pt")
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / "m.pt"), "-o",
                        str(tmp_path / "m.sharded.pt")], capture_output=True, text=True)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, r.stderr
    assert "unsupported operator 'aten::" in errors[0]
    assert "traced with transformers' eager experts" in errors[0]
    assert 'config._experts_implementation = "grouped_mm"' in errors[0]
    assert not (tmp_path / "m.sharded.pt").exists()


def test_mixtral_checkpoint_exports_with_load_weights(tmp_path):
    build(*architectures.ARCHS["mixtral"]).save_pretrained(tmp_path / "ckpt")
    export = [*tool("bmt-export-hf"), "--checkpoint", str(tmp_path / "ckpt"), "-o",
              str(tmp_path / "m.pt")]
    r = subprocess.run(export, capture_output=True, text=True)
    assert r.returncode == 1 and not (tmp_path / "m.pt").exists()
    assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [
        "error: MixtralForCausalLM is a mixture of experts, whose routing bmt cannot trace on the "
        "meta device (transformers takes its GPU path there): pass --load-weights"], r.stderr
    r = subprocess.run(export + ["--set", "num_hidden_layers=1"], capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: --set applies to --config"), r.stderr
    subprocess.run(export + ["--load-weights"], check=True, capture_output=True)
    sharded = tmp_path / "m.sharded.pt"
    subprocess.run([binary("bmt-opt"), str(tmp_path / "m.pt"), "-o", str(sharded)], check=True,
                   capture_output=True)
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    model.config._attn_implementation = "sdpa"  # bmt-export-hf's default, as exported
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, architectures.VOCAB, (3, 12), generator=g)
    check_dump_against_eager(model.eval(), str(sharded), tmp_path, ids, g)


def test_expert_load_of_a_tensor_parallel_group_counts_once(tmp_path):
    """bmt-run's log under --tensor-parallel 2 on 2 CPU ranks (one TP group:
    both ranks route the same tokens): expert_tokens_min / _max of the first
    step equal the counts of eager Mixtral's router top-k ids on the step's
    rows (the ranks' sum divided by T; 2 x 8 tokens x 2 experts x 2 layers)."""
    model = build(*architectures.ARCHS["mixtral"])
    trace(model, tmp_path / "m.pt")
    sharded = tmp_path / "m.sharded.pt"
    subprocess.run([binary("bmt-opt"), str(tmp_path / "m.pt"), "-o", str(sharded), "--world-size",
                    "2", "--tensor-parallel", "2"], check=True, capture_output=True)
    batches = torch.randint(0, architectures.VOCAB, (1, 2, 9),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "b.pt")
    log = tmp_path / "log.jsonl"
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc_per_node=2", "--no-python", binary("bmt-run"), str(sharded),
                        "--batches", str(tmp_path / "b.pt"), "--steps", "1", "--log-file", str(log),
                        "--device", "cpu"], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    record = next(x for x in map(json.loads, open(log)) if x["kind"] == "train")
    experts = model.config.num_local_experts
    counts = []
    hooks = [m.register_forward_hook(lambda _m, _i, out: counts.append(
        torch.bincount(out[2].reshape(-1), minlength=experts)))
        for n, m in model.named_modules() if n.endswith("mlp.gate")]
    with torch.no_grad():
        model(input_ids=batches[0][:, :-1])
    for h in hooks:
        h.remove()
    layers = torch.stack(counts)
    assert layers.shape == (2, experts) and layers.sum() == 2 * 8 * 2 * 2
    assert (record["expert_tokens_min"], record["expert_tokens_max"]) == (
        layers.min().item(), layers.max().item()), (record, layers)
    assert f"experts {layers.min().item()}-{layers.max().item()} tokens | " in r.stdout, r.stdout


def torchrun(n, *args):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc_per_node={n}", "--no-python", binary("bmt-run"),
                        *map(str, args), "--device", "cpu"], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return r


def test_router_bias_update_matches_eager_and_resumes(tmp_path):
    from safetensors.torch import load_file
    import transformers
    model = build(*MODELS["deepseek_v3"])
    trace(model, tmp_path / "m.pt")
    sharded = tmp_path / "m.sharded.pt"
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / "m.pt"), "-o", str(sharded),
                        "--world-size", "2"], check=True, capture_output=True, text=True)
    assert "1 router with a score-correction bias" in r.stderr, r.stderr
    steps, rate = 5, 0.01
    batches = torch.randint(0, architectures.VOCAB, (steps, 4, 9),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "b.pt")
    common = [sharded, "--batches", tmp_path / "b.pt", "--steps", steps, "--lr", "1e-3",
              "--schedule", "constant", "--clip-grad", "0.5", "--moe-bias-update-rate", rate]
    torchrun(2, *common, "--log-file", tmp_path / "log.jsonl", "--save-params",
             tmp_path / "p.safetensors", "--checkpoint-dir", tmp_path / "ck",
             "--checkpoint-every", 3)
    records = [x for x in map(json.loads, open(tmp_path / "log.jsonl")) if x["kind"] == "train"]
    got = load_file(tmp_path / "p.safetensors")

    # Eager: the same steps, each gate's bias moved after each step by its
    # routers' top-k counts over both ranks' rows.
    gates = {n: m for n, m in model.named_modules() if n.endswith("mlp.gate")}
    experts = model.config.n_routed_experts
    counts = {n: torch.zeros(experts, dtype=torch.float64) for n in gates}

    def count(name):
        def hook(_module, _inputs, out):
            counts[name].add_(torch.bincount(out[2].reshape(-1), minlength=experts))
        return hook

    hooks = [m.register_forward_hook(count(n)) for n, m in gates.items()]

    def move_biases(_step):
        with torch.no_grad():
            for n, gate in gates.items():
                c = counts[n]
                gate.e_score_correction_bias.add_(((c.mean() - c).sign() * rate).float())
                c.zero_()

    losses = eager_training(model, batches, steps, 1, lambda _s: 1e-3, 0.5, 0.01, ranks=2,
                            after_step=move_biases)
    for h in hooks:
        h.remove()
    for x, loss in zip(records, losses):
        assert_loss_close(x["loss"], loss, what=f"loss of step {x['step']}")
    want = {n: p.detach() for n, p in model.named_parameters()}
    assert_trained_close({n: got[n] for n in want}, want, 1e-3 * steps)
    biases = {f"{n}.e_score_correction_bias": g.e_score_correction_bias for n, g in gates.items()}
    for n, b in biases.items():
        assert torch.equal(got[n], b), (n, got[n], b)
        assert b.abs().max() > 0, b  # it moved
    print(f"deepseek_v3, 2 ranks, rate {rate}: biases {[b.tolist() for b in biases.values()]}")

    # A resume from step 3 ends where the uninterrupted run did.
    torchrun(2, *common, "--resume", tmp_path / "ck" / "step-00000003", "--save-params",
             tmp_path / "resumed.safetensors")
    assert_identical(load_file(tmp_path / "resumed.safetensors"), got, what="resumed run")
    # A resume without the rate says that the biases stop moving.
    r = torchrun(2, sharded, "--batches", tmp_path / "b.pt", "--steps", 4, "--lr", "1e-3",
                 "--schedule", "constant", "--clip-grad", "0.5", "--resume",
                 tmp_path / "ck" / "step-00000003")
    assert "--moe-bias-update-rate 0 (saved: 0.01)" in r.stdout, r.stdout

    # bmt-to-hf writes the moved biases; from_pretrained loads them.
    out = tmp_path / "hf"
    model.config.save_pretrained(tmp_path / "config")
    r = subprocess.run([*tool("bmt-to-hf"), str(tmp_path / "ck" / "step-00000005"), "-o", str(out),
                        "--config", str(tmp_path / "config" / "config.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    state = loaded.state_dict()
    for n, b in biases.items():
        assert torch.equal(state[n], b), n
