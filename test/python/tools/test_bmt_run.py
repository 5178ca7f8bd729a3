"""bmt-run as a user meets it: evaluation against eager PyTorch, masked-LM
training, and every kind of bad input giving one clear error, exit status 1
and nothing half-written.
"""
import io
import json
import math
import os
import re
import resource
import signal
import struct
import subprocess
import time
import zipfile

import numpy as np
import pytest
import torch

from bmt_paths import binary
from numerics import assert_close, assert_gradients_close, assert_loss_close
from eager import build, compile_model


def write_tokens(prefix, tokens, vocab, dtype="uint16", mask_id=None, **overrides):
    """A token file as bmt-prepare-data writes it (independent of it)."""
    arr = np.asarray(tokens, dtype=np.uint16 if dtype == "uint16" else np.uint32)
    arr.tofile(f"{prefix}.bin")
    meta = {"format": "bmt-tokens", "version": 1, "dtype": dtype, "num_tokens": int(arr.size),
            "num_documents": 1, "vocab_size": vocab, "eos_id": 0, "mask_id": mask_id,
            "pad_id": None, "tokenizer": "synthetic", "source": []}
    meta.update(overrides)
    with open(f"{prefix}.json", "w") as f:
        json.dump(meta, f)
    return f"{prefix}.bin"


def bmt_run(*args):
    return subprocess.run([binary("bmt-run"), *map(str, args), "--device", "cpu"],
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpt2")
    model = build("gpt2")
    return model, compile_model(model, tmp, "gpt2"), tmp


def assert_one_error(result, *fragments):
    assert result.returncode == 1, (result.returncode, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


def check_eval_only_against_eager(model, sharded, tmp, val, tokens, seq_len, micro_batch):
    """bmt-run --eval-only on the token file `val` (holding `tokens`)
    against eager on the same consecutive windows of seq_len + 1 tokens,
    micro_batch per batch. Returns bmt's JSON record and eager's loss."""
    log = tmp / "eval.jsonl"
    r = bmt_run(sharded, "--eval-only", "--eval-data", val, "--seq-len", seq_len,
                "--micro-batch", micro_batch, "--log-file", log)
    assert r.returncode == 0, r.stderr
    got = json.loads(open(log).read().splitlines()[-1])
    width = seq_len + 1
    n = len(tokens) // width // micro_batch * micro_batch
    windows = tokens[: n * width].view(n, width)
    with torch.no_grad():
        logits = model(input_ids=windows[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 windows[:, 1:].reshape(-1))
    assert got["kind"] == "eval" and got["step"] == 0
    assert got["tokens"] == n * seq_len
    assert_loss_close(got["val_loss"], loss.item())
    return got, loss.item()


def test_eval_only_matches_eager(gpt2):
    model, sharded, tmp = gpt2
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 128, (1000,), generator=g)
    val = write_tokens(tmp / "val", tokens.tolist(), 128)
    got, loss = check_eval_only_against_eager(model, sharded, tmp, val, tokens, 16, 4)
    assert abs(got["val_ppl"] - math.exp(loss)) <= 1e-3 * math.exp(loss)


def test_masked_lm_training_lowers_the_loss(tmp_path):
    model = build("bert")
    sharded = compile_model(model, tmp_path, "bert")
    # A learnable sequence: a repeating pattern over ids 5..36; [MASK] is 3.
    tokens = [5 + (i % 32) for i in range(20000)]
    data = write_tokens(tmp_path / "train", tokens, 128, mask_id=3)
    log = tmp_path / "log.jsonl"
    r = bmt_run(sharded, "--data", data, "--eval-data", data, "--eval-batches", 4, "--steps", 40,
                "--micro-batch", 8, "--seq-len", 32, "--lr", "3e-3", "--warmup", 5, "--log-file", log)
    assert r.returncode == 0, r.stderr
    assert "objective masked-lm" in r.stdout
    records = [json.loads(line) for line in open(log)]
    train = [x["loss"] for x in records if x["kind"] == "train"]
    assert len(train) == 40 and all(math.isfinite(x) for x in train)
    assert sum(train[-5:]) / 5 < 0.85 * sum(train[:5]) / 5
    assert records[-1]["kind"] == "eval" and records[-1]["val_loss"] < train[0]


def test_bad_data(gpt2, tmp_path):
    _, sharded, _ = gpt2
    common = ["--steps", 2, "--seq-len", 16, "--micro-batch", 2]
    assert_one_error(bmt_run(sharded, "--data", tmp_path / "missing.bin", *common), "missing")
    big = write_tokens(tmp_path / "big", [1, 2, 300, 4] * 100, 1000)
    assert_one_error(bmt_run(sharded, "--data", big, *common), "big.bin", "300", "position 2")
    short = write_tokens(tmp_path / "short", list(range(10)), 128)
    assert_one_error(bmt_run(sharded, "--data", short, *common), "short.bin")
    wrong = write_tokens(tmp_path / "wrong", list(range(100)), 128)
    with open(tmp_path / "wrong.json") as f:
        meta = json.load(f)
    meta["dtype"] = "uint32"
    with open(tmp_path / "wrong.json", "w") as f:
        json.dump(meta, f)
    assert_one_error(bmt_run(sharded, "--data", wrong, *common), "wrong")
    meta["dtype"] = "float32"
    with open(tmp_path / "wrong.json", "w") as f:
        json.dump(meta, f)
    assert_one_error(bmt_run(sharded, "--data", wrong, *common), "float32")


def rewrite_archive(src, dst, change):
    """Copies a zip archive, passing each record's bytes through change(name, data)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, change(info.filename, zin.read(info.filename)))


def test_bad_archives(gpt2, tmp_path):
    _, sharded, _ = gpt2
    data = write_tokens(tmp_path / "d", list(range(100)) * 10, 128)
    args = ["--data", data, "--steps", 1, "--seq-len", 8, "--micro-batch", 2]
    assert_one_error(bmt_run(tmp_path / "none.pt", *args), "no such file")
    (tmp_path / "text.pt").write_text("not an archive")
    assert_one_error(bmt_run(tmp_path / "text.pt", *args), "not a bmt archive")
    v99 = tmp_path / "v99.pt"
    rewrite_archive(sharded, v99,
                    lambda n, d: b"bmt-sharded 99\n" if n.endswith("bmt/version") else d)
    assert_one_error(bmt_run(v99, *args), "format version 99", "reads version 2")
    corrupt = tmp_path / "corrupt.pt"
    rewrite_archive(sharded, corrupt,
                    lambda n, d: bytes(b ^ 0xFF for b in d) if n.endswith("bmt/weights/group1") else d)
    assert_one_error(bmt_run(corrupt, *args), "corrupt record bmt/weights/group1", "checksum")
    badplan = tmp_path / "badplan.pt"
    rewrite_archive(sharded, badplan, lambda n, d: d[:50] if n.endswith("bmt/plan.pkl") else d)
    assert_one_error(bmt_run(badplan, *args), "badplan.pt")


def test_nan_loss_stops_with_the_step_and_writes_nothing(tmp_path):
    model = build("gpt2")
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight[0, 0] = float("nan")
    sharded = compile_model(model, tmp_path, "nan")
    data = write_tokens(tmp_path / "d", list(range(100)) * 10, 128)
    log, params = tmp_path / "log.jsonl", tmp_path / "params.pt"
    r = bmt_run(sharded, "--data", data, "--steps", 3, "--seq-len", 8, "--micro-batch", 2,
                "--log-file", log, "--save-params", params)
    assert_one_error(r, "NaN", "step 1")
    assert not params.exists()
    assert open(log).read() == ""


def test_usage_errors(gpt2):
    _, sharded, tmp = gpt2
    assert_one_error(bmt_run(), "no archive")
    assert_one_error(bmt_run(sharded, "--steps", "x"), "--steps expects an integer")
    assert_one_error(bmt_run(sharded, "--frobnicate"), "unknown option --frobnicate")
    assert_one_error(bmt_run(sharded, "--data", "x.bin"), "--steps is required")
    assert_one_error(bmt_run(sharded, "--steps", 1, "--data", "x.bin", "--schedule", "zigzag"),
                     "zigzag")
    # Balancing by router biases needs a router with one (DeepSeek-V3's).
    batches = tmp / "usage.batches.pt"
    torch.save(torch.zeros(1, 2, 9, dtype=torch.long), batches)
    assert_one_error(bmt_run(sharded, "--steps", 1, "--batches", batches,
                             "--moe-bias-update-rate", "0.01"),
                     "--moe-bias-update-rate: ", "has no router with a score-correction bias")
    assert bmt_run("--help").returncode == 0


@pytest.mark.parametrize("twice, flag", [
    (["--steps", 5, "--steps", 10], "--steps"),
    (["--lr", "1e-3", "--steps", 5, "--lr=2e-3"], "--lr"),
    (["--steps", 5, "--seed", 1, "--seed", 1, "--seed", 2], "--seed"),
])
def test_an_option_given_twice_is_refused_before_anything_loads(gpt2, tmp_path, twice, flag):
    """An option given again would keep its last value: one error naming it,
    exit 1, before the archive or the data are read (no start line; the
    data file does not exist)."""
    _, sharded, _ = gpt2
    r = bmt_run(sharded, "--data", tmp_path / "missing.bin", *twice)
    times = sum(1 for a in map(str, twice) if a.split("=")[0] == flag)
    assert r.stderr.strip() == f"error: {flag} was given {times} times; give it once", r.stderr
    assert r.returncode == 1 and r.stdout == "", r.stdout


def test_profile_prints_ops_and_writes_a_trace(gpt2, tmp_path):
    _, sharded, tmp = gpt2
    data = write_tokens(tmp_path / "train", list(range(128)) * 20, 128)
    trace = tmp_path / "trace.json"
    r = bmt_run(sharded, "--data", data, "--steps", 4, "--micro-batch", 2, "--seq-len", 16,
                "--profile", "2:3", "--profile-trace", trace)
    assert r.returncode == 0, r.stderr
    table = r.stdout[r.stdout.index("profile: 2 steps"):]
    rows = [line.split() for line in table.splitlines()[2:] if line.startswith("  ")]
    ops = {row[-1]: float(row[0]) for row in rows if len(row) >= 4}
    # The matmuls of forward and backward are there, with time, and the
    # shares add up to at most 100 %.
    assert any(op in ops for op in ("aten::mm", "aten::addmm")), table
    assert all(t >= 0 for t in ops.values()) and sum(ops.values()) > 0
    assert sum(float(row[1]) for row in rows if len(row) >= 4) <= 100.5
    # The table comes after step 3 and before step 4.
    assert r.stdout.index("step 3/4") < r.stdout.index("profile:") < r.stdout.index("step 4/4")
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)
    assert_one_error(bmt_run(sharded, "--data", data, "--steps", 4, "--profile", "3:5"),
                     "--profile 3:5 reaches beyond --steps 4")
    assert_one_error(bmt_run(sharded, "--data", data, "--steps", 4, "--profile", "3"),
                     "expects A:B")
    assert_one_error(bmt_run(sharded, "--data", data, "--steps", 4, "--profile-trace", trace),
                     "--profile-trace needs --profile")


def test_memory_check_refuses_a_micro_batch_that_cannot_fit(gpt2, tmp_path):
    """A micro-batch whose forward (measured at 1 and 2 rows, scaled) needs
    more than the host's MemAvailable is refused before step 1, at once and
    without allocating it; sizes that overflow are one error too. (Every
    other test's run passes the check.)"""
    _, sharded, _ = gpt2
    data = write_tokens(tmp_path / "d", list(range(100)) * 10, 128)
    with open("/proc/meminfo") as f:
        available = next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemAvailable:"))
    rows = 2 * available // (64 * 64 * 4 * 4)  # twice memory for 64 x 64 float32 scores, 4 heads
    start = time.time()
    proc = subprocess.Popen([binary("bmt-run"), sharded, "--data", data, "--steps", "1",
                             "--seq-len", "64", "--micro-batch", str(rows), "--device", "cpu"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate(timeout=60)
    elapsed = time.time() - start
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert_one_error(r, f"--micro-batch {rows} --seq-len 64: a forward of this micro-batch "
                     "allocates at least ", "; lower --micro-batch", "or pass --no-memory-check")
    m = re.search(r"at least ([0-9.]+) GiB on each rank \(measured at 1 and 2 rows: ([0-9]+) bytes "
                  r"a row\), more than the ([0-9.]+) GiB (MemAvailable of this host|left under "
                  r"this cgroup's memory limit);", err)
    need, per_row, have = float(m[1]) * 2**30, int(m[2]), float(m[3]) * 2**30
    assert have <= 1.25 * available, (have, available)
    if m[4].startswith("MemAvailable"):
        assert abs(have - available) < 0.25 * available, (have, available)
    assert need > have and abs(need - per_row * rows) < 0.01 * need, (need, per_row, rows)
    # At least the attention's scores and probabilities: 2 x 4 heads x 64 x 64 float32 a row.
    assert per_row >= 2 * 4 * 64 * 64 * 4, per_row
    assert elapsed < 5 and maxrss < 4 * 2**30, (elapsed, maxrss)
    assert "step 1/1" not in out
    assert_one_error(bmt_run(sharded, "--data", data, "--steps", 1, "--seq-len", 8,
                             "--micro-batch", 2**63 - 1),
                     f"--micro-batch {2**63 - 1} --seq-len 8: {2**63 - 1} x 8 tokens a "
                     "micro-batch is beyond any memory (its sizes overflow 64-bit byte counts)")


def test_outputs_never_overwrite_inputs_and_are_checked_first(gpt2, tmp_path):
    _, sharded, _ = gpt2
    data = write_tokens(tmp_path / "d", list(range(100)) * 10, 128)
    size = os.path.getsize(data)
    common = ["--data", data, "--steps", 1, "--seq-len", 8, "--micro-batch", 2]
    assert_one_error(bmt_run(sharded, *common, "--log-file", data), "--log-file", "would overwrite the input")
    assert os.path.getsize(data) == size
    assert_one_error(bmt_run(sharded, *common, "--save-params", sharded), "--save-params",
                     "would overwrite the input")
    assert_one_error(bmt_run(sharded, *common, "--log-file", tmp_path / "x", "--save-params",
                             tmp_path / "x"), "name the same file")
    # The same file under two spellings (the one not yet existing).
    assert_one_error(bmt_run(sharded, *common, "--log-file", tmp_path / "y", "--save-params",
                             str(tmp_path / "." / "y")), "name the same file")
    assert not (tmp_path / "y").exists()
    # An output flag that the mode would silently ignore is refused.
    assert_one_error(bmt_run(sharded, "--eval-only", "--eval-data", data, "--save-params",
                             tmp_path / "p"), "--save-params", "no effect with --eval-only")
    # An unwritable --save-params is found before training, not after.
    r = bmt_run(sharded, *common, "--save-params", tmp_path / "no" / "p.safetensors")
    assert_one_error(r, "--save-params", "cannot write there (No such file or directory)")
    assert "step 1/1" not in r.stdout


@pytest.mark.parametrize("minutes", ["0", "-1", "-0.5"])
def test_checkpoint_every_minutes_must_be_positive(minutes, tmp_path):
    r = subprocess.run([binary("bmt-run"), str(tmp_path / "m.sharded.pt"), "--data", "d.bin",
                        "--checkpoint-dir", str(tmp_path), "--checkpoint-every-minutes", minutes],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: --checkpoint-every-minutes must be positive, got {minutes}"


def usable_cpus():
    """The CPUs a process started now may use: its affinity mask, capped by
    the cgroup's CPU quota (cpu.max, rounded up)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()
        if quota != "max" and int(period) > 0:
            cpus = min(cpus, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(cpus, 1)


@pytest.mark.parametrize("cpus,env,want", [
    (1, {}, ("1", "passive")),
    (None, {}, (str(usable_cpus()), "passive")),
    (None, {"LOCAL_WORLD_SIZE": "2"}, (str(max(1, usable_cpus() // 2)), "passive")),
    (1, {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "active"}, ("3", "active")),
], ids=["one-cpu", "all-cpus", "two-local-ranks", "set-by-the-user"])
def test_a_single_process_chooses_its_threads(gpt2, tmp_path, cpus, env, want):
    """A bmt-run started without OMP_NUM_THREADS (a single process: torchrun
    sets it for several) runs, under its own pid, with OMP_NUM_THREADS = the
    CPUs it may use (affinity, cgroup quota) / LOCAL_WORLD_SIZE and
    OMP_WAIT_POLICY=passive, which OpenMP reads when it loads (LibTorch's
    default counts the host's cores and spins: 18x slower on a busy 2-core
    machine); values the user set are kept. Read from the running
    process's environment once it has trained a step."""
    _, sharded, _ = gpt2
    data = write_tokens(tmp_path / "d", list(range(100)) * 10, 128)
    log = tmp_path / "log.jsonl"
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "LOCAL_WORLD_SIZE")}
    first = sorted(os.sched_getaffinity(0))[0]
    proc = subprocess.Popen([binary("bmt-run"), sharded, "--data", data, "--steps", "100000",
                             "--seq-len", "8", "--micro-batch", "2", "--device", "cpu",
                             "--log-file", log], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**base, **env},
                            preexec_fn=(lambda: os.sched_setaffinity(0, {first})) if cpus else None)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not (
                log.exists() and log.read_text().count("\n") >= 1):
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        environ = dict(x.split("=", 1) for x in
                       open(f"/proc/{proc.pid}/environ").read().split("\0") if "=" in x)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert (environ.get("OMP_NUM_THREADS"), environ.get("OMP_WAIT_POLICY")) == want, environ
    assert proc.returncode == 143, err[-2000:]


def test_limits_found_before_training(gpt2, tmp_path):
    _, sharded, _ = gpt2
    data = write_tokens(tmp_path / "d", list(range(100)) * 10, 128)
    small = write_tokens(tmp_path / "s", list(range(100)), 128)
    assert_one_error(bmt_run(sharded, "--eval-only", "--eval-data", small, "--seq-len", 16,
                             "--micro-batch", 8), "s.bin", "fewer than one evaluation batch")
    # The tiny GPT-2 has 64 positions.
    assert_one_error(bmt_run(sharded, "--data", data, "--steps", 1, "--seq-len", 100),
                     "--seq-len 100")
    # --batches fixes the training's shape; --eval-data's micro-batches are
    # --micro-batch x --seq-len (default 128 > 64 positions): refused before
    # step 1, not after the training (whose --save-params would be lost).
    import torch
    torch.save(torch.randint(0, 100, (2, 2, 9), generator=torch.Generator().manual_seed(0)),
               tmp_path / "batches.pt")
    r = bmt_run(sharded, "--batches", tmp_path / "batches.pt", "--steps", 2, "--eval-data", data,
                "--save-params", tmp_path / "p.safetensors")
    assert_one_error(r, "--eval-data with --micro-batch 8 --seq-len 128",
                     "set --seq-len to the batches' 8")
    assert "step 1/2" not in r.stdout and not (tmp_path / "p.safetensors").exists()
    r = bmt_run(sharded, "--batches", tmp_path / "batches.pt", "--steps", 2, "--eval-data", data,
                "--seq-len", 8, "--save-params", tmp_path / "p.safetensors")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "val loss" in r.stdout and (tmp_path / "p.safetensors").exists()
    assert_one_error(bmt_run(sharded, "--data", data, "--steps", 1, "--lr", "1e-4",
                             "--min-lr", "1"), "--min-lr")


class _Plain(torch.nn.Module):
    """A tiny LM of plain ops: full means (aten::mean, mean.dim over every
    dim) inside, and either a dict with 'logits' or a plain tensor out."""

    def __init__(self, plain):
        super().__init__()
        self.plain = plain
        self.emb = torch.nn.Embedding(32, 8)
        self.head = torch.nn.Linear(8, 32)

    def forward(self, input_ids):
        h = self.emb(input_ids)
        h = (h - h.mean()) * torch.rsqrt(h.pow(2).mean(dim=(0, 1, 2), keepdim=True) + 1e-5)
        logits = self.head(h + h.mean(dim=(0, 1, 2)))
        return logits if self.plain else {"logits": logits}


def test_full_mean_runs_and_a_plain_tensor_output_is_explained(tmp_path):
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(4))
    paths = {}
    for plain in (False, True):
        torch.manual_seed(0)
        model = _Plain(plain)
        pt = str(tmp_path / f"plain{plain}.pt")
        torch.jit.trace(model, example_kwarg_inputs={"input_ids": ids}, strict=False).save(pt)
        paths[plain] = str(tmp_path / f"plain{plain}.sharded.pt")
        r = subprocess.run([binary("bmt-opt"), pt, "-o", paths[plain]], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
    # The means against eager: logits, loss and gradients of --dump.
    torch.manual_seed(0)
    model = _Plain(False)
    torch.save({"input_ids": ids}, tmp_path / "in.pt")
    r = bmt_run(paths[False], "--dump", tmp_path / "in.pt", tmp_path / "out.pt")
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    logits = model(ids)["logits"]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 32), ids[:, 1:].reshape(-1))
    loss.backward()
    assert_close(got["logits"], logits, what="logits")
    assert_loss_close(got["loss"].item(), loss.item())
    assert_gradients_close({k[5:]: v for k, v in got.items() if k.startswith("grad/")},
                           {n: p.grad for n, p in model.named_parameters()})
    # A forward returning a plain tensor: the error says what it must return.
    data = write_tokens(tmp_path / "d", list(range(32)) * 10, 32)
    assert_one_error(bmt_run(paths[True], "--data", data, "--steps", 1, "--seq-len", 4),
                     "returns a plain tensor", "'logits'", "--objective model-loss")
