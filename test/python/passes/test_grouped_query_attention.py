"""bmt-grouped-query-attention end to end: the tiny LLaMA of
test_runtime_parity.py (4 query heads on 2 key/value heads) with SDPA
attention, traced (.pt) and exported (.pt2), compiled with
grouped-query-attention=true: every SDPA call reads the kv heads with
enable_gqa=True, no repeat_kv copy is left in the program, and bmt-run
--dump gives the eager model's logits, loss and every parameter gradient
within numerics.py's tolerances (fp32, CPU). The pass's matching rules and
the calls it leaves alone are lit-tested (test/Passes/grouped-query-attention.mlir).
"""
import re

import pytest
import torch

from test_causal_attention import compile_sdpa, plan_of
from eager import check_dump_against_eager

OPTION = "--bmt-default-pipeline=grouped-query-attention=true"


@pytest.mark.parametrize("fmt", ["pt", "pt2"])
def test_gqa_sdpa_matches_eager(fmt, tmp_path):
    batch, seq = (3, 12) if fmt == "pt2" else (2, 8)
    model, sharded, err = compile_sdpa("llama", fmt, tmp_path, OPTION, batch=batch, seq=seq)
    assert model.config.num_attention_heads == 2 * model.config.num_key_value_heads
    assert "bmt-grouped-query-attention: 2 aten::scaled_dot_product_attention calls read the " \
           "key/value heads with enable_gqa=True" in err, err
    _, _, program = plan_of(sharded)
    calls = [l for l in program.splitlines() if "aten::scaled_dot_product_attention" in l]
    assert len(calls) == 2 and all("e-01, true) :" in l or ", true) :" in l for l in calls), calls
    # repeat_kv's expand to [b, kv, n, s, d] is gone (the rotary
    # embedding's expands stay).
    expands = re.findall(r'"aten::expand"\(%[\w#]+, \[([^\]]*)\]', program)
    assert expands and not [e for e in expands if e.count(",") == 4], expands

    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (3, 12), generator=g)
    check_dump_against_eager(model, sharded, tmp_path, ids, g)
