"""bmt-export-hf writes .pt2 too: BLOOM, which torch.jit.trace cannot
handle, exported to torch.export, compiled with bmt-opt and run by bmt-run
gives the logits and loss of the same model in eager PyTorch (numerics.py's tolerances).
"""
import subprocess

import torch

from bmt_paths import binary, tool
from numerics import assert_close, assert_loss_close


def test_bloom_pt2_round_trip(tmp_path):
    pt2, sharded = tmp_path / "bloom.pt2", tmp_path / "bloom.sharded.pt"
    r = subprocess.run([*tool("bmt-export-hf"), "--config", "bloom",
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
    assert_close(got["logits"], logits, what="logits")
    assert_loss_close(got["loss"].item(), loss.item())


def test_t5_pt2_trains_at_the_exported_shapes(tmp_path):
    """A T5 .pt2 from bmt-export-hf is fixed to its example's shapes; its
    decoder length is the one bmt-run's span corruption gives --seq-len, so
    the two tools agree without the user computing it. --dump with labels
    gives eager T5's logits and loss (teacher forcing)."""
    import json
    import numpy as np
    pt2, sharded = tmp_path / "t5.pt2", tmp_path / "t5.sharded.pt"
    sets = ["num_layers=2", "d_model=32", "d_kv=8", "d_ff=64", "num_heads=4", "vocab_size=160"]
    r = subprocess.run([*tool("bmt-export-hf"), "--config", "t5",
                        *[x for kv in sets for x in ("--set", kv)], "--batch", "2",
                        "--seq-len", "24", "-o", str(pt2)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # 26-token windows: 4 noise tokens in 1 span; target 4 + 1 + EOS.
    assert "decoder input 2 x 6" in r.stdout, r.stdout
    r = subprocess.run([binary("bmt-opt"), str(pt2), "-o", str(sharded)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    # Training data: ids < 128, the top ids are free for sentinels.
    np.asarray([5 + i % 40 for i in range(4000)], dtype=np.uint16).tofile(tmp_path / "d.bin")
    json.dump({"format": "bmt-tokens", "version": 1, "dtype": "uint16", "num_tokens": 4000,
               "vocab_size": 128, "eos_id": 1, "mask_id": None, "pad_id": 0},
              open(tmp_path / "d.json", "w"))
    r = subprocess.run([binary("bmt-run"), str(sharded), "--data", str(tmp_path / "d.bin"),
                        "--steps", "2", "--micro-batch", "2", "--seq-len", "24", "--device", "cpu"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "encoder input 24 + target 6 tokens" in r.stdout, r.stdout

    import transformers
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model("t5", num_layers=2, d_model=32, d_kv=8, d_ff=64,
                                               num_heads=4, vocab_size=160)
    model = transformers.T5ForConditionalGeneration(config).eval()
    g = torch.Generator().manual_seed(4)
    ids, labels = torch.randint(0, 160, (2, 24), generator=g), torch.randint(0, 160, (2, 6), generator=g)
    torch.save({"input_ids": ids, "labels": labels}, tmp_path / "in.pt")
    r = subprocess.run([binary("bmt-run"), str(sharded), "--dump", str(tmp_path / "in.pt"),
                        str(tmp_path / "out.pt"), "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "out.pt", weights_only=False)
    decoder = torch.cat([torch.zeros(2, 1, dtype=torch.long), labels[:, :-1]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, decoder_input_ids=decoder).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 160), labels.reshape(-1))
    assert_close(got["logits"], logits, what="logits")
    assert_loss_close(got["loss"].item(), loss.item())


def test_seq_len_beyond_rope_positions_is_refused(tmp_path):
    """A RoPE model (LLaMA) runs at any length, so the forward cannot find a
    --seq-len beyond its positions: bmt-run reads max_position_embeddings
    from the config.json that sharded.pt carries and refuses before step 1."""
    pt, sharded = tmp_path / "llama.pt", tmp_path / "llama.sharded.pt"
    r = subprocess.run([*tool("bmt-export-hf"), "--config", "llama", "--set", "num_hidden_layers=1",
                        "--set", "hidden_size=32", "--set", "intermediate_size=64",
                        "--set", "num_attention_heads=4", "--set", "num_key_value_heads=4",
                        "--set", "vocab_size=100", "--set", "max_position_embeddings=16",
                        "--batch", "2", "--seq-len", "8", "-o", str(pt)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([binary("bmt-opt"), str(pt), "-o", str(sharded)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    torch.save(torch.randint(0, 100, (1, 2, 33), generator=torch.Generator().manual_seed(0)),
               tmp_path / "b.pt")
    run = lambda *args: subprocess.run([binary("bmt-run"), str(sharded), "--batches",
                                        str(tmp_path / "b.pt"), "--steps", "1", "--device", "cpu",
                                        *args], capture_output=True, text=True)
    r = run()
    errors = [x for x in r.stderr.splitlines() if x.startswith("error:")]
    assert r.returncode == 1 and errors == [
        f"error: {tmp_path}/b.pt: sequences of 32 tokens, but {sharded}'s model has 16 positions "
        "(max_position_embeddings in its config.json); lower --seq-len, or export the model with "
        "more positions"], r.stderr
    torch.save(torch.randint(0, 100, (1, 2, 17), generator=torch.Generator().manual_seed(0)),
               tmp_path / "b.pt")
    r = run()
    assert r.returncode == 0, r.stderr


def test_ctrl_c_is_one_line_and_leaves_no_output(tmp_path):
    """SIGINT (Ctrl-C) while bmt-export-hf works: status 130, one error
    line, no traceback, no output. A transformers that waits inside its
    import holds the run there."""
    import signal
    from stalled import signal_when_stalled, stalled_module
    env, marker = stalled_module(tmp_path, "transformers")
    out = tmp_path / "m.pt"
    status, stderr = signal_when_stalled(tool("bmt-export-hf") + ["--config", "gpt2", "-o", out],
                                         env, marker, signal.SIGINT)
    assert status == 130, stderr
    assert stderr.strip().splitlines() == ["error: stopped by SIGINT; no output written"], stderr
    assert not out.exists()


def test_set_takes_what_the_model_reads_and_refuses_a_typo(tmp_path, capsys):
    """--set of a field the config class lacks but the modeling code reads
    (Qwen3-MoE's head_dim, read with getattr) reaches the model: q_proj has
    heads x head_dim rows. A field nobody reads is one error line."""
    import pytest
    from bmt import export_hf
    small = ["--config", "qwen3_moe", "--set", "num_hidden_layers=1", "--set", "hidden_size=32",
             "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2",
             "--set", "num_experts=4", "--set", "num_experts_per_tok=2",
             "--set", "moe_intermediate_size=16", "--set", "vocab_size=64"]
    out = tmp_path / "m.pt"
    assert export_hf.main(small + ["--set", "head_dim=16", "-o", str(out)]) == 0
    weights = torch.jit.load(str(out)).state_dict()
    assert tuple(weights["model.layers.0.self_attn.q_proj.weight"].shape) == (4 * 16, 32)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        export_hf.main(small + ["--set", "head_dimm=16", "-o", str(tmp_path / "n.pt")])
    assert stop.value.code == 1
    assert capsys.readouterr().err.strip() == "error: config of qwen3_moe has no field 'head_dimm'"
