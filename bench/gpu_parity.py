#!/usr/bin/env python3
"""bmt-run on a GPU against eager PyTorch on the same GPU.

usage: gpu_parity.py BMT_RUN DIR NAME...

For each NAME (a model of test/fixtures/make_fixtures.py), DIR/NAME.sharded.pt
must have been compiled (bmt-opt) from that fixture (seed 0): the GPU machine
has no MLIR, so the archives are compiled elsewhere and carried. The default
pipeline fuses elementwise regions; `bmt-opt --fuse-elementwise=false` makes
the plain plans (bench/gpu_fusion.sh checks both). Runs
`bmt-run --dump --device cuda` on a batch of 3 x 12 tokens and prints the max
abs difference of logits, loss and every parameter gradient against the eager
transformers model on CUDA. Exit status 1 if any exceeds --tol.

With --dtype bfloat16, DIR/NAME.sharded.pt must come from the fixture in
bfloat16 (bench/make_bf16_fixtures.py), and the reference is the float32
model: bmt's bf16 logits, loss and each parameter's gradient must be as
close to it as eager PyTorch's bf16 model is, within a factor of 2 (plus 2
bf16 ulps of the largest value), since both round to bf16 but in different
places (a fused region rounds once, eager after every op). An
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
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to try the script")
    args = parser.parse_args()
    if args.dtype == "bfloat16":
        return bf16_parity(args)
    worst_all = 0.0
    for name in args.names:
        import transformers
        model, ids, labels = build(name, transformers, args.device)
        got = run_bmt(args.bmt_run, os.path.join(args.dir, f"{name}.sharded.pt"), ids, labels,
                      args.device)
        if got is None:
            return 1
        logits, loss = eager(model, ids.to(args.device), labels.to(args.device))
        loss.backward()
        diffs = {"logits": (got["logits"].float() - logits.detach().float().cpu()).abs().max().item(),
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


def build(name, transformers, device):
    """The fixture model (seed 0, as make_fixtures builds it) on CUDA, and a
    3 x 12 batch with its labels (masked for BERT, a 3 x 7 target for T5)."""
    torch.manual_seed(0)
    cls, config = make_fixtures.MODELS[name](transformers)
    model = cls(config).eval().to(device)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, vocab, (3, 12), generator=g)
    labels = ids.clone()
    if name == "bert":
        labels[torch.rand(ids.shape, generator=g) > 0.3] = -100
        labels[0, 0] = ids[0, 0]
    if getattr(model.config, "is_encoder_decoder", False):
        labels = torch.randint(0, vocab, (3, 7), generator=g)
    return model, ids, labels


def run_bmt(bmt_run, sharded, ids, labels, device):
    """bmt-run --dump on `device`: its logits, loss and grad/NAME tensors, or None."""
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels},
                   f"{tmp}/in.pt")
        r = subprocess.run([bmt_run, sharded, "--dump", f"{tmp}/in.pt", f"{tmp}/out.pt",
                            "--device", device], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{os.path.basename(sharded)}: bmt-run failed: {r.stderr.strip()}")
            return None
        return torch.load(f"{tmp}/out.pt", weights_only=False)


def eager(model, ids, labels):
    """The eager model's logits and loss (bmt-run's objective for its kind)."""
    vocab = model.config.vocab_size
    if getattr(model.config, "is_encoder_decoder", False):
        decoder = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                       decoder_input_ids=decoder).logits
        return logits, torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                         labels.reshape(-1))
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    if model.config.model_type == "bert":
        return logits, torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                         labels.reshape(-1))
    return logits, torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, vocab),
                                                     labels[:, 1:].reshape(-1))


def bf16_parity(args):
    import transformers
    worst_ratio = 0.0
    for name in args.names:
        ref, ids, labels = build(name, transformers, args.device)
        half = build(name, transformers, args.device)[0].to(torch.bfloat16)
        got = run_bmt(args.bmt_run, os.path.join(args.dir, f"{name}.sharded.pt"), ids, labels,
                      args.device)
        if got is None:
            return 1
        values = {}
        for label, m in (("ref", ref), ("eager", half)):
            logits, loss = eager(m, ids.to(args.device), labels.to(args.device))
            loss.backward()
            values[label] = {"logits": logits.detach().float().cpu(), "loss": loss.detach().float().cpu()}
            for n, p in m.named_parameters():
                values[label]["grad/" + n] = p.grad.float().cpu()
        bmt = {"logits": got["logits"].float(), "loss": got["loss"].float()}
        bmt.update({k: got[k].float() for k in values["ref"] if k.startswith("grad/")})
        ulp = 2.0 ** -8
        ratios, text = [], []
        for key in ["logits", "loss"] + sorted(k for k in values["ref"] if k.startswith("grad/")):
            want = values["ref"][key]
            d_bmt = (bmt[key] - want).abs().max().item()
            d_eager = (values["eager"][key] - want).abs().max().item()
            bound = 2 * d_eager + 2 * ulp * want.abs().max().item()
            ratios.append((d_bmt / bound if bound > 0 else 0.0, key, d_bmt, d_eager))
        r, key, d_bmt, d_eager = max(ratios)
        worst_ratio = max(worst_ratio, r)
        logit = next(x for x in ratios if x[1] == "logits")
        print(f"{name} (bf16): logits {logit[2]:.2e} from float32 (eager bf16 {logit[3]:.2e}); "
              f"worst of {len(ratios)} values {key}: {d_bmt:.2e} (eager bf16 {d_eager:.2e}), "
              f"{r:.2f} of the bound")
    print(f"worst bf16 difference {worst_ratio:.2f} of the bound (2 x eager bf16's + 2 ulps)")
    return 0 if worst_ratio <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
