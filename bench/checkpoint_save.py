#!/usr/bin/env python3
"""What a checkpoint costs a training run on one GPU: bmt-run's background
save against PyTorch DCP's async_save of an FSDP2 model, in one call.

usage: python3 bench/checkpoint_save.py [--build] [--archives DIR | --bmt-opt BIN]
           [--steps 100] [--every 45] [--out DIR] [--only bmt dcp]

The model is bench/gpu_speed.py's: GPT-2 1.31 B, bf16 with float32 master
weights, micro-batch 8 x 1024, every block recomputed, AdamW, one GPU.

bmt: `bmt-run … --checkpoint-dir D --checkpoint-every EVERY` (plus the save
after the last step). A save snapshots the rank's shards (bf16 parameters,
float32 masters, both AdamW moments: 14 bytes a parameter) into pinned host
memory on a side stream and writes them from a thread while training goes
on. Reported: the step time of the step after each save minus the median
step time (the time the save added), the host time it held training (its
JSON record's held_s), the bytes written and the background write's
seconds. Then a resumed run from the first checkpoint must give the
uninterrupted run's losses to the bit (the CUDA path of the snapshot).

dcp: the same model under FSDP2 (fully_shard per block and at the root,
MixedPrecisionPolicy bf16/float32, one rank), torch.distributed.checkpoint
.async_save of get_state_dict(model, optimizer) after the same steps (its
staging into host memory is what the call blocks for; the write runs in a
thread); reported the same way.

Prints one line per save and a JSON summary (RESULT ...).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import gpu_speed  # noqa: E402  (the model and the helpers)

MICRO_BATCH, SEQ = gpu_speed.MICRO_BATCH, gpu_speed.SEQ


def folder_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def added_times(step_seconds, save_steps, skip=3):
    """Per save after step s: the time of steps s and s + 1 minus twice the
    median step time of the steps next to no save (after the first `skip`).
    Step times are the intervals between consecutive step ends, so the
    save's work lands in one of the two, wherever the loop does it."""
    near = set(save_steps) | {s + 1 for s in save_steps}
    median = statistics.median(t for s, t in step_seconds.items() if s > skip and s not in near)
    return median, {s: step_seconds[s] + step_seconds[s + 1] - 2 * median
                    for s in save_steps if s + 1 in step_seconds}


def run_bmt(args, bmt_run, archive, data, out):
    ck = os.path.join(out, "bmt-ck")
    subprocess.run(["rm", "-rf", ck])
    log = os.path.join(out, "bmt-ck.jsonl")
    common = [bmt_run, archive, "--data", data, "--steps", str(args.steps), "--micro-batch",
              str(MICRO_BATCH), "--seq-len", str(SEQ), "--lr", "1e-4", "--schedule", "constant",
              "--clip-grad", "1.0", "--device", "cuda", "--log-every", "10",
              "--checkpoint-dir", ck, "--checkpoint-every", str(args.every), "--keep", "2"]
    t0 = time.time()
    r = subprocess.run(common + ["--log-file", log], capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        return None
    records = [json.loads(x) for x in open(log)]
    train = {x["step"]: x["tokens"] / x["tokens_per_s"] for x in records if x["kind"] == "train"}
    saves = [x for x in records if x["kind"] == "checkpoint"]
    for line in r.stdout.splitlines():
        if line.startswith("checkpoint"):
            print("  bmt: " + line, flush=True)
    median, added = added_times(train, {x["step"] for x in saves})
    first = os.path.join(ck, f"step-{args.every:08d}")
    result = {"name": "bmt", "median_step_s": median, "wall_s": wall,
              "saves": [{"step": x["step"], "ok": x["ok"], "bytes": x["bytes"],
                         "write_s": x["write_s"], "held_s": x["held_s"],
                         "added_s": added.get(x["step"])} for x in saves]}
    # Resume from the newest checkpoint but one and compare the losses.
    complete = sorted(d for d in os.listdir(ck) if d.startswith("step-") and "." not in d)
    if len(complete) >= 2:
        resume_log = os.path.join(out, "bmt-resumed.jsonl")
        plain = common[:common.index("--checkpoint-dir")]
        r2 = subprocess.run(plain + ["--resume", os.path.join(ck, complete[0]), "--log-file",
                                     resume_log],
                            capture_output=True, text=True)
        if r2.returncode != 0:
            print(r2.stdout[-3000:], r2.stderr[-3000:])
            result["resume"] = "failed"
        else:
            again = {x["step"]: x["loss"] for x in map(json.loads, open(resume_log))
                     if x["kind"] == "train"}
            want = {x["step"]: x["loss"] for x in records if x["kind"] == "train"}
            same = all(again[s] == want[s] for s in again)
            result["resume"] = (f"{len(again)} steps from {complete[0]}: losses "
                                f"{'bit-identical' if same else 'DIFFER'}")
        print(f"  bmt: resume {result['resume']}", flush=True)
    result["checkpoint_bytes"] = folder_bytes(first) if os.path.isdir(first) else None
    subprocess.run(["rm", "-rf", ck])
    return result


def reference(args):
    """FSDP2 + DCP async_save, in its own process."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import transformers
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29519")
    torch.cuda.set_device(0)
    dist.init_process_group("cuda:nccl,cpu:gloo", rank=0, world_size=1)
    device = torch.device("cuda")
    torch.manual_seed(0)
    with device:
        model = transformers.GPT2LMHeadModel(gpu_speed.model_config(args))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    g = torch.Generator(device=device).manual_seed(1)
    ck = os.path.join(args.out, "dcp-ck")
    subprocess.run(["rm", "-rf", ck])
    times, saves, future = {}, [], None
    torch.cuda.synchronize()
    last = time.perf_counter()
    for step in range(1, args.steps + 1):
        w = torch.randint(0, args.vocab, (MICRO_BATCH, SEQ + 1), device=device, generator=g)
        logits = model(input_ids=w[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                                                 w[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        now = time.perf_counter()
        times[step], last = now - last, now
        if step % args.every == 0 or step == args.steps:
            h0 = time.perf_counter()
            if future is not None:
                future.result()
                saves[-1]["bytes"] = folder_bytes(saves[-1]["path"])
                r0 = time.perf_counter()
                subprocess.run(["rm", "-rf", saves[-1]["path"]])  # the disk holds two at most
                removed = time.perf_counter() - r0
                h0 += removed  # (not the save's time, nor the next step's)
                last += removed
            msd, osd = get_state_dict(model, opt)
            path = os.path.join(ck, f"step-{step:08d}")
            future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=path)
            saves.append({"step": step, "held_s": time.perf_counter() - h0, "path": path,
                          "started": h0})
    future.result()
    last_write = time.perf_counter() - saves[-1]["started"]
    saves[-1]["bytes"] = folder_bytes(saves[-1]["path"])
    subprocess.run(["rm", "-rf", ck])
    median, added = added_times(times, {s["step"] for s in saves})
    result = {"name": "dcp", "median_step_s": median,
              "saves": [{"step": s["step"], "held_s": s["held_s"], "added_s": added.get(s["step"]),
                         "bytes": s["bytes"]} for s in saves],
              "last_write_s": last_write}
    for s in result["saves"]:
        print(f"  dcp: async_save step {s['step']}: held {s['held_s']:.3f} s, added "
              f"{s['added_s'] if s['added_s'] is None else round(s['added_s'], 3)} s, "
              f"{s['bytes']} bytes", flush=True)
    print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--bmt-opt")
    ap.add_argument("--archives", help="folder with gpu_speed.py's plans made elsewhere")
    ap.add_argument("--out", default="/tmp/bmt-ck-bench")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=45)
    ap.add_argument("--only", nargs="+", default=["bmt", "dcp"])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--reference", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.reference:
        return reference(args)
    results = []
    if "bmt" in args.only:
        if args.build:
            gpu_speed.build_runtime()
        bmt_run = gpu_speed.find_binary("bmt-run")
        args.recompute = ["on"]
        archive = gpu_speed.make_archives(args, args.out)["on"]
        data = gpu_speed.write_tokens(os.path.join(args.out, "tokens"), args.vocab, 4_000_000)
        results.append(run_bmt(args, bmt_run, archive, data, args.out))
    if "dcp" in args.only:
        cmd = [sys.executable, os.path.abspath(__file__), "--reference", "--steps",
               str(args.steps), "--every", str(args.every), "--out", args.out,
               "--layers", str(args.layers), "--hidden", str(args.hidden), "--heads",
               str(args.heads), "--vocab", str(args.vocab)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        lines = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        print("\n".join(x for x in r.stdout.splitlines() if not x.startswith("RESULT ")))
        if r.returncode != 0 or not lines:
            print(r.stderr[-3000:])
        else:
            results.append(json.loads(lines[-1][len("RESULT "):]))
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
