"""bmt-plot: plot a bmt-run metrics log (JSON lines) into a PNG.

    bmt-plot metrics.jsonl -o plot.png [--title TEXT]

Two panels against the step: the loss (the train curve, the eval points) and
the training throughput in tokens/s.  Lines used:
  {"kind": "train", "step": 12, "loss": 5.31, "tokens_per_s": 15000.0, ...}
  {"kind": "eval", "step": 100, "val_loss": 4.2, ...}
Other kinds and other keys are ignored; a null or non-finite value (e.g. the
loss of a step skipped by loss scaling) leaves a gap.  A log that a resumed
run appended to (bmt-run --resume after a kill) holds the steps between the
checkpoint and the kill twice: a train line whose step is not after the one
before it starts a new run, and the earlier lines of that step and later
ones (train and eval) are dropped, so each step is drawn once, as the last
run trained it.  A last line without
its newline that does not parse (a run still writing) is ignored with a note.

Exit status 0 on success; on bad input (missing, empty or malformed log, no
train or eval lines) one "error: ..." line and status 1, and no output file
(the PNG is written to a temporary name and renamed).
"""

import argparse
import json
import math
import os
import sys
import tempfile


class UserError(Exception):
    """Bad input: reported as one 'error: ...' line, exit status 1."""


def error(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def number(value):
    """A finite float, or None for null / NaN / inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def read_metrics(path):
    """(train records, eval records) of a metrics log, in file order."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise UserError(f"metrics log {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read metrics log {path}: {e}") from None
    lines = text.split("\n")
    train, evals = [], []
    for number_, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number_ == len(lines) and not text.endswith("\n"):
                print(f"note: {path}:{number_}: ignoring an incomplete last line", file=sys.stderr)
                continue
            raise UserError(f"{path}:{number_}: not a JSON line ({e.msg})") from None
        if not isinstance(record, dict):
            raise UserError(f"{path}:{number_}: not a JSON object")
        kind = record.get("kind")
        if kind not in ("train", "eval"):
            continue
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)):
            raise UserError(f"{path}:{number_}: {kind} line without a numeric step")
        if kind == "train":
            if train and train[-1]["step"] >= step:  # a resumed run: its steps replace these
                train = [r for r in train if r["step"] < step]
                evals = [r for r in evals if r["step"] < step]
            train.append(record)
        else:
            evals.append(record)
    if not train and not evals:
        raise UserError(f"metrics log {path} has no train or eval lines")
    return train, evals


def series(records, key):
    """(steps, values) of the records whose key holds a finite number."""
    steps, values = [], []
    for record in records:
        value = number(record.get(key))
        if value is not None:
            steps.append(record["step"])
            values.append(value)
    return steps, values


def plot_metrics(train, evals, output, title=None):
    """Draw the two panels into the PNG `output`; returns what was plotted:
    {"train_loss": (steps, values), "val_loss": (...), "tokens_per_s": (...)}."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plotted = {
        "train_loss": series(train, "loss"),
        "val_loss": series(evals, "val_loss"),
        "tokens_per_s": series(train, "tokens_per_s"),
    }
    fig, (ax_loss, ax_tps) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    steps, values = plotted["train_loss"]
    ax_loss.plot(steps, values, label="train loss", color="tab:blue", linewidth=1)
    steps, values = plotted["val_loss"]
    ax_loss.plot(steps, values, "o", label="val loss", color="tab:orange", markersize=5)
    ax_loss.set_title("Loss")
    ax_loss.set_ylabel("loss")
    ax_loss.grid(True, alpha=0.3)
    ax_loss.legend()

    steps, values = plotted["tokens_per_s"]
    ax_tps.plot(steps, values, color="tab:green", linewidth=1)
    ax_tps.set_title("Throughput")
    ax_tps.set_xlabel("step")
    ax_tps.set_ylabel("tokens/s")
    if values:
        ax_tps.set_ylim(bottom=0)
    ax_tps.grid(True, alpha=0.3)
    ax_tps.tick_params(labelbottom=True)
    if title:
        fig.suptitle(title)
    fig.tight_layout()

    out_dir = os.path.dirname(os.path.abspath(output))
    try:
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{os.path.basename(output)}.", suffix=".tmp")
    except OSError as e:
        plt.close(fig)
        raise UserError(f"cannot write {output}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=100)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        plt.close(fig)
    return plotted


class Parser(argparse.ArgumentParser):
    def error(self, message):
        error(f"{message} (see {self.prog} --help)")


def main(argv=None):
    parser = Parser(prog="bmt-plot", description=__doc__.splitlines()[0])
    parser.add_argument("log", help="metrics log of bmt-run (JSON lines)")
    parser.add_argument("-o", "--output", required=True, help="output image (PNG)")
    parser.add_argument("--title", help="figure title (default: the log's name)")
    args = parser.parse_args(argv)
    if os.path.isdir(args.output):
        error(f"{args.output} is a directory; -o names the PNG to write")
    if os.path.exists(args.output) and os.path.exists(args.log) and \
            os.path.samefile(args.output, args.log):
        error(f"-o {args.output} would overwrite the log it plots")
    try:
        train, evals = read_metrics(args.log)
        plotted = plot_metrics(train, evals, args.output, args.title or os.path.basename(args.log))
    except UserError as e:
        error(str(e))
    names = {"train_loss": "train loss", "val_loss": "val loss", "tokens_per_s": "tokens/s"}
    counts = ", ".join(f"{len(plotted[k][0])} {names[k]}" for k in plotted)
    print(f"plotted {counts} points to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
