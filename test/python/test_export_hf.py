"""bmt-export-hf writes .pt2 too: BLOOM, which torch.jit.trace cannot
handle, exported to torch.export, compiled with bmt-opt and run by bmt-run
gives the logits and loss of the same model in eager PyTorch (1e-5).
"""
import os
import subprocess

import torch

from bmt_paths import REPO, binary


def test_bloom_pt2_round_trip(tmp_path):
    pt2, sharded = tmp_path / "bloom.pt2", tmp_path / "bloom.sharded.pt"
    r = subprocess.run([os.path.join(REPO, "tools", "bin", "bmt-export-hf"), "--config", "bloom",
                        "--set", "n_layer=2", "--set", "hidden_size=32", "--set", "n_head=4",
                        "--set", "vocab_size=200", "--batch", "2", "--seq-len", "8",
                        "-o", str(pt2)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([binary("bmt-opt"), str(pt2), "--bmt-find-blocks", "-o", str(sharded)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "2 blocks in transformer.h" in r.stderr

    ids = torch.randint(0, 200, (2, 8), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    torch.save({"input_ids": ids, "attention_mask": mask}, tmp_path / "in.pt")
    r = subprocess.run([binary("bmt-run"), str(sharded), "--dump", str(tmp_path / "in.pt"),
                        str(tmp_path / "out.pt"), "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "out.pt", weights_only=False)

    # The reference: the same model built in eager PyTorch the way
    # bmt-export-hf builds it (config from the architecture, seed 0).
    import transformers
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("bloom", n_layer=2, hidden_size=32, n_head=4,
                                               vocab_size=200)
    model = transformers.BloomForCausalLM(config).eval()
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 200), ids[:, 1:].reshape(-1))
    assert (got["logits"] - logits).abs().max().item() <= 1e-5
    assert abs(got["loss"].item() - loss.item()) <= 1e-5
