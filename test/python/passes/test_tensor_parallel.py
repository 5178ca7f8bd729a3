"""bmt-opt --tensor-parallel end to end: the fixture GPT-2 and LLaMA
(CONFIGS) and BERT (BERT_CONFIGS) compiled by bmt-tensor-parallel (chains
and vocab-parallel head found from the program), trained by bmt-run on CPU ranks (TP groups of T consecutive
ranks, ZeRO over the N / T data-parallel ranks) against single-process
eager PyTorch on the same weights and batches: every step's loss and the
final gathered parameters (numerics.assert_loss_close / assert_trained_close).
"""
import json
import subprocess

import pytest

from bmt_paths import binary
from numerics import assert_close, assert_loss_close, assert_trained_close
from test_zero_multirank import STEPS, eager_reference, torchrun, traced  # noqa: F401 (fixture)

CONFIGS = {
    # name: (tensor parallel T, world size N, bmt-opt's --checkpoint: which
    # blocks are recomputed, bmt-opt's default recomputing both of the tiny
    # models' blocks; --sequence-parallel)
    "t2-n2": (2, 2, None, False),
    "t2-n2-no-recompute": (2, 2, "none", False),
    "t2-n2-sequence-parallel": (2, 2, None, True),
    "t2-n4": (2, 4, None, False),
    "t4-n4": (4, 4, None, False),
    # the configs above have the default pipeline's elementwise fusion (fused
    # regions split by heads; LLaMA's RoPE regions hold rotate_half); this one
    # a plan of plain ATen ops (--fuse-elementwise=false)
    "t2-n2-plain": (2, 2, None, False),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_tensor_parallel_training_matches_eager(traced, config):  # noqa: F811
    tp, ranks, checkpoint, sequence_parallel = CONFIGS[config]
    tmp = traced["tmp"] / f"tp-{config}"
    tmp.mkdir()
    sharded = tmp / "sharded.pt"
    compiled = subprocess.run([binary("bmt-opt"), str(traced["pt"]), "-o", str(sharded),
                               "--world-size", str(ranks), "--tensor-parallel", str(tp),
                               *(["--checkpoint", checkpoint] if checkpoint else []),
                               *(["--sequence-parallel"] if sequence_parallel else []),
                               *(["--fuse-elementwise=false"] if config.endswith("-plain") else [])],
                              capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    if config.endswith("-plain"):
        assert "bmt-fuse-elementwise:" not in compiled.stderr, compiled.stderr
    else:
        assert "bmt-fuse-elementwise:" in compiled.stderr, compiled.stderr
        if traced["name"] == "llama":
            assert ", 4 rotate_half)" in compiled.stderr, compiled.stderr
    # Recomputed blocks run their tp_copy and tp_all_reduce again in backward.
    recomputed = 0 if checkpoint == "none" else 2
    assert f"{recomputed} of 2 blocks recomputed" in compiled.stderr, compiled.stderr
    if sequence_parallel:
        # The norms, residual adds and position embedding run on each rank's
        # half of the sequence; 2 blocks x 2 chains + the LM head's input
        # gathered, the embedding's and the 4 chains' sums scattered; the
        # norms (GPT-2: and its row biases and wpe) reduce_grad.
        params = 15 if traced["name"] == "gpt2" else 5
        assert f"sequence-parallel (dim 1): 5 all-gathers, 5 reduce-scatters, {params} " \
            "parameters reduce_grad" in compiled.stderr, compiled.stderr
    if traced["name"] == "llama" and tp == 4:
        # 2 kv heads over 4 ranks: k/v replicated (reduce_grad), each rank
        # narrows the repeated heads to its one query head.
        assert "self_attn.k_proj, self_attn.v_proj k/v replicated on 4 ranks (2 kv heads < T = 4), " \
            "reduce_grad" in compiled.stderr, compiled.stderr
    assert f"tensor parallel: {tp} ranks per group;" in compiled.stderr
    assert "vocab-parallel embedding and LM head" in compiled.stderr
    log, params = tmp / "log.jsonl", tmp / "params.safetensors"
    r = torchrun(ranks, sharded, "--batches", traced["tmp"] / "batches.pt", "--steps", STEPS,
                 "--lr", "1e-3", "--schedule", "cosine", "--warmup", 2, "--clip-grad", 0.5,
                 "--weight-decay", 0.01, "--log-file", log, "--save-params", params)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    records = [json.loads(line) for line in open(log) if line.strip()]
    train = [x for x in records if x["kind"] == "train"]
    assert [x["step"] for x in train] == list(range(1, STEPS + 1))
    # A recomputed block's MLP output is unused, so the row-parallel matmul,
    # its all-reduce (reduce-scatter under sequence parallelism) and the adds
    # after it are recorded, not computed (no communication): GPT-2's mm,
    # collective, bias add and residual add, LLaMA's linear, collective and
    # residual add. BMT_DEBUG_RECOMPUTE_NAN=1 (torchrun) fills them with NaN,
    # so the parity below shows any value read after all.
    per_block = 4 if traced["name"] == "gpt2" else 3
    assert train[-1]["recompute_skipped"] == STEPS * recomputed * per_block, train[-1]
    lrs = {x["step"]: x["lr"] for x in train}
    losses, want = eager_reference(traced, 1, lrs)
    for x, loss in zip(train, losses):
        assert_loss_close(x["loss"], loss, what=f"{config}: loss of step {x['step']}")
    from safetensors.torch import load_file
    stats = assert_trained_close(load_file(params), want, sum(lrs.values()))
    print(f"{traced['name']} {config}: parameters max {stats[0]:.2e}, mean {stats[1]:.2e}, "
          f"differing {stats[2]:.1%}")


def train_t2_n2(model_file, tmp_path, steps):
    """Compiles model_file for T = 2 N = 2 and trains it on 2 ranks on
    tmp_path/batches.pt (AdamW, lr 1e-3, no clipping, weight decay 0.01):
    (bmt-opt's remarks, the train records, the gathered parameters' file)."""
    sharded = tmp_path / "sharded.pt"
    compiled = subprocess.run([binary("bmt-opt"), str(model_file), "-o", str(sharded),
                               "--world-size", "2", "--tensor-parallel", "2"],
                              capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    log, params = tmp_path / "log.jsonl", tmp_path / "params.safetensors"
    r = torchrun(2, sharded, "--batches", tmp_path / "batches.pt", "--steps", steps, "--lr", "1e-3",
                 "--clip-grad", 0, "--weight-decay", 0.01, "--log-file", log, "--save-params", params)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    train = [json.loads(line) for line in open(log) if line.strip()]
    return compiled.stderr, [x for x in train if x["kind"] == "train"], params


def test_dropout_masks_agree_over_the_tp_group(tmp_path):
    """GPT-2 traced in training mode: its embedding and residual dropouts act
    on activations every rank of a TP group holds whole. bmt-run seeds the
    generators from --seed and the data-parallel rank, so the ranks of a TP
    group draw the same masks, and T = 2 N = 2 trains as one process with
    the same --seed does (losses and parameters within the numerics policy;
    with each rank's own masks the TP ranks' copies would disagree). The
    attention's dropout, on the TP ranks' own heads, is set to 0: there the
    ranks draw for their slices only, so T = 1 draws another stream. A run
    repeats bit for bit; another --seed gives other masks."""
    import torch
    from safetensors.torch import load_file
    from eager import build
    from test_zero_multirank import SEQ
    model = build("gpt2")
    for block in model.transformer.h:
        block.attn.attn_dropout.p = 0.0
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
    pt = tmp_path / "gpt2-dropout.pt"
    traced_model = torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids,
                                                                "attention_mask": torch.ones_like(ids)},
                                   strict=False, check_trace=False)
    assert str(traced_model.inlined_graph).count("aten::dropout") == 7  # embedding, 3 per block
    traced_model.save(str(pt))
    batches = torch.randint(0, model.config.vocab_size, (4, 2, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    runs = {}
    for name, tp, ranks, seed in [("t1", 1, 1, 5), ("t1-again", 1, 1, 5), ("t1-seed6", 1, 1, 6),
                                  ("t2", 2, 2, 5)]:
        sharded = tmp_path / f"{name}.sharded.pt"
        flags = ["--world-size", str(ranks), "--tensor-parallel", str(tp)] if tp > 1 else []
        compiled = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(sharded), *flags],
                                  capture_output=True, text=True)
        assert compiled.returncode == 0, compiled.stderr
        log, params = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.safetensors"
        r = torchrun(ranks, sharded, "--batches", tmp_path / "batches.pt", "--steps", 4, "--lr", "1e-3",
                     "--seed", seed, "--log-file", log, "--save-params", params)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        train = [x for x in map(json.loads, open(log)) if x["kind"] == "train"]
        runs[name] = ([x["loss"] for x in train], load_file(params), sum(x["lr"] for x in train))
    assert runs["t1-again"][0] == runs["t1"][0]
    assert max(abs(a - b) for a, b in zip(runs["t1-seed6"][0], runs["t1"][0])) > 1e-3
    for step, (a, b) in enumerate(zip(runs["t2"][0], runs["t1"][0]), 1):
        assert_loss_close(a, b, what=f"T = 2 against one process, loss of step {step}")
    assert_trained_close(runs["t2"][1], runs["t1"][1], runs["t1"][2])


def test_padded_vocab_matches_eager(tmp_path):
    """A vocab T does not divide (GPT-2 with 127 tokens on T = 2): the
    embedding and head padded to 128 rows (TensorSplit.paddedSize), the
    padding's logits ignored by the loss; against eager on 127 tokens."""
    import torch
    import transformers
    import make_fixtures
    from eager import eager_training
    from test_zero_multirank import GLOBAL_BATCH, SEQ
    torch.manual_seed(0)
    cls, config = make_fixtures.MODELS["gpt2"](transformers)
    config.vocab_size = 127
    model = cls(config).eval()
    inputs = {"input_ids": torch.randint(0, 127, (2, SEQ), generator=torch.Generator().manual_seed(1)),
              "attention_mask": torch.ones(2, SEQ, dtype=torch.long)}
    pt = tmp_path / "gpt2-127.pt"
    torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(str(pt))
    steps = 6
    batches = torch.randint(0, 127, (steps, GLOBAL_BATCH, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    remarks, train, params = train_t2_n2(pt, tmp_path, steps)
    assert "vocab-parallel embedding and LM head (127 -> 64 per rank, padded to 128)" in remarks
    lrs = {x["step"]: x["lr"] for x in train}
    torch.manual_seed(0)
    reference = cls(config).eval()
    losses = eager_training(reference, batches, steps, 1, lambda s: lrs[s], 0.0, 0.01)
    for x, loss in zip(train, losses):
        assert_loss_close(x["loss"], loss, what=f"padded vocab: loss of step {x['step']}")
    from safetensors.torch import load_file
    got = load_file(params)
    assert got["transformer.wte.weight"].shape == (127, 32)  # gathered without the padding
    assert_trained_close(got, dict(reference.named_parameters()), sum(lrs.values()))


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_pt2_tensor_parallel_matches_eager(name, tmp_path):
    """From torch.export (.pt2, static shapes: the view, expand and reshape
    sizes of heads and widths are constants the pass rewrites to local
    ones), T = 2 N = 2, against eager."""
    import torch
    from eager import build, eager_training
    from test_zero_multirank import GLOBAL_BATCH, SEQ
    model = build(name)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (GLOBAL_BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    exported = torch.export.export(model, args=(), kwargs={"input_ids": ids,
                                                           "attention_mask": torch.ones_like(ids)},
                                   strict=False)
    pt2 = tmp_path / f"{name}.pt2"
    torch.export.save(exported, str(pt2))
    steps = 4
    batches = torch.randint(0, vocab, (steps, GLOBAL_BATCH, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    remarks, train, params = train_t2_n2(pt2, tmp_path, steps)
    assert "0 chains replicated" in remarks
    lrs = {x["step"]: x["lr"] for x in train}
    reference = build(name)
    losses = eager_training(reference, batches, steps, 1, lambda s: lrs[s], 0.0, 0.01)
    for x, loss in zip(train, losses):
        assert_loss_close(x["loss"], loss, what=f"{name} .pt2: loss of step {x['step']}")
    from safetensors.torch import load_file
    assert_trained_close(load_file(params), dict(reference.named_parameters()), sum(lrs.values()))


def test_bert_token_windows_match_one_process(tmp_path):
    """BERT on --data (random windows drawn for the global batch, each
    data-parallel rank taking its rows, each TP group sharing them) with
    T = 2 N = 4 against bmt's own one-process run with plain SGD, whose
    update is the gradient itself. The one-process run is the reference
    checked against eager PyTorch in test_runtime_parity.py and
    test_seq2seq.py; test_bert_masked_lm_matches_eager checks the TP runs on
    fixed batches against eager transformers."""
    from safetensors.torch import load_file
    from test_bmt_run import bmt_run, write_tokens
    from eager import build, compile_model
    tp, ranks = 2, 4
    model = build("bert")
    one = compile_model(model, tmp_path, "bert")
    split = tmp_path / "bert.tp.pt"
    pt = tmp_path / "bert.pt"
    compiled = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(split), "--world-size",
                               str(ranks), "--tensor-parallel", str(tp)],
                              capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    assert "attention.self.query, attention.self.key, attention.self.value column-parallel" \
        in compiled.stderr, compiled.stderr
    data = write_tokens(tmp_path / "d", [5 + (i * 7) % 90 for i in range(8000)], 100, eos_id=1,
                        mask_id=3)
    common = ["--data", data, "--steps", 2, "--seq-len", 24, "--optimizer", "sgd", "--lr", "0.5",
              "--schedule", "constant", "--warmup", 0, "--clip-grad", 0, "--weight-decay", 0,
              "--seed", 4]
    rows = 4   # global micro-batch
    ref = bmt_run(one, *common, "--micro-batch", rows, "--log-file", tmp_path / "one.jsonl",
                  "--save-params", tmp_path / "one.safetensors")
    assert ref.returncode == 0, ref.stderr
    got = torchrun(ranks, split, *common, "--micro-batch", rows // (ranks // tp),
                   "--log-file", tmp_path / "tp.jsonl", "--save-params", tmp_path / "tp.safetensors")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    losses = [[json.loads(x)["loss"] for x in open(tmp_path / f) if '"train"' in x]
              for f in ("one.jsonl", "tp.jsonl")]
    assert len(losses[0]) == 2
    for a, b in zip(*losses):
        assert_loss_close(b, a, what=f"losses {losses}")
    want, have = load_file(tmp_path / "one.safetensors"), load_file(tmp_path / "tp.safetensors")
    assert sorted(want) == sorted(have)
    # fp32 sums in another order over the split: differences of ~1e-7 after
    # updates of size ~1e-2 (a doubled gradient would differ by ~1e-2).
    worst = max((want[k] - have[k]).abs().max().item() for k in want)
    assert worst <= 1e-5, worst


@pytest.mark.parametrize("ranks,flags,message", [
    (2, ["--objective", "model-loss"], "--objective model-loss is not supported with it yet"),
    (3, [], "it needs a world size that is a multiple of 2, not 3 ranks"),
])
def test_what_tensor_parallel_refuses_for_now(traced, ranks, flags, message):  # noqa: F811
    """Each refusal of a T = 2 plan follows from the options and the plan,
    so every rank finds it alike: one error line (rank 0's), a non-zero
    exit and no step trained."""
    if traced["name"] != "gpt2":
        pytest.skip("one model is enough")
    tmp = traced["tmp"] / "refusals"
    tmp.mkdir(exist_ok=True)
    sharded = tmp / "sharded.pt"
    if not sharded.exists():
        subprocess.run([binary("bmt-opt"), str(traced["pt"]), "-o", str(sharded), "--world-size",
                        "2", "--tensor-parallel", "2"], check=True, capture_output=True)
    log = tmp / f"log{ranks}{''.join(flags)}.jsonl"  # one per case: a case that trained must not hide
    r = torchrun(ranks, sharded, "--batches", traced["tmp"] / "batches.pt", "--steps", 1,
                 "--log-file", log, *flags)
    assert r.returncode != 0
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, r.stderr[-3000:]
    assert errors[0].startswith(f"error: {sharded} is compiled for tensor parallelism (2 ranks "
                                "per TP group): "), errors[0]
    assert message in errors[0], r.stderr[-3000:]
    assert not log.exists() or not [x for x in open(log) if '"train"' in x]


@pytest.mark.parametrize("heads,kv_heads,fmt,tp,attention", [
    (4, 1, "pt", 2, "eager"), (4, 1, "pt2", 2, "eager"), (4, 2, "pt2", 4, "eager"),
    (6, 2, "pt", 3, "eager"), (4, 2, "pt", 4, "sdpa")])
def test_replicated_kv_matches_eager(heads, kv_heads, fmt, tp, attention, tmp_path):
    """LLaMA whose kv heads T does not divide: multi-query attention (1 kv
    head) at T = 2, the fixture's grouped-query attention (2 kv heads) at
    T = 4 from torch.export (and with scaled_dot_product_attention from a
    trace), and 6 query heads on 2 kv heads at T = 3 (a rank's 2 query
    heads straddle the kv heads). The k/v projections are
    replicated (reduce_grad), q and o split by heads, each rank narrows the
    repeated kv heads to its own query heads; N = T, against eager on the
    same weights and batches."""
    import torch
    import transformers
    import make_fixtures
    from safetensors.torch import load_file
    from eager import eager_training
    from test_zero_multirank import GLOBAL_BATCH, SEQ

    def build():
        torch.manual_seed(0)
        cls, config = make_fixtures.MODELS["llama"](transformers)
        config.num_key_value_heads = kv_heads
        config.num_attention_heads = heads
        config.head_dim = 8
        config.hidden_size = 8 * heads
        config.intermediate_size = 16 * heads
        config._attn_implementation = attention
        return cls(config).eval()

    model = build()
    vocab = model.config.vocab_size
    # torch.export's shapes are static: N = T, so a rank's micro-batch is the global batch.
    ids = torch.randint(0, vocab, (GLOBAL_BATCH if fmt == "pt2" else 2, SEQ),
                        generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    path = tmp_path / f"llama-kv{kv_heads}.{fmt}"
    if fmt == "pt":
        torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(str(path))
    else:
        torch.export.save(torch.export.export(model, args=(), kwargs=inputs, strict=False), str(path))
    steps = 6
    batches = torch.randint(0, vocab, (steps, GLOBAL_BATCH, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    sharded = tmp_path / "sharded.pt"
    compiled = subprocess.run([binary("bmt-opt"), str(path), "-o", str(sharded), "--world-size",
                               str(tp), "--tensor-parallel", str(tp)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    kv_text = "1 kv head" if kv_heads == 1 else f"{kv_heads} kv heads"
    assert f"self_attn.q_proj column-parallel by heads ({heads} -> {heads // tp} per rank), self_attn.k_proj, " \
        f"self_attn.v_proj k/v replicated on {tp} ranks ({kv_text} < T = {tp}), reduce_grad" \
        in compiled.stderr, compiled.stderr
    assert "0 chains replicated" in compiled.stderr
    log, params = tmp_path / "log.jsonl", tmp_path / "params.safetensors"
    r = torchrun(tp, sharded, "--batches", tmp_path / "batches.pt", "--steps", steps, "--lr", "1e-3",
                 "--clip-grad", 0.5, "--weight-decay", 0.01, "--log-file", log, "--save-params", params)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    train = [x for x in map(json.loads, open(log)) if x["kind"] == "train"]
    assert [x["step"] for x in train] == list(range(1, steps + 1))
    lrs = {x["step"]: x["lr"] for x in train}
    reference = build()
    losses = eager_training(reference, batches, steps, 1, lambda s: lrs[s], 0.5, 0.01)
    for x, loss in zip(train, losses):
        assert_loss_close(x["loss"], loss, what=f"kv heads {kv_heads} T = {tp}: loss of step {x['step']}")
    got = load_file(params)
    assert got["model.layers.0.self_attn.k_proj.weight"].shape == (8 * kv_heads, 8 * heads)
    assert_trained_close(got, dict(reference.named_parameters()), sum(lrs.values()))


class Mt19937_64:
    """std::mt19937_64 (C++ [rand.eng.mers], the parameters of [rand.predef];
    Matsumoto and Nishimura's 64-bit Mersenne Twister), written out so that
    the eager reference draws bmt-run's masked-LM masks itself."""
    N, M, MASK = 312, 156, (1 << 64) - 1

    def __init__(self, seed):
        self.state = [seed & self.MASK]
        for i in range(1, self.N):
            x = self.state[-1]
            self.state.append((6364136223846793005 * (x ^ (x >> 62)) + i) & self.MASK)
        self.index = self.N

    def __call__(self):
        if self.index == self.N:
            s, n, m = self.state, self.N, self.M
            for i in range(n):
                y = (s[i] & 0xFFFFFFFF80000000) | (s[(i + 1) % n] & 0x7FFFFFFF)
                s[i] = s[(i + m) % n] ^ (y >> 1) ^ (0xB5026F5AA96619E9 if y & 1 else 0)
            self.index = 0
        x = self.state[self.index]
        self.index += 1
        x ^= (x >> 29) & 0x5555555555555555
        x ^= (x << 17) & 0x71D67FFFEDA60000
        x ^= (x << 37) & 0xFFF7EEE000000000
        return (x ^ (x >> 43)) & self.MASK

    def uniform01(self):  # 53 random bits (runtime/data/Random.h)
        return (self() >> 11) / 9007199254740992.0

    def below(self, n):  # [0, n) by rejection (runtime/data/Random.h)
        threshold = (1 << 64) % n
        while True:
            x = self()
            if x >= threshold:
                return x % n


def test_mt19937_64_replica():
    # The C++ standard's check value ([rand.predef]: the 10000th draw of a
    # default-constructed mt19937_64, seed 5489).
    rng = Mt19937_64(5489)
    for _ in range(9999):
        rng()
    assert rng() == 9981545732273789042


def mask_tokens(tokens, mask_id, vocab, rng, probability=0.15):
    """BERT's masked-LM corruption (Devlin et al. 2019, section 3.1) in the
    order of bmt-run's draws (docs/runtime/objectives.md): each token of the
    [rows, seq] batch in row-major order is picked with `probability`, a
    picked one becomes [MASK] (80 %), a uniform random id (10 %) or stays;
    if none is picked, one uniform position is. (inputs, labels: -100 where
    not picked)."""
    import torch
    flat = tokens.flatten().tolist()
    inputs, labels = list(flat), [-100] * len(flat)

    def corrupt(i):
        labels[i] = flat[i]
        r = rng.uniform01()
        if r < 0.8:
            inputs[i] = mask_id
        elif r < 0.9:
            inputs[i] = rng.below(vocab)

    picked = False
    for i in range(len(flat)):
        if rng.uniform01() < probability:
            corrupt(i)
            picked = True
    if not picked:
        corrupt(rng.below(len(flat)))
    return (torch.tensor(inputs).view(tokens.shape), torch.tensor(labels).view(tokens.shape))


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """The fixture BERT (masked LM) traced, the token windows, a token file
    that only carries the [MASK] id (bmt-run trains on --batches and takes
    the mask id from --data's metadata; ids 4.. in the batches, so that a
    [MASK] is never an original token) and the cache of eager_masked_lm's
    reference runs."""
    import torch
    from test_bmt_run import write_tokens
    from eager import build
    from test_zero_multirank import GLOBAL_BATCH, SEQ
    tmp = tmp_path_factory.mktemp("bert")
    model = build("bert")
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, SEQ), generator=torch.Generator().manual_seed(1))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    pt = tmp / "bert.pt"
    torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(str(pt))
    batches = torch.randint(4, vocab, (STEPS, GLOBAL_BATCH, SEQ + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp / "batches.pt")
    data = write_tokens(tmp / "mask", list(range(4, 100)), vocab, mask_id=3)
    return {"pt": pt, "batches": batches, "data": data, "tmp": tmp, "vocab": vocab, "eager": {}}


def eager_masked_lm(bert, lrs, clip, wd, seed):
    """Losses, gradient norms (before clipping) and final parameters of
    eager BertForMaskedLM trained on `bert`'s batches with bmt-run's masks
    of --seed `seed` (one generator for the run, one global batch a step)."""
    key = (tuple(sorted(lrs.items())), clip, wd, seed)
    if key in bert["eager"]:
        return bert["eager"][key]
    import torch
    from eager import build, decay_groups
    from test_zero_multirank import SEQ
    model = build("bert")
    opt = torch.optim.AdamW(decay_groups(model.parameters(), wd), lr=1.0, betas=(0.9, 0.999),
                            eps=1e-8)
    rng = Mt19937_64(seed)
    losses, norms = [], []
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        ids, labels = mask_tokens(bert["batches"][step - 1][:, :SEQ], 3, bert["vocab"], rng)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 labels.reshape(-1), ignore_index=-100)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                    clip if clip > 0 else float("inf")).item())
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        opt.step()
        losses.append(loss.item())
    bert["eager"][key] = losses, norms, {n: p.detach().clone() for n, p in model.named_parameters()}
    return bert["eager"][key]


BERT_CONFIGS = {
    # name: (tensor parallel T, world size N, bmt-opt's --checkpoint); the
    # fixture's 4 heads, 64-wide MLP and 128 tokens divide by T = 4 as well.
    "t2-n2": (2, 2, None),
    "t2-n2-no-recompute": (2, 2, "none"),
    "t2-n4": (2, 4, None),
    "t4-n4": (4, 4, None),
}


@pytest.mark.parametrize("config", list(BERT_CONFIGS))
def test_bert_masked_lm_matches_eager(bert, config):
    """BERT (post-LN: the attention module passes its input both to the
    q/k/v module and, as the residual, to the output module, so the tp_copy
    sits at the q/k/v call; above it, each block would multiply the lower
    blocks' gradients by T) trained with --tensor-parallel T on N ranks
    (BERT_CONFIGS: with and without recompute) against eager transformers:
    the masked-LM corruption of the whole global batch drawn as bmt-run
    draws it, every step's loss and the final gathered parameters; and
    every step's gradient norm, which AdamW's scale-free update would not
    show (a gradient summed over the TP group where it should not be: the
    bug the tp_copy placement avoids)."""
    tp, ranks, checkpoint = BERT_CONFIGS[config]
    tmp = bert["tmp"] / config
    tmp.mkdir()
    sharded = tmp / "sharded.pt"
    compiled = subprocess.run([binary("bmt-opt"), str(bert["pt"]), "-o", str(sharded),
                               "--world-size", str(ranks), "--tensor-parallel", str(tp),
                               *(["--checkpoint", checkpoint] if checkpoint else [])],
                              capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    recomputed = 0 if checkpoint == "none" else 2
    assert f"{recomputed} of 2 blocks recomputed" in compiled.stderr, compiled.stderr
    assert f"tensor parallel: {tp} ranks per group;" in compiled.stderr, compiled.stderr
    assert f"attention.self.query, attention.self.key, attention.self.value column-parallel " \
        f"by heads (4 -> {4 // tp} per rank)" in compiled.stderr, compiled.stderr
    assert f"vocab-parallel embedding and LM head (128 -> {128 // tp} per rank)" in compiled.stderr
    log, params = tmp / "log.jsonl", tmp / "params.safetensors"
    seed = 4
    r = torchrun(ranks, sharded, "--batches", bert["tmp"] / "batches.pt", "--data", bert["data"],
                 "--steps", STEPS, "--lr", "1e-3", "--schedule", "cosine", "--warmup", 2,
                 "--clip-grad", 0.5, "--weight-decay", 0.01, "--seed", seed, "--log-file", log,
                 "--save-params", params)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "objective masked-lm" in r.stdout, r.stdout[-3000:]
    train = [json.loads(x) for x in open(log) if '"train"' in x]
    assert [x["step"] for x in train] == list(range(1, STEPS + 1))
    lrs = {x["step"]: x["lr"] for x in train}
    losses, norms, want = eager_masked_lm(bert, lrs, 0.5, 0.01, seed)
    for x, loss, norm in zip(train, losses, norms):
        assert_loss_close(x["loss"], loss, what=f"bert {config}: loss of step {x['step']}")
        assert_close(x["grad_norm"], norm,
                     what=f"bert {config}: gradient norm of step {x['step']}")
    from safetensors.torch import load_file
    stats = assert_trained_close(load_file(params), want, sum(lrs.values()))
    worst = max(abs(x["grad_norm"] - n) / n for x, n in zip(train, norms))
    print(f"bert {config}: parameters max {stats[0]:.2e}, mean {stats[1]:.2e}, "
          f"differing {stats[2]:.1%}; gradient norms within {worst:.1e} relative")


def test_sequence_parallel_refuses_a_sequence_t_does_not_divide(traced, tmp_path):  # noqa: F811
    """bmt-run on a --sequence-parallel plan (its parity with eager is
    CONFIGS' t2-n2-sequence-parallel) with 7-token sequences at T = 2, from
    --batches and from --data --seq-len 7: before any step, one error line
    (rank 0's) naming --sequence-parallel, T and where the length comes
    from."""
    if traced["name"] != "gpt2":
        pytest.skip("one model is enough")
    import torch
    from test_bmt_run import write_tokens
    sharded = tmp_path / "sharded.pt"
    subprocess.run([binary("bmt-opt"), str(traced["pt"]), "-o", str(sharded), "--world-size", "2",
                    "--tensor-parallel", "2", "--sequence-parallel"], check=True,
                   capture_output=True)
    odd = tmp_path / "odd.pt"
    torch.save(traced["batches"][:1, :2, :8].clone(), odd)  # 7 tokens and their targets
    data = write_tokens(tmp_path / "d", list(range(1, 400)), 128)
    want = f"error: {sharded} was compiled with --sequence-parallel, which splits the sequence " \
        "over the 2 ranks of a tensor-parallel group, so the sequence length must be a multiple " \
        "of 2; "
    for source, where in [(["--batches", odd], f"{odd} holds sequences of 7 tokens"),
                          (["--data", data, "--seq-len", 7, "--micro-batch", 2], "--seq-len is 7")]:
        log = tmp_path / f"log{source[0]}.jsonl"
        r = torchrun(2, sharded, *source, "--steps", 1, "--log-file", log)
        assert r.returncode != 0
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert errors == [want + where], r.stdout[-3000:] + r.stderr[-3000:]
        assert not log.exists() or not [x for x in open(log) if '"train"' in x]


def test_sequence_parallel_needs_tensor_parallel(traced):  # noqa: F811
    """--sequence-parallel without --tensor-parallel T > 1, or with a
    --seq-len T does not divide: one error, no plan written."""
    for flags, message in [
            ([], "error: --sequence-parallel needs --tensor-parallel T > 1"),
            (["--tensor-parallel", "2", "--world-size", "2", "--seq-len", "7"],
             "error: --sequence-parallel: --seq-len 7 is not a multiple of --tensor-parallel 2")]:
        out = traced["tmp"] / "sp-refused.pt"
        r = subprocess.run([binary("bmt-opt"), str(traced["pt"]), "-o", str(out), "--sequence-parallel",
                            *flags], capture_output=True, text=True)
        assert r.returncode != 0
        assert message in r.stderr, r.stderr
        assert not out.exists()


# Architectures users train today that the fixtures lack: per-head q/k norms
# (q_norm, k_norm: RMSNorm weights of head_dim applied to head-split
# activations) and fused projections taken apart by slices, built as
# scripts/architectures.py builds its models: tiny config, eager attention,
# no cache, seed 0.
TP_ARCHS = {
    # name: (transformers class, model_type, config fields)
    "qwen3": ("Qwen3ForCausalLM", "qwen3", dict(tie_word_embeddings=False)),
    "qwen3_tied": ("Qwen3ForCausalLM", "qwen3", dict(tie_word_embeddings=True)),
    # Gemma 3's norms (1 + weight, then type_as) also mix sliding-window and
    # global layers.
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text", dict(sliding_window=4)),
    # Phi-3's fused projections, taken apart by slices (qkv_proj: q, k, v of
    # 4 heads each) and by chunk (gate_up_proj); no q/k norms.
    "phi3": ("Phi3ForCausalLM", "phi3", dict(num_key_value_heads=4, pad_token_id=0)),
}


def build_arch(name):
    import torch
    import transformers
    cls, model_type, fields = TP_ARCHS[name]
    config = transformers.AutoConfig.for_model(
        model_type, **dict(dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                max_position_embeddings=64), **fields))
    config.use_cache = False
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return getattr(transformers, cls)(config).eval()


@pytest.mark.parametrize("name,ranks", [("qwen3", 2), ("qwen3_tied", 4), ("gemma3", 2), ("phi3", 2)])
def test_architectures_match_eager(name, ranks, tmp_path):
    """Qwen3 (untied, and tied on T = 2 N = 4), Gemma 3 and Phi-3 at T = 2
    against eager transformers over 5 AdamW steps: every step's loss and
    gradient norm, and the final parameters. q_norm and k_norm stay whole on
    each TP rank while the heads they scale are split, so each rank's
    gradient of them is the sum over its own heads: the gradient-completion
    proof marks them reduce_grad (without it the losses drifted 1.3e-4 from
    eager in 5 steps); Gemma 3 crashed upstream's sharding-propagation (its
    norms' type_as of a split dtype source). Phi-3's fused qkv_proj and
    gate_up_proj are split in parts, as GPT-2's c_attn (they were refused)."""
    import torch
    from safetensors.torch import load_file
    from eager import decay_groups
    from test_zero_multirank import GLOBAL_BATCH, SEQ
    model = build_arch(name)
    ids = torch.randint(0, 128, (2, SEQ), generator=torch.Generator().manual_seed(1))
    pt = tmp_path / f"{name}.pt"
    torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                    strict=False).save(str(pt))
    steps = 5
    batches = torch.randint(0, 128, (steps, GLOBAL_BATCH, SEQ + 1), generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    sharded = tmp_path / "sharded.pt"
    compiled = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(sharded), "--world-size", str(ranks),
                               "--tensor-parallel", "2"], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    if name == "phi3":
        assert "self_attn.qkv_proj column-parallel by heads (4 -> 2 per rank, fused q/k/v), " \
            "self_attn.o_proj row-parallel; mlp.gate_up_proj column-parallel (128 -> 64 per rank)" \
            in compiled.stderr, compiled.stderr
    else:
        assert "gradient completion: 4 whole parameters read beside split values, each rank's gradient a " \
            "partial sum, reduce_grad (self_attn.q_norm.weight, self_attn.k_norm.weight)" in compiled.stderr, \
            compiled.stderr
        assert "column-parallel by heads (4 -> 2 per rank, kv heads 2 -> 1)" in compiled.stderr, compiled.stderr
    log, params = tmp_path / "log.jsonl", tmp_path / "params.safetensors"
    r = torchrun(ranks, sharded, "--batches", tmp_path / "batches.pt", "--steps", steps, "--lr", "1e-3",
                 "--clip-grad", 0, "--weight-decay", 0.01, "--log-file", log, "--save-params", params)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    train = [x for x in map(json.loads, open(log)) if x["kind"] == "train"]
    assert [x["step"] for x in train] == list(range(1, steps + 1))
    # Eager transformers on the same weights and batches (torch.optim.AdamW
    # with bmt-run's weight-decay groups and learning rates).
    lrs = {x["step"]: x["lr"] for x in train}
    reference = build_arch(name)
    opt = torch.optim.AdamW(decay_groups(reference.parameters(), 0.01), lr=1.0)
    for x, w in zip(train, batches):
        opt.zero_grad()
        logits = reference(input_ids=w[:, :-1], attention_mask=torch.ones_like(w[:, :-1])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), float("inf")).item()
        for group in opt.param_groups:
            group["lr"] = lrs[x["step"]]
        opt.step()
        assert_loss_close(x["loss"], loss.item(), what=f"{name}: loss of step {x['step']}")
        assert_close(x["grad_norm"], norm, what=f"{name}: gradient norm of step {x['step']}")
    stats = assert_trained_close(load_file(params), dict(reference.named_parameters()), sum(lrs.values()))
    print(f"{name} T = 2 N = {ranks}: parameters max {stats[0]:.2e}, mean {stats[1]:.2e}")
