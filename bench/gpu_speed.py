#!/usr/bin/env python3
"""GPU training speed: bmt-run against eager PyTorch, FSDP2 and FSDP2 +
torch.compile on the same machine (issue 5's benchmark).

usage: python3 bench/gpu_speed.py [--build] [--bmt-opt BIN] [--archives DIR] [--plain]
           [--only bmt eager fsdp2 fsdp2-compile] [--recompute on off]
           [--steps 20] [--warmup 5] [--out DIR] [--layers 24 --hidden 2048 ...]
           [--gpus N [--expert-parallel E] [--experts X]] [--device cpu]
           [--gpus N --pipeline-parallel P.. [--virtual-stages V..] [--tensor-parallel T..]
            [--micro-batches M] [--arch gpt2|llama-8b]]

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

--pipeline-parallel P [P ...] (with --gpus N) measures pipeline parallelism:
bmt plans compiled with --pipeline-parallel P --virtual-stages V
--tensor-parallel T --world-size N for every listed P, V (default 1; V > 1
is interleaved 1F1B) and T (default 1), data-parallel ZeRO-3 over the
rest, D = N / (P x T),
beside the ZeRO-3-alone plan ("bmt") and, by default, FSDP2 + compile
(--only). Every run trains the same global batch, micro-batch x N rows:
the peers micro-batch rows on each rank; bmt micro-batch x P x T rows on
each data-parallel rank (bmt-run --micro-batch; a TP group and the stages
share them), split into M pieces (--micro-batches M; default 4 P, 2 P or
P, the first that divides those rows; bmt-opt's --micro-batch is the
piece). Prints tokens/s and model TFLOP/s per GPU, rank 0's peak GiB, the
loss, each run's ratio to ZeRO-3 alone and to FSDP2 + compile, then per
pipeline from bmt-run's metrics (`pipeline`, docs/runtime/pipeline.md)
the measured idle share of each rank (mean over the timed steps) against
the schedule's `bubble` (P - 1) / (V M + P - 1) and the simulated share;
bmt-run's --profile is refused with stages, so pipelines get no profile.
--arch llama-8b is bench/make_llama_1b.py --config 8b (--hidden and
--vocab shrink it for a dry run). Launched processes get
NCCL_NVLS_ENABLE=0 (NVLink multicast off). Dry run: --device cpu --gpus 4
--layers 4 --hidden 128 --heads 4 --vocab 512 --micro-batch 2 --seq 64
--steps 3 --warmup 1 --recompute on --pipeline-parallel 2
--virtual-stages 1 2 --tensor-parallel 1 2.

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
    if args.arch == "llama-8b":  # bench/make_llama_1b.py --config 8b (--hidden: dry runs)
        return transformers.LlamaConfig(
            num_hidden_layers=args.layers, hidden_size=args.hidden, num_attention_heads=32,
            num_key_value_heads=8, intermediate_size=int(3.5 * args.hidden),
            vocab_size=args.vocab, max_position_embeddings=SEQ, rope_theta=500000.0,
            tie_word_embeddings=False, attention_dropout=0.0, use_cache=False)
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
    cls = {"llama": transformers.LlamaForCausalLM, "llama-8b": transformers.LlamaForCausalLM,
           "gpt2": transformers.GPT2LMHeadModel,
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


# --- pipeline configurations (--pipeline-parallel) ------------------------------
# A configuration is (P, V, T): pipeline stages, virtual stages a stage,
# tensor-parallel ranks; (1, 1, 1) is ZeRO-3 alone, the existing plans.

BASE = (1, 1, 1)


def config_name(cfg):
    p, v, t = cfg
    if cfg == BASE:
        return "bmt"
    return "bmt" + (f" pp{p}" if p > 1 else "") + (f" v{v}" if v > 1 else "") + \
        (f" tp{t}" if t > 1 else "")


def pipeline_configs(args):
    """ZeRO-3 alone, then every (P, V, T) of the lists that N ranks can run
    (P x T divides N; V > 1 needs P > 1: such products are left out)."""
    configs = [BASE]
    for p in args.pipeline_parallel:
        for v in args.virtual_stages:
            for t in args.tensor_parallel:
                cfg = (p, v, t)
                if cfg in configs or (v > 1 and p == 1):
                    continue
                if args.gpus % (p * t):
                    raise SystemExit(f"--pipeline-parallel {p} x --tensor-parallel {t} does not "
                                     f"divide --gpus {args.gpus}")
                configs.append(cfg)
    return configs


def rows_per_step(cfg):
    """A data-parallel rank's rows a step: the global batch MICRO_BATCH x N
    over the N / (P x T) data-parallel ranks (a TP group and a pipeline's
    stages share their rows)."""
    p, _, t = cfg
    return MICRO_BATCH * p * t


def micro_batches(args, cfg):
    """M: the pieces a step's rows are split into (1 without stages);
    --micro-batches, else 4 P, 2 P or P, the first that divides the rows."""
    p, v, _ = cfg
    if p == 1:
        return 1
    rows = rows_per_step(cfg)
    m = args.micro_batches or next(k * p for k in (4, 2, 1) if rows % (k * p) == 0)
    if m < p or rows % m or (v > 1 and m % p):
        raise SystemExit(f"--micro-batches {m}: at P = {p}, V = {v} it must be >= P, divide the "
                         f"{rows} rows a data-parallel rank trains a step (micro-batch "
                         f"{MICRO_BATCH} x P x T){' and be a multiple of P' if v > 1 else ''}")
    return m


def make_archives(args, out, configs=(BASE,)):
    """{config: {recompute: plan}}: compiled here, or (--archives) made
    elsewhere by --make-archives-only with the same options."""
    plain = "-plain" if args.plain else ""
    stem = {"gpt2": "gpt2-1p3b", "llama": "llama-1b", "llama-8b": "llama-8b",
            "qwen3-moe": "qwen3-moe"}[args.arch]
    if args.gpus > 1:
        stem += f"-n{args.gpus}" + (f"-ep{args.expert_parallel}" if args.expert_parallel > 1 else "")
    archives = {}
    for cfg in configs:
        p, v, t = cfg
        tag = "" if cfg == BASE else f"-pp{p}-v{v}-tp{t}-m{micro_batches(args, cfg)}"
        # ZeRO-3 alone: both plans, as before; a pipeline's: --recompute's.
        archives[cfg] = {r: os.path.join(out, f"{stem}{tag}-recompute-{r}{plain}.sharded.pt")
                         for r in (("on", "off") if cfg == BASE else args.recompute)}
    bmt_opt = find_binary("bmt-opt", args.bmt_opt)
    if args.archives or not bmt_opt:
        if not args.archives:
            raise SystemExit("no bmt-opt here: give --bmt-opt or --archives DIR (plans made "
                             "elsewhere by this script)")
        return {cfg: {r: os.path.join(args.archives, os.path.basename(a)) for r, a in x.items()}
                for cfg, x in archives.items()}
    traced = os.path.join(out, f"{stem}-bf16.pt")
    if args.arch == "qwen3-moe":
        make = ["make_qwen3_moe.py", "--layers", str(args.layers), "--vocab", str(args.vocab),
                "--experts", str(args.experts), "--hidden", str(args.hidden)]
    elif args.arch == "gpt2":
        make = ["make_gpt2_1p3b.py", "--layers", str(args.layers), "--hidden", str(args.hidden),
                "--heads", str(args.heads), "--vocab", str(args.vocab)]
    elif args.arch == "llama-8b":
        # --contiguous: zero-stride weights would trace the 8B shape through
        # the CPU's naive GEMM (over half an hour); this file holds 1 GiB.
        make = ["make_llama_1b.py", "--config", "8b", "--layers", str(args.layers), "--hidden",
                str(args.hidden), "--vocab", str(args.vocab), "--contiguous"]
    else:
        raise SystemExit("--arch llama: bmt's plans come from bench/make_llama_1b.py and "
                         "bench/gpu_fusion.sh (--archives DIR)")
    subprocess.run([sys.executable, os.path.join(REPO, "bench", make[0]), traced, *make[1:],
                    "--dtype", "bfloat16"], check=True)
    import torch  # a portable bmt-opt (BMT_STATIC_LLVM) finds LibTorch by LD_LIBRARY_PATH
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [os.path.join(os.path.dirname(torch.__file__), "lib"), env.get("LD_LIBRARY_PATH", "")])
    for cfg, plans in archives.items():
        p, v, t = cfg
        # bmt-opt's --micro-batch: the rows of one forward (a piece of a step's rows).
        rows = rows_per_step(cfg) // micro_batches(args, cfg)
        stages = [] if cfg == BASE else ["--pipeline-parallel", str(p), "--virtual-stages",
                                         str(v), "--tensor-parallel", str(t)]
        for r, path in plans.items():
            subprocess.run([bmt_opt, traced, "-o", path, "--random-init", "--world-size",
                            str(args.gpus), "--expert-parallel", str(args.expert_parallel),
                            *stages, "--micro-batch", str(rows), "--seq-len", str(SEQ),
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


def pipeline_summary(timed):
    """Means over the timed steps of the `pipeline` object of bmt-run's
    metrics (docs/runtime/pipeline.md): per rank the measured idle share
    and the simulated one, and the closed-form bubble."""
    pipes = [s["pipeline"] for s in timed if "pipeline" in s]
    if not pipes:
        return None

    def mean(key):
        return [sum(x[key][i] for x in pipes) / len(pipes) for i in range(len(pipes[0][key]))]

    first = pipes[0]
    return {"schedule": first["schedule"], "stages": first["stages"],
            "virtual_stages": first["virtual_stages"], "micro_batches": first["micro_batches"],
            "bubble": first["bubble"], "idle_fraction": mean("idle_fraction"),
            "simulated_idle_fraction": mean("simulated_idle_fraction"),
            "in_flight": first["in_flight"], "steps": len(pipes)}


def run_bmt(args, bmt_run, archive, data, recompute, out, cfg=BASE):
    total = args.warmup + args.steps
    p, v, t = cfg
    pipelined = getattr(args, "pipeline_parallel", None) is not None
    tag = "" if cfg == BASE else f"-pp{p}-v{v}-tp{t}"
    log = os.path.join(out, f"bmt{tag}-recompute-{recompute}.jsonl")
    if os.path.exists(log):
        os.remove(log)
    rows, m = rows_per_step(cfg), micro_batches(args, cfg)
    batch = ["--micro-batch", str(rows), "--seq-len", str(SEQ)] + \
        (["--micro-batches", str(m)] if p > 1 else [])
    # Step total + 1 ends the queued run before the profile window (it also
    # counts the device's lag behind the host): not timed, as the steps of
    # the window are not. bmt-run refuses --profile with pipeline stages.
    window = ["--steps", str(total + 4), "--profile", f"{total + 2}:{total + 4}"] if p == 1 \
        else ["--steps", str(total + 1)]
    run = launcher(args) + (["--no-python"] if args.gpus > 1 else []) + [bmt_run]
    cmd = run + [archive, "--data", data, *batch, "--lr", "1e-4", "--schedule", "constant",
                 "--clip-grad", "1.0", "--device", args.device, "--log-file", log,
                 "--log-every", "5", *window]
    # Several GPUs, pipeline runs: NVLink multicast off (the lent machines').
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1") if pipelined and args.gpus > 1 else None
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(f"{config_name(cfg)} (recompute {recompute}) failed:")
        print(r.stdout[-4000:], r.stderr[-4000:])
        return None
    steps = [json.loads(line) for line in open(log)]
    steps = [s for s in steps if s.get("kind", "train") == "train"]
    timed = [s for s in steps if args.warmup < s["step"] <= total]
    seconds = sum(s["tokens"] / s["tokens_per_s"] for s in timed)  # tokens: all ranks' 
    profile = r.stdout[r.stdout.index("profile:"):] if "profile:" in r.stdout else ""
    profile = "\n".join(line for line in profile.splitlines() if not line.startswith("step "))
    # No host synchronisation inside a step: with BMT_DEBUG_SYNC=1 any
    # synchronising CUDA call after step 1 is an error.
    syncs = "not checked (cpu)"
    if args.device == "cuda":
        check = subprocess.run(cmd[:cmd.index("--micro-batch")] + batch +
                               ["--steps", "4", "--device", "cuda"],
                               capture_output=True, text=True,
                               env=dict(env or os.environ, BMT_DEBUG_SYNC="1"))
        syncs = "none" if check.returncode == 0 else \
            (check.stderr.strip().splitlines() or ["?"])[-1]
    if pipelined:
        # The global batch's tokens (MICRO_BATCH x N rows) over the step
        # times, per GPU: the same count for every configuration.
        tokens_per_s = len(timed) * MICRO_BATCH * args.gpus * SEQ / seconds / args.gpus
    else:
        tokens_per_s = sum(s["tokens"] for s in timed) / seconds / args.gpus
    result = {"name": config_name(cfg), "recompute": recompute == "on",
              "tokens_per_s": tokens_per_s,
              "peak_gib": max(s["peak_mem_gib"] for s in steps[:total]),
              "loss_first": steps[0]["loss"], "loss_last": steps[total - 1]["loss"],
              "profile": profile, "host_syncs": syncs}
    if pipelined:
        result.update({"pp": p, "vs": v, "tp": t, "dp": args.gpus // (p * t), "rows": rows,
                       "micro_batches": m, "logged_tokens": timed[-1]["tokens"],
                       "pipeline": pipeline_summary(timed)})
    return result


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


def print_pipeline(args, results, fpt):
    """--pipeline-parallel: each run's speed against ZeRO-3 alone and FSDP2
    + compile, then each pipeline's measured idle share per rank against
    the schedule's bubble."""
    print(f"global batch {MICRO_BATCH * args.gpus} x {SEQ} tokens a step in every run: FSDP2 "
          f"{MICRO_BATCH} rows on each of {args.gpus} ranks; bmt rows = {MICRO_BATCH} x P x T on "
          f"each of D = N / (P x T) data-parallel ranks, split into M pieces of rows / M; peak GiB: "
          f"rank 0's")
    print(f"{'run':<16} {'rec':<3} {'P':>2} {'V':>2} {'T':>2} {'D':>3} {'rows':>4} {'M':>3} "
          f"{'tokens/s':>9} {'TFLOP/s':>8} {'peak GiB':>8} {'loss 1 -> last':>16}  "
          f"{'/ZeRO-3':>7} {'/fsdp2c':>7}")
    by = {(r["name"], r["recompute"]): r for r in results}
    for r in results:
        zero = by.get(("bmt", r["recompute"]))
        ref = by.get(("fsdp2-compile", r["recompute"]))
        ratios = [f"{r['tokens_per_s'] / x['tokens_per_s']:>7.2f}" if x else f"{'-':>7}"
                  for x in (zero, ref)]
        shape = [str(r.get(k, "-")) for k in ("pp", "vs", "tp", "dp", "rows", "micro_batches")]
        print(f"{r['name']:<16} {'on' if r['recompute'] else 'off':<3} {shape[0]:>2} "
              f"{shape[1]:>2} {shape[2]:>2} {shape[3]:>3} {shape[4]:>4} {shape[5]:>3} "
              f"{r['tokens_per_s']:>9,.0f} {r['tokens_per_s'] * fpt / 1e12:>8.2f} "
              f"{r['peak_gib']:>8.1f} {r['loss_first']:>7.3f} -> {r['loss_last']:.3f}  "
              f"{' '.join(ratios)}")
    print("\nbubble: the schedule's (P - 1) / (V M + P - 1); idle: measured share of each "
          "rank's step spent waiting (mean of the timed steps); simulated: the schedule timed "
          "with the measured forward/backward times, transfers free")
    for r in results:
        pipe = r.get("pipeline")
        if not pipe:
            continue
        idle = " ".join(f"{x:.3f}" for x in pipe["idle_fraction"])
        sim = " ".join(f"{x:.3f}" for x in pipe["simulated_idle_fraction"])
        print(f"{r['name']:<16} {'on' if r['recompute'] else 'off':<3} {pipe['schedule']}, "
              f"M = {pipe['micro_batches']}: bubble {pipe['bubble']:.3f} | idle per rank {idle} "
              f"| simulated {sim} | in flight {pipe['in_flight']}")


def main():
    global MICRO_BATCH, SEQ
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true", help="build bmt-run into build-gpu/ first")
    ap.add_argument("--bmt-opt", help="the compiler (default: build/bin/bmt-opt or PATH)")
    ap.add_argument("--archives", help="folder with plans made elsewhere by this script")
    ap.add_argument("--plain", action="store_true",
                    help="bmt's plans without the elementwise fusion (--fuse-elementwise=false)")
    ap.add_argument("--out", default="/tmp/bmt-gpu-speed", help="work folder")
    ap.add_argument("--only", nargs="+", choices=["bmt", "eager", "fsdp2", "fsdp2-compile"],
                    help="default: all four; with --pipeline-parallel bmt fsdp2-compile")
    ap.add_argument("--recompute", nargs="+", default=["on", "off"], choices=["on", "off"])
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    ap.add_argument("--arch", choices=["gpt2", "llama", "llama-8b", "qwen3-moe"], default="gpt2",
                    help="llama: the references only (bmt's plans: bench/make_llama_1b.py, "
                         "bench/gpu_fusion.sh); its defaults 16 layers, 32 heads, vocab 128256; "
                         "llama-8b: bench/make_llama_1b.py --config 8b (32 x 4096, FFN 3.5 x "
                         "hidden, vocab 128256, untied); "
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
    ap.add_argument("--pipeline-parallel", type=int, nargs="+",
                    help="P: bmt plans with P pipeline stages (each listed P), run beside ZeRO-3 "
                         "alone at the same global batch; prints the bubble per rank")
    ap.add_argument("--virtual-stages", type=int, nargs="+", default=[1],
                    help="V (each listed): interleaved 1F1B with V > 1 (T = 1 only)")
    ap.add_argument("--tensor-parallel", type=int, nargs="+", default=[1],
                    help="T (each listed) with --pipeline-parallel: data-parallel ZeRO "
                         "fills the rest, D = N / (P x T)")
    ap.add_argument("--micro-batches", type=int,
                    help="M: pieces of a step's rows through the stages (default 4 P, 2 P or P, "
                         "the first that divides micro-batch x P x T)")
    ap.add_argument("--reference", help=argparse.SUPPRESS)
    ap.add_argument("--profile-reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    MICRO_BATCH, SEQ = args.micro_batch, args.seq
    llama, moe = args.arch in ("llama", "llama-8b"), args.arch == "qwen3-moe"
    big = args.arch == "llama-8b"
    pipelined = args.pipeline_parallel is not None
    args.only = args.only or (["bmt", "fsdp2-compile"] if pipelined else
                              ["bmt", "eager", "fsdp2", "fsdp2-compile"])
    if not pipelined and (args.virtual_stages != [1] or args.tensor_parallel != [1] or
                          args.micro_batches):
        raise SystemExit("--virtual-stages, --tensor-parallel and --micro-batches go with "
                         "--pipeline-parallel")
    if pipelined and (moe or args.arch == "llama"):
        raise SystemExit("--pipeline-parallel: --arch gpt2 or llama-8b (bmt-run refuses "
                         "mixture-of-experts layers in a pipeline)")
    if pipelined and min(args.pipeline_parallel + args.virtual_stages + args.tensor_parallel) < 1:
        raise SystemExit("--pipeline-parallel, --virtual-stages, --tensor-parallel must be >= 1")
    args.experts = args.experts or (32 if args.gpus == 1 else 16 * args.gpus)
    args.expert_parallel = args.expert_parallel or (args.gpus if moe else 1)
    if args.expert_parallel > 1 and not moe:
        raise SystemExit("--expert-parallel needs --arch qwen3-moe")
    if args.gpus % args.expert_parallel or args.experts % args.expert_parallel:
        raise SystemExit(f"--expert-parallel {args.expert_parallel} must divide --gpus "
                         f"{args.gpus} and --experts {args.experts}")
    args.layers = args.layers or (32 if big else 16 if llama or moe else 24)
    args.heads = args.heads or (12 if moe else 32 if llama else 16)
    args.vocab = args.vocab or (151936 if moe else 128256 if llama else 50304)
    if moe and args.hidden == 2048:  # the default is GPT-2's
        args.hidden = 1536
    if big and args.hidden == 2048:
        args.hidden = 4096
    if args.reference:
        return reference(args)

    os.makedirs(args.out, exist_ok=True)
    configs = pipeline_configs(args) if pipelined else [BASE]
    if args.make_archives_only:
        args.archives = None
        for cfg, plans in make_archives(args, args.out, configs).items():
            for r, path in plans.items():
                name = "" if cfg == BASE else config_name(cfg) + " "
                print(f"{name}recompute {r}: {path} ({os.path.getsize(path):,} bytes)")
        return
    results = []
    if "bmt" in args.only:
        if args.build:
            build_runtime()
        bmt_run = find_binary("bmt-run")
        if not bmt_run:
            raise SystemExit("no bmt-run: build it (--build) first")
        archives = make_archives(args, args.out, configs)
        data = write_tokens(os.path.join(args.out, "tokens"), args.vocab,
                            (args.warmup + args.steps + 3) * MICRO_BATCH * (SEQ + 1) * 2 * args.gpus)
        for cfg in configs:
            for r in args.recompute:
                results.append(run_bmt(args, bmt_run, archives[cfg][r], data, r, args.out, cfg))
                print(f"{config_name(cfg)} recompute {r}: done", flush=True)
    for name in [n for n in args.only if n != "bmt"]:
        for r in args.recompute:
            results.append(run_reference(args, name, r))
            print(f"{name} recompute {r}: done", flush=True)
    results = [r for r in results if r]
    path = args.results or os.path.join(
        args.out, f"results-pp-{args.arch}-n{args.gpus}.json" if pipelined else "results.json")
    earlier = json.load(open(path)) if os.path.exists(path) else []
    mine = {(r["name"], r["recompute"]) for r in results}
    order = ["bmt", "eager", "fsdp2", "fsdp2-compile"]
    results = sorted([r for r in earlier if (r["name"], r["recompute"]) not in mine] + results,
                     key=lambda r: (not r["recompute"], order.index(r["name"].split()[0]),
                                    r["name"]))
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
    if pipelined:
        print_pipeline(args, results, fpt)
    bmt = {r["recompute"]: r for r in results if r["name"] == "bmt"}
    if not pipelined:
        print(f"{'run':<15} {'recompute':<9} {'tokens/s':>9} {'TFLOP/s':>8} {'peak GiB':>8} "
              f"{'loss 1 -> last':>16}  bmt / it")
    for r in results if not pipelined else []:
        tflops = r["tokens_per_s"] * fpt / 1e12
        ratio = ""
        if r["recompute"] in bmt:
            ratio = f"{bmt[r['recompute']]['tokens_per_s'] / r['tokens_per_s']:.2f}"
        print(f"{r['name']:<15} {'on' if r['recompute'] else 'off':<9} "
              f"{r['tokens_per_s']:>9,.0f} {tflops:>8.1f} {r['peak_gib']:>8.1f} "
              f"{r['loss_first']:>7.3f} -> {r['loss_last']:.3f}  {ratio}")
    for r in results:
        if "host_syncs" in r and (r["name"], r["recompute"]) in mine:
            print(f"{r['name']} (recompute {'on' if r['recompute'] else 'off'}): host "
                  f"synchronisations "
                  f"inside steps 2-4 (BMT_DEBUG_SYNC=1): {r['host_syncs']}")
    for r in results:
        if r.get("profile") and (r["name"], r["recompute"]) in mine:
            print(f"\n--- {r['name']} (recompute {'on' if r['recompute'] else 'off'}) profile ---")
            print(r["profile"])


if __name__ == "__main__":
    main()
