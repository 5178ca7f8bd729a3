"""Compile a Llama-3-8B-shaped checkpoint without holding it in memory, and
measure it (bench/RESULTS.md, docs/hf-checkpoints.md).

Writes a Hugging Face checkpoint of Llama-3-8B's shape (hidden 4096, MLP
14336, 32 heads, 8 key/value heads, vocab 128256, untied head; --layers of
32) with random bf16 weights, as save_pretrained lays it out (config.json,
model-0000k-of-0000N.safetensors shards of about 2 GB, the index), one shard
in memory at a time; then, each with the checkpoint's pages dropped from the
page cache first (posix_fadvise DONTNEED), measures:

  read      cat FILES > /dev/null: reading the checkpoint once
  export    bmt-export-hf --checkpoint DIR -o model.pt (weight-free trace)
  compile   bmt-opt model.pt -o sharded.pt (streams the weights), then sync

and prints wall time, peak RSS (the process's ru_maxrss) and bytes read and
written of each. The free disk (df) must hold the checkpoint and sharded.pt
(about 2 x 16 GB for 32 layers): with less, the largest layer count that fits
is used, and the output says so. The checkpoint is kept in WORKDIR for the
next run (one folder per layer count); sharded.pt is removed unless --keep.
--in-memory also measures the path that loads the model (--load-weights),
for small --layers.

usage: python3 bench/stream_compile.py WORKDIR [--layers 32] [--bin-dir build/bin]
                                       [--dtype bfloat16|float32] [--keep] [--results FILE]
                                       [--in-memory]
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD_BYTES = 2 << 30
POOL = 1 << 26  # random values drawn once, read at random offsets


def llama3_8b(layers):
    import transformers
    return transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
        dtype="bfloat16", use_cache=False)


def state_dict_shapes(config):
    """(name, shape) of every tensor save_pretrained writes, in its order."""
    import torch
    import transformers
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return [(n, tuple(t.shape)) for n, t in model.state_dict().items()]


def checkpoint_bytes(layers):
    import math
    return sum(2 * math.prod(s) for _, s in state_dict_shapes(llama3_8b(layers)))


def make_checkpoint(directory, layers):
    """The checkpoint in `directory` (reused when its stamp says the same
    shape), written shard by shard and fsynced."""
    import torch
    from safetensors.torch import save_file
    stamp = os.path.join(directory, "bench-stamp.json")
    want = {"layers": layers, "format": 1}
    if os.path.exists(stamp) and json.load(open(stamp)) == want:
        return
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    config = llama3_8b(layers)
    config.save_pretrained(directory)
    shapes = state_dict_shapes(config)
    shards, current, size = [], [], 0
    for name, shape in shapes:
        n = 2 * int(torch.Size(shape).numel())
        if current and size + n > SHARD_BYTES:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += n
    shards.append(current)
    g = torch.Generator().manual_seed(0)
    pool = torch.randn(POOL, generator=g, dtype=torch.float32).mul_(0.02).to(torch.bfloat16)
    weight_map, total = {}, 0
    start = time.time()
    for k, shard in enumerate(shards):
        file = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            numel = int(torch.Size(shape).numel())
            if name.endswith("norm.weight"):
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                at = int(torch.randint(0, POOL, (1,), generator=g))
                flat = pool.roll(-at).repeat((numel + POOL - 1) // POOL)[:numel]
                tensors[name] = flat.view(shape)
            weight_map[name] = file
            total += 2 * numel
        path = os.path.join(directory, file)
        save_file(tensors, path, metadata={"format": "pt"})
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        del tensors
        print(f"  wrote {file} ({k + 1}/{len(shards)}, {time.time() - start:.0f} s)", flush=True)
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    json.dump(want, open(stamp, "w"))


def drop_from_page_cache(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


# Runs a command from a small process of its own, so that the peak RSS it
# reports is the command's: a child's ru_maxrss starts from its parent's
# resident size at fork (Linux keeps it across exec), and this script holds
# torch and the checkpoint generator's buffers.
LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execvp(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
open(sys.argv[1], "w").write(str(usage.ru_maxrss * 1024))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run(cmd, env=None, stdout=None):
    """(seconds, peak RSS bytes, stdout+stderr text) of one command."""
    import tempfile
    with tempfile.NamedTemporaryFile("r") as rss:
        start = time.time()
        r = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, rss.name, *map(str, cmd)],
                           stdout=stdout or subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                           text=True)
        seconds = time.time() - start
        if r.returncode != 0:
            sys.exit(f"error: {' '.join(map(str, cmd))} failed:\n{r.stdout}")
        return seconds, int(rss.read()), r.stdout or ""


def free_bytes(path):
    return shutil.disk_usage(path).free


def gib(n):
    return f"{n / 2**30:.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workdir")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--bin-dir", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--dtype", choices=["bfloat16", "float32"],
                    help="bmt-export-hf --dtype (default: the checkpoint's, bf16)")
    ap.add_argument("--keep", action="store_true", help="keep sharded.pt")
    ap.add_argument("--results", help="append the results as a markdown table row to FILE")
    ap.add_argument("--in-memory", action="store_true",
                    help="also measure the in-memory path (bmt-export-hf --load-weights, then "
                         "bmt-opt): needs about twice the checkpoint in memory")
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    ckpt_of = lambda n: os.path.join(args.workdir, f"llama3-8b-shape-{n}-layers")  # noqa: E731

    # Disk: the checkpoint (unless already there) and sharded.pt (its size,
    # twice for float32), plus 1 GiB.
    out_factor = 2 if args.dtype == "float32" else 1
    def existing(n):  # a checkpoint made before counts as space
        d = ckpt_of(n)
        if not os.path.exists(os.path.join(d, "bench-stamp.json")):
            return 0
        return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))

    layers = args.layers
    free = free_bytes(args.workdir)
    while layers > 1 and (1 + out_factor) * checkpoint_bytes(layers) + (1 << 30) > \
            free + existing(layers):
        layers -= 1
    free += existing(layers)
    ckpt = ckpt_of(layers)
    print(f"disk: {gib(free)} free for the checkpoint and sharded.pt (df {args.workdir})")
    if layers != args.layers:
        print(f"note: {args.layers} layers ({gib(checkpoint_bytes(args.layers))}) do not fit "
              f"twice; running the largest that fits, {layers} layers")
    print(f"checkpoint: Llama-3-8B shape, {layers} layers, bf16, {gib(checkpoint_bytes(layers))}")
    make_checkpoint(ckpt, layers)
    files = sorted(os.path.join(ckpt, f) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    size = sum(os.path.getsize(f) for f in files)

    import stat
    if not stat.S_ISCHR(os.stat(os.devnull).st_mode):
        sys.exit(f"error: {os.devnull} is not a device (a regular file replaced it?): "
                 f"cat > {os.devnull} would measure writing it")
    drop_from_page_cache(files)
    with open(os.devnull, "w") as null:
        t_read, rss_read, _ = run(["cat", *files], stdout=null)

    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    model = os.path.join(args.workdir, "model.pt")
    sharded = os.path.join(args.workdir, "sharded.pt")
    drop_from_page_cache(files)
    dtype = ["--dtype", args.dtype] if args.dtype else []
    t_export, rss_export, out_export = run(
        [sys.executable, "-m", "bmt.export_hf", "--checkpoint", ckpt, "-o", model, *dtype], env=env)
    drop_from_page_cache(files)
    t_compile, rss_compile, out_compile = run([os.path.join(args.bin_dir, "bmt-opt"), model,
                                               "-o", sharded])
    t_sync = time.time()
    subprocess.run(["sync"], check=True)
    t_sync = time.time() - t_sync
    m = re.search(r"read (\d+) bytes, wrote (\d+) bytes", out_compile)
    if not m:
        sys.exit(f"error: bmt-opt did not say what it streamed:\n{out_compile}")
    read, written = int(m.group(1)), int(m.group(2))
    largest = 128256 * 4096 * (4 if args.dtype == "float32" else 2)

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    total = t_export + t_compile + t_sync
    result = {
        "date": datetime.date.today().isoformat(), "cpu": cpu, "cores": os.cpu_count(),
        "memory": mem, "layers": layers, "checkpoint_bytes": size, "read_s": t_read,
        "export_s": t_export, "export_rss": rss_export, "compile_s": t_compile,
        "compile_rss": rss_compile, "sync_s": t_sync, "bytes_read": read,
        "bytes_written": written, "model_pt_bytes": os.path.getsize(model),
        "largest_tensor_bytes": largest, "ratio_to_read": total / t_read,
    }
    print(f"machine: {cpu}, {os.cpu_count()} cores, {gib(mem)}")
    print(f"read once (cat, cold):   {t_read:7.1f} s  {size} bytes, "
          f"{size / t_read / 1e6:.0f} MB/s")
    print(f"bmt-export-hf:           {t_export:7.1f} s  peak RSS {gib(rss_export)}, "
          f"model.pt {os.path.getsize(model)} bytes")
    print(f"bmt-opt (streaming):     {t_compile:7.1f} s  peak RSS {gib(rss_compile)}, "
          f"read {read} bytes, wrote {written} bytes (+ sync {t_sync:.1f} s)")
    print(f"export + compile + sync: {total:7.1f} s  = {total / t_read:.2f} x reading once; "
          f"RSS bound 2 GiB + largest tensor ({gib(largest)}) = {gib(2**31 + largest)}")
    print(json.dumps(result))
    if args.results:
        with open(args.results, "a") as f:
            f.write(f"| {result['date']} | {layers} | {gib(size)} | {t_read:.1f} s | "
                    f"{t_export:.1f} s, {gib(rss_export)} | {t_compile:.1f} s + sync "
                    f"{t_sync:.1f} s, {gib(rss_compile)} | {read} / {written} | "
                    f"{total / t_read:.2f}x |\n")
    if not args.keep:
        os.remove(sharded)
    if args.in_memory:
        loaded = os.path.join(args.workdir, "loaded.pt")
        drop_from_page_cache(files)
        t_load, rss_load, _ = run([sys.executable, "-m", "bmt.export_hf", "--checkpoint", ckpt,
                                   "--load-weights", "-o", loaded, *dtype], env=env)
        t_c, rss_c, _ = run([os.path.join(args.bin_dir, "bmt-opt"), loaded, "-o", sharded])
        print(f"in memory: bmt-export-hf --load-weights {t_load:.1f} s, peak RSS {gib(rss_load)}, "
              f"model.pt {os.path.getsize(loaded)} bytes; bmt-opt {t_c:.1f} s, peak RSS "
              f"{gib(rss_c)}")
        os.remove(loaded)
        if not args.keep:
            os.remove(sharded)


if __name__ == "__main__":
    main()
