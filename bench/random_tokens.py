#!/usr/bin/env python3
"""Random token ids as a bmt token file, for the GPU benchmarks.

usage: python3 bench/random_tokens.py OUT.bin NUM_TOKENS HIGH [--vocab-size V]

Writes NUM_TOKENS uint32 ids drawn uniformly from [0, HIGH) by numpy's
default_rng(0) to OUT.bin and their metadata (docs/token-files.md, version 1:
one document, eos id 0) to OUT.json beside it; --vocab-size is the
metadata's vocabulary size (default HIGH, at least HIGH). The same
arguments give the same bytes. Both files are written under temporary
names and renamed into place, the .json last, so a failed run leaves
neither a partial file nor a .bin without its .json. A bad argument or an
unwritable path is one error line and exit status 1.
"""
import argparse
import json
import os
import sys

import numpy as np

MAX_TOKENS = 1 << 34  # 64 GiB of uint32: far beyond any benchmark's data


def fail(message):
    print(f"random_tokens.py: error: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the .bin file (the .json is written beside it)")
    ap.add_argument("num_tokens", type=int)
    ap.add_argument("high", type=int, help="ids are drawn from [0, HIGH)")
    ap.add_argument("--vocab-size", type=int, help="the metadata's vocab_size (default: HIGH)")
    args = ap.parse_args()
    name = os.path.basename(args.out)
    if not name.endswith(".bin") or name == ".bin":
        fail(f"OUT must be a file name ending in .bin, not '{args.out}'")
    if not 0 < args.num_tokens <= MAX_TOKENS:
        fail(f"NUM_TOKENS must be in [1, {MAX_TOKENS}], not {args.num_tokens}")
    if not 0 < args.high <= 1 << 32:
        fail(f"HIGH must be in [1, 2^32] (uint32 ids), not {args.high}")
    vocab = args.high if args.vocab_size is None else args.vocab_size
    if vocab < args.high:
        fail(f"--vocab-size {vocab} is below HIGH {args.high}: ids would lie outside the vocabulary")
    meta_path = args.out[:-4] + ".json"
    meta = {"format": "bmt-tokens", "version": 1, "dtype": "uint32", "num_tokens": args.num_tokens,
            "num_documents": 1, "vocab_size": vocab, "eos_id": 0, "mask_id": None, "pad_id": None,
            "tokenizer": "random", "source": []}
    for path in (args.out, meta_path):
        if os.path.isdir(path):
            fail(f"{path} is a folder")
    tmp_bin, tmp_meta = args.out + ".tmp", meta_path + ".tmp"
    written = []
    try:
        ids = np.random.default_rng(0).integers(0, args.high, args.num_tokens, dtype=np.uint32)
        ids.tofile(tmp_bin)
        with open(tmp_meta, "w") as f:
            json.dump(meta, f)
        for tmp, path in ((tmp_bin, args.out), (tmp_meta, meta_path)):
            os.replace(tmp, path)
            written.append(path)
    except (OSError, MemoryError) as e:
        for t in [tmp_bin, tmp_meta] + written:
            if os.path.isfile(t):
                os.remove(t)
        fail(f"cannot write {args.out} and {meta_path}: {e}")


if __name__ == "__main__":
    main()
