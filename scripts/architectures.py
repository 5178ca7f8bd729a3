#!/usr/bin/env python3
"""Which transformers architectures bmt handles, from .pt2 and from .pt.

usage: scripts/architectures.py [--bin build/bin] [--only NAME ...] [--keep DIR]

For each architecture of issue 6 (tiny random config, eager attention, no
cache, seed 0): export it as a user does, to TorchScript (torch.jit.trace,
strict=False) and to torch.export (torch.export.export(..., strict=False) +
torch.export.save); then for each archive: bmt-opt import (functions, calls
to the layers), bmt-opt compile to sharded.pt, bmt-run --dump on a batch of
the export's shape, and compare logits and every parameter gradient with the
eager model (fp32, max abs difference). Prints a Markdown table (the one in
docs/architectures.md) with the first error line where a step fails.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import warnings

BATCH, SEQ, VOCAB = 2, 8, 128
LLAMA_LIKE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
ARCHS = {
    # name: (model class, model_type, config fields)
    "gpt2": ("GPT2LMHeadModel", "gpt2", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                              n_positions=64, n_inner=64)),
    "llama": ("LlamaForCausalLM", "llama", dict(LLAMA_LIKE, tie_word_embeddings=False)),
    "llama (tied)": ("LlamaForCausalLM", "llama", dict(LLAMA_LIKE, tie_word_embeddings=True)),
    "mistral": ("MistralForCausalLM", "mistral", dict(LLAMA_LIKE)),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", dict(LLAMA_LIKE)),
    "gemma": ("GemmaForCausalLM", "gemma", dict(LLAMA_LIKE, head_dim=8)),
    "bert (masked LM)": ("BertForMaskedLM", "bert", dict(vocab_size=VOCAB, hidden_size=32,
                                                          num_hidden_layers=2, num_attention_heads=4,
                                                          intermediate_size=64,
                                                          max_position_embeddings=64)),
    "opt": ("OPTForCausalLM", "opt", dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                          num_attention_heads=4, ffn_dim=64,
                                          word_embed_proj_dim=32, max_position_embeddings=64)),
    "bloom": ("BloomForCausalLM", "bloom", dict(vocab_size=VOCAB, hidden_size=32, n_layer=2,
                                                n_head=4)),
    "gpt_neox": ("GPTNeoXForCausalLM", "gpt_neox", dict(vocab_size=VOCAB, hidden_size=64,
                                                       num_hidden_layers=2, num_attention_heads=4,
                                                       intermediate_size=128,
                                                       max_position_embeddings=64)),
    "falcon": ("FalconForCausalLM", "falcon", dict(vocab_size=VOCAB, hidden_size=32,
                                                   num_hidden_layers=2, num_attention_heads=4)),
    "phi": ("PhiForCausalLM", "phi", dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          max_position_embeddings=64)),
    "gptj": ("GPTJForCausalLM", "gptj", dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                             rotary_dim=4, n_positions=64)),
    "t5": ("T5ForConditionalGeneration", "t5", dict(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                                                    num_layers=2, num_decoder_layers=2,
                                                    num_heads=4)),
}


def exception_line(e):
    lines = [l for l in str(e).strip().splitlines() if l.strip()]
    return (type(e).__name__ + ": " + (lines[0].strip() if lines else ""))[:240]


def first_line(text):
    lines = [l for l in str(text).strip().splitlines() if l.strip()]
    for l in lines:
        if "error" in l.lower():
            return l.strip()[:240]
    return (lines[-1].strip() if lines else "?")[:240]


def build(name):
    import torch
    import transformers
    cls_name, model_type, fields = ARCHS[name]
    config = transformers.AutoConfig.for_model(model_type, **fields)
    if hasattr(config, "use_cache"):
        config.use_cache = False
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config)
    model.eval()
    return model


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def check(name, archive, model, inputs, tmp, bindir):
    """Import, compile, run; returns the table cells (import, parity)."""
    import torch
    rc, out = run([os.path.join(bindir, "bmt-opt"), archive, "-o", archive + ".mlir"])
    if rc:
        return f"fails: `{first_line(out)}`", "–"
    text = open(archive + ".mlir").read()
    funcs = len(re.findall(r"^\s*func\.func ", text, re.M))
    # Calls of the repeated layers (transformer.h.N, model.layers.N,
    # bert.encoder.layer.N, encoder.block.N), not of their sublayers.
    layer_calls = len(re.findall(
        r"call @(?:[A-Za-z_]+\.)*(?:h|layers|layer|block)\.\d+\.forward\(", text))
    imported = f"{funcs} functions, {layer_calls} layer calls"
    rc, out = run([os.path.join(bindir, "bmt-opt"), archive, "--bmt-find-blocks"])
    lists = re.findall(r"bmt\.block_list @([\w.]+) in @[\w.]+ : \[([^\]]*)\]", out)
    if rc == 0:
        blocks = ", ".join(f"{n} x{len(m.split(','))}" for n, m in lists) or "none"
        imported += f"; find-blocks: {blocks}"
    sharded = archive + ".sharded.pt"
    rc, out = run([os.path.join(bindir, "bmt-opt"), archive, "-o", sharded])
    if rc:
        return imported + f"; compile fails: `{first_line(out)}`", "–"
    if "decoder_input_ids" in inputs:
        return imported + "; compiles", "not run: bmt-run feeds input_ids and attention_mask only"
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    masked = type(model).__name__.endswith("ForMaskedLM")
    if masked:
        labels = torch.full_like(ids, -100)
        labels[:, ::3] = ids[:, ::3]
    else:
        labels = ids
    torch.save({"input_ids": ids, "attention_mask": mask, "labels": labels}, tmp + "/in.pt")
    rc, out = run([os.path.join(bindir, "bmt-run"), sharded, "--dump", tmp + "/in.pt",
                   tmp + "/out.pt", "--device", "cpu"])
    if rc:
        return imported + "; compiles", f"bmt-run fails: `{first_line(out)}`"
    got = torch.load(tmp + "/out.pt", weights_only=False)
    model.zero_grad()
    logits = model(**inputs).logits
    vocab = logits.size(-1)
    if masked:
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1),
                                                 ignore_index=-100)
    else:
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                                                 labels[:, 1:].reshape(-1))
    loss.backward()
    diff = (got["logits"] - logits.detach()).abs().max().item()
    grads = {k[5:]: v for k, v in got.items() if k.startswith("grad/")}
    params = dict(model.named_parameters())
    if set(grads) != set(params):
        return imported + "; compiles", f"gradient names differ: {sorted(set(grads) ^ set(params))[:3]}"
    gdiff = max((grads[k] - p.grad).abs().max().item() for k, p in params.items())
    verdict = "ok" if max(diff, gdiff) <= 1e-5 else "**exceeds 1e-5**"
    return imported + "; compiles", f"{verdict}: logits {diff:.1e}, grads {gdiff:.1e}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin"))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--keep")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    torch.set_num_threads(2)
    rows = []
    for name in args.only or ARCHS:
        tmp = args.keep or tempfile.mkdtemp(prefix="bmt-arch-")
        os.makedirs(tmp, exist_ok=True)
        stem = re.sub(r"\W+", "_", name).strip("_")
        model = build(name)
        g = torch.Generator().manual_seed(1)
        inputs = {"input_ids": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
                  "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long)}
        if ARCHS[name][1] == "t5":
            inputs["decoder_input_ids"] = inputs["input_ids"].clone()
        cells = {}
        # torch.export
        try:
            ep = torch.export.export(model, args=(), kwargs=inputs, strict=False)
            pt2 = os.path.join(tmp, stem + ".pt2")
            torch.export.save(ep, pt2)
            cells["pt2"] = check(name, pt2, model, inputs, tmp, args.bin)
        except Exception as e:  # noqa: BLE001
            cells["pt2"] = (f"torch.export fails: `{exception_line(e)}`", "–")
        # TorchScript
        try:
            with torch.no_grad():
                traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
            pt = os.path.join(tmp, stem + ".pt")
            traced.save(pt)
            cells["pt"] = check(name, pt, model, inputs, tmp, args.bin)
        except Exception as e:  # noqa: BLE001
            cells["pt"] = (f"torch.jit.trace fails: `{exception_line(e)}`", "–")
        row = f"| {name} | {cells['pt2'][0]} | {cells['pt2'][1]} | {cells['pt'][0]} | {cells['pt'][1]} |"
        print(row, flush=True)
        rows.append(row)
    print()
    print("| architecture | .pt2 import | .pt2 parity (fp32) | .pt import | .pt parity (fp32) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(r)


if __name__ == "__main__":
    sys.exit(main())
