#!/usr/bin/env python3
"""Checks the parameters and buffers of an imported model against the eager
model's own list (NAME.params.json, written by test/fixtures/make_fixtures.py
from transformers in Python, an independent reference).

usage: check_globals.py IMPORTED.mlir NAME.params.json

Every name in the reference must be a bmt.parameter / bmt.buffer symbol or
one of its aliases, with the same shape, dtype and requires_grad; names tied
in the reference must be one symbol here; and there must be no symbol the
reference does not have. Prints one line per mismatch and exits 1 if any.
"""
import json
import re
import sys

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
          "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "ui8": "uint8",
          "i1": "bool"}
GLOBAL = re.compile(r'^\s*bmt\.(parameter|buffer) @"?([^"\s]+)"? : tensor<([^>]*)>(?: \{(.*)\})?$')


def parse_tensor_type(text):
    parts = text.split("x")
    return [int(p) for p in parts[:-1]], DTYPES[parts[-1]]


def main(mlir_path, json_path):
    imported = {}  # name -> (kind, shape, dtype, requires_grad, canonical)
    for line in open(mlir_path):
        m = GLOBAL.match(line)
        if not m:
            continue
        kind, name, type_text, attrs = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        shape, dtype = parse_tensor_type(type_text)
        requires_grad = bool(re.search(r"\brequires_grad\b", attrs))
        imported[name] = (kind, shape, dtype, requires_grad, name)
        aliases = re.search(r"aliases = \[([^\]]*)\]", attrs)
        if aliases:
            for alias in re.findall(r'"([^"]+)"', aliases.group(1)):
                imported[alias] = (kind, shape, dtype, requires_grad, name)

    errors = []
    reference = json.load(open(json_path))
    canonical_of = {}
    for rec in reference:
        name = rec["name"]
        if name not in imported:
            errors.append(f"missing: {name}")
            continue
        kind, shape, dtype, requires_grad, canonical = imported[name]
        want = (rec["kind"], rec["shape"], rec["dtype"])
        if (kind, shape, dtype) != want:
            errors.append(f"{name}: imported {(kind, shape, dtype)}, reference {want}")
        if rec["kind"] == "parameter" and requires_grad != rec["requires_grad"]:
            errors.append(f"{name}: requires_grad {requires_grad}, reference {rec['requires_grad']}")
        root = rec["tied_to"] or name
        canonical_of.setdefault(root, canonical)
        if canonical_of[root] != canonical:
            errors.append(f"{name}: tied to {root} in the reference, but a separate symbol here")
    extra = set(imported) - {rec["name"] for rec in reference}
    errors += [f"not in the reference: {name}" for name in sorted(extra)]
    for e in errors:
        print(e)
    print(f"{len(reference)} names checked, {len(errors)} mismatches")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
