#!/usr/bin/env python3
"""Checks that two imports of one model (TorchScript .pt and torch.export
.pt2) are equivalent programs for the parts that must agree, so that the
passes (block detection, ZeRO grouping) see the same structure from either.

usage: compare_programs.py A.mlir B.mlir

"Equivalent" means:
  * globals: the same bmt.parameter / bmt.buffer symbols (kind, name, tensor
    type, requires_grad) with the same aliases (ties);
  * functions: the same set of function symbols, each with the same
    bmt.module_path and bmt.module_type, and the root `forward` with the same
    argument and result bmt.names;
  * calls: in every function, the same sequence of callees (func.call
    targets, in program order).
Not compared (expected to differ): the ATen ops inside the functions
(torch.export records aten::linear where a trace records aten::addmm, fills
in other overloads, and drops or adds views), SSA value names, the argument
and result lists of non-root functions (a trace passes what Python passed; an
export passes the tensors that cross the module boundary), the `persistent`
flag of buffers (TorchScript does not record it), and locations.
Prints one line per difference and exits 1 if any.
"""
import re
import sys

GLOBAL = re.compile(r'^\s*bmt\.(parameter|buffer) @"?([^"\s]+)"? : (tensor<[^>]*>)(?: \{(.*)\})?$')
FUNC = re.compile(r'^\s*func\.func (?:private )?@"?([^"(\s]+)"?\((.*)$')
CALL = re.compile(r'\bcall @"?([^"(\s]+)"?\(')


def parse(path):
    globals_, funcs, order = {}, {}, []
    current = None
    for line in open(path):
        m = GLOBAL.match(line)
        if m:
            kind, name, ty, attrs = m.groups()
            attrs = attrs or ""
            aliases = re.search(r"aliases = \[([^\]]*)\]", attrs)
            globals_[name] = (kind, ty, bool(re.search(r"\brequires_grad\b", attrs)),
                              tuple(re.findall(r'"([^"]+)"', aliases.group(1))) if aliases else ())
            continue
        m = FUNC.match(line)
        if m:
            name, rest = m.groups()
            path_ = re.search(r'bmt\.module_path = "([^"]*)"', rest)
            type_ = re.search(r'bmt\.module_type = "([^"]*)"', rest)
            sig = rest.split(" attributes ")[0]
            args_part, _, results_part = sig.partition(") -> ")
            current = {
                "path": path_.group(1) if path_ else None,
                "type": type_.group(1) if type_ else None,
                "arg_names": re.findall(r'bmt\.name = "([^"]*)"', args_part),
                "result_names": re.findall(r'bmt\.name = "([^"]*)"', results_part),
                "calls": [],
            }
            funcs[name] = current
            order.append(name)
            continue
        if current is not None:
            for callee in CALL.findall(line):
                current["calls"].append(callee)
    return globals_, funcs


def main(a_path, b_path):
    ga, fa = parse(a_path)
    gb, fb = parse(b_path)
    errors = []
    for name in sorted(set(ga) | set(gb)):
        if name not in ga or name not in gb:
            errors.append(f"global @{name} only in {a_path if name in ga else b_path}")
        elif ga[name] != gb[name]:
            errors.append(f"global @{name}: {ga[name]} vs {gb[name]}")
    for name in sorted(set(fa) | set(fb)):
        if name not in fa or name not in fb:
            errors.append(f"function @{name} only in {a_path if name in fa else b_path}")
            continue
        x, y = fa[name], fb[name]
        for key in ("path", "type", "calls"):
            if x[key] != y[key]:
                errors.append(f"function @{name}: {key} {x[key]} vs {y[key]}")
        if name == "forward":
            for key in ("arg_names", "result_names"):
                if x[key] != y[key]:
                    errors.append(f"function @forward: {key} {x[key]} vs {y[key]}")
    for e in errors:
        print(e)
    print(f"{len(ga)} globals, {len(fa)} functions compared, {len(errors)} differences")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
