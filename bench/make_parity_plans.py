#!/usr/bin/env python3
"""The plans bench/gpu_parity.py checks, for every architecture, fp32 and bf16.

usage: python3 bench/make_parity_plans.py OUT [NAME ...] [--bin build/bin] [--plain]
                                              [--jobs N]

For each NAME (default: all 14 architectures of docs/architectures.md, by
the short names of scripts/architectures.py: gpt2, llama, llama_tied,
mistral, qwen2, gemma, bert, opt, bloom, gpt_neox, falcon, phi, gptj, t5)
builds the tiny model exactly as gpu_parity.py's eager reference does
(scripts/architectures.py ARCHS config, seed 0: gpu_parity.build), in float32
and converted to bfloat16, saves it as a user does at the batch gpu_parity.py
runs (3 x 12 tokens; T5 also a 3 x 7 decoder input) and compiles it with
bmt-opt:

    OUT/models/NAME.pt, NAME-bf16.pt    torch.jit.trace(model, example_kwarg_inputs=...,
                                        strict=False) + save
    OUT/models/bloom.pt2, bloom-bf16.pt2  torch.export.export(..., strict=False) + save
                                        (torch.jit.trace cannot record BLOOM's
                                        GeLUFunction, docs/architectures.md)
    OUT/tiny-fused/NAME.sharded.pt      bmt-opt MODEL -o ... (the default pipeline,
    OUT/tiny-fused-bf16/NAME.sharded.pt which fuses elementwise regions)
    OUT/tiny-plain/NAME.sharded.pt      with --plain: bmt-opt --fuse-elementwise=false
    OUT/tiny-plain-bf16/NAME.sharded.pt

Everything is deterministic (seed 0, fixed example inputs): a second run
writes the same weights and programs, the archives differing only in the
source path they record and the zip's random serialization id. The weights
are in the archives, so the GPU machine (which has no MLIR) needs only the
tiny-*/ folders (11 MiB for the four) and a checkout: gpu_parity.py rebuilds
the same eager models there from the same configs and seed and checks them
against each archive's weights (the plan's CRC-32s) before comparing.
bench/gpu_fusion.sh PLANS expects this layout. --jobs: bmt-opt processes at
a time (default: the number of CPUs). About 30 s for all 14 on 2 cores,
fused and plain.
"""
import argparse
import concurrent.futures
import os
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
import gpu_parity  # noqa: E402

# Saved with torch.export: torch.jit.trace fails on them.
EXPORTED = {"bloom"}


def save_model(model, ids, labels, path_stem, name):
    """The model saved at the parity batch's shapes; returns the path."""
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if getattr(model.config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = gpu_parity.decoder_inputs(labels)
    if name in EXPORTED:
        path = path_stem + ".pt2"
        ep = torch.export.export(model, args=(), kwargs=inputs, strict=False)
        torch.export.save(ep, path)
    else:
        path = path_stem + ".pt"
        with torch.no_grad():
            traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
        traced.save(path)
    return path


def compile_plan(bmt_opt, model_path, sharded, extra):
    r = subprocess.run([bmt_opt, model_path, "-o", sharded, *extra], capture_output=True,
                       text=True)
    if r.returncode != 0:
        return f"{sharded}: bmt-opt failed: {(r.stdout + r.stderr).strip()[-2000:]}"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("names", nargs="*", help=f"default: all ({', '.join(gpu_parity.NAMES)})")
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--plain", action="store_true",
                    help="also the --fuse-elementwise=false plans (tiny-plain*/)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    names = args.names or gpu_parity.NAMES
    unknown = [n for n in names if n not in gpu_parity.NAMES]
    if unknown:
        ap.error(f"unknown architecture(s) {', '.join(unknown)} "
                 f"(known: {', '.join(gpu_parity.NAMES)})")
    bmt_opt = os.path.join(args.bin, "bmt-opt")
    if not os.access(bmt_opt, os.X_OK):
        ap.error(f"no bmt-opt at {bmt_opt} (--bin)")
    gpu_parity.quiet()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    variants = [("tiny-fused", [])] + ([("tiny-plain", ["--fuse-elementwise=false"])]
                                       if args.plain else [])
    os.makedirs(os.path.join(args.out, "models"), exist_ok=True)
    for v, _ in variants:
        for suffix in ("", "-bf16"):
            os.makedirs(os.path.join(args.out, v + suffix), exist_ok=True)
    t0 = time.monotonic()
    errors = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        jobs = []
        for name in names:
            for dtype, suffix in ((torch.float32, ""), (torch.bfloat16, "-bf16")):
                model, ids, labels = gpu_parity.build(name, "cpu")
                model = model.to(dtype)
                stem = os.path.join(args.out, "models", name + suffix)
                path = save_model(model, ids, labels, stem, name)
                for v, extra in variants:
                    sharded = os.path.join(args.out, v + suffix, name + ".sharded.pt")
                    jobs.append(pool.submit(compile_plan, bmt_opt, path, sharded, extra))
            print(f"{name}: saved fp32 and bf16 ({time.monotonic() - t0:.0f} s)", flush=True)
        errors = [e for e in (j.result() for j in jobs) if e]
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{len(jobs) - len(errors)} of {len(jobs)} plans in "
          f"{', '.join(v + s + '/' for v, _ in variants for s in ('', '-bf16'))} of {args.out} "
          f"({time.monotonic() - t0:.0f} s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
