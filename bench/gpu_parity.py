#!/usr/bin/env python3
"""bmt-run on a GPU against eager PyTorch on the same GPU.

usage: gpu_parity.py BMT_RUN DIR NAME... [--dtype bfloat16] [--tol T] [--jobs N] [--device cpu]

NAME is an architecture of docs/architectures.md by its short name (gpt2,
llama, llama_tied, mistral, qwen2, gemma, bert, opt, bloom, gpt_neox,
falcon, phi, gptj, t5; `all` for the 14): the tiny config of
scripts/architectures.py ARCHS (the one source of the configs), built with
seed 0. The fixture models of test/fixtures/make_fixtures.py with those
names (gpt2, llama, bert, opt, gpt_neox, t5) are the same models, weight for
weight, so plans compiled from them run here too. DIR/NAME.sharded.pt must
have been compiled (bmt-opt) from that model: the GPU machine has no MLIR,
so the archives are compiled elsewhere and carried (bench/make_parity_plans.py
writes them all, fp32 and bf16, fused and plain). Before a model runs, its
weights are checked against the archive's (the CRC-32 the plan records for
every tensor, against the eager model's bytes in the plan's dtype): a model
rebuilt here from another config, seed or transformers version fails
loudly instead of being compared with the wrong reference.

The default pipeline fuses elementwise regions; `bmt-opt
--fuse-elementwise=false` makes the plain plans (bench/gpu_fusion.sh checks
both). Runs `bmt-run --dump --device cuda` on a batch of 3 x 12 tokens and
prints the max abs difference of logits, loss and every parameter gradient
against the eager transformers model on CUDA. Exit status 1 if any exceeds
--tol.

With --dtype bfloat16, DIR/NAME.sharded.pt must come from the model in
bfloat16, and the reference is the float32 model: bmt's bf16 logits, loss
and each parameter's gradient must be as close to it as eager PyTorch's
bf16 model is, within a factor of 2 (plus 2 bf16 ulps of the largest
value), since both round to bf16 but in different places (a fused region
rounds once, eager after every op). An encoder-decoder (t5) gets a 3 x 7
target, fed by teacher forcing (decoder input = target shifted right behind
token 0; the archive must have been compiled from a model that runs at
those shapes: bench/make_parity_plans.py traces every model at them, and
exports BLOOM, which torch.jit.trace cannot record, with torch.export at
them).

--jobs N runs N bmt-run processes at a time (each is mostly start-up and
kernel compilation for these tiny models); the eager references run in this
process meanwhile, and the report is in NAME order whatever the jobs' order.
"""
import argparse
import concurrent.futures
import io
import os
import subprocess
import sys
import tempfile
import zipfile
import zlib

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import architectures  # noqa: E402

# The batch every model runs (and is traced) at: BATCH x SEQ tokens, an
# encoder-decoder's target TARGET long.
BATCH, SEQ, TARGET = 3, 12, 7
NAMES = [architectures.short_name(a) for a in architectures.ARCHS]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bmt_run")
    parser.add_argument("dir")
    parser.add_argument("names", nargs="+", help=f"{', '.join(NAMES)}, or all")
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu to try the script")
    parser.add_argument("--jobs", type=int, default=1, help="bmt-run processes at a time")
    args = parser.parse_args()
    names = NAMES if args.names == ["all"] else args.names
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        parser.error(f"unknown architecture(s) {', '.join(unknown)} (known: {', '.join(NAMES)})")
    quiet()
    dtype = getattr(torch, args.dtype)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        runs = {}
        for name in names:
            sharded = os.path.join(args.dir, f"{name}.sharded.pt")
            model, ids, labels = build(name, "cpu")
            if not os.path.exists(sharded):
                runs[name] = f"{sharded}: no such file"
                continue
            bad = check_weights(sharded, model.to(dtype))
            runs[name] = bad or pool.submit(run_bmt, args.bmt_run, sharded, ids, labels,
                                            args.device)
        compare = fp32_parity if args.dtype == "float32" else bf16_parity
        worst = 0.0
        for name in names:
            run = runs[name]
            got = run if isinstance(run, str) else run.result()
            if isinstance(got, str):
                print(f"{name}: {got}", flush=True)
                failed.append(name)
                continue
            worst = max(worst, compare(name, got, args))
    if args.dtype == "float32":
        print(f"worst max abs difference {worst:.2e} (tolerance {args.tol:.0e})")
        ok = worst <= args.tol
    else:
        print(f"worst bf16 difference {worst:.2f} of the bound (2 x eager bf16's + 2 ulps)")
        ok = worst <= 1
    if failed:
        print(f"failed to run: {', '.join(failed)}")
    return 0 if ok and not failed else 1


def quiet():
    import warnings
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def build(name, device):
    """The architecture's tiny model (seed 0, scripts/architectures.py), in
    float32 on `device`, and the BATCH x SEQ batch with its labels (masked
    for BERT, a BATCH x TARGET target for T5). Weights are initialized on
    the CPU whatever the device, so they are the same everywhere."""
    model = architectures.build(architectures.arch_of(name)).to(device)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, vocab, (BATCH, SEQ), generator=g)
    labels = ids.clone()
    if model.config.model_type == "bert":
        labels[torch.rand(ids.shape, generator=g) > 0.3] = -100
        labels[0, 0] = ids[0, 0]
    if getattr(model.config, "is_encoder_decoder", False):
        labels = torch.randint(0, vocab, (BATCH, TARGET), generator=g)
    return model, ids, labels


def decoder_inputs(labels):
    """Teacher forcing: the target shifted right behind token 0."""
    return torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)


def check_weights(sharded, model):
    """None when every tensor of the archive that names a parameter or
    buffer of `model` has that tensor's bytes (the plan's CRC-32) and every
    parameter of `model` is in the archive; else what differs."""
    with zipfile.ZipFile(sharded) as z:
        record = next((n for n in z.namelist() if n.endswith("bmt/plan.pkl")), None)
        if record is None:
            return f"{sharded}: no bmt/plan.pkl (not a sharded.pt)"
        plan = torch.load(io.BytesIO(z.read(record)), weights_only=False)
    tensors = dict(model.named_parameters(remove_duplicate=False))
    tensors.update(model.named_buffers(remove_duplicate=False))
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    differ, seen = [], set()
    for t in plan["tensors"]:
        names = [t["name"]] + list(t["aliases"])
        seen.update(names)
        mine = next((tensors[n] for n in names if n in tensors), None)
        if mine is None:
            continue  # a constant of the program's own (torch.export lifts some)
        if t["init"]:
            return f"{os.path.basename(sharded)}: a weights-free plan (init rule {t['init']})"
        x = mine.detach().cpu().contiguous()
        raw = x.reshape(-1).view(torch.uint8).numpy().tobytes()
        if (t["dtype"] != str(x.dtype).replace("torch.", "") or list(t["shape"]) != list(x.shape)
                or zlib.crc32(raw) != t["crc32"]):
            differ.append(f"{t['name']} ({t['dtype']} {t['shape']})")
    missing = sorted(params - seen)
    if differ or missing:
        return (f"{os.path.basename(sharded)} was not compiled from this model "
                f"({str(next(iter(tensors.values())).dtype).replace('torch.', '')}, seed 0, "
                f"transformers {__import__('transformers').__version__}): "
                + (f"{len(differ)} tensors differ, first {differ[0]}" if differ else "")
                + ("; " if differ and missing else "")
                + (f"{len(missing)} parameters missing, first {missing[0]}" if missing else ""))
    return None


def fp32_parity(name, got, args):
    model, ids, labels = build(name, args.device)
    logits, loss = eager(model, ids.to(args.device), labels.to(args.device))
    loss.backward()
    diffs = {"logits": (got["logits"].float() - logits.detach().float().cpu()).abs().max().item(),
             "loss": abs(got["loss"].item() - loss.item())}
    grads = [(got["grad/" + n] - p.grad.cpu()).abs().max().item()
             for n, p in model.named_parameters()]
    diffs["grads (max over params)"] = max(grads)
    print(f"{name}: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()) +
          f" over {len(grads)} parameters", flush=True)
    return max(diffs.values())


def run_bmt(bmt_run, sharded, ids, labels, device):
    """bmt-run --dump on `device`: its logits, loss and grad/NAME tensors,
    or why it failed (a string)."""
    with tempfile.TemporaryDirectory() as tmp:
        torch.save({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels},
                   f"{tmp}/in.pt")
        r = subprocess.run([bmt_run, sharded, "--dump", f"{tmp}/in.pt", f"{tmp}/out.pt",
                            "--device", device], capture_output=True, text=True)
        if r.returncode != 0:
            return f"bmt-run failed ({os.path.basename(sharded)}): {r.stderr.strip()}"
        return torch.load(f"{tmp}/out.pt", weights_only=False)


def eager(model, ids, labels):
    """The eager model's logits and loss (bmt-run's objective for its kind)."""
    vocab = model.config.vocab_size
    if getattr(model.config, "is_encoder_decoder", False):
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                       decoder_input_ids=decoder_inputs(labels)).logits
        return logits, torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                         labels.reshape(-1))
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    if model.config.model_type == "bert":
        return logits, torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab),
                                                         labels.reshape(-1))
    return logits, torch.nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, vocab),
                                                     labels[:, 1:].reshape(-1))


def bf16_parity(name, got, args):
    ref, ids, labels = build(name, args.device)
    half = build(name, args.device)[0].to(torch.bfloat16)
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
    ratios = []
    for key in ["logits", "loss"] + sorted(k for k in values["ref"] if k.startswith("grad/")):
        want = values["ref"][key]
        d_bmt = (bmt[key] - want).abs().max().item()
        d_eager = (values["eager"][key] - want).abs().max().item()
        bound = 2 * d_eager + 2 * ulp * want.abs().max().item()
        ratios.append((d_bmt / bound if bound > 0 else 0.0, key, d_bmt, d_eager))
    r, key, d_bmt, d_eager = max(ratios)
    logit = next(x for x in ratios if x[1] == "logits")
    print(f"{name} (bf16): logits {logit[2]:.2e} from float32 (eager bf16 {logit[3]:.2e}); "
          f"worst of {len(ratios)} values {key}: {d_bmt:.2e} (eager bf16 {d_eager:.2e}), "
          f"{r:.2f} of the bound", flush=True)
    return r


if __name__ == "__main__":
    sys.exit(main())
