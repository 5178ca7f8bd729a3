#!/usr/bin/env python3
"""T5 training speed on one GPU: bmt-run's span corruption against eager
transformers on the same shapes.

usage: PYTHONPATH=python python3 bench/gpu_seq2seq.py BMT_RUN ARCHIVE
           [--micro-batch 32] [--seq-len 512] [--steps 20] [--warmup 5] [--out DIR]
(it imports bmt.export_hf: the checkout's python/ on PYTHONPATH, or the
package installed by `pip install .`)

ARCHIVE: a T5 compiled elsewhere (the GPU machine has no MLIR), e.g.
  bmt-export-hf --config t5 --set d_model=768 --set num_layers=12 \\
      --set num_heads=12 --set d_ff=3072 --set d_kv=64 --dtype bfloat16 \\
      --seq-len 512 -o t5-base-bf16.pt
  bmt-opt t5-base-bf16.pt --random-init -o t5-base-bf16.sharded.pt
(T5-base: 12 + 12 blocks, every block recomputed, ZeRO-3 on one rank.)

1. bmt-run trains on random tokens of a 32000-id vocabulary (the model's
   top ids are the sentinels) with the span-corruption objective: encoder
   input --seq-len tokens, the target the rule gives (114 for 512). bf16
   parameters with float32 masters, AdamW, clipping 1.0.
2. The eager reference: transformers' T5ForConditionalGeneration built from
   the same config, float32 parameters under torch.autocast(bf16), fused
   torch.optim.AdamW, clipping 1.0, gradient checkpointing per block
   (use_reentrant=False), on random batches of the same shapes.
Prints encoder tokens/s over the steps after --warmup and the peak GiB
(CUDA caching allocator, allocated bytes) of both, and the ratio.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

from bmt.export_hf import span_corruption_target_length as target_length


def run_bmt(args, out):
    data = os.path.join(out, "random")
    rng = np.random.default_rng(0)
    n = 4_000_000
    rng.integers(2, 32000, n, dtype=np.uint16).tofile(data + ".bin")
    json.dump({"format": "bmt-tokens", "version": 1, "dtype": "uint16", "num_tokens": n,
               "vocab_size": 32000, "eos_id": 1, "mask_id": None, "pad_id": 0},
              open(data + ".json", "w"))
    log = os.path.join(out, "bmt-t5.jsonl")
    cmd = [args.bmt_run, args.archive, "--data", data + ".bin", "--steps", str(args.steps),
           "--micro-batch", str(args.micro_batch), "--seq-len", str(args.seq_len),
           "--lr", "1e-4", "--log-file", log, "--log-every", "5", "--device", "cuda"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout[-3000:])
    if r.returncode != 0:
        print(r.stderr[-3000:])
        raise SystemExit("bmt-run failed")
    records = [json.loads(x) for x in open(log) if '"train"' in x]
    timed = records[args.warmup:-1]  # the last step ends the queued run (the device's lag)
    seconds = sum(x["tokens"] / x["tokens_per_s"] for x in timed)
    tokens = sum(x["tokens"] for x in timed)
    # The sync check: any synchronising CUDA call inside a step is an error.
    env = dict(os.environ, BMT_DEBUG_SYNC="1")
    s = subprocess.run(cmd[:5] + ["4"] + cmd[6:], capture_output=True, text=True, env=env)
    sync = "no host synchronisation" if s.returncode == 0 else "SYNC: " + s.stderr.strip()[-300:]
    return tokens / seconds, max(x["peak_mem_gib"] for x in records), records[-1]["loss"], sync


def run_eager(args, config):
    import transformers
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).cuda().train()
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    tgt = target_length(args.seq_len)
    g = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.steps):
        ids = torch.randint(2, 32000, (args.micro_batch, args.seq_len), device="cuda", generator=g)
        labels = torch.randint(2, 32000, (args.micro_batch, tgt), device="cuda", generator=g)
        decoder = torch.cat([torch.zeros_like(labels[:, :1]), labels[:, :-1]], dim=1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=ids, decoder_input_ids=decoder).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                 labels.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    seconds = sum(times[args.warmup:])
    tokens = args.micro_batch * args.seq_len * (args.steps - args.warmup)
    return tokens / seconds, torch.cuda.max_memory_allocated() / 2**30


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bmt_run")
    parser.add_argument("archive")
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", default="/tmp/gpu_seq2seq")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import transformers
    config = transformers.T5Config(d_model=768, num_layers=12, num_heads=12, d_ff=3072, d_kv=64,
                                   vocab_size=32128, dropout_rate=0.0, use_cache=False)
    bmt_tps, bmt_gib, bmt_loss, sync = run_bmt(args, args.out)
    eager_tps, eager_gib = run_eager(args, config)
    print(f"T5-base (one GPU), micro-batch {args.micro_batch}, encoder "
          f"{args.seq_len} + target {target_length(args.seq_len)} tokens, bf16, every block "
          "recomputed")
    print(f"bmt:   {bmt_tps:,.0f} encoder tokens/s, peak {bmt_gib:.1f} GiB, last loss "
          f"{bmt_loss:.3f}; {sync}")
    print(f"eager: {eager_tps:,.0f} encoder tokens/s, peak {eager_gib:.1f} GiB (autocast bf16, "
          "gradient checkpointing)")
    print(f"bmt / eager: {bmt_tps / eager_tps:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
