#!/usr/bin/env python3
"""bmt-run on a GPU against eager PyTorch on the same GPU.

usage: gpu_parity.py BMT_RUN DIR NAME...

For each NAME (a model of test/fixtures/make_fixtures.py), DIR/NAME.sharded.pt
must have been compiled (bmt-opt) from that fixture (seed 0): the GPU machine
has no MLIR, so the archives are compiled elsewhere and carried. Runs
`bmt-run --dump --device cuda` on a batch of 3 x 12 tokens and prints the max
abs difference of logits, loss and every parameter gradient against the eager
transformers model on CUDA. Exit status 1 if any exceeds --tol. An
encoder-decoder (t5) gets a 3 x 7 target, fed by teacher forcing (decoder
input = target shifted right behind token 0; the archive must have been
compiled from a trace that runs at those shapes).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bmt_run")
    parser.add_argument("dir")
    parser.add_argument("names", nargs="+")
    parser.add_argument("--tol", type=float, default=1e-4)
    args = parser.parse_args()
    worst_all = 0.0
    for name in args.names:
        import transformers
        torch.manual_seed(0)  # as make_fixtures builds the fixture
        cls, config = make_fixtures.MODELS[name](transformers)
        model = cls(config).eval().cuda()
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(2)
        ids = torch.randint(0, vocab, (3, 12), generator=g)
        masked = name == "bert"
        seq2seq = getattr(model.config, "is_encoder_decoder", False)
        labels = ids.clone()
        if masked:
            labels[torch.rand(ids.shape, generator=g) > 0.3] = -100
            labels[0, 0] = ids[0, 0]
        if seq2seq:
            labels = torch.randint(0, vocab, (3, 7), generator=g)
        with tempfile.TemporaryDirectory() as tmp:
            torch.save({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels},
                       f"{tmp}/in.pt")
            r = subprocess.run([args.bmt_run, os.path.join(args.dir, f"{name}.sharded.pt"), "--dump",
                                f"{tmp}/in.pt", f"{tmp}/out.pt", "--device", "cuda"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{name}: bmt-run failed: {r.stderr.strip()}")
                return 1
            got = torch.load(f"{tmp}/out.pt", weights_only=False)
        ids, labels = ids.cuda(), labels.cuda()
        if seq2seq:
            decoder = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                           decoder_input_ids=decoder).logits
        else:
            logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        if masked or seq2seq:
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
        else:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                                                     labels[:, 1:].reshape(-1))
        loss.backward()
        diffs = {"logits": (got["logits"] - logits.detach().cpu()).abs().max().item(),
                 "loss": abs(got["loss"].item() - loss.item())}
        grads = [(got["grad/" + n] - p.grad.cpu()).abs().max().item()
                 for n, p in model.named_parameters()]
        diffs["grads (max over params)"] = max(grads)
        worst = max(diffs.values())
        worst_all = max(worst_all, worst)
        print(f"{name}: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()) +
              f" over {len(grads)} parameters")
    print(f"worst max abs difference {worst_all:.2e} (tolerance {args.tol:.0e})")
    return 0 if worst_all <= args.tol else 1


if __name__ == "__main__":
    sys.exit(main())
