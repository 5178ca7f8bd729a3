#!/usr/bin/env python3
"""GPU training speed: bmt-run against eager PyTorch, FSDP2 and FSDP2 +
torch.compile on the same machine (issue 5's benchmark).

usage: python3 bench/gpu_speed.py [--build] [--bmt-opt BIN] [--archives DIR] [--plain]
           [--only bmt eager fsdp2 fsdp2-compile] [--recompute on off]
           [--steps 20] [--warmup 5] [--out DIR] [--layers 24 --hidden 2048 ...]
           [--gpus N [--expert-parallel E] [--experts X]] [--device cpu]

The model: Hugging Face GPT-2 architecture, 24 layers, hidden 2048, 16
heads, sequence 1024, vocab 50304 (1.31 B parameters), or with --arch
qwen3-moe bench/make_qwen3_moe.py's mixture of experts (2.98 B parameters,
0.87 B active; transformers' grouped_mm experts in the references; model
FLOPs count the active parameters), random init, dropout 0, bf16 compute with float32 master weights, micro-batch 8 x 1024 tokens,
AdamW (fused), gradient clipping at 1.0, one GPU.

--gpus N runs every configuration on N GPUs of this host under torchrun
(micro-batch 8 x 1024 per GPU; tokens/s per GPU): bmt's plans compiled for
world size N (ZeRO-3 over the N ranks), FSDP2 sharding over the N ranks.
With --arch qwen3-moe, bmt's plans also split each layer's experts over
groups of E = --expert-parallel ranks (default N; all-to-all dispatch and
combine), and the model has --experts X experts (default 32 on one GPU,
16 N on N), so that each GPU holds as many experts as the one-GPU run's
half; the peers shard the experts as every other parameter (no expert
parallelism). --device cpu is a dry run of the whole script on CPU ranks
(gloo; give a tiny model: --layers 2 --hidden 128 --vocab 512 --steps 2
--warmup 1).

1. --build builds bmt-run here (runtime only: -DBMT_COMPILER=OFF) into
   build-gpu/; otherwise build-gpu/bin/bmt-run or build/bin/bmt-run is used.
2. The model is traced here (bench/make_gpt2_1p3b.py, bf16, no weights) and
   compiled by bmt-opt (--bmt-opt, else bmt-opt on PATH or in build/bin)
   twice: every block recomputed (--checkpoint all) and none
   (--checkpoint none), ZeRO-3, --random-init, with the default pipeline's
   elementwise fusion (--plain: --fuse-elementwise=false, plans of plain
   ATen ops). Where no bmt-opt runs (a GPU machine without a portable
   bmt-opt), --archives DIR names a folder with the two plans this script
   writes elsewhere (gpt2-1p3b-recompute-{on,off}[-plain].sharded.pt).
3. Each configuration runs in its own process: bmt-run on random tokens
   (--steps + 3 steps: the last 3 are profiled with --profile), and the
   references, each as `python3 bench/gpu_speed.py --reference NAME`:
   eager = the transformers model in float32 under torch.autocast(bf16);
   fsdp2 = fully_shard per block and at the root, MixedPrecisionPolicy
   (param_dtype=bf16, reduce_dtype=float32), one rank (NCCL);
   fsdp2-compile = the same with torch.compile per block before sharding.
   Recompute on = transformers' gradient checkpointing per block
   (use_reentrant=False); bmt recomputes every block (its plan).
4. Prints tokens/s over the steps after --warmup, model TFLOP/s per GPU
   (6 N + 12 L d S FLOPs per token), peak GiB (CUDA caching allocator peak
   of allocated bytes) and bmt's ratio to each reference; then bmt's per-op
   profile and the eager reference's (torch.profiler), to say where the
   time goes.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICRO_BATCH, SEQ = 8, 1024


def model_config(args):
    import transformers
    if args.arch == "qwen3-moe":  # bench/make_qwen3_moe.py's model, grouped_mm experts
        sys.path.insert(0, os.path.join(REPO, "bench"))
        import make_qwen3_moe
        return make_qwen3_moe.config(args.layers, args.vocab, args.experts, args.hidden)
    if args.arch == "llama":  # bench/make_llama_1b.py's model (Llama-3.2-1B shape)
        return transformers.LlamaConfig(
            num_hidden_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
            num_key_value_heads=8, intermediate_size=4 * args.hidden, vocab_size=args.vocab,
            max_position_embeddings=SEQ, rope_theta=500000.0, tie_word_embeddings=True,
            attention_dropout=0.0, use_cache=False)
    return transformers.GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                                   n_positions=SEQ, vocab_size=args.vocab, resid_pdrop=0.0,
                                   embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)


def flops_per_token(num_params, args):
    """num_params: those a token uses (a mixture of experts' active ones)."""
    return 6 * num_params + 12 * args.layers * args.hidden * SEQ


def build_model(args):
    import transformers
    cls = {"llama": transformers.LlamaForCausalLM, "gpt2": transformers.GPT2LMHeadModel,
           "qwen3-moe": transformers.Qwen3MoeForCausalLM}[args.arch]
    return cls(model_config(args))


def active_parameters(model, args):
    if args.arch != "qwen3-moe":
        return sum(p.numel() for p in model.parameters())
    import make_qwen3_moe
    return make_qwen3_moe.active_parameters(model, model.config)


# --- references (run in a child process each) --------------------------------

def reference(args):
    import torch
    import transformers
    name, recompute = args.reference, args.recompute[0] == "on"
    torch.manual_seed(0)
    cuda = args.device == "cuda"
    # Under torchrun (--gpus N): this rank's GPU; else one process on GPU 0.
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    fsdp = name.startswith("fsdp2")
    if world > 1 and not fsdp:
        raise SystemExit(f"--reference {name} runs on one GPU only")
    if fsdp:
        import torch.distributed as dist
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                                **({"device_id": device} if cuda else {}))
    # On N GPUs the model is built whole on the CPU (the same seed on every
    # rank) and fully_shard moves each rank's shards to its GPU.
    with torch.device("cpu") if world > 1 else device:
        model = build_model(args)
    blocks = model.transformer.h if args.arch == "gpt2" else model.model.layers
    num_params = active_parameters(model, args)
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if fsdp:
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in blocks:
            if name == "fsdp2-compile":
                block.compile()
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
        model.to(device)  # buffers (rotary frequencies) too
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=cuda)
    g = torch.Generator(device=device).manual_seed(1 + rank)
    total = args.warmup + args.steps

    def step():
        w = torch.randint(0, args.vocab, (MICRO_BATCH, SEQ + 1), device=device, generator=g)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not fsdp):
            logits = model(input_ids=w[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                 w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    losses = []
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(args.warmup):
        losses.append(step())
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        losses.append(step())
    sync()
    seconds = time.perf_counter() - t0
    # Per GPU: every rank runs MICRO_BATCH x SEQ tokens a step.
    result = {"name": name, "recompute": recompute, "params": num_params,
              "tokens_per_s": args.steps * MICRO_BATCH * SEQ / seconds,
              "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0,
              "loss_first": losses[0].item(), "loss_last": losses[-1].item()}
    if args.profile_reference:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        result["profile"] = p.key_averages().table(sort_by="self_cuda_time_total", row_limit=30)
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)
    if fsdp:
        dist.destroy_process_group()


# --- bmt ---------------------------------------------------------------------

def find_binary(name, explicit=None):
    for candidate in [explicit, os.path.join(REPO, "build-gpu", "bin", name),
                      shutil.which(name), os.path.join(REPO, "build", "bin", name)]:
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def build_runtime():
    build = os.path.join(REPO, "build-gpu")
    cmd = ["cmake", "-S", REPO, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
           "-DBMT_COMPILER=OFF", "-DBMT_TESTS=OFF", f"-DPython3_EXECUTABLE={sys.executable}"]
    headers = os.path.join(REPO, ".devcarry", "include")
    if os.path.isdir(os.path.join(headers, "nlohmann")):  # machines without nlohmann-json3-dev
        cmd.append(f"-DNLOHMANN_JSON_INCLUDE_DIR={headers}")
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["ninja", "-C", build, "bmt-run"], check=True, stdout=subprocess.DEVNULL)
    print(f"built bmt-run in {time.time() - t0:.0f} s", flush=True)


def make_archives(args, out):
    plain = "-plain" if args.plain else ""
    stem = {"gpt2": "gpt2-1p3b", "llama": "llama-1b", "qwen3-moe": "qwen3-moe"}[args.arch]
    if args.gpus > 1:
        stem += f"-n{args.gpus}" + (f"-ep{args.expert_parallel}" if args.expert_parallel > 1 else "")
    archives = {r: os.path.join(out, f"{stem}-recompute-{r}{plain}.sharded.pt")
                for r in ("on", "off")}
    bmt_opt = find_binary("bmt-opt", args.bmt_opt)
    if args.archives or not bmt_opt:
        if not args.archives:
            raise SystemExit("no bmt-opt here: give --bmt-opt or --archives DIR (plans made "
                             "elsewhere by this script)")
        return {r: os.path.join(args.archives, os.path.basename(a)) for r, a in archives.items()}
    traced = os.path.join(out, f"{stem}-bf16.pt")
    if args.arch == "qwen3-moe":
        make = ["make_qwen3_moe.py", "--layers", str(args.layers), "--vocab", str(args.vocab),
                "--experts", str(args.experts), "--hidden", str(args.hidden)]
    elif args.arch == "gpt2":
        make = ["make_gpt2_1p3b.py", "--layers", str(args.layers), "--hidden", str(args.hidden),
                "--heads", str(args.heads), "--vocab", str(args.vocab)]
    else:
        raise SystemExit("--arch llama: bmt's plans come from bench/make_llama_1b.py and "
                         "bench/gpu_fusion.sh (--archives DIR)")
    subprocess.run([sys.executable, os.path.join(REPO, "bench", make[0]), traced, *make[1:],
                    "--dtype", "bfloat16"], check=True)
    import torch  # a portable bmt-opt (BMT_STATIC_LLVM) finds LibTorch by LD_LIBRARY_PATH
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(torch.__file__), "lib"), env.get("LD_LIBRARY_PATH", "")])
    for r, path in archives.items():
        subprocess.run([bmt_opt, traced, "-o", path, "--random-init", "--world-size",
                        str(args.gpus), "--expert-parallel", str(args.expert_parallel),
                        "--micro-batch", str(MICRO_BATCH), "--seq-len", str(SEQ),
                        "--checkpoint", "all" if r == "on" else "none",
                        f"--fuse-elementwise={'false' if args.plain else 'true'}"],
                       check=True, env=env)
    return archives


def write_tokens(prefix, vocab, n):
    import numpy as np
    dtype = "uint16" if vocab <= 65536 else "uint32"  # Llama's 128256 tokens need 32 bits
    np.random.default_rng(0).integers(0, vocab, n, dtype=dtype).tofile(prefix + ".bin")
    meta = {"format": "bmt-tokens", "version": 1, "dtype": dtype, "num_tokens": n,
            "num_documents": 1, "vocab_size": vocab, "eos_id": 0, "mask_id": None,
            "pad_id": None, "tokenizer": "random", "source": []}
    with open(prefix + ".json", "w") as f:
        json.dump(meta, f)
    return prefix + ".bin"


def launcher(args):
    """The command prefix that starts one process per GPU (none for one)."""
    if args.gpus == 1:
        return []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={args.gpus}"]


def run_bmt(args, bmt_run, archive, data, recompute, out):
    total = args.warmup + args.steps
    log = os.path.join(out, f"bmt-recompute-{recompute}.jsonl")
    # Step total + 1 ends the queued run before the profile window (it also
    # counts the device's lag behind the host): not timed, as the steps of
    # the window are not.
    run = launcher(args) + (["--no-python"] if args.gpus > 1 else []) + [bmt_run]
    cmd = run + [archive, "--data", data, "--steps", str(total + 4), "--micro-batch",
                 str(MICRO_BATCH), "--seq-len", str(SEQ), "--lr", "1e-4", "--schedule",
                 "constant", "--clip-grad", "1.0", "--device", args.device, "--log-file", log,
                 "--log-every", "5", "--profile", f"{total + 2}:{total + 4}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout[-4000:], r.stderr[-4000:])
        return None
    steps = [json.loads(line) for line in open(log)]
    timed = [s for s in steps if args.warmup < s["step"] <= total]
    seconds = sum(s["tokens"] / s["tokens_per_s"] for s in timed)  # tokens: all ranks' 
    profile = r.stdout[r.stdout.index("profile:"):] if "profile:" in r.stdout else ""
    profile = "\n".join(line for line in profile.splitlines() if not line.startswith("step "))
    # No host synchronisation inside a step: with BMT_DEBUG_SYNC=1 any
    # synchronising CUDA call after step 1 is an error.
    syncs = "not checked (cpu)"
    if args.device == "cuda":
        check = subprocess.run(cmd[:cmd.index("--steps")] + ["--steps", "4", "--micro-batch",
                                                             str(MICRO_BATCH), "--seq-len",
                                                             str(SEQ), "--device", "cuda"],
                               capture_output=True, text=True,
                               env=dict(os.environ, BMT_DEBUG_SYNC="1"))
        syncs = "none" if check.returncode == 0 else \
            (check.stderr.strip().splitlines() or ["?"])[-1]
    return {"name": "bmt", "recompute": recompute == "on",
            "tokens_per_s": sum(s["tokens"] for s in timed) / seconds / args.gpus,
            "peak_gib": max(s["peak_mem_gib"] for s in steps[:total]),
            "loss_first": steps[0]["loss"], "loss_last": steps[total - 1]["loss"],
            "profile": profile, "host_syncs": syncs}


def run_reference(args, name, recompute):
    if args.gpus > 1 and not name.startswith("fsdp2"):
        return None  # eager runs on one GPU
    cmd = (launcher(args) or [sys.executable]) + [
        os.path.abspath(__file__), "--reference", name, "--recompute", recompute, "--steps",
        str(args.steps), "--warmup", str(args.warmup), "--layers", str(args.layers),
        "--hidden", str(args.hidden), "--heads", str(args.heads), "--vocab", str(args.vocab),
        "--arch", args.arch, "--experts", str(args.experts), "--device", args.device,
        "--micro-batch", str(MICRO_BATCH), "--seq", str(SEQ)]
    if name == "eager" and recompute == "on":
        cmd.append("--profile-reference")
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not lines:
        print(f"{name} (recompute {recompute}) failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return None
    return json.loads(lines[-1][len("RESULT "):])


def main():
    global MICRO_BATCH, SEQ
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="build bmt-run into build-gpu/ first")
    ap.add_argument("--bmt-opt", help="the compiler (default: build/bin/bmt-opt or PATH)")
    ap.add_argument("--archives", help="folder with plans made elsewhere by this script")
    ap.add_argument("--plain", action="store_true",
                    help="bmt's plans without the elementwise fusion (--fuse-elementwise=false)")
    ap.add_argument("--out", default="/tmp/bmt-gpu-speed", help="work folder")
    ap.add_argument("--only", nargs="+", default=["bmt", "eager", "fsdp2", "fsdp2-compile"],
                    choices=["bmt", "eager", "fsdp2", "fsdp2-compile"])
    ap.add_argument("--recompute", nargs="+", default=["on", "off"], choices=["on", "off"])
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--arch", choices=["gpt2", "llama", "qwen3-moe"], default="gpt2",
                    help="llama: the references only (bmt's plans: bench/make_llama_1b.py, "
                         "bench/gpu_fusion.sh); its defaults 16 layers, 32 heads, vocab 128256; "
                         "qwen3-moe: bench/make_qwen3_moe.py's 16 layers, hidden 1536, 32 "
                         "experts top 4, vocab 151936")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--results", help="JSON file of results: runs of this call replace the same "
                                      "(run, recompute) there, the table shows them all "
                                      "(default: OUT/results.json)")
    ap.add_argument("--make-archives-only", action="store_true",
                    help="write the two bmt plans into --out and stop (for a GPU machine "
                         "without bmt-opt: carry them and pass --archives)")
    ap.add_argument("--gpus", type=int, default=1,
                    help="GPUs of this host: every run under torchrun on N ranks")
    ap.add_argument("--expert-parallel", type=int, default=None,
                    help="qwen3-moe: ranks of an expert group in bmt's plans (default --gpus)")
    ap.add_argument("--experts", type=int, default=None,
                    help="qwen3-moe: experts a layer (default 32 on one GPU, 16 x --gpus)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a dry run on CPU ranks (gloo), tiny models only")
    ap.add_argument("--micro-batch", type=int, default=MICRO_BATCH, help="sequences a rank a step")
    ap.add_argument("--seq", type=int, default=SEQ, help="tokens a sequence")
    ap.add_argument("--reference", help=argparse.SUPPRESS)
    ap.add_argument("--profile-reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    MICRO_BATCH, SEQ = args.micro_batch, args.seq
    llama, moe = args.arch == "llama", args.arch == "qwen3-moe"
    args.experts = args.experts or (32 if args.gpus == 1 else 16 * args.gpus)
    args.expert_parallel = args.expert_parallel or (args.gpus if moe else 1)
    if args.expert_parallel > 1 and not moe:
        raise SystemExit("--expert-parallel needs --arch qwen3-moe")
    if args.gpus % args.expert_parallel or args.experts % args.expert_parallel:
        raise SystemExit(f"--expert-parallel {args.expert_parallel} must divide --gpus "
                         f"{args.gpus} and --experts {args.experts}")
    args.layers = args.layers or (16 if llama or moe else 24)
    args.heads = args.heads or (12 if moe else 32 if llama else 16)
    args.vocab = args.vocab or (151936 if moe else 128256 if llama else 50304)
    if moe and args.hidden == 2048:  # the default is GPT-2's
        args.hidden = 1536
    if args.reference:
        return reference(args)

    os.makedirs(args.out, exist_ok=True)
    if args.make_archives_only:
        args.archives = None
        for r, path in make_archives(args, args.out).items():
            print(f"recompute {r}: {path} ({os.path.getsize(path):,} bytes)")
        return
    results = []
    if "bmt" in args.only:
        if args.build:
            build_runtime()
        bmt_run = find_binary("bmt-run")
        if not bmt_run:
            raise SystemExit("no bmt-run: build it (--build) first")
        archives = make_archives(args, args.out)
        data = write_tokens(os.path.join(args.out, "tokens"), args.vocab,
                            (args.warmup + args.steps + 3) * MICRO_BATCH * (SEQ + 1) * 2 * args.gpus)
        for r in args.recompute:
            results.append(run_bmt(args, bmt_run, archives[r], data, r, args.out))
            print(f"bmt recompute {r}: done", flush=True)
    for name in [n for n in args.only if n != "bmt"]:
        for r in args.recompute:
            results.append(run_reference(args, name, r))
            print(f"{name} recompute {r}: done", flush=True)
    results = [r for r in results if r]
    path = args.results or os.path.join(args.out, "results.json")
    earlier = json.load(open(path)) if os.path.exists(path) else []
    mine = {(r["name"], r["recompute"]) for r in results}
    order = ["bmt", "eager", "fsdp2", "fsdp2-compile"]
    results = sorted([r for r in earlier if (r["name"], r["recompute"]) not in mine] + results,
                     key=lambda r: (not r["recompute"], order.index(r["name"])))
    with open(path, "w") as f:
        json.dump(results, f, indent=1)

    import torch
    num_params = next((r["params"] for r in results if "params" in r), None)
    if num_params is None:  # only bmt ran: the same architecture's count
        with torch.device("meta"):
            num_params = active_parameters(build_model(args), args)
    fpt = flops_per_token(num_params, args)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    where = f"{args.gpus} x {gpu}" if args.device == "cuda" else f"{args.gpus} CPU ranks"
    experts = f", {args.experts} experts, expert groups of {args.expert_parallel} (bmt)" \
        if args.arch == "qwen3-moe" else ""
    print(f"\n{args.arch} {args.layers} x {args.hidden}{experts}, {num_params:,} parameters a "
          f"token, micro-batch {MICRO_BATCH} x {SEQ} a rank, bf16 + fp32 master weights, {where}, "
          f"torch {torch.__version__}; {args.steps} timed steps after {args.warmup}; tokens/s "
          f"and TFLOP/s per GPU")
    print(f"{'run':<15} {'recompute':<9} {'tokens/s':>9} {'TFLOP/s':>8} {'peak GiB':>8} "
          f"{'loss 1 -> last':>16}  bmt / it")
    bmt = {r["recompute"]: r for r in results if r["name"] == "bmt"}
    for r in results:
        tflops = r["tokens_per_s"] * fpt / 1e12
        ratio = ""
        if r["recompute"] in bmt:
            ratio = f"{bmt[r['recompute']]['tokens_per_s'] / r['tokens_per_s']:.2f}"
        print(f"{r['name']:<15} {'on' if r['recompute'] else 'off':<9} "
              f"{r['tokens_per_s']:>9,.0f} {tflops:>8.1f} {r['peak_gib']:>8.1f} "
              f"{r['loss_first']:>7.3f} -> {r['loss_last']:.3f}  {ratio}")
    for r in results:
        if "host_syncs" in r and (r["name"], r["recompute"]) in mine:
            print(f"bmt (recompute {'on' if r['recompute'] else 'off'}): host synchronisations "
                  f"inside steps 2-4 (BMT_DEBUG_SYNC=1): {r['host_syncs']}")
    for r in results:
        if r.get("profile") and (r["name"], r["recompute"]) in mine:
            print(f"\n--- {r['name']} (recompute {'on' if r['recompute'] else 'off'}) profile ---")
            print(r["profile"])


if __name__ == "__main__":
    main()
