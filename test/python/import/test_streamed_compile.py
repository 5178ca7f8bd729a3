"""A Hugging Face checkpoint compiled without holding it in memory
(docs/hf-checkpoints.md): `bmt-export-hf --checkpoint DIR` traces the model
on the meta device and records where its weights are in DIR's safetensors
files; bmt-opt streams them into sharded.pt.

For tiny GPT-2 (tied, its checkpoint sharded into several files with an
index), LLaMA (also converted to bf16), BERT, T5 (TorchScript) and BLOOM
(.pt2) checkpoints written by save_pretrained: the streamed sharded.pt holds
the weight records of the in-memory path (--load-weights) byte for byte and
the same program, every parameter equals the transformers model's
(from_pretrained) bit for bit, and `bmt-run --dump` gives its logits
(numerics.py's tolerance). test_streamed_compile_100m.py trains a
~100 M-parameter checkpoint compiled this way on 2 CPU ranks.
"""
import io
import json
import os
import sys
import warnings
import zipfile

import pytest
import torch

from bmt_paths import REPO, binary, tool
from numerics import assert_close, assert_identical

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402  (the tiny model configs)

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64, "int64": torch.int64, "int32": torch.int32,
          "uint8": torch.uint8, "bool": torch.bool}


def config_of(name):
    """(model class, config) of a tiny model: the fixtures' configs, and
    BLOOM's of test_export_hf."""
    import transformers
    if name == "bloom":
        return transformers.BloomForCausalLM, transformers.AutoConfig.for_model(
            "bloom", n_layer=2, hidden_size=32, n_head=4, vocab_size=200)
    return make_fixtures.MODELS[name](transformers)


def save_checkpoint(name, directory, **save_kwargs):
    """The tiny model (seed 0) as save_pretrained writes it."""
    cls, config = config_of(name)
    torch.manual_seed(0)
    cls(config).save_pretrained(directory, **save_kwargs)
    return cls


def export_hf(capsys, *argv):
    """bmt-export-hf in this process (the checkout's python/bmt, as tool()
    checks): its stdout; fails the test on an error exit."""
    tool("bmt-export-hf")
    from bmt import export_hf
    capsys.readouterr()
    try:
        export_hf.main([str(a) for a in argv])
    except SystemExit as e:
        pytest.fail(f"bmt-export-hf {' '.join(map(str, argv))}: exit {e.code}: "
                    f"{capsys.readouterr().err}")
    return capsys.readouterr().out


def bmt(name, *args, check=True):
    import subprocess
    r = subprocess.run([binary(name), *map(str, args)], capture_output=True, text=True)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def archive(path):
    """(records under bmt/weights/ and bmt/hf/ by name, the plan, the
    program text)."""
    with zipfile.ZipFile(path) as z:
        records = {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}
    plan = torch.load(io.BytesIO(records["bmt/plan.pkl"]), weights_only=False)
    weights = {k: v for k, v in records.items() if k.startswith(("bmt/weights/", "bmt/hf/"))}
    return weights, plan, records["bmt/program.mlir"].decode()


def plan_of(path):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/bmt/plan.pkl"))
        return torch.load(io.BytesIO(z.read(name)), weights_only=False)


def tensors_of(path):
    """Every tensor of a sharded.pt by plan name, decoded from its records
    as docs/sharded-format.md describes them (groups in one record or in
    parts)."""
    weights, plan, _ = archive(path)
    out = {}
    for t in plan["tensors"]:
        if t["group"] >= 0:
            g = plan["groups"][t["group"]]
            data = weights[g["record"]] if g["record"] else b"".join(weights[p] for p in g["parts"])
        else:
            data = weights[t["record"]]
        dtype = DTYPES[t["dtype"]]
        n = torch.Size(t["shape"]).numel() * torch.empty((), dtype=dtype).element_size()
        out[t["name"]] = torch.frombuffer(bytearray(data[t["offset"]:t["offset"] + n]),
                                          dtype=dtype).view(t["shape"])
    return out, plan


def compile_both_ways(capsys, tmp, name, ckpt, ext, *flags):
    """Exports `ckpt` streamed and in memory (--load-weights), compiles
    both; returns the two sharded.pt paths and the streamed export's output."""
    paths = {}
    for way, extra in (("streamed", []), ("loaded", ["--load-weights"])):
        d = tmp / way
        d.mkdir()
        model = d / f"{name}.{ext}"
        out = export_hf(capsys, "--checkpoint", ckpt, "-o", model, *flags, *extra)
        if way == "streamed":
            streamed_output = out
        paths[way] = d / f"{name}.sharded.pt"
        r = bmt("bmt-opt", model, "-o", paths[way])
        if way == "streamed":
            assert "streamed the weights from" in r.stderr, r.stderr
    return paths, streamed_output


def assert_same_archives(streamed, loaded):
    """The weight records (and the Hugging Face files) byte for byte, the
    plans' checksums, the program (but for the model file's path)."""
    w1, p1, prog1 = archive(streamed)
    w2, p2, prog2 = archive(loaded)
    assert "bmt/hf/config.json" in w1
    assert sorted(w1) == sorted(w2)
    for k in w1:
        assert w1[k] == w2[k], f"record {k} differs"
    assert [(t["name"], t["crc32"]) for t in p1["tensors"]] == \
        [(t["name"], t["crc32"]) for t in p2["tensors"]]
    source1, source2 = os.path.dirname(p1["source"]), os.path.dirname(p2["source"])
    assert prog1.replace(source1, "DIR").replace("streamed", "X") == \
        prog2.replace(source2, "DIR").replace("loaded", "X")


def reference(name, ckpt, dtype=None):
    """transformers' own load of the checkpoint (eval mode), converted to
    `dtype` as bmt-export-hf --dtype converts."""
    cls, _ = config_of(name)
    model = cls.from_pretrained(ckpt, local_files_only=True).eval()
    return model.to(dtype) if dtype else model


CASES = {
    # name: (model, archive, bmt-export-hf flags, save_pretrained arguments)
    "gpt2": ("gpt2", "pt", [], {"max_shard_size": "40KB"}),  # tied; sharded with an index
    "llama": ("llama", "pt", [], {}),
    "llama-bf16": ("llama", "pt", ["--dtype", "bfloat16"], {}),
    "bert": ("bert", "pt", [], {}),
    "t5": ("t5", "pt", [], {}),
    "bloom": ("bloom", "pt2", [], {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_streamed_equals_in_memory_and_transformers(case, tmp_path, capsys):
    name, ext, flags, save_kwargs = CASES[case]
    ckpt = tmp_path / "checkpoint"
    save_checkpoint(name, ckpt, **save_kwargs)
    if case == "gpt2":
        index = json.load(open(ckpt / "model.safetensors.index.json"))
        assert len(set(index["weight_map"].values())) > 1
    paths, out = compile_both_ways(capsys, tmp_path, name, ckpt, ext, *flags)
    assert "weights not copied" in out, out
    assert_same_archives(paths["streamed"], paths["loaded"])

    # Every parameter (tied names once, under the plan's name or an alias)
    # is transformers' value bit for bit.
    dtype = {"bfloat16": torch.bfloat16}.get(flags[-1]) if flags else None
    model = reference(name, ckpt, dtype)
    got, plan = tensors_of(paths["streamed"])
    params = dict(model.named_parameters(remove_duplicate=False))
    for t in plan["tensors"]:
        if t["is_parameter"]:
            names = [t["name"], *t["aliases"]]
            assert set(names) <= set(params), names
            for n in names:
                assert_identical(got[t["name"]], params[n].detach(), f"{case}: {n}")
    assert {n for t in plan["tensors"] if t["is_parameter"] for n in [t["name"], *t["aliases"]]} \
        == set(params)

    if dtype is not None:
        return  # the numerics of bf16 are test_mixed_precision's
    # bmt-run --dump on the streamed sharded.pt against transformers.
    g = torch.Generator().manual_seed(4)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 8), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    feed = dict(batch)
    if name == "t5":
        labels = torch.randint(0, vocab, (2, 3), generator=g)  # the traced decoder length
        feed = {"input_ids": ids, "labels": labels}
        batch["decoder_input_ids"] = torch.cat([torch.zeros(2, 1, dtype=torch.long),
                                                labels[:, :-1]], dim=1)
        del batch["attention_mask"]
    torch.save(feed, tmp_path / "in.pt")
    bmt("bmt-run", paths["streamed"], "--dump", tmp_path / "in.pt", tmp_path / "out.pt",
        "--device", "cpu")
    dumped = torch.load(tmp_path / "out.pt", weights_only=False)
    with torch.no_grad():
        want = model(**batch).logits
    assert_close(dumped["logits"], want, what=f"{case}: logits")
