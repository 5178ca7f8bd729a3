"""Pipeline stages (bmt-opt --pipeline-parallel P; docs/passes/pipeline.md,
docs/runtime/pipeline.md) on the tiny GPT-2 and LLaMA fixtures: the cut,
each stage's parameter count against the eager model's own parameters (the
embedding on stage 0, the final norm and head on the last, GPT-2's tied
wte on both), the head's FLOPs on the last stage (GPT-2 passes its tied
weight to @lm_head.forward as an argument), the plan's format version, and one error line for what is
refused: P larger than the blocks, P with tensor parallelism, and bmt-run
given a pipelined plan (it does not run the stages yet)."""
import re
import subprocess
import zipfile

import pytest

from bmt_paths import binary
from eager import build, compile_model


def stage_lines(remarks):
    return re.findall(r"stage (\d+): blocks (\d+)\.\.(\d+).*?, (\d+) parameters", remarks)


def error_lines(text):
    return [l[l.index("error:"):].strip() for l in text.splitlines() if "error:" in l]


@pytest.mark.parametrize("name, prefix, before, after", [
    ("gpt2", "transformer.h.", ("transformer.wte.", "transformer.wpe."),
     ("transformer.ln_f.", "transformer.wte.")),
    ("llama", "model.layers.", ("model.embed_tokens.",), ("model.norm.", "lm_head.")),
])
def test_stages_hold_their_parameters(name, prefix, before, after, tmp_path):
    model = build(name)
    sharded = compile_model(model, tmp_path, name,
                            ["--pipeline-parallel", "2", "--world-size", "4"])
    remarks = (tmp_path / f"{name}.remarks").read_text()
    assert re.search(r"pipeline: 2 stages of \S+ over world size 4 \(stage = rank / 2\), 1F1B",
                     remarks), remarks
    # Two blocks, one per stage; the parameters each stage reads, from the
    # eager model's named parameters (a tied weight counts on both stages).
    params = dict(model.named_parameters(remove_duplicate=False))
    def count(prefixes):
        return sum(p.numel() for n, p in params.items() if n.startswith(prefixes))
    want = [count(before + (prefix + "0.",)), count(after + (prefix + "1.",))]
    if name == "llama" and model.config.tie_word_embeddings:
        want[1] -= count(("lm_head.",))  # the tie reads embed_tokens' weight
        want[1] += count(("model.embed_tokens.",))
    got = [(int(s), int(a), int(b), int(n)) for s, a, b, n in stage_lines(remarks)]
    assert got == [(0, 0, 0, want[0]), (1, 1, 1, want[1])], remarks
    tied = "transformer.wte.weight" if name == "gpt2" else None
    if tied:
        assert f"tied across stages 0 and 1 (gradient summed): {tied}" in remarks, remarks
    # The cost model: equal blocks, so the last stage's extra FLOPs are the
    # head's matmul, forward and backward (3 x 2 x V x H per token) over
    # the default micro-batch of 1 x 1024 tokens (the embedding has none).
    r = subprocess.run([binary("bmt-opt"), str(tmp_path / f"{name}.pt"),
                        "--bmt-default-pipeline=pipeline-parallel=2 world-size=4 summary=false"],
                       capture_output=True, text=True, check=True, timeout=300)
    flops = [int(x) for x in re.search(r"flops = array<i64: (\d+), (\d+)>", r.stdout).groups()]
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    assert flops[1] - flops[0] == 6 * vocab * hidden * 1024
    with zipfile.ZipFile(sharded) as z:
        version = [z.read(n) for n in z.namelist() if n.endswith("bmt/version")]
    assert version == [b"bmt-sharded 8\n"]
    # bmt-run: one line, exit status 1, before any rank connects.
    r = subprocess.run([binary("bmt-run"), sharded, "--data", tmp_path / "none.bin", "--steps", "1",
                        "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert error_lines(r.stderr) == [
        f"error: {sharded} is cut into 2 pipeline stages (bmt-opt --pipeline-parallel 2), "
        "which this bmt-run cannot run yet; compile it without --pipeline-parallel"], r.stderr


def test_sizes_the_model_cannot_take_are_refused(tmp_path):
    model = build("llama")
    def refused(*flags):
        r = subprocess.run([binary("bmt-opt"), *flags], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 1, r.stderr
        lines = error_lines(r.stderr)
        assert len(lines) == 1, r.stderr
        return lines[0]
    compile_model(model, tmp_path, "llama")  # the trace, llama.pt
    pt = str(tmp_path / "llama.pt")
    out = str(tmp_path / "refused.sharded.pt")
    assert refused(pt, "-o", out, "--pipeline-parallel", "3", "--world-size", "3") == (
        "error: bmt-pipeline-parallel: pipeline-parallel 3 exceeds the 2 blocks of "
        "model.layers; each stage needs at least one block")
    assert refused(pt, "-o", out, "--pipeline-parallel", "2", "--world-size", "3") == (
        "error: --world-size 3 is not a multiple of --pipeline-parallel 2")
    assert refused(pt, "-o", out, "--pipeline-parallel", "2", "--tensor-parallel", "2",
                   "--world-size", "4") == (
        "error: --pipeline-parallel 2 with --tensor-parallel is not supported yet")
