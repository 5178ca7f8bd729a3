"""Tests of bmt-plot (python/bmt/plot.py): the data it plots against the log
the test wrote, the PNG read back with matplotlib, and its errors."""

import json
import math
import os
import subprocess

import numpy as np
import pytest

from bmt_paths import tool

TOOL = tool("bmt-plot")   # python3 -m bmt.plot, after checking it is this checkout's
from bmt import plot as bmt_plot  # noqa: E402

# matplotlib's default colours, which the tool draws with (RGB 0..1)
BLUE, ORANGE, GREEN = (0.122, 0.467, 0.706), (1.0, 0.498, 0.055), (0.173, 0.627, 0.173)


def train_line(step, loss):
    return {"kind": "train", "step": step, "loss": loss, "lr": 3e-4, "grad_norm": 1.2,
            "loss_scale": None, "tokens_per_s": 15000.0 + 10 * step, "tflops": 0.01,
            "elapsed_s": 0.1 * step, "peak_mem_gib": 0.5, "some_future_key": [1, 2]}


def write_log(path, steps=120, eval_every=25):
    """A log like bmt-run's; returns what the plot must show."""
    expect = {"train_loss": ([], []), "val_loss": ([], []), "tokens_per_s": ([], [])}
    with open(path, "w") as f:
        f.write(json.dumps({"kind": "config", "model": "gpt2", "seq_len": 128}) + "\n")
        for step in range(1, steps + 1):
            # step 40: an overflowed step (loss null) still has a throughput
            loss = None if step == 40 else 6.0 * math.exp(-step / 50) + 2.0
            f.write(json.dumps(train_line(step, loss)) + "\n")
            if loss is not None:
                expect["train_loss"][0].append(step)
                expect["train_loss"][1].append(loss)
            expect["tokens_per_s"][0].append(step)
            expect["tokens_per_s"][1].append(15000.0 + 10 * step)
            if step % eval_every == 0:
                val = 6.0 * math.exp(-step / 50) + 2.3
                f.write(json.dumps({"kind": "eval", "step": step, "val_loss": val,
                                    "val_ppl": math.exp(val)}) + "\n")
                expect["val_loss"][0].append(step)
                expect["val_loss"][1].append(val)
        f.write("\n")   # blank lines are fine
        f.write(json.dumps({"kind": "checkpoint", "step": steps, "path": "x.bin"}) + "\n")
    return expect


def colour_pixels(image, rgb, tol=0.08):
    return int((np.abs(image[:, :, :3] - np.array(rgb)).max(axis=2) < tol).sum())


def test_plot_returns_what_it_drew_and_a_readable_png(tmp_path):
    import matplotlib.image

    log = tmp_path / "metrics.jsonl"
    expect = write_log(log)
    train, evals = bmt_plot.read_metrics(str(log))
    assert len(train) == 120 and len(evals) == 4
    out = tmp_path / "plot.png"
    plotted = bmt_plot.plot_metrics(train, evals, str(out), title="run")
    for key, (steps, values) in expect.items():
        assert list(plotted[key][0]) == steps, key
        assert np.allclose(plotted[key][1], values), key
    assert len(plotted["train_loss"][0]) == 119   # the null loss is a gap
    assert len(plotted["val_loss"][0]) == 4
    assert len(plotted["tokens_per_s"][0]) == 120

    assert 10_000 < os.path.getsize(out) < 2_000_000
    image = matplotlib.image.imread(str(out))
    assert image.shape[:2] == (700, 900)          # 9 x 7 inches at 100 dpi
    assert image.std() > 0.05                     # not a blank canvas
    # The three series are drawn in their colours.
    assert colour_pixels(image, BLUE) > 200       # train loss curve
    assert colour_pixels(image, ORANGE) > 4 * 10  # 4 eval markers
    assert colour_pixels(image, GREEN) > 200      # tokens/s curve
    assert sorted(os.listdir(tmp_path)) == ["metrics.jsonl", "plot.png"]   # no temporary left


def test_cli(tmp_path):
    log = tmp_path / "metrics.jsonl"
    write_log(log, steps=30, eval_every=10)
    r = subprocess.run([*TOOL, str(log), "-o", str(tmp_path / "p.png")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "30 train loss, 3 val loss, 30 tokens/s points" in r.stdout
    with open(tmp_path / "p.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_incomplete_last_line_of_a_running_job_is_ignored(tmp_path):
    log = tmp_path / "metrics.jsonl"
    write_log(log, steps=10, eval_every=5)
    with open(log, "a") as f:
        f.write('{"kind": "train", "step": 11, "lo')
    train, evals = bmt_plot.read_metrics(str(log))
    assert len(train) == 10 and len(evals) == 2


def test_eval_only_log(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"kind": "eval", "step": 5, "val_loss": 3.0}) + "\n")
    plotted = bmt_plot.plot_metrics(*bmt_plot.read_metrics(str(log)), str(tmp_path / "p.png"))
    assert plotted["val_loss"] == ([5], [3.0]) and plotted["train_loss"] == ([], [])


BAD_LOGS = {
    "empty": ("", "no train or eval lines"),
    "only blank lines": ("\n\n", "no train or eval lines"),
    "only unknown kinds": ('{"kind": "config"}\n', "no train or eval lines"),
    "malformed line": ('{"kind": "train", "step": 1, "loss": 2}\nnot json\n'
                       '{"kind": "train", "step": 2, "loss": 2}\n', ":2: not a JSON line"),
    "not an object": ("[1, 2]\n", ":1: not a JSON object"),
    "train without step": ('{"kind": "train", "loss": 2}\n', "without a numeric step"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOGS))
def test_bad_log(case, tmp_path):
    text, message = BAD_LOGS[case]
    log = tmp_path / "metrics.jsonl"
    log.write_text(text)
    out = tmp_path / "p.png"
    r = subprocess.run([*TOOL, str(log), "-o", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert os.listdir(tmp_path) == ["metrics.jsonl"]


def test_missing_log(tmp_path):
    r = subprocess.run([*TOOL, str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "p.png")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [f"error: metrics log {tmp_path / 'nope.jsonl'} does not exist"]
    assert os.listdir(tmp_path) == []
