"""A ~100 M-parameter Hugging Face checkpoint compiled without holding it
(docs/hf-checkpoints.md): a GPT-2 of 95 M parameters saved with
save_pretrained, exported weight-free, compiled with its 158 MB embedding
group streamed into 64 MiB parts (sharded.pt format 4), trains 3 steps on 2
CPU ranks under torchrun with eager PyTorch's losses (from_pretrained and
torch.optim.AdamW on the same global batches), each rank reading half of
the weights.

Not in the second-kernel run (test/CMakeLists.txt): its comparison is the
one test_zero_multirank.py makes there, and it takes most of a minute (the
CPU collectives move 0.4 GB a step through the TCPStore).
"""
import json
import re

import torch

from numerics import assert_loss_close
from test_streamed_compile import bmt, export_hf, plan_of


def test_a_100m_checkpoint_trains_on_two_ranks_as_eager(tmp_path, capsys):
    """GPT-2 of 95 M parameters (8 layers of 768, vocab 50257): its 158 MB
    embedding group is written in 64 MiB parts; 3 steps on 2 CPU ranks from
    the streamed sharded.pt give eager PyTorch's losses from from_pretrained,
    and each rank reads half of the weights."""
    import transformers
    from eager import eager_training
    from test_zero_multirank import torchrun
    config = transformers.GPT2Config(n_layer=8, n_embd=768, n_head=12, n_positions=64,
                                     vocab_size=50257, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0)
    ckpt = tmp_path / "gpt2-100m"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    assert 90e6 < sum(p.numel() for p in model.parameters()) < 110e6
    model.save_pretrained(ckpt)
    del model
    out = export_hf(capsys, "--checkpoint", ckpt, "--seq-len", 16, "-o", tmp_path / "m.pt")
    assert "weights not copied" in out, out
    sharded = tmp_path / "m.sharded.pt"
    r = bmt("bmt-opt", tmp_path / "m.pt", "-o", sharded, "--world-size", 2, "--zero-stage", 2)
    m = re.search(r"read (\d+) bytes, wrote (\d+) bytes", r.stderr)
    assert m, r.stderr
    plan = plan_of(sharded)
    # Split groups need version 4, the default pipeline's fused regions 5.
    assert plan["version"] == 5 and any(g["parts"] for g in plan["groups"])
    assert any(i[0] == "fused" for f in plan["functions"] for i in f["body"])

    steps, seq = 3, 16
    batches = torch.randint(0, config.vocab_size, (steps, 4, seq + 1),
                            generator=torch.Generator().manual_seed(3))
    torch.save(batches, tmp_path / "batches.pt")
    log = tmp_path / "log.jsonl"
    r = torchrun(2, sharded, "--batches", tmp_path / "batches.pt", "--steps", steps,
                 "--lr", "1e-3", "--schedule", "cosine", "--warmup", 1, "--clip-grad", 0,
                 "--weight-decay", 0.01, "--log-file", log)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = re.search(r"weights (\d+) bytes; bytes read per rank: ([\d ]+)", r.stdout)
    assert m, r.stdout
    total, per_rank = int(m.group(1)), [int(x) for x in m.group(2).split()]
    assert all(b <= total / 2 * 1.01 for b in per_rank), (total, per_rank)

    train = [json.loads(x) for x in open(log) if '"train"' in x]
    assert [x["step"] for x in train] == list(range(1, steps + 1))
    lrs = {x["step"]: x["lr"] for x in train}
    model = transformers.GPT2LMHeadModel.from_pretrained(ckpt, local_files_only=True).eval()
    losses = eager_training(model, batches, steps, 1, lambda s: lrs[s], 0.0, 0.01)
    for x, want in zip(train, losses):
        assert_loss_close(x["loss"], want, what=f"loss of step {x['step']}")
