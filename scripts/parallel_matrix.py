#!/usr/bin/env python3
"""Every architecture of scripts/architectures.py in every parallel mode.

usage: scripts/parallel_matrix.py [--bin build/bin] [--only NAME ...]
                                  [--modes MODE ...] [--blocks B] [--write-docs]
                                  [--device cuda]

For each architecture (its tiny config, seed 0): trace it once (BLOOM, which
torch.jit.trace cannot record, is exported once with a dynamic batch and
sequence), then for each mode of MODES compile it with bmt-opt and the
mode's flags, train STEPS AdamW steps with bmt-run on CPU ranks under
torchrun, and compare every step's loss and the final gathered parameters
with eager transformers + torch.optim.AdamW on the same weights and batches
(test/python/numerics.py's bounds: losses within 32 ulps, parameters by
assert_trained_close). Causal LMs and the masked-LM encoders train with
--objective causal-lm on --batches windows (an encoder predicting the next
token: the same forward, backward and optimizer, with a loss eager computes
without drawing masks); encoder-decoders on --batches source/target pairs
(teacher forcing).

A cell is `ok (loss d, params d)`, `refused (n)` (bmt-opt exited 1 with one
`error:` line, listed below the table) or **FAILURE** (a mismatch, a crash,
a failed run or a hang past the timeout). --write-docs puts the table into
docs/architectures.md between its parallel-matrix markers.

--device cuda runs bmt-run's ranks on GPUs (rank r on GPU r: NCCL) and the
eager reference on GPU 0, both in float32: the multi-GPU parity check (the
GPU machine needs a bmt-opt: the portable build of docs/status.md).
--device cuda-shared puts every rank on GPU 0, their collectives through
host memory (BMT_DEBUG_COMM=host; NCCL refuses two ranks on one GPU): the
GPU compute of every parallel mode checked on a one-GPU machine.

test/python/models/test_architectures_parallel.py runs every architecture at
tp2-n4 (T = 2 with ZeRO-3 over 2 data-parallel ranks), and at zero3-n2 where
T = 2 is refused or known wrong, through the functions here.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "test", "python"))
for _area in ("runtime", "models", "passes", "import", "tools"):  # as test/python/conftest.py
    sys.path.insert(0, os.path.join(REPO, "test", "python", _area))
sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))

import architectures  # noqa: E402

STEPS = 5
GLOBAL_BATCH = 12  # rows a step, divisible by every mode's data-parallel ranks
SEQ = 8            # tokens a row (even: sequence parallelism splits it over T = 2)
TARGET = 5         # an encoder-decoder's target length
DEVICE = "cpu"     # where bmt-run's ranks and the eager reference run (--device)
TIMEOUT_S = 300    # a cell's torchrun; BMT_COMM_TIMEOUT_S (120) ends a stuck collective first
TRAIN_FLAGS = ["--lr", "1e-3", "--schedule", "cosine", "--warmup", "2", "--clip-grad", "0.5",
               "--weight-decay", "0.01"]
CLIP, WEIGHT_DECAY = 0.5, 0.01

MODES = {
    # name: (ranks, bmt-opt flags); bmt-opt recomputes every block by default
    "zero3-n1": (1, []),
    "zero3-n2": (2, []),
    "zero3-n3": (3, []),
    "zero3-n2-no-recompute": (2, ["--checkpoint", "none"]),
    "zero2-n2": (2, ["--zero-stage", "2"]),
    "hybrid-g2-n4": (4, ["--shard-group-size", "2"]),
    "tp2-n2": (2, ["--tensor-parallel", "2"]),
    "tp2-n2-no-recompute": (2, ["--tensor-parallel", "2", "--checkpoint", "none"]),
    "tp2-sp-n2": (2, ["--tensor-parallel", "2", "--sequence-parallel"]),
    # T = 2 and ZeRO-3 over the 2 data-parallel ranks in one run
    "tp2-n4": (4, ["--tensor-parallel", "2"]),
    # expert parallelism (mixtures of experts only): groups of E ranks, ZeRO-3 over all
    "ep2-n2": (2, ["--expert-parallel", "2"]),
    "ep2-n4-no-recompute": (4, ["--expert-parallel", "2", "--checkpoint", "none"]),
    "ep4-n4": (4, ["--expert-parallel", "4"]),
    # T = 2 with expert groups of E = 2 among the 2 data-parallel ranks of each TP rank
    "tp2-ep2-n4": (4, ["--tensor-parallel", "2", "--expert-parallel", "2"]),
    "tp2-ep2-n4-no-recompute": (4, ["--tensor-parallel", "2", "--expert-parallel", "2",
                                    "--checkpoint", "none"]),
    # pipeline stages (M = P micro-batches a step); with T = 2: P x T x D = 2 x 2 x 1
    "pp2-n2": (2, ["--pipeline-parallel", "2"]),
    "pp2-tp2-n4": (4, ["--pipeline-parallel", "2", "--tensor-parallel", "2"]),
    "pp2-tp2-n4-no-recompute": (4, ["--pipeline-parallel", "2", "--tensor-parallel", "2",
                                    "--checkpoint", "none"]),
    "pp2-tp2-sp-n4": (4, ["--pipeline-parallel", "2", "--tensor-parallel", "2",
                          "--sequence-parallel"]),
    # ZeRO-3 over each stage's D = 2 ranks
    "pp2-n4": (4, ["--pipeline-parallel", "2"]),
    "pp2-n4-no-recompute": (4, ["--pipeline-parallel", "2", "--checkpoint", "none"]),
    # the modes below cut into 4 parts: prepare(..., blocks=4) for the 2-layer configs
    "pp4-n4": (4, ["--pipeline-parallel", "4"]),
    "pp4-n4-no-recompute": (4, ["--pipeline-parallel", "4", "--checkpoint", "none"]),
    # interleaved 1F1B: V = 2 chunks a stage (M = P micro-batches, a multiple of P)
    "pp2-v2-n4": (4, ["--pipeline-parallel", "2", "--virtual-stages", "2"]),
    "pp2-v2-n4-no-recompute": (4, ["--pipeline-parallel", "2", "--virtual-stages", "2",
                                   "--checkpoint", "none"]),
    "pp2-v2-tp2-n4": (4, ["--pipeline-parallel", "2", "--virtual-stages", "2",
                          "--tensor-parallel", "2"]),
    "pp2-v2-tp2-n4-no-recompute": (4, ["--pipeline-parallel", "2", "--virtual-stages", "2",
                                       "--tensor-parallel", "2", "--checkpoint", "none"]),
    "pp2-v2-tp2-sp-n4": (4, ["--pipeline-parallel", "2", "--virtual-stages", "2",
                             "--tensor-parallel", "2", "--sequence-parallel"]),
}


def is_seq2seq(name):
    return architectures.ARCHS[name][1] in architectures.SEQ2SEQ


def eager_device():
    """Where the eager reference runs: GPU 0 for the cuda devices."""
    return "cpu" if DEVICE == "cpu" else "cuda:0"


def prepare(name, tmp, blocks=None):
    """Exports `name` once (with `blocks` layers instead of its config's,
    for P x V > 2) and draws its batches: a dict with the archive, the
    batches file and what eager_reference needs."""
    import torch
    tmp = str(tmp)
    model = architectures.build(name, blocks)
    g = torch.Generator().manual_seed(1)
    inputs = {"input_ids": torch.randint(0, architectures.VOCAB, (2, SEQ), generator=g),
              "attention_mask": torch.ones(2, SEQ, dtype=torch.long)}
    g = torch.Generator().manual_seed(3)
    prep = {"name": name, "tmp": tmp, "eager": None, "blocks": blocks}
    if is_seq2seq(name):
        inputs["decoder_input_ids"] = torch.randint(0, architectures.VOCAB, (2, TARGET), generator=g)
        ids = torch.randint(0, architectures.VOCAB, (STEPS, GLOBAL_BATCH, SEQ), generator=g)
        labels = torch.randint(0, architectures.VOCAB, (STEPS, GLOBAL_BATCH, TARGET), generator=g)
        prep.update(ids=ids, labels=labels)
        torch.save({"input_ids": ids, "labels": labels}, os.path.join(tmp, "batches.pt"))
    else:
        batches = torch.randint(0, architectures.VOCAB, (STEPS, GLOBAL_BATCH, SEQ + 1), generator=g)
        prep["batches"] = batches
        torch.save(batches, os.path.join(tmp, "batches.pt"))
    stem = re.sub(r"\W+", "_", name).strip("_")
    try:
        with torch.no_grad():
            traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
        prep["archive"] = os.path.join(tmp, stem + ".pt")
        traced.save(prep["archive"])
    except Exception:  # noqa: BLE001  (BLOOM's GeLUFunction): the dynamic export
        ep, _ = architectures.export_dynamic(model, inputs)
        prep["archive"] = os.path.join(tmp, stem + "-dyn.pt2")
        torch.export.save(ep, prep["archive"])
    return prep


def eager_reference(prep, lrs):
    """Losses and final parameters of eager transformers + torch.optim.AdamW
    on the global batches (computed once per architecture)."""
    if prep["eager"] is None:
        from test_runtime_parity import eager_training
        from test_seq2seq import eager_pairs_training
        model = architectures.build(prep["name"], prep.get("blocks")).to(eager_device())  # fresh
        if is_seq2seq(prep["name"]):
            losses = eager_pairs_training(model, prep["ids"].to(eager_device()),
                                          prep["labels"].to(eager_device()), STEPS, 1, lrs, CLIP)
        else:
            losses = eager_training(model, prep["batches"].to(eager_device()), STEPS, 1,
                                    lambda s: lrs[s], CLIP, WEIGHT_DECAY)
        params = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
        prep["eager"] = (losses, params)
    return prep["eager"]


def error_lines(text):
    return [l[l.index("error:"):].strip() for l in text.splitlines() if "error:" in l]


def compile_cell(prep, mode, bindir):
    """bmt-opt for `mode`: ("compiled", sharded path), ("refused", the error
    line) or ("FAILURE", what happened)."""
    ranks, flags = MODES[mode]
    sharded = os.path.join(prep["tmp"], f"{mode}.sharded.pt")
    try:
        r = subprocess.run([os.path.join(bindir, "bmt-opt"), prep["archive"], "-o", sharded,
                            "--world-size", str(ranks), *flags],
                           capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return "FAILURE", f"bmt-opt hangs (past {TIMEOUT_S} s)"
    if r.returncode == 0:
        return "compiled", sharded
    errors = error_lines(r.stderr)
    if r.returncode == 1 and len(errors) == 1 and not os.path.exists(sharded):
        return "refused", errors[0]
    if r.returncode < 0:
        return "FAILURE", f"bmt-opt crashes (signal {-r.returncode})" + \
            (f": {errors[0]}" if errors else "")
    line = errors[0] if errors else architectures.first_line(r.stderr)
    return "FAILURE", f"bmt-opt exit {r.returncode} with {len(errors)} error lines: {line}"


def run_cell(prep, mode, bindir):
    """Compiles, trains and compares one cell: (status, text), status one of
    "ok", "refused", "FAILURE"."""
    from numerics import assert_loss_close, assert_trained_close
    from safetensors.torch import load_file
    from test_zero_multirank import torchrun
    status, what = compile_cell(prep, mode, bindir)
    if status != "compiled":
        return status, what
    ranks, _ = MODES[mode]
    log = os.path.join(prep["tmp"], f"{mode}.jsonl")
    saved = os.path.join(prep["tmp"], f"{mode}.safetensors")
    objective = [] if is_seq2seq(prep["name"]) else ["--objective", "causal-lm"]
    try:
        r = torchrun(ranks, what, "--batches", os.path.join(prep["tmp"], "batches.pt"),
                     "--steps", STEPS, *objective, *TRAIN_FLAGS, "--log-file", log,
                     "--save-params", saved, timeout=TIMEOUT_S,
                     device="cuda:0" if DEVICE == "cuda-shared" else DEVICE)
    except subprocess.TimeoutExpired:
        return "FAILURE", f"bmt-run hangs (past {TIMEOUT_S} s)"
    if r.returncode != 0:
        errors = error_lines((r.stdout + r.stderr).replace(prep["tmp"] + os.sep, ""))
        line = errors[0] if errors else architectures.first_line(r.stdout + r.stderr)
        return "FAILURE", f"bmt-run exit {r.returncode}: {line}"
    train = [x for x in map(json.loads, open(log)) if x["kind"] == "train"]
    if [x["step"] for x in train] != list(range(1, STEPS + 1)):
        return "FAILURE", f"steps logged: {[x['step'] for x in train]}"
    lrs = {x["step"]: x["lr"] for x in train}
    losses, params = eager_reference(prep, lrs)
    try:
        loss_diff = max(assert_loss_close(x["loss"], want, what=f"loss of step {x['step']}")
                        for x, want in zip(train, losses))
        stats = assert_trained_close(load_file(saved), params, sum(lrs.values()))
    except AssertionError as e:
        return "FAILURE", f"mismatch: {architectures.first_line(str(e)) or e}"
    return "ok", f"loss {loss_diff:.0e}, params {stats[0]:.0e}"


def table(rows, modes):
    """The Markdown table: a row per architecture, a column per mode;
    refusals numbered and listed below it."""
    notes, out = [], []
    out.append("| architecture | " + " | ".join(modes) + " |")
    out.append("|---|" + "---|" * len(modes))
    for name, cells in rows:
        shown = []
        for mode in modes:
            status, text = cells.get(mode, ("", "not run"))
            if status == "ok":  # "loss 5e-07, params 2e-06" -> "ok 5e-07 / 2e-06"
                shown.append("ok " + re.sub(r"loss (\S+), params (\S+)", r"\1 / \2", text))
            elif status == "refused":
                if text not in notes:
                    notes.append(text)
                shown.append(f"refused ({notes.index(text) + 1})")
            elif status == "FAILURE":
                shown.append(f"**FAILURE**: `{text[:400]}`")
            else:
                shown.append(text)
        out.append(f"| {name} | " + " | ".join(shown) + " |")
    out.append("")
    for i, text in enumerate(notes, 1):
        out.append(f"({i}) `{text}`")
    return "\n".join(out).rstrip() + "\n"


BEGIN, END = "<!-- parallel-matrix: begin -->", "<!-- parallel-matrix: end -->"


def write_docs(text, path=os.path.join(REPO, "docs", "architectures.md")):
    doc = open(path).read()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc[:start] + "\n" + text + doc[end:])
    os.replace(tmp, path)


def table_from(files, modes, write):
    """The table of the cells recorded in `files`, architectures and modes
    in ARCHS' and MODES' order."""
    cells = {}
    for path in files:
        for line in open(path):
            name, mode, status, text = json.loads(line)
            cells.setdefault(name, {})[mode] = (status, text)
    modes = modes or [m for m in MODES if any(m in c for c in cells.values())]
    text = table([(n, cells[n]) for n in architectures.ARCHS if n in cells], modes)
    print(text)
    if write:
        write_docs(text)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--only", nargs="*", help="architectures (scripts/architectures.py's names)")
    ap.add_argument("--modes", nargs="*", choices=list(MODES))
    ap.add_argument("--write-docs", action="store_true",
                    help="put the table into docs/architectures.md")
    ap.add_argument("--blocks", type=int,
                    help="layers of each model instead of its config's (4 for the pp4 and v2 modes)")
    ap.add_argument("--results", help="append each cell to this file (JSON lines)")
    ap.add_argument("--device", choices=["cpu", "cuda", "cuda-shared"], default="cpu",
                    help="cuda: bmt-run's rank r on GPU r, the eager reference on GPU 0; "
                         "cuda-shared: every rank on GPU 0, collectives through host memory")
    ap.add_argument("--table-from", nargs="*",
                    help="make the table from these --results files (later cells win), run nothing")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda-shared":
        os.environ["BMT_DEBUG_COMM"] = "host"
    if args.table_from:
        return table_from(args.table_from, args.modes, args.write_docs)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ["BMT_BIN_DIR"] = os.path.abspath(args.bin)
    import torch
    torch.set_num_threads(2)
    modes = args.modes or list(MODES)
    rows, failures = [], 0
    for name in args.only or architectures.ARCHS:
        tmp = tempfile.mkdtemp(prefix="bmt-matrix-")
        prep = prepare(name, tmp, args.blocks)
        cells = {}
        for mode in modes:
            start = time.time()
            cells[mode] = run_cell(prep, mode, args.bin)
            failures += cells[mode][0] == "FAILURE"
            print(f"{name} {mode}: {cells[mode][0]} {cells[mode][1]} ({time.time() - start:.0f} s)",
                  flush=True)
            if args.results:
                with open(args.results, "a") as f:
                    f.write(json.dumps([name, mode, *cells[mode]]) + "\n")
        rows.append((name, cells))
    text = table(rows, modes)
    print(text)
    if args.write_docs:
        write_docs(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
