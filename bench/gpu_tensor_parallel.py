#!/usr/bin/env python3
"""Tensor parallelism on N GPUs: bmt-run with --tensor-parallel T for every
T in {1, 2, 4, 8} that divides N, against FSDP2 + torch.compile on the same
N GPUs at the same global batch.

NOT MEASURED YET: this script has only been run end to end on CPU ranks
with a tiny model (--device cpu, see below); bench/RESULTS.md has no
multi-GPU tensor-parallel numbers so far.

usage: python3 bench/gpu_tensor_parallel.py --gpus N [--tensor-parallel 1 2 4 8]
           [--arch gpt2|llama-1b|llama-8b] [--layers L --hidden H --heads A --vocab V]
           [--seq 1024] [--micro-batch 8] [--recompute on|off] [--only bmt fsdp2-compile]
           [--steps 20] [--warmup 5] [--archives DIR | --make-archives-only] [--out DIR]
           [--device cuda|cpu]

1. The model is traced here without weights (bench/make_gpt2_1p3b.py: GPT-2
   of any size, default 24 x 2048, 1.3 B; bench/make_llama_1b.py: the
   Llama-3.2-1B or Llama-3-8B shape), bf16, and compiled by bmt-opt once
   per T: `--tensor-parallel T --world-size N --random-init`, every block
   recomputed (--recompute on, the default) or none. A GPU machine without
   bmt-opt takes the plans made elsewhere by --make-archives-only
   (--archives DIR; names ARCH-bf16-tpT-nN-recompute-R.sharded.pt).
2. The global batch is G = micro-batch x N sequences of --seq tokens per
   step for every configuration: bmt-run gets --micro-batch
   (micro-batch x T) on its N / T data-parallel ranks (the T ranks of a TP
   group train the same rows), FSDP2 gets micro-batch rows on each of its N
   ranks. Each bmt configuration is one `torchrun --nproc_per_node=N
   --no-python bmt-run` on random tokens (AdamW, lr 1e-4 constant,
   clipping at 1.0, bf16 compute, fp32 master weights); the reference is
   `torchrun --nproc_per_node=N bench/gpu_tensor_parallel.py --reference`:
   transformers' model, torch.compile per block, then fully_shard per block
   and at the root (MixedPrecisionPolicy bf16 / fp32 reduce), fused AdamW,
   transformers' gradient checkpointing when recompute is on. Every
   launched process gets NCCL_NVLS_ENABLE=0,
   TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
3. Prints, per configuration: tokens/s (the global batch's tokens over the
   steps after --warmup), tokens/s per GPU (/ N), model TFLOP/s per GPU
   (6 P + 12 L d S FLOPs per token, as bench/gpu_speed.py), peak GiB (rank
   0's CUDA caching allocator peak; bmt-run's log, FSDP2's
   max_memory_allocated over the ranks), the loss of the first and the last
   step, and each run's tokens/s over the reference's.

CPU dry run (what has been run, on a 2-core machine): `python3
bench/gpu_tensor_parallel.py --device cpu --gpus 2 --arch gpt2 --layers 2
--hidden 64 --heads 4 --vocab 512 --seq 32 --micro-batch 2 --steps 2
--warmup 1` runs every step above on CPU ranks (bmt-run's CPU backend,
FSDP2 on gloo; fp32 there: bf16 is a GPU setting), so that the script's
plumbing is tested; its speed numbers mean nothing.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from gpu_speed import find_binary, write_tokens  # noqa: E402 (bench/ is the script's folder)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
           NVSHMEM_DISABLE_NVLS="1")


def model_config(args):
    import transformers
    if args.arch.startswith("llama"):  # bench/make_llama_1b.py's shapes
        big = args.arch == "llama-8b"
        return transformers.LlamaConfig(
            num_hidden_layers=args.layers, hidden_size=args.hidden, num_attention_heads=32,
            num_key_value_heads=8, intermediate_size=14336 if big else 8192,
            vocab_size=args.vocab, max_position_embeddings=1024, rope_theta=500000.0,
            tie_word_embeddings=not big, attention_dropout=0.0, use_cache=False)
    return transformers.GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                                   n_positions=max(args.seq, 1024), vocab_size=args.vocab,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   use_cache=False)


def build_model(args):
    import transformers
    cls = transformers.LlamaForCausalLM if args.arch.startswith("llama") else \
        transformers.GPT2LMHeadModel
    return cls(model_config(args))


def num_parameters(args):
    import torch
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(args).parameters())


def flops_per_token(args):
    return 6 * num_parameters(args) + 12 * args.layers * args.hidden * args.seq


# --- the reference: FSDP2 + torch.compile, one process per GPU under torchrun --

def reference(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    with device:
        model = build_model(args)
    blocks = model.model.layers if args.arch.startswith("llama") else model.transformer.h
    if args.recompute == "on":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if cuda else torch.float32,
                              reduce_dtype=torch.float32)
    for block in blocks:
        block.compile()
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=cuda)
    g = torch.Generator(device=device).manual_seed(1 + rank)

    def step():
        w = torch.randint(0, args.vocab, (args.micro_batch, args.seq + 1), device=device,
                          generator=g)
        logits = model(input_ids=w[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                 w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # DTensors: the global norm
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def synchronize():
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    losses = [step() for _ in range(args.warmup)]
    synchronize()
    t0 = time.perf_counter()
    losses += [step() for _ in range(args.steps)]
    synchronize()
    seconds = time.perf_counter() - t0
    mean = torch.stack(losses).to(device)
    dist.all_reduce(mean)
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")],
                        device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if rank == 0:
        mean = (mean / world).tolist()
        print("RESULT " + json.dumps({
            "name": "fsdp2-compile", "tp": 1, "dp": world, "micro_batch": args.micro_batch,
            "tokens_per_s": args.steps * args.micro_batch * world * args.seq / seconds,
            "peak_gib": peak.item() if cuda else None,
            "loss_first": mean[0], "loss_last": mean[-1]}), flush=True)
    dist.destroy_process_group()


def run_reference(args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.gpus}", os.path.abspath(__file__), "--reference",
           "--gpus", str(args.gpus), "--device", args.device, "--arch", args.arch,
           "--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
           "--vocab", str(args.vocab), "--seq", str(args.seq), "--micro-batch",
           str(args.micro_batch), "--recompute", args.recompute, "--steps", str(args.steps),
           "--warmup", str(args.warmup)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(ENV, OMP_NUM_THREADS="1"))
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        print(f"fsdp2-compile failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}", flush=True)
        return None
    return json.loads(lines[-1][len("RESULT "):])


# --- bmt ---------------------------------------------------------------------

def tensor_parallel_sizes(args):
    sizes = args.tensor_parallel or [t for t in (1, 2, 4, 8) if args.gpus % t == 0]
    for t in sizes:
        if t < 1 or args.gpus % t != 0:
            raise SystemExit(f"--tensor-parallel {t} does not divide --gpus {args.gpus}")
    return sizes


def archive_name(args, tp):
    dtype = "bf16" if args.device == "cuda" else "fp32"  # the trace's (make_archives)
    return f"{args.arch}-{dtype}-tp{tp}-n{args.gpus}-recompute-{args.recompute}.sharded.pt"


def make_archives(args, out):
    """The plans, one per T: made here by bmt-opt, or (--archives) made
    elsewhere by --make-archives-only."""
    sizes = tensor_parallel_sizes(args)
    if args.archives:
        archives = {t: os.path.join(args.archives, archive_name(args, t)) for t in sizes}
        missing = [a for a in archives.values() if not os.path.exists(a)]
        if missing:
            raise SystemExit(f"--archives: no {', '.join(missing)} (make them with "
                             f"--make-archives-only and the same options)")
        return archives
    bmt_opt = find_binary("bmt-opt", args.bmt_opt)
    if not bmt_opt:
        raise SystemExit("no bmt-opt here: give --bmt-opt or --archives DIR (plans made "
                         "elsewhere by --make-archives-only)")
    traced = os.path.join(out, f"{args.arch}-{args.layers}x{args.hidden}.pt")
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    if args.arch == "gpt2":
        make = [os.path.join(REPO, "bench", "make_gpt2_1p3b.py"), traced, "--layers",
                str(args.layers), "--hidden", str(args.hidden), "--heads", str(args.heads),
                "--vocab", str(args.vocab), "--positions", str(max(args.seq, 1024))]
    else:
        make = [os.path.join(REPO, "bench", "make_llama_1b.py"), traced, "--config",
                args.arch[len("llama-"):], "--layers", str(args.layers)]
    subprocess.run([sys.executable, *make, "--dtype", dtype], check=True)
    import torch  # a portable bmt-opt (BMT_STATIC_LLVM) finds LibTorch by LD_LIBRARY_PATH
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(torch.__file__), "lib"), env.get("LD_LIBRARY_PATH", "")])
    archives = {}
    for t in sizes:
        archives[t] = os.path.join(out, archive_name(args, t))
        r = subprocess.run([bmt_opt, traced, "-o", archives[t], "--random-init", "--world-size",
                            str(args.gpus), "--tensor-parallel", str(t), "--micro-batch",
                            str(args.micro_batch * t), "--seq-len", str(args.seq), "--checkpoint",
                            "all" if args.recompute == "on" else "none"],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise SystemExit(f"bmt-opt --tensor-parallel {t} failed:\n{r.stderr[-3000:]}")
        print(f"T = {t}: {archives[t]} ({os.path.getsize(archives[t]):,} bytes)", flush=True)
    return archives


def run_bmt(args, bmt_run, archive, data, tp, out):
    total = args.warmup + args.steps
    log = os.path.join(out, f"bmt-tp{tp}-n{args.gpus}-recompute-{args.recompute}.jsonl")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={args.gpus}", "--no-python", bmt_run, archive, "--data", data,
           "--steps", str(total + 1), "--micro-batch", str(args.micro_batch * tp), "--seq-len",
           str(args.seq), "--lr", "1e-4", "--schedule", "constant", "--clip-grad", "1.0",
           "--device", args.device, "--log-file", log, "--log-every", "5"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=dict(ENV, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        print(f"bmt T = {tp} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}", flush=True)
        return None
    steps = [json.loads(line) for line in open(log) if '"train"' in line]
    # Not the last step: it ends the queued run (and counts the device's lag).
    timed = [s for s in steps if args.warmup < s["step"] <= total]
    seconds = sum(s["tokens"] / s["tokens_per_s"] for s in timed)
    peaks = [s.get("peak_mem_gib") for s in steps if s.get("peak_mem_gib") is not None]
    return {"name": "bmt", "tp": tp, "dp": args.gpus // tp, "micro_batch": args.micro_batch * tp,
            "tokens_per_s": sum(s["tokens"] for s in timed) / seconds,
            "peak_gib": max(peaks) if peaks and args.device == "cuda" else None,
            "loss_first": steps[0]["loss"], "loss_last": timed[-1]["loss"]}


def print_table(args, results):
    fpt = flops_per_token(args)
    n = args.gpus
    device = "CPU ranks (dry run: the speed means nothing)" if args.device == "cpu" else "GPUs"
    print(f"\n{args.arch} {args.layers} x {args.hidden}, {num_parameters(args):,} parameters, "
          f"{n} {device}, global batch {args.micro_batch * n} x {args.seq} tokens, recompute "
          f"{args.recompute}; {args.steps} timed steps after {args.warmup}")
    print(f"{'run':<14} {'T':>2} {'DP':>3} {'rows':>5} {'tokens/s':>10} {'per GPU':>9} "
          f"{'TFLOP/s':>8} {'peak GiB':>8} {'loss 1 -> last':>16}  it / fsdp2-compile")
    ref = next((r for r in results if r["name"] == "fsdp2-compile"), None)
    for r in results:
        peak = f"{r['peak_gib']:>8.1f}" if r["peak_gib"] is not None else f"{'-':>8}"
        ratio = f"{r['tokens_per_s'] / ref['tokens_per_s']:.2f}" if ref else ""
        print(f"{r['name']:<14} {r['tp']:>2} {r['dp']:>3} {r['micro_batch']:>5} "
              f"{r['tokens_per_s']:>10,.0f} {r['tokens_per_s'] / n:>9,.0f} "
              f"{r['tokens_per_s'] * fpt / n / 1e12:>8.2f} {peak} "
              f"{r['loss_first']:>7.3f} -> {r['loss_last']:.3f}  {ratio}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, required=True, help="N: GPUs (ranks) of every run")
    ap.add_argument("--tensor-parallel", type=int, nargs="+",
                    help="the T to run (default: 1 2 4 8, those that divide N)")
    ap.add_argument("--arch", choices=["gpt2", "llama-1b", "llama-8b"], default="gpt2")
    ap.add_argument("--layers", type=int, help="default: 24 (gpt2), 16 (llama-1b), 32 (llama-8b)")
    ap.add_argument("--hidden", type=int, help="gpt2 only (default 2048)")
    ap.add_argument("--heads", type=int, help="gpt2 only (default 16)")
    ap.add_argument("--vocab", type=int, help="gpt2 only (default 50304)")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    ap.add_argument("--micro-batch", type=int, default=8,
                    help="sequences per GPU at T = 1 (global batch: micro-batch x N)")
    ap.add_argument("--recompute", choices=["on", "off"], default="on")
    ap.add_argument("--only", nargs="+", default=["bmt", "fsdp2-compile"],
                    choices=["bmt", "fsdp2-compile"])
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--bmt-opt", help="the compiler (default: build/bin/bmt-opt or PATH)")
    ap.add_argument("--archives", help="folder with the plans made by --make-archives-only")
    ap.add_argument("--make-archives-only", action="store_true",
                    help="write the plans into --out and stop")
    ap.add_argument("--out", default="/tmp/bmt-gpu-tensor-parallel", help="work folder")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a dry run on CPU ranks (fp32), to test the script")
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arch != "gpt2" and (args.hidden or args.heads or args.vocab):
        ap.error(f"--hidden, --heads and --vocab are gpt2's; {args.arch} has its own shape")
    if args.gpus < 1 or args.micro_batch < 1 or args.seq < 1 or args.steps < 1 or args.warmup < 0:
        ap.error("--gpus, --micro-batch, --seq and --steps must be >= 1, --warmup >= 0")
    args.layers = args.layers or {"gpt2": 24, "llama-1b": 16, "llama-8b": 32}[args.arch]
    if args.layers < 2:
        ap.error("--layers must be >= 2 (bmt-find-blocks finds blocks as repeated layers, and "
                 "bmt-tensor-parallel splits blocks)")
    args.hidden = args.hidden or {"gpt2": 2048, "llama-1b": 2048, "llama-8b": 4096}[args.arch]
    args.heads = args.heads or (16 if args.arch == "gpt2" else 32)
    args.vocab = args.vocab or (50304 if args.arch == "gpt2" else 128256)
    if args.reference:
        return reference(args)
    sizes = tensor_parallel_sizes(args)
    os.makedirs(args.out, exist_ok=True)
    if args.make_archives_only:
        args.archives = None
        make_archives(args, args.out)
        return
    results = []
    if "bmt" in args.only:
        bmt_run = find_binary("bmt-run")
        if not bmt_run:
            raise SystemExit("no bmt-run: build it (scripts/build.sh, or BMT_COMPILER=OFF on a "
                             "GPU machine) first")
        archives = make_archives(args, args.out)
        global_rows = args.micro_batch * args.gpus
        data = write_tokens(os.path.join(args.out, "tokens"), args.vocab,
                            (args.warmup + args.steps) * global_rows * (args.seq + 1) * 2)
        for t in sizes:
            results.append(run_bmt(args, bmt_run, archives[t], data, t, args.out))
            print(f"bmt T = {t}: done", flush=True)
    if "fsdp2-compile" in args.only:
        results.append(run_reference(args))
        print("fsdp2-compile: done", flush=True)
    results = [r for r in results if r]
    with open(os.path.join(args.out, f"results-n{args.gpus}-recompute-{args.recompute}.json"),
              "w") as f:
        json.dump(results, f, indent=1)
    print_table(args, results)
    if len(results) < len(sizes) * ("bmt" in args.only) + ("fsdp2-compile" in args.only):
        raise SystemExit("some runs failed (above)")


if __name__ == "__main__":
    main()
