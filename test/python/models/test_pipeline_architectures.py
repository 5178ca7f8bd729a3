"""Pipeline stages on more architectures than test_pipeline_parallel.py's
GPT-2 and LLaMA: Qwen3 (q/k norms), BERT (an encoder, trained as a causal
LM as scripts/parallel_matrix.py does) and LLaMA untied and with tied
embeddings (embed_tokens on the first chunk read by the LM head on the
last, vocab-split with T = 2), each with 4 layers, at P = 2 x T = 2, P = 4
and P = 2 with ZeRO over D = 2 ranks, 1F1B and interleaved (V = 2; with
T = 2 and sequence parallelism for the tied LLaMA: each TP rank sends its
slice of the sequence to the next chunk), recompute on and off across
them; 5 AdamW steps under torchrun on CPU ranks against eager transformers
(numerics.py's bounds), through parallel_matrix.run_cell. An
encoder-decoder (T5: two block lists) is refused by bmt-opt in one line."""
import os
import sys

import pytest

from bmt_paths import REPO, binary

sys.path.insert(0, os.path.join(REPO, "scripts"))
import parallel_matrix  # noqa: E402

# (architecture, blocks, mode): every model with 4 layers (the fixtures'
# configs have 2; one trace each serves P = 2, P = 4 and P x V = 2 x 2).
# With test_pipeline_parallel.py (GPT-2 at P = 2 on N = 2 and 4, P = 4,
# P = 2 x T = 2; LLaMA at P = 2 and P = 2 x T = 2) and
# test_pipeline_interleaved.py (GPT-2 and LLaMA at P = 2, V = 2), every
# architecture trains at P = 2 x T = 2, at P = 4 and at P = 2 with ZeRO
# over each stage's D = 2 ranks, both schedules and recompute on and off
# spread across them. Run once, not in CI (time): GPT-2 (tied) in
# pp2-v2-tp2-sp-n4 (losses 2e-7, parameters 1e-6) and LLaMA in
# pp2-v2-tp2-n4-no-recompute (7e-7, 1e-6).
CELLS = [
    ("qwen3", 4, "pp2-tp2-n4"),
    ("bert (masked LM)", 4, "pp2-tp2-n4-no-recompute"),
    # interleaved 1F1B with TP: the tied embedding (vocab-split, on chunks
    # 0 and 3) with sequence parallelism
    ("llama (tied)", 4, "pp2-v2-tp2-sp-n4"),
    # P = 4
    ("llama", 4, "pp4-n4"),
    ("llama (tied)", 4, "pp4-n4-no-recompute"),
    ("qwen3", 4, "pp4-n4-no-recompute"),
    ("bert (masked LM)", 4, "pp4-n4"),
    # P = 2 with ZeRO over D = 2 (interleaved for three of them)
    ("llama", 4, "pp2-v2-n4"),
    ("llama (tied)", 4, "pp2-n4-no-recompute"),
    ("qwen3", 4, "pp2-v2-n4"),
    ("bert (masked LM)", 4, "pp2-v2-n4-no-recompute"),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Each (architecture, blocks) traced once for the cells that use it."""
    cache = {}

    def get(name, blocks):
        if (name, blocks) not in cache:
            stem = f"{name.split()[0]}{'-tied' if 'tied' in name else ''}-{blocks}"
            cache[name, blocks] = parallel_matrix.prepare(
                name, tmp_path_factory.mktemp(stem), blocks)
        return cache[name, blocks]
    return get


@pytest.mark.parametrize("name, blocks, mode", CELLS,
                         ids=[f"{n.split()[0]}{'-tied' if 'tied' in n else ''}-{b}-{m}"
                              for n, b, m in CELLS])
def test_pipeline_trains_as_eager(name, blocks, mode, prepared):
    prep = prepared(name, blocks)
    status, text = parallel_matrix.run_cell(prep, mode, os.path.dirname(binary("bmt-opt")))
    print(f"{name} ({blocks} blocks) {mode}: {status} {text}")
    assert status == "ok", text


def test_encoder_decoder_is_refused(tmp_path):
    prep = parallel_matrix.prepare("t5", tmp_path)
    status, text = parallel_matrix.compile_cell(prep, "pp2-n2", os.path.dirname(binary("bmt-opt")))
    assert (status, text) == ("refused", "error: bmt-pipeline-parallel: the model has 2 block lists "
                              "(encoder.block, decoder.block); pipelining more than one (an "
                              "encoder-decoder) is not supported"), text
