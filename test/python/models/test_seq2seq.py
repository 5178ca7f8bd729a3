"""Encoder-decoders (T5) through bmt: forward and gradients, training, span
corruption, against eager transformers on the same weights and batches.

- bmt-run --dump of the tiny T5 (make_fixtures' config), traced (.pt) and
  exported (.pt2): logits, loss and every gradient within numerics.py's tolerances of eager with
  teacher forcing (decoder input = labels shifted right behind token 0).
- Training on ready source/target pairs (--batches {"input_ids", "labels"}):
  5 AdamW steps with gradient accumulation and clipping, in one process and
  on 2 ranks under torchrun (ZeRO-3 over T5's encoder and decoder blocks),
  against torch.optim.AdamW: losses and final parameters as numerics.py
  bounds them. Span corruption and masked LM on 2 ranks give one process's losses.
- Span corruption from a token file: the sizes bmt-run reports against the
  T5 paper's rule computed here, a learnable sequence's loss going down,
  sentinels from the data's metadata or the model's top ids, and the errors.
- The decoder start and pad ids of the exported config (3 and 5, not T5's
  0): training on pairs as transformers' own shift of the labels trains.
"""
import json
import math
import subprocess
import warnings

import pytest
import torch

from bmt_paths import binary, tool
from numerics import (assert_close, assert_gradients_close, assert_loss_close,
                      assert_trained_close)
from test_bmt_run import assert_one_error, bmt_run, write_tokens
from eager import build, compile_model, decay_groups
from test_zero_multirank import torchrun

warnings.filterwarnings("ignore")
VOCAB = 128


def shift_right(labels, start=0):
    """Teacher forcing's decoder input, written out here (not transformers')."""
    dec = torch.full_like(labels, start)
    dec[:, 1:] = labels[:, :-1]
    return dec.masked_fill(dec == -100, 0)


def seq2seq_loss(model, ids, labels):
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                   decoder_input_ids=shift_right(labels)).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                             labels.reshape(-1), ignore_index=-100)
    return logits, loss


def example(batch, src, tgt, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (batch, src), generator=g),
            torch.randint(0, VOCAB, (batch, tgt), generator=g))


def compile_t5(model, tmp_path, fmt, ids, labels):
    """Trace (.pt) or export (.pt2) as a user does, with decoder_input_ids."""
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "decoder_input_ids": shift_right(labels)}
    path = str(tmp_path / f"t5.{fmt}")
    if fmt == "pt2":
        torch.export.save(torch.export.export(model, (), inputs, strict=False), path)
    else:
        with torch.no_grad():
            torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(path)
    sharded = str(tmp_path / f"t5-{fmt}.sharded.pt")
    r = subprocess.run([binary("bmt-opt"), path, "-o", sharded], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "2 in encoder.block" in out and "2 in decoder.block" in out, out
    return sharded


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("t5")
    model = build("t5")
    ids, labels = example(2, 8, 5, 1)
    return model, compile_t5(model, tmp, "pt", ids, labels), tmp


@pytest.mark.parametrize("fmt", ["pt", "pt2"])
def test_t5_forward_and_gradients_match_eager(fmt, tmp_path):
    model = build("t5")
    # A trace runs at other shapes; a static .pt2 at its export's.
    shape = (3, 12, 7) if fmt == "pt" else (2, 8, 5)
    ids, labels = example(*shape, seed=2)
    labels[0, -1] = -100  # an ignored target position
    sharded = compile_t5(model, tmp_path, fmt, *example(2, 8, 5, 1))
    torch.save({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels},
               tmp_path / "in.pt")
    r = bmt_run(sharded, "--dump", tmp_path / "in.pt", tmp_path / "out.pt")
    assert r.returncode == 0, r.stderr
    assert "objective span-corruption" in r.stdout
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    logits, loss = seq2seq_loss(model, ids, labels)
    loss.backward()
    assert got["logits"].shape == logits.shape
    assert_close(got["logits"], logits, what="logits")
    assert_loss_close(got["loss"].item(), loss.item())
    grads = {k[5:]: v for k, v in got.items() if k.startswith("grad/")}
    assert_gradients_close(grads, {n: p.grad for n, p in model.named_parameters()})


def eager_pairs_training(model, ids, labels, steps, accum, lrs, clip, loss_fn=seq2seq_loss):
    opt = torch.optim.AdamW(decay_groups(model.parameters(), 0.01), lr=1.0, betas=(0.9, 0.999),
                            eps=1e-8)
    losses, k = [], 0
    for step in range(1, steps + 1):
        opt.zero_grad()
        total = 0.0
        for _ in range(accum):
            _, loss = loss_fn(model, ids[k % len(ids)], labels[k % len(ids)])
            k += 1
            (loss / accum).backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        opt.step()
        losses.append(total / accum)
    return losses


@pytest.mark.parametrize("ranks", [1, 2])
def test_training_on_pairs_matches_torch_optim(ranks, t5):
    _, sharded, tmp = t5
    model = build("t5")
    steps, accum = 5, 2
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (steps * accum, 4, 9), generator=g)
    labels = torch.randint(0, VOCAB, (steps * accum, 4, 6), generator=g)
    # Padded targets are ignored; only in rank 0's rows, so that the ranks'
    # shares of the predicted tokens differ (each weights its mean by it).
    labels[:, 1, -3:] = -100
    batches = tmp / f"pairs{ranks}.pt"
    torch.save({"input_ids": ids, "labels": labels}, batches)
    log, params = tmp / f"log{ranks}.jsonl", tmp / f"params{ranks}.safetensors"
    args = [sharded, "--batches", batches, "--steps", steps, "--grad-accum", accum, "--lr", "2e-3",
            "--warmup", 2, "--clip-grad", "0.5", "--log-file", log, "--save-params", params]
    r = torchrun(2, *args) if ranks == 2 else bmt_run(*args)
    assert r.returncode == 0, r.stderr
    train = [json.loads(x) for x in open(log) if '"train"' in x]
    lrs = {x["step"]: x["lr"] for x in train}
    want = eager_pairs_training(model, ids, labels, steps, accum, lrs, 0.5)
    for x, w in zip(train, want):
        assert_loss_close(x["loss"], w, what=f"loss of step {x['step']}")
    from safetensors.torch import load_file
    got = load_file(params)
    stats = assert_trained_close(got, dict(model.named_parameters()), sum(lrs.values()))
    print(f"t5 on {ranks} rank(s): parameters max {stats[0]:.2e}, mean {stats[1]:.2e}")


@pytest.mark.parametrize("name", ["t5", "bert"])
def test_corrupting_objectives_train_alike_on_1_and_2_ranks(name, t5, tmp_path):
    """Span corruption and masked-LM corrupt the global batch the same way
    on every rank and weight each rank's loss by its share of the predicted
    tokens: 2 ranks with micro-batch 2 give the losses of one process with
    micro-batch 4."""
    sharded = t5[1] if name == "t5" else compile_model(build("bert"), tmp_path, "bert")
    data = write_tokens(tmp_path / "d", [5 + (i * 7) % 90 for i in range(8000)], 100, eos_id=1,
                        mask_id=3)
    common = ["--data", data, "--steps", 3, "--seq-len", 24, "--lr", "1e-3", "--seed", 4]
    one = bmt_run(sharded, *common, "--micro-batch", 4, "--log-file", tmp_path / "one.jsonl")
    assert one.returncode == 0, one.stderr
    two = torchrun(2, sharded, *common, "--micro-batch", 2, "--log-file", tmp_path / "two.jsonl")
    assert two.returncode == 0, two.stderr
    losses = [[json.loads(x)["loss"] for x in open(tmp_path / f) if '"train"' in x]
              for f in ("one.jsonl", "two.jsonl")]
    assert len(losses[0]) == 3
    for a, b in zip(*losses):
        assert_loss_close(b, a, what=f"losses {losses}")


def expected_sizes(encoder_len, density=0.15, mean_span=3.0):
    """The window, noise tokens, spans and target length of T5's span
    corruption for an encoder input of encoder_len tokens (round() is half
    to even, as numpy's)."""
    def sizes(w):
        noise = min(max(round(w * density), 1), w - 1)
        spans = min(max(round(noise / mean_span), 1), noise, w - noise)
        return noise, spans, w - noise + spans + 1, noise + spans + 1
    w = 2
    while sizes(w + 1)[2] <= encoder_len:
        w += 1
    return (w, *sizes(w))


def test_span_corruption_training_lowers_the_loss(t5):
    _, sharded, tmp = t5
    # A learnable sequence over ids 5..36 (the model's top ids are free for
    # sentinels: the data's vocabulary is 100).
    data = write_tokens(tmp / "train", [5 + (i % 32) for i in range(20000)], 100, eos_id=1)
    log = tmp / "span.jsonl"
    r = bmt_run(sharded, "--data", data, "--eval-data", data, "--eval-batches", 4, "--steps", 40,
                "--micro-batch", 8, "--seq-len", 32, "--lr", "3e-3", "--warmup", 5,
                "--log-file", log)
    assert r.returncode == 0, r.stderr
    window, noise, spans, enc, target = expected_sizes(32)
    assert enc == 32
    assert (f"span corruption: windows of {window} tokens -> encoder input 32 + target "
            f"{target} tokens ({noise} corrupted in {spans} spans); sentinels from the model's "
            f"top ids ({VOCAB - 1}, ...), eos 1, decoder start 0") in r.stdout, r.stdout
    records = [json.loads(line) for line in open(log)]
    train = [x["loss"] for x in records if x["kind"] == "train"]
    assert len(train) == 40 and all(math.isfinite(x) for x in train)
    assert sum(train[-5:]) / 5 < 0.7 * sum(train[:5]) / 5
    # Tokens per step: the encoder inputs of 8 windows.
    assert records[0]["tokens"] == 8 * 32
    assert records[-1]["kind"] == "eval" and records[-1]["val_loss"] < train[0]
    assert records[-1]["tokens"] == 4 * 8 * target


def test_span_corruption_sentinels_from_the_tokenizer(t5):
    _, sharded, tmp = t5
    sentinels = list(range(127, 27, -1))  # T5's <extra_id_0> = the top id, downwards
    data = write_tokens(tmp / "t5tok", [30 + (i % 20) for i in range(5000)], VOCAB, eos_id=1,
                        pad_id=0, sentinel_ids=sentinels)
    r = bmt_run(sharded, "--data", data, "--steps", 2, "--micro-batch", 2, "--seq-len", 64,
                "--decoder-start-id", 2)
    assert r.returncode == 0, r.stderr
    assert "sentinels from the tokenizer's <extra_id_N> (127, ...), eos 1, decoder start 2" in r.stdout
    # Too few sentinels for a window's spans.
    few = write_tokens(tmp / "few", [30 + (i % 20) for i in range(5000)], VOCAB, eos_id=1,
                       sentinel_ids=[127, 126])
    assert_one_error(bmt_run(sharded, "--data", few, "--steps", 1, "--seq-len", 64),
                     "few.bin", "2 sentinel tokens", "spans")


def test_encoder_decoder_errors(t5, tmp_path):
    _, sharded, tmp = t5
    full = write_tokens(tmp_path / "full", [5 + (i % 32) for i in range(5000)], VOCAB)
    # The data uses the whole vocabulary and has no sentinels.
    assert_one_error(bmt_run(sharded, "--data", full, "--steps", 1, "--seq-len", 32),
                     "sentinel ids", "<extra_id_N>", "128")
    assert_one_error(bmt_run(sharded, "--data", full, "--steps", 1, "--objective", "causal-lm"),
                     "encoder-decoder", "span-corruption")
    assert_one_error(bmt_run(sharded, "--data", full, "--steps", 1, "--seq-len", 2), "--seq-len")
    torch.save({"input_ids": torch.zeros(2, 2, 5, dtype=torch.long)}, tmp_path / "bad.pt")
    assert_one_error(bmt_run(sharded, "--batches", tmp_path / "bad.pt", "--steps", 1),
                     "bad.pt", "labels")
    torch.save({"input_ids": torch.zeros(2, 8, dtype=torch.long)}, tmp_path / "nolabels.pt")
    assert_one_error(bmt_run(sharded, "--dump", tmp_path / "nolabels.pt", tmp_path / "o.pt"),
                     "nolabels.pt", "labels")
    # A decoder-only model refuses the objective and the pairs.
    gpt2 = compile_model(build("gpt2"), tmp_path, "gpt2")
    assert_one_error(bmt_run(gpt2, "--data", full, "--steps", 1, "--objective", "span-corruption"),
                     "span-corruption", "not one")
    torch.save({"input_ids": torch.zeros(1, 2, 5, dtype=torch.long),
                "labels": torch.zeros(1, 2, 3, dtype=torch.long)}, tmp_path / "pairs.pt")
    assert_one_error(bmt_run(gpt2, "--batches", tmp_path / "pairs.pt", "--steps", 1),
                     "pairs.pt", "encoder-decoder")


def transformers_loss(model, ids, labels):
    """transformers' own teacher forcing: decoder_input_ids from labels by
    its shift (config.decoder_start_token_id first, -100 -> pad_token_id)."""
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                             labels.reshape(-1), ignore_index=-100)
    return logits, loss


def test_decoder_start_id_comes_from_the_exported_config(tmp_path):
    """A T5 whose config starts the decoder with 3 and pads with 5 (as BART
    starts with 2, not T5's 0): exported by bmt-export-hf --checkpoint (which
    carries the config), trained on pairs as transformers trains it."""
    model = build("t5")
    model.config.decoder_start_token_id, model.config.pad_token_id = 3, 5
    model.save_pretrained(tmp_path / "hf")
    pt, sharded = tmp_path / "t5.pt", tmp_path / "t5.sharded.pt"
    r = subprocess.run([*tool("bmt-export-hf"), "--checkpoint", str(tmp_path / "hf"),
                        "--seq-len", "8", "-o", str(pt)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(sharded)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    steps = 3
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, VOCAB, (steps, 4, 9), generator=g)
    labels = torch.randint(0, VOCAB, (steps, 4, 6), generator=g)
    labels[:, 1, -2:] = -100  # padded targets: the decoder reads pad_token_id there
    torch.save({"input_ids": ids, "labels": labels}, tmp_path / "pairs.pt")
    log = tmp_path / "log.jsonl"
    r = bmt_run(sharded, "--batches", tmp_path / "pairs.pt", "--steps", steps, "--lr", "2e-3",
                "--clip-grad", "0.5", "--log-file", log)
    assert r.returncode == 0, r.stderr
    train = [json.loads(x) for x in open(log) if '"train"' in x]
    lrs = {x["step"]: x["lr"] for x in train}
    want = eager_pairs_training(model, ids, labels, steps, 1, lrs, 0.5, transformers_loss)
    for x, w in zip(train, want):
        assert_loss_close(x["loss"], w, what=f"loss of step {x['step']}")
    assert "decoder start 3 (the model's config.json decoder_start_token_id)" in r.stdout, r.stdout
