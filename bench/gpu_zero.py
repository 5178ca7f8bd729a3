#!/usr/bin/env python3
"""ZeRO on GPUs: bmt-run under torchrun (NCCL) against eager PyTorch, and the
1.3 B-parameter GPT-2 training run of bench/RESULTS.md.

usage: gpu_zero.py BIN_DIR DIR [--ranks 1 2] [--big DIR/gpt2-1p3b.sharded.pt ...] [--skip-parity]

1. Parity: for gpt2 and llama (test/fixtures/make_fixtures.py, seed 0),
   DIR/NAME.sharded.pt compiled elsewhere by the default pipeline (the GPU
   machine has no MLIR). For each rank count, `torchrun --nproc_per_node=N
   --no-python bmt-run --device cuda` trains 20 steps on fixed global batches
   of 12 x 8 tokens; eager transformers + torch.optim.AdamW trains the same
   model on one GPU. Prints the max abs difference of the losses and the
   final parameters (fp32, TF32 off on both sides).
2. Benchmark (with --big): 20 steps of the weights-free 1.3 B GPT-2 plan,
   micro-batch 8 x 1024 tokens per rank, fp32; prints tokens/s, model
   TFLOP/s (6N + 12 L d S per token) and peak GiB from bmt-run's JSON log.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402

STEPS = 20
DEVICE = "cuda"  # --device cpu dry-runs the script on a CPU machine
ENV = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
           NVSHMEM_DISABLE_NVLS="1")


def torchrun(n, bmt_run, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
           "--no-python", bmt_run, *map(str, args), "--device", DEVICE]
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        raise SystemExit(f"bmt-run failed with {n} ranks")
    return r


def eager(name, batches, lrs):
    import transformers
    torch.manual_seed(0)
    cls, config = make_fixtures.MODELS[name](transformers)
    model = cls(config).eval().to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.01)
    losses = []
    for step in range(1, STEPS + 1):
        w = batches[step - 1].to(DEVICE)
        opt.zero_grad()
        logits = model(input_ids=w[:, :-1], attention_mask=torch.ones_like(w[:, :-1])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().cpu() for n, p in model.named_parameters()}


def parity(bin_dir, carry, ranks, tmp):
    from safetensors.torch import load_file
    bmt_run = os.path.join(bin_dir, "bmt-run")
    for name in ["gpt2", "llama"]:
        vocab = 128
        batches = torch.randint(0, vocab, (STEPS, 12, 9), generator=torch.Generator().manual_seed(3))
        torch.save(batches, os.path.join(tmp, "batches.pt"))
        reference = None
        for n in ranks:
            log = os.path.join(tmp, f"{name}-{n}.jsonl")
            params = os.path.join(tmp, f"{name}-{n}.safetensors")
            torchrun(n, bmt_run, os.path.join(carry, f"{name}.sharded.pt"), "--batches",
                     os.path.join(tmp, "batches.pt"), "--steps", STEPS, "--lr", "1e-3",
                     "--schedule", "cosine", "--warmup", 2, "--clip-grad", 0.5,
                     "--weight-decay", 0.01, "--log-file", log, "--save-params", params)
            train = [json.loads(x) for x in open(log) if '"train"' in x]
            if reference is None:
                reference = eager(name, batches, {x["step"]: x["lr"] for x in train})
            losses, want = reference
            got = load_file(params)
            dl = max(abs(x["loss"] - l) for x, l in zip(train, losses))
            dp = max((got[k] - v).abs().max().item() for k, v in want.items())
            print(f"parity {name} ranks={n} ({DEVICE}): max |loss diff| {dl:.2e} over {STEPS} steps, "
                  f"max |param diff| {dp:.2e}", flush=True)


def benchmark(bin_dir, big, ranks, tmp, micro_batch, seq, extra=()):
    layers, hidden, params = 24, 2048, 1_313_722_368
    flops_per_token = 6 * params + 12 * layers * hidden * seq
    for n in ranks:
        batches = torch.randint(0, 50304, (STEPS, micro_batch * n, seq + 1),
                                generator=torch.Generator().manual_seed(0))
        path = os.path.join(tmp, "big-batches.pt")
        torch.save(batches, path)
        log = os.path.join(tmp, f"big-{n}.jsonl")
        r = torchrun(n, os.path.join(bin_dir, "bmt-run"), big, "--batches", path, "--steps",
                     STEPS, "--lr", "1e-4", "--warmup", 5, "--log-file", log, "--log-every", 5,
                     *extra)
        print(r.stdout[-1500:])
        train = [json.loads(x) for x in open(log) if '"train"' in x]
        steady = train[3:]  # skip warm-up steps (allocator, cuBLAS handles)
        tps = sum(x["tokens"] for x in steady) / sum(x["tokens"] / x["tokens_per_s"] for x in steady)
        print(f"gpt2-1.3B {os.path.basename(big)} ranks={n}: {tps:,.0f} tokens/s, {tps * flops_per_token / 1e12 / n:.1f} "
              f"model TFLOP/s per GPU, peak {max(x['peak_mem_gib'] for x in train):.1f} GiB "
              f"(rank 0), loss {train[0]['loss']:.3f} -> {train[-1]['loss']:.3f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("carry")
    ap.add_argument("--ranks", type=int, nargs="+", default=[1])
    ap.add_argument("--big", nargs="*", default=[])
    ap.add_argument("--skip-parity", action="store_true")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.backends.cuda.matmul.allow_tf32 = False
    with tempfile.TemporaryDirectory() as tmp:
        if not args.skip_parity:
            parity(args.bin_dir, args.carry, args.ranks, tmp)
        for big in args.big:
            benchmark(args.bin_dir, big, args.ranks, tmp, args.micro_batch, args.seq)


if __name__ == "__main__":
    main()
