"""bmt-causal-attention end to end: SDPA models compiled with the default
pipeline run is_causal=True attention and match eager transformers.

transformers 5 gives every SDPA call of a traced or exported model an
explicit boolean mask (kv <= q, ANDed with attention_mask); the default
pipeline proves it causal, assuming attention_mask all ones (what bmt-run
trains with), and rewrites the calls to attn_mask=None, is_causal=True.
For the tiny GPT-2 and LLaMA of test_runtime_parity.py built with
attn_implementation="sdpa", traced (.pt) and exported (.pt2): bmt-run --dump
on all-ones masks gives the eager model's logits, loss and every parameter
gradient within numerics.py's tolerances (fp32, CPU); the plan records the assumption (format
version 3, or 5 with the default pipeline's fused regions, which these plans have) and --dump
refuses a padded mask with one error. With
--assume-unpadded=false the padding term stays and a padded batch matches
eager too. OPT traced without attention_mask needs no assumption at all.
Compile-only checks show what the pass does to the other architectures.
"""
import os
import subprocess
import sys
import warnings
import zipfile

import pytest
import torch

from bmt_paths import REPO, binary
from numerics import assert_close, assert_gradients_close, assert_loss_close
from eager import causal_loss, check_dump_against_eager

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import make_fixtures  # noqa: E402  (the tiny model configs)

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

MADE_CAUSAL = "2 of 2 aten::scaled_dot_product_attention with an attn_mask made causal"
ASSUMED = "assuming attention_mask all ones"


def build_sdpa(name):
    """The fixture model with SDPA attention (seed 0, eval mode)."""
    import transformers
    cls, config = make_fixtures.MODELS[name](transformers)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return cls(config).eval()


def build_arch(name, **overrides):
    """A model of scripts/architectures.py's table with SDPA attention."""
    import architectures
    import transformers
    cls_name, model_type, fields = architectures.ARCHS[name]
    config = transformers.AutoConfig.for_model(model_type, **dict(fields, **overrides))
    config.use_cache = False
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return getattr(transformers, cls_name)(config).eval()


def save_model(model, path, inputs):
    """Traces (.pt) or exports (.pt2) `model` with `inputs`, as a user does."""
    if path.endswith(".pt2"):
        ep = torch.export.export(model, args=(), kwargs=inputs, strict=False)
        torch.export.save(ep, path)
    else:
        with torch.no_grad():
            torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(path)


def bmt_opt(*args):
    result = subprocess.run([binary("bmt-opt"), *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stderr


def plan_of(sharded):
    """The plan record of a sharded.pt (a torch.save'd dict) and its version line."""
    with zipfile.ZipFile(sharded) as z:
        names = z.namelist()
        version = z.read(next(n for n in names if n.endswith("bmt/version"))).decode()
        program = z.read(next(n for n in names if n.endswith("bmt/program.mlir"))).decode()
        with z.open(next(n for n in names if n.endswith("bmt/plan.pkl"))) as f:
            import io
            plan = torch.load(io.BytesIO(f.read()), weights_only=False)
    return plan, version.strip(), program


def compile_sdpa(name, fmt, tmp_path, *flags, batch=2, seq=8):
    """The SDPA model `name` saved as `fmt` with an all-ones mask and
    compiled by the default pipeline; returns (model, sharded, stderr)."""
    model = build_sdpa(name)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq),
                        generator=torch.Generator().manual_seed(1))
    path = str(tmp_path / f"{name}.{fmt}")
    save_model(model, path, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    sharded = str(tmp_path / f"{name}.sharded.pt")
    return model, sharded, bmt_opt(path, "-o", sharded, *flags)


def plain_plan_of(tmp_path, name, fmt, *flags):
    """The plan of compile_sdpa's saved model compiled without the
    elementwise fusion (--fuse-elementwise=false): the oldest format version
    that holds it."""
    sharded = str(tmp_path / f"{name}.plain.sharded.pt")
    err = bmt_opt(str(tmp_path / f"{name}.{fmt}"), "-o", sharded, "--fuse-elementwise=false", *flags)
    assert "bmt-fuse-elementwise" not in err, err
    return plan_of(sharded)


def run_dump(sharded, tmp_path, ids, mask, labels=None):
    torch.save({"input_ids": ids, "attention_mask": mask,
                "labels": ids if labels is None else labels}, tmp_path / "in.pt")
    return subprocess.run([binary("bmt-run"), sharded, "--dump", str(tmp_path / "in.pt"),
                           str(tmp_path / "out.pt"), "--device", "cpu"],
                          capture_output=True, text=True)


@pytest.mark.parametrize("fmt", ["pt", "pt2"])
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_causal_sdpa_matches_eager(name, fmt, tmp_path):
    # The .pt2 export is static: trace it at the shape --dump runs; the
    # trace runs at another shape than its example's.
    batch, seq = (3, 12) if fmt == "pt2" else (2, 8)
    model, sharded, err = compile_sdpa(name, fmt, tmp_path, batch=batch, seq=seq)
    assert MADE_CAUSAL in err and ASSUMED in err, err
    plan, version, program = plan_of(sharded)
    assert version == "bmt-sharded 5" and plan["version"] == 5  # fused instructions
    assert plan["assumptions"] == ["attention_mask all ones"]
    plain, plain_version, _ = plain_plan_of(tmp_path, name, fmt)
    assert plain_version == "bmt-sharded 3" and plain["version"] == 3
    assert plain["assumptions"] == ["attention_mask all ones"]
    assert program.count('"aten::scaled_dot_product_attention"') == 2
    assert "bmt.assumptions = [\"attention_mask all ones\"]" in program
    # Every call is causal, without a mask operand; no mask is built.
    for line in program.splitlines():
        if "aten::scaled_dot_product_attention" in line:
            assert "#bmt.none, 0.000000e+00, true," in line, line
    assert "aten::le.Tensor" not in program

    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (3, 12), generator=g)
    check_dump_against_eager(model, sharded, tmp_path, ids, g)


def test_padded_mask_is_refused(tmp_path):
    model, sharded, _ = compile_sdpa("gpt2", "pt", tmp_path)
    ids = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0  # right padding
    result = run_dump(sharded, tmp_path, ids, mask)
    assert result.returncode == 1
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "attention_mask has 2 of 12 entries that are not 1 (padding)" in errors[0]
    assert "compiled assuming attention_mask all ones" in errors[0]
    assert "--assume-unpadded=false" in errors[0]
    assert not (tmp_path / "out.pt").exists()
    # Another shape than input_ids' is refused the same way.
    result = run_dump(sharded, tmp_path, ids, torch.ones(2, 5, dtype=torch.long))
    assert result.returncode == 1
    assert "attention_mask has shape [2, 5], not input_ids' [2, 6]" in result.stderr
    # A plan assuming something this bmt-run does not know is refused whole.
    unknown = str(tmp_path / "unknown.sharded.pt")
    with zipfile.ZipFile(sharded) as zin, zipfile.ZipFile(unknown, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("bmt/plan.pkl"):
                data = data.replace(b"attention_mask all ones", b"attention_mask all twos")
            zout.writestr(info.filename, data)
    result = run_dump(unknown, tmp_path, ids, torch.ones_like(ids))
    assert result.returncode == 1
    assert "unknown assumption 'attention_mask all twos'" in result.stderr, result.stderr


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_assume_unpadded_false_keeps_the_padding(name, tmp_path):
    model, sharded, err = compile_sdpa(name, "pt", tmp_path, "--assume-unpadded=false")
    assert ("0 of 2 aten::scaled_dot_product_attention with an attn_mask made causal "
            "(attn_mask=None, is_causal=True); left alone: 2 (the mask reads attention_mask "
            "(padding) and assume-unpadded is off)") in err, err
    plan, version, _ = plan_of(sharded)
    assert version == "bmt-sharded 5" and plan["version"] == 5 and not plan.get("assumptions")
    plain, plain_version, _ = plain_plan_of(tmp_path, name, "pt", "--assume-unpadded=false")
    assert plain_version == "bmt-sharded 2" and plain["version"] == 2 and "assumptions" not in plain

    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, model.config.vocab_size, (3, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[0, 9:] = 0  # right padding: every query keeps a key
    mask[2, 5:] = 0
    result = run_dump(sharded, tmp_path, ids, mask)
    assert result.returncode == 0, result.stderr
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    logits = model(input_ids=ids, attention_mask=mask).logits
    loss = causal_loss(logits, ids)
    loss.backward()
    assert_close(got["logits"], logits, what="logits")
    assert_loss_close(got["loss"].item(), loss.item())
    assert_gradients_close({n: got["grad/" + n] for n, _ in model.named_parameters()},
                           {n: p.grad for n, p in model.named_parameters()})


def test_causal_without_attention_mask_needs_no_assumption(tmp_path):
    """OPT traced without attention_mask builds its mask from ones: causal
    for every input, so the plan assumes nothing."""
    model = build_sdpa("opt")
    ids = torch.randint(0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    pt, sharded = str(tmp_path / "opt.pt"), str(tmp_path / "opt.sharded.pt")
    save_model(model, pt, {"input_ids": ids})
    err = bmt_opt(pt, "-o", sharded)
    assert MADE_CAUSAL in err and ASSUMED not in err, err
    plan, version, _ = plan_of(sharded)
    assert version == "bmt-sharded 5" and not plan.get("assumptions")
    plain, plain_version, _ = plain_plan_of(tmp_path, "opt", "pt")
    assert plain_version == "bmt-sharded 2" and "assumptions" not in plain
    g = torch.Generator().manual_seed(2)
    check_dump_against_eager(model, sharded, tmp_path,
                             torch.randint(0, model.config.vocab_size, (3, 12), generator=g), g)


# What the pass does to the other architectures' SDPA masks (compile only;
# scripts/architectures.py's tiny configs, traced and exported with an
# all-ones attention_mask at 2 x 8).
ARCH_CASES = [
    ("qwen2", {}, "pt", MADE_CAUSAL),
    ("gemma", {}, "pt", MADE_CAUSAL),  # scaled embeddings: the length through x * scale
    ("phi", {}, "pt2", MADE_CAUSAL),
    ("gpt_neox", {}, "pt2", MADE_CAUSAL),
    ("falcon", {}, "pt", MADE_CAUSAL),
    # Mistral's sliding window (4096) adds kv > q - 4096: vacuous only when
    # the length is a known constant <= 4096 (a static export), not in a trace.
    ("mistral", {}, "pt2", MADE_CAUSAL),
    ("mistral", {}, "pt", "left alone: 2 (the mask also bounds kv - q from below (a sliding window))"),
    ("mistral", {"sliding_window": 4}, "pt2",
     "left alone: 2 (the mask also bounds kv - q from below (a sliding window))"),
    # Bidirectional: no kv <= q, nothing to do.
    ("bert (masked LM)", {}, "pt", "left alone: 2 (the mask is not kv <= q)"),
]


@pytest.mark.parametrize("name,overrides,fmt,expect", ARCH_CASES,
                         ids=[f"{c[0].split()[0]}-{c[2]}{'-sw4' if c[1] else ''}" for c in ARCH_CASES])
def test_architectures(name, overrides, fmt, expect, tmp_path):
    import architectures
    model = build_arch(name, **overrides)
    ids = torch.randint(0, architectures.VOCAB, (architectures.BATCH, architectures.SEQ),
                        generator=torch.Generator().manual_seed(1))
    path = str(tmp_path / f"model.{fmt}")
    save_model(model, path, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    err = bmt_opt(path, "--bmt-causal-attention=assume-unpadded=true", "-o", os.devnull)
    assert expect in err, err
