#!/usr/bin/env python3
"""LoRA fine-tuning speed and memory on one GPU: bmt-run against peft on the
same machine.

usage: python3 bench/gpu_lora.py [--build] [--bmt-opt BIN | --archives DIR]
           [--only bmt peft-compile peft-fsdp2-compile] [--layers 32]
           [--lora r=16,alpha=32,dropout=0.05] [--steps 10] [--warmup 3] [--out DIR]

The model: the Llama-3-8B shape of bench/make_llama_1b.py --config 8b (32
layers, hidden 4096, 32 heads, 8 key/value heads, FFN 14336, vocab 128256,
untied), random init, LoRA on every linear layer but the head (peft's
target_modules="all-linear"), every other parameter frozen; every block
recomputed; micro-batch 8 x 1024 tokens, AdamW (fused) over the adapters,
gradient clipping at 1.0, bf16 compute, one GPU.

1. bmt: the model traced (bf16, random values) and compiled by bmt-opt with
   `--lora r=..,targets=all-linear --checkpoint all --random-init`; the
   plan holds the frozen base (16 GB), so on a GPU machine without MLIR
   give it a portable bmt-opt (--bmt-opt; docs/status.md). The frozen base
   is bf16, the adapters have fp32 master weights.
2. peft-compile: transformers' model with its weights in bf16, peft 0.21's
   get_peft_model (adapters in fp32, peft's autocast_adapter_dtype), bf16
   autocast, gradient checkpointing per block (use_reentrant=False),
   torch.compile per block: the usual single-GPU setup.
   peft-fsdp2-compile: the model in fp32 under fully_shard per block and at
   the root (MixedPrecisionPolicy bf16 / reduce fp32, one rank, NCCL),
   torch.compile per block before sharding, the same checkpointing.
3. Prints tokens/s after --warmup steps, model TFLOP/s and peak GiB (CUDA
   caching allocator peak of allocated bytes) and bmt's ratio to each.
   Model FLOPs per token of LoRA training: 2 N forward + 2 N for the input
   gradients (frozen weights get none) + 6 N_adapters + 12 L d S attention
   (N: the base's parameters); the recompute's extra forward not counted.
"""
import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import gpu_speed  # noqa: E402  (tokens, bmt-run driver, binaries)

MICRO_BATCH, SEQ = gpu_speed.MICRO_BATCH, gpu_speed.SEQ


def parse_lora(spec):
    values = dict(kv.split("=", 1) for kv in spec.split(","))
    r = int(values["r"])
    return r, float(values.get("alpha", r)), float(values.get("dropout", 0))


def config(layers):
    import transformers
    return transformers.LlamaConfig(
        num_hidden_layers=layers, hidden_size=4096, intermediate_size=14336,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=SEQ, rope_theta=500000.0, tie_word_embeddings=False,
        attention_dropout=0.0, use_cache=False)


def counts(layers, r):
    """(base parameters, adapter parameters) of the model."""
    import torch
    import transformers
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config(layers))
    base = sum(p.numel() for p in model.parameters())
    adapters = sum(r * (m.in_features + m.out_features) for n, m in model.named_modules()
                   if isinstance(m, torch.nn.Linear) and not n.endswith("lm_head"))
    return base, adapters


def flops_per_token(layers, r):
    base, adapters = counts(layers, r)
    return 4 * base + 6 * adapters + 12 * layers * 4096 * SEQ


# --- peers (each in a child process) -----------------------------------------

def reference(args):
    import peft
    import torch
    import transformers
    name = args.reference
    r, alpha, dropout = parse_lora(args.lora)
    torch.manual_seed(0)
    device = torch.device("cuda")
    fsdp = name == "peft-fsdp2-compile"
    if fsdp:
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29519")
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    with device:
        model = transformers.LlamaForCausalLM(config(args.layers))
    if not fsdp:
        model = model.to(torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()  # checkpointed blocks of a frozen embedding's output
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                           target_modules="all-linear", task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, lora)
    model.train()
    blocks = model.base_model.model.model.layers
    if fsdp:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in blocks:
            block.compile()
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    else:
        for block in blocks:
            block.compile()
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.01, fused=True)
    g = torch.Generator(device=device).manual_seed(1)

    def step():
        w = torch.randint(0, 128256, (MICRO_BATCH, SEQ + 1), device=device, generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not fsdp):
            logits = model(input_ids=w[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                 w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    losses = [step() for _ in range(args.warmup)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses += [step() for _ in range(args.steps)]
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    print("RESULT " + json.dumps({
        "name": name, "recompute": True, "tokens_per_s": args.steps * MICRO_BATCH * SEQ / seconds,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "trainable": sum(p.numel() for p in trainable),
        "loss_first": losses[0].item(), "loss_last": losses[-1].item()}), flush=True)
    if fsdp:
        dist.destroy_process_group()


def run_reference(args, name):
    cmd = [sys.executable, os.path.abspath(__file__), "--reference", name, "--lora", args.lora,
           "--layers", str(args.layers), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        print(f"{name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return None
    return json.loads(lines[-1][len("RESULT "):])


# --- bmt ---------------------------------------------------------------------

def archive_path(folder, args):
    r, _, _ = parse_lora(args.lora)
    recompute = "all" if args.checkpoint == "all" else f"auto{args.budget_gib:g}"
    return os.path.join(folder, f"llama-8b-{args.layers}l-lora-r{r}-{recompute}.sharded.pt")


def make_archive(args):
    out = archive_path(args.out, args)
    bmt_opt = gpu_speed.find_binary("bmt-opt", args.bmt_opt)
    if not bmt_opt:
        raise SystemExit("no bmt-opt here: give --bmt-opt, or --archives DIR with a plan made "
                         "elsewhere by --make-archives-only")
    traced = os.path.join(args.out, f"llama-8b-{args.layers}l-bf16.pt")
    if not os.path.exists(traced):
        subprocess.run([sys.executable, os.path.join(REPO, "bench", "make_llama_1b.py"), traced,
                        "--config", "8b", "--layers", str(args.layers), "--dtype", "bfloat16",
                        "--contiguous"], check=True)
    import torch  # a portable bmt-opt (BMT_STATIC_LLVM) finds LibTorch by LD_LIBRARY_PATH
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(torch.__file__), "lib"), env.get("LD_LIBRARY_PATH", "")])
    budget = ["--memory-budget-gib", str(args.budget_gib)] if args.checkpoint == "auto" else []
    # --random-init leaves out the trainable parameters' weights only: the
    # frozen base (random values) is written, 16 GB for the 8B shape.
    subprocess.run([bmt_opt, traced, "-o", out, "--random-init", "--world-size", "1",
                    "--micro-batch", str(MICRO_BATCH), "--seq-len", str(SEQ),
                    "--checkpoint", args.checkpoint, *budget, "--lora", args.lora + ",targets=all-linear"],
                   check=True, env=env)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="build bmt-run into build-gpu/ first")
    ap.add_argument("--bmt-opt", help="the compiler (default: build/bin/bmt-opt or PATH)")
    ap.add_argument("--archives", help="folder with the plan --make-archives-only wrote")
    ap.add_argument("--make-archives-only", action="store_true")
    ap.add_argument("--out", default="/tmp/bmt-gpu-lora", help="work folder")
    ap.add_argument("--only", nargs="+", default=["bmt", "peft-compile", "peft-fsdp2-compile"],
                    choices=["bmt", "peft-compile", "peft-fsdp2-compile"])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--lora", default="r=16,alpha=32,dropout=0.05",
                    help="r, alpha, dropout (targets: all linear layers)")
    ap.add_argument("--checkpoint", choices=["all", "auto"], default="all",
                    help="bmt's recompute: every block, or bmt-opt's checkpoint=auto under --budget-gib")
    ap.add_argument("--budget-gib", type=float, default=30.0,
                    help="checkpoint=auto's per-rank memory budget")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    ap.add_argument("--reference", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.gpus, args.device = 1, "cuda"  # gpu_speed.run_bmt's launcher: one process
    if args.reference:
        return reference(args)
    os.makedirs(args.out, exist_ok=True)
    if args.make_archives_only:
        path = make_archive(args)
        print(f"{path} ({os.path.getsize(path):,} bytes)")
        return
    results = []
    if "bmt" in args.only:
        if args.build:
            gpu_speed.build_runtime()
        bmt_run = gpu_speed.find_binary("bmt-run")
        if not bmt_run:
            raise SystemExit("no bmt-run: build it (--build) first")
        archive = archive_path(args.archives, args) if args.archives else make_archive(args)
        data = gpu_speed.write_tokens(os.path.join(args.out, "tokens"), 128256,
                                      (args.warmup + args.steps + 5) * MICRO_BATCH * (SEQ + 1) * 2)
        run = gpu_speed.run_bmt(args, bmt_run, archive, data, "on", args.out)
        if run and args.checkpoint == "auto":
            run["name"] = "bmt-auto"
        results.append(run)
        print("bmt: done", flush=True)
    for name in [n for n in args.only if n != "bmt"]:
        results.append(run_reference(args, name))
        print(f"{name}: done", flush=True)
    results = [r for r in results if r]
    path = os.path.join(args.out, "results.json")  # earlier calls' runs stay unless rerun
    mine = {r["name"] for r in results}
    earlier = json.load(open(path)) if os.path.exists(path) else []
    order = ["bmt", "bmt-auto", "peft-compile", "peft-fsdp2-compile"]
    results = sorted([r for r in earlier if r["name"] not in mine] + results,
                     key=lambda r: order.index(r["name"]))
    with open(path, "w") as f:
        json.dump(results, f, indent=1)

    import torch
    r, alpha, dropout = parse_lora(args.lora)
    base, adapters = counts(args.layers, r)
    fpt = flops_per_token(args.layers, r)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    print(f"\nLlama-3-8B shape, {args.layers} layers, {base:,} parameters frozen, LoRA r={r} "
          f"alpha={alpha:g} dropout={dropout:g} on all linear layers ({adapters:,} trained), "
          f"recompute: bmt every block, bmt-auto bmt-opt's checkpoint=auto under "
          f"{args.budget_gib:g} GiB, the peers every block; micro-batch {MICRO_BATCH} x {SEQ}, {gpu}, torch "
          f"{torch.__version__}; {args.steps} timed steps after {args.warmup}")
    print(f"{'run':<19} {'tokens/s':>9} {'TFLOP/s':>8} {'peak GiB':>8} {'loss 1 -> last':>16}  "
          f"it / peft-compile")
    bmt = next((x for x in results if x["name"] == "bmt"), None)
    peer = next((x for x in results if x["name"] == "peft-compile"), None)
    for x in results:
        ratio = f"{x['tokens_per_s'] / peer['tokens_per_s']:.2f}" if peer else ""
        print(f"{x['name']:<19} {x['tokens_per_s']:>9,.0f} {x['tokens_per_s'] * fpt / 1e12:>8.1f} "
              f"{x['peak_gib']:>8.1f} {x['loss_first']:>7.3f} -> {x['loss_last']:.3f}  {ratio}")
    if bmt:
        print(f"bmt: host synchronisations inside steps 2-4 (BMT_DEBUG_SYNC=1): {bmt['host_syncs']}")
        print(f"\n--- bmt profile ---\n{bmt['profile']}")


if __name__ == "__main__":
    main()
