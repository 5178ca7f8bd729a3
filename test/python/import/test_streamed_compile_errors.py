"""Bad checkpoints on the streamed path (docs/hf-checkpoints.md): each gives
one `error: ...` line naming the file or tensor, exit status 1, and no
output file, from bmt-export-hf (what it finds in the checkpoint) or from
bmt-opt (what changed in it since the export).
"""
import json
import os
import shutil
import subprocess
import warnings

import pytest
import torch

from bmt_paths import binary, tool
from test_streamed_compile import save_checkpoint

warnings.filterwarnings("ignore")


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """A tiny GPT-2 checkpoint in one file and one sharded into several."""
    tmp = tmp_path_factory.mktemp("ckpt")
    save_checkpoint("gpt2", tmp / "single")
    save_checkpoint("gpt2", tmp / "sharded", max_shard_size="40KB")
    return tmp


def copy_of(gpt2, tmp_path, which="single"):
    d = tmp_path / which
    shutil.copytree(gpt2 / which, d)
    return d


def assert_one_error(r, *fragments, outputs=()):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, r.stderr
    for f in fragments:
        assert f in errors[0], errors[0]
    for out in outputs:
        assert not os.path.exists(out), out
        leftovers = [n for n in os.listdir(os.path.dirname(out))
                     if n.startswith(os.path.basename(out)) or n.startswith("tmp")]
        assert not leftovers, leftovers


class Export:
    """bmt-export-hf --checkpoint, in this process (export_hf.main: its
    error() prints the line and exits 1) or as the command itself."""

    def __init__(self, capsys):
        self.capsys = capsys

    def __call__(self, ckpt, out, *flags, command=False):
        argv = ["--checkpoint", str(ckpt), "-o", str(out), *map(str, flags)]
        if command:
            return subprocess.run([*tool("bmt-export-hf"), *argv], capture_output=True, text=True)
        tool("bmt-export-hf")  # checks that bmt is this checkout's
        from bmt import export_hf
        self.capsys.readouterr()
        try:
            code = export_hf.main(argv)
        except SystemExit as e:
            code = e.code
        captured = self.capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


@pytest.fixture
def export(capsys):
    return Export(capsys)


def compile_(model, out):
    return subprocess.run([binary("bmt-opt"), str(model), "-o", str(out)], capture_output=True,
                          text=True)


def rewrite(path, change):
    """Rewrites a safetensors file with change(tensors) applied."""
    from safetensors.torch import load_file, save_file
    tensors = change(load_file(path))
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_shard(gpt2, tmp_path, export):
    d = copy_of(gpt2, tmp_path, "sharded")
    index = json.load(open(d / "model.safetensors.index.json"))
    gone = sorted(set(index["weight_map"].values()))[-1]
    os.remove(d / gone)
    out = tmp_path / "out" / "m.pt"
    out.parent.mkdir()
    assert_one_error(export(d, out), "model.safetensors.index.json names " + gone,
                     "does not exist", outputs=[out])


def test_index_names_a_tensor_absent_from_its_file(gpt2, tmp_path, export):
    d = copy_of(gpt2, tmp_path, "sharded")
    index = json.load(open(d / "model.safetensors.index.json"))
    first = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"]["transformer.h.7.attn.c_attn.weight"] = first
    json.dump(index, open(d / "model.safetensors.index.json", "w"))
    out = tmp_path / "m.pt"
    assert_one_error(export(d, out), "tensor transformer.h.7.attn.c_attn.weight in " + first,
                     "which does not hold it", outputs=[out])


def test_tensor_of_another_shape(gpt2, tmp_path, export):
    d = copy_of(gpt2, tmp_path)
    rewrite(d / "model.safetensors",
            lambda t: {**t, "transformer.h.1.mlp.c_fc.weight": torch.zeros(32, 100)})
    out = tmp_path / "m.pt"
    assert_one_error(export(d, out), "checkpoint tensor transformer.h.1.mlp.c_fc.weight",
                     "has shape [32, 100]", "parameter transformer.h.1.mlp.c_fc.weight has [32, 64]",
                     outputs=[out])


def test_tensor_of_another_dtype(gpt2, tmp_path, export):
    d = copy_of(gpt2, tmp_path)
    rewrite(d / "model.safetensors",
            lambda t: {**t, "transformer.ln_f.bias": torch.zeros(32, dtype=torch.int64)})
    out = tmp_path / "m.pt"
    assert_one_error(export(d, out), "checkpoint tensor transformer.ln_f.bias", "has dtype I64",
                     "parameter transformer.ln_f.bias is float32", outputs=[out])


def test_truncated_safetensors(gpt2, tmp_path, export):
    d = copy_of(gpt2, tmp_path)
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    out = tmp_path / "m.pt"
    assert_one_error(export(d, out), str(path), "not a readable safetensors file",
                     outputs=[out])


def test_config_that_does_not_match_the_weights(gpt2, tmp_path, export):
    d = copy_of(gpt2, tmp_path)
    config = json.load(open(d / "config.json"))
    config["n_layer"] = 3
    json.dump(config, open(d / "config.json", "w"))
    out = tmp_path / "m.pt"
    assert_one_error(export(d, out), "the checkpoint has no tensor for parameter transformer.h.2.",
                     "config.json match the weights", outputs=[out])


def test_bin_checkpoint_is_refused(gpt2, tmp_path, export):
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(gpt2 / "single" / "config.json", d)
    from safetensors.torch import load_file
    torch.save(load_file(gpt2 / "single" / "model.safetensors"), d / "pytorch_model.bin")
    out = tmp_path / "m.pt"
    # As a command: the one error line and the exit status of the tool.
    assert_one_error(export(d, out, command=True), "pytorch_model.bin", "safetensors only",
                     "--load-weights", outputs=[out])


@pytest.fixture
def exported(gpt2, tmp_path, export):
    """A copy of the checkpoint, exported weight-free."""
    d = copy_of(gpt2, tmp_path)
    model = tmp_path / "m.pt"
    r = export(d, model)
    assert r.returncode == 0, r.stderr
    return d, model


def test_checkpoint_moved_after_export(exported, tmp_path):
    d, model = exported
    d.rename(tmp_path / "elsewhere")
    out = tmp_path / "m.sharded.pt"
    assert_one_error(compile_(model, out), str(d / "model.safetensors"), "was the checkpoint moved",
                     outputs=[out])


def test_checkpoint_changed_after_export(exported, tmp_path):
    d, model = exported
    rewrite(d / "model.safetensors",
            lambda t: {**t, "transformer.wpe.weight": t["transformer.wpe.weight"] + 1})
    out = tmp_path / "m.sharded.pt"
    assert_one_error(compile_(model, out), str(d / "model.safetensors"),
                     "has changed since bmt-export-hf recorded it", "export it again",
                     outputs=[out])


def forge_record(model, forged, change):
    """A copy of the model archive `model` whose checkpoint record is
    change(record)."""
    import zipfile
    with zipfile.ZipFile(model) as zin, zipfile.ZipFile(forged, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            content = zin.read(info.filename)
            if info.filename.endswith("extra/bmt-checkpoint.json"):
                content = json.dumps(change(json.loads(content))).encode()
            zout.writestr(info, content)


def test_checkpoint_truncated_behind_the_records_back(exported, tmp_path):
    """A file truncated while its record (size, time) says nothing changed:
    bmt-opt's own check of the header against the file finds it."""
    d, model = exported
    path = d / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 100])
    stat = os.stat(path)

    def same_size_and_time(record):
        record["files"][0].update(size=stat.st_size, mtime_ns=stat.st_mtime_ns)
        return record

    forged = tmp_path / "forged.pt"
    forge_record(model, forged, same_size_and_time)
    out = tmp_path / "m.sharded.pt"
    assert_one_error(compile_(forged, out), str(path) + " is truncated", "ends at byte",
                     outputs=[out])


def test_record_that_does_not_match_the_program(exported, tmp_path):
    """bmt-opt checks the record against the program it compiles: a
    parameter the record lacks, a tensor of another shape."""
    d, model = exported

    def without_wpe(record):
        del record["tensors"]["transformer.wpe.weight"]
        return record

    def wte_for_wpe(record):
        record["tensors"]["transformer.wpe.weight"] = record["tensors"]["transformer.wte.weight"]
        return record

    out = tmp_path / "m.sharded.pt"
    forge_record(model, tmp_path / "a.pt", without_wpe)
    assert_one_error(compile_(tmp_path / "a.pt", out), "records the checkpoint " + str(d),
                     "no tensor of it for parameter transformer.wpe.weight", outputs=[out])
    forge_record(model, tmp_path / "b.pt", wte_for_wpe)
    assert_one_error(compile_(tmp_path / "b.pt", out), "checkpoint tensor transformer.wte.weight",
                     "has shape [128, 32], the program's parameter transformer.wpe.weight has",
                     outputs=[out])
