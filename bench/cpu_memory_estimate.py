"""bmt-opt's per-rank activation estimate (docs/passes/memory-estimate.md) against bmt-run's measured peak on CPU ranks under tensor
parallelism.

On the CPU bmt-run's peak_mem_gib is the process's peak resident set
(getrusage), which also holds LibTorch, the weights and the optimizer
state; those do not grow with the batch, so the script compares slopes:
the peak at micro-batch 8 minus the peak at micro-batch 2, over 6
sequences, against the same difference of the estimate (--checkpoint none,
so that every block keeps its activations). Three plans of random-weight
models, 2 layers, 256 wide, seq-len 512: GPT-2 at T = 2 with and without
--sequence-parallel, LLaMA with 8 query heads on 2 kv heads at T = 4 (k/v
replicated). Rank 0's peak; N = T.

    python bench/cpu_memory_estimate.py [--out DIR] [--bin-dir build/bin]
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_speed import find_binary, write_tokens  # noqa: E402 (bench/ is the script's folder)

SEQ = 512
CASES = [("gpt2", 2, False), ("gpt2", 2, True), ("llama", 4, False)]


def trace(name, out):
    import torch
    import transformers
    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(vocab_size=256, n_positions=1024, n_embd=256, n_layer=2,
                                         n_head=4, n_inner=1024, use_cache=False,
                                         attn_implementation="eager")
        model = transformers.GPT2LMHeadModel(config).eval()
    else:
        config = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512,
                                          num_hidden_layers=2, num_attention_heads=8,
                                          num_key_value_heads=2, max_position_embeddings=1024,
                                          tie_word_embeddings=False, use_cache=False,
                                          attn_implementation="eager")
        model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 256, (2, 16))
    pt = os.path.join(out, f"{name}.pt")
    torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids,
                                                 "attention_mask": torch.ones_like(ids)},
                    strict=False).save(pt)
    return pt


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="/tmp/bmt-memory-estimate")
    ap.add_argument("--bin-dir", default=None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    binary = {n: find_binary(n, args.bin_dir and os.path.join(args.bin_dir, n))
              for n in ("bmt-opt", "bmt-run")}
    data = write_tokens(os.path.join(args.out, "tokens"), 256, 400_000)
    for name, tp, sp in CASES:
        pt = trace(name, args.out)
        plan = os.path.join(args.out, f"{name}-t{tp}{'-sp' if sp else ''}.pt")
        got = {}
        for mb in (2, 8):
            c = subprocess.run([binary["bmt-opt"], pt, "-o", plan, "--world-size", str(tp),
                                "--tensor-parallel", str(tp), "--checkpoint", "none",
                                "--micro-batch", str(mb), "--seq-len", str(SEQ),
                                *(["--sequence-parallel"] if sp else [])],
                               capture_output=True, text=True)
            assert c.returncode == 0, c.stderr
            estimate = int(re.search(r"activations: .*?\((\d+) bytes", c.stderr).group(1))
            log = os.path.join(args.out, "log.jsonl")
            r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                f"--nproc_per_node={tp}", "--no-python", binary["bmt-run"], plan,
                                "--data", data, "--seq-len", str(SEQ), "--micro-batch", str(mb),
                                "--steps", "3", "--log-file", log, "--device", "cpu"],
                               capture_output=True, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            assert r.returncode == 0, r.stderr[-2000:]
            peak = max(json.loads(x)["peak_mem_gib"] for x in open(log) if '"train"' in x)
            got[mb] = (estimate, peak * 2**30)
        estimate = (got[8][0] - got[2][0]) / 6 / 2**20
        measured = (got[8][1] - got[2][1]) / 6 / 2**20
        print(f"{name} T = {tp}{' sequence-parallel' if sp else ''}: a sequence of {SEQ} tokens "
              f"adds {estimate:.1f} MiB to the estimate, {measured:.1f} MiB to the measured peak "
              f"(ratio {measured / estimate:.2f})", flush=True)


if __name__ == "__main__":
    main()
