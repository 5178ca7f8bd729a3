#!/usr/bin/env python3
"""Random token ids as a bmt token file, for the GPU benchmarks.

usage: python3 bench/random_tokens.py OUT.bin NUM_TOKENS HIGH [--vocab-size V]

Writes NUM_TOKENS uint32 ids drawn uniformly from [0, HIGH) by numpy's
default_rng(0) to OUT.bin and their metadata (docs/token-files.md, version 1:
one document, eos id 0) to OUT.json beside it;
--vocab-size is the metadata's vocabulary size (default HIGH). The same
arguments give the same bytes.
"""
import argparse
import json

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the .bin file (the .json is written beside it)")
    ap.add_argument("num_tokens", type=int)
    ap.add_argument("high", type=int, help="ids are drawn from [0, HIGH)")
    ap.add_argument("--vocab-size", type=int, help="the metadata's vocab_size (default: HIGH)")
    args = ap.parse_args()
    if not args.out.endswith(".bin") or args.num_tokens <= 0 or args.high <= 0:
        raise SystemExit("random_tokens.py: OUT must end in .bin, NUM_TOKENS and HIGH be positive")
    np.random.default_rng(0).integers(0, args.high, args.num_tokens, dtype=np.uint32).tofile(args.out)
    meta = {"format": "bmt-tokens", "version": 1, "dtype": "uint32", "num_tokens": args.num_tokens,
            "num_documents": 1, "vocab_size": args.vocab_size or args.high, "eos_id": 0,
            "mask_id": None, "pad_id": None, "tokenizer": "random", "source": []}
    with open(args.out[:-4] + ".json", "w") as f:
        json.dump(meta, f)


if __name__ == "__main__":
    main()
