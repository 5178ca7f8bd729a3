"""Pipeline stages (bmt-opt --pipeline-parallel 2, alone and with
--tensor-parallel 2: P x T x D = 2 x 2 x 1) on more architectures than
test_pipeline_parallel.py's GPT-2 and LLaMA: Qwen3 (q/k norms), BERT (an
encoder, trained as a causal LM as scripts/parallel_matrix.py does) and
LLaMA with tied embeddings (embed_tokens on stage 0 read by the LM head on
stage 1, vocab-split) with sequence parallelism (each TP rank sends its
slice of the sequence to the next stage), recompute on and off across them; 5 AdamW steps under torchrun on
CPU ranks against eager transformers (numerics.py's bounds), through
parallel_matrix.run_cell. An encoder-decoder (T5: two block lists) is
refused by bmt-opt in one line."""
import os
import sys

import pytest

from bmt_paths import REPO, binary

sys.path.insert(0, os.path.join(REPO, "scripts"))
import parallel_matrix  # noqa: E402

CELLS = [
    ("qwen3", "pp2-tp2-n4"),
    ("bert (masked LM)", "pp2-tp2-n4-no-recompute"),
    ("llama (tied)", "pp2-tp2-sp-n4"),
]


@pytest.mark.parametrize("name, mode", CELLS, ids=[f"{n.split()[0]}{'-tied' if 'tied' in n else ''}-{m}"
                                                   for n, m in CELLS])
def test_pipeline_trains_as_eager(name, mode, tmp_path):
    prep = parallel_matrix.prepare(name, tmp_path)
    status, text = parallel_matrix.run_cell(prep, mode, os.path.dirname(binary("bmt-opt")))
    print(f"{name} {mode}: {status} {text}")
    assert status == "ok", text


def test_encoder_decoder_is_refused(tmp_path):
    prep = parallel_matrix.prepare("t5", tmp_path)
    status, text = parallel_matrix.compile_cell(prep, "pp2-n2", os.path.dirname(binary("bmt-opt")))
    assert (status, text) == ("refused", "error: bmt-pipeline-parallel: the model has 2 block lists "
                              "(encoder.block, decoder.block); pipelining more than one (an "
                              "encoder-decoder) is not supported"), text
