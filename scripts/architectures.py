#!/usr/bin/env python3
"""Which transformers architectures bmt handles, from .pt2 and from .pt.

usage: scripts/architectures.py [--bin build/bin] [--only NAME ...] [--keep DIR]
                                [--dynamic-only]

For each architecture bmt supports (tiny random config, eager attention, no
cache, seed 0): export it as a user does, to TorchScript (torch.jit.trace,
strict=False) and to torch.export (torch.export.export(..., strict=False) +
torch.export.save); then for each archive: bmt-opt import (functions, calls
to the layers), bmt-opt compile to sharded.pt, bmt-run --dump on a batch of
the export's shape, and compare logits and every parameter gradient with the
eager model (fp32, max abs difference). Prints a Markdown table (the one in
docs/architectures.md) with the first error line where a step fails.

The ".pt2 dynamic" column exports the same model with a dynamic batch and
sequence length, as a user does (dynamic_shapes: a named Dim for each, or
Dim.DYNAMIC for the sequence where torch refuses the named Dim with
"Constraints violated"; strict=False), imports and compiles it the same way,
and runs bmt-run --dump at two shapes other than the export's (DYN_SHAPES),
against the eager model at those shapes. --dynamic-only runs that column
alone.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import warnings

BATCH, SEQ, VOCAB = 2, 8, 128
# Shapes the dynamic export runs at (batch x seq), none of them the export's.
DYN_SHAPES = [(3, 12), (1, 5)]
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
    # Special token ids inside the tiny vocabulary (the defaults are real
    # tokenizers' ids, past 128).
    "qwen3": ("Qwen3ForCausalLM", "qwen3", dict(LLAMA_LIKE, head_dim=8, tie_word_embeddings=False)),
    "qwen3 (tied)": ("Qwen3ForCausalLM", "qwen3", dict(LLAMA_LIKE, head_dim=8,
                                                       tie_word_embeddings=True)),
    # One sliding-window layer (window 4 < the sequence: the band mask is
    # exercised) and one global layer, as Gemma 3 alternates them.
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text", dict(
        LLAMA_LIKE, head_dim=8, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], pad_token_id=0, bos_token_id=2,
        eos_token_id=1)),
    "phi3": ("Phi3ForCausalLM", "phi3", dict(LLAMA_LIKE, pad_token_id=0, bos_token_id=1,
                                             eos_token_id=2)),
    "cohere": ("CohereForCausalLM", "cohere", dict(LLAMA_LIKE, pad_token_id=0, bos_token_id=1,
                                                   eos_token_id=2)),
    # Local attention (window 4) on one layer, global on the other.
    "modernbert (masked LM)": ("ModernBertForMaskedLM", "modernbert", dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=64, local_attention=4,
        global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2)),
    "bart": ("BartForConditionalGeneration", "bart", dict(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2)),
    "olmo2": ("Olmo2ForCausalLM", "olmo2", dict(LLAMA_LIKE, pad_token_id=0, bos_token_id=1,
                                                eos_token_id=2)),
    "granite": ("GraniteForCausalLM", "granite", dict(
        LLAMA_LIKE, embedding_multiplier=12.0, logits_scaling=8.0, residual_multiplier=0.22,
        attention_multiplier=0.125, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
    # NoPE every 4th layer as SmolLM3 does; with 2 layers: one of each.
    "smollm3": ("SmolLM3ForCausalLM", "smollm3", dict(LLAMA_LIKE, no_rope_layers=[1, 0],
                                                      pad_token_id=0, bos_token_id=1,
                                                      eos_token_id=2)),
    "starcoder2": ("Starcoder2ForCausalLM", "starcoder2", dict(LLAMA_LIKE, pad_token_id=0,
                                                               bos_token_id=1, eos_token_id=2)),
    # Mixtures of experts (transformers' grouped_mm experts: top-k router,
    # tokens sorted by expert, one _grouped_mm over the experts' 3-D weights).
    "mixtral": ("MixtralForCausalLM", "mixtral", dict(LLAMA_LIKE, num_local_experts=4,
                                                      num_experts_per_tok=2)),
    # Qwen3's per-head q/k norms, routed experts only.
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe", dict(
        LLAMA_LIKE, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
        tie_word_embeddings=False)),
    # A shared expert beside the routed ones, gated by a sigmoid.
    "qwen2_moe": ("Qwen2MoeForCausalLM", "qwen2_moe", dict(
        LLAMA_LIKE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
        shared_expert_intermediate_size=40)),
    # Attention sinks, a sliding window on every other layer, biased experts
    # with a clamped SwiGLU.
    "gpt_oss": ("GptOssForCausalLM", "gpt_oss", dict(LLAMA_LIKE, num_local_experts=4,
                                                     num_experts_per_tok=2, head_dim=8,
                                                     sliding_window=4)),
    # Multi-head latent attention (low-rank q and kv projections, a rotary
    # part of each head apart), one dense layer before the MoE ones, a
    # sigmoid router with group-limited top-k (the best topk_group of n_group
    # groups, the rest masked with -inf) and a shared expert.
    "deepseek_v3": ("DeepseekV3ForCausalLM", "deepseek_v3", dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8,
        qk_nope_head_dim=8, v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
        topk_group=1, n_shared_experts=1, num_mtp_layers=0, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}

# Encoder-decoders: run by teacher forcing on a target of their own.
SEQ2SEQ = {"t5", "bart"}

# Short names of ARCHS (file stems and command-line names of bench/make_parity_plans.py and
# bench/gpu_parity.py); an architecture not listed here is its own short name.
SHORT_NAMES = {"llama (tied)": "llama_tied", "bert (masked LM)": "bert", "qwen3 (tied)": "qwen3_tied",
               "modernbert (masked LM)": "modernbert"}


def short_name(arch):
    return SHORT_NAMES.get(arch, arch)


def arch_of(short):
    """The ARCHS key whose short name is `short` (KeyError if none)."""
    for arch in ARCHS:
        if short_name(arch) == short:
            return arch
    raise KeyError(short)


def exception_line(e):
    lines = [l for l in str(e).strip().splitlines() if l.strip()]
    return (type(e).__name__ + ": " + (lines[0].strip() if lines else ""))[:240]


def first_line(text):
    lines = [l for l in str(text).strip().splitlines() if l.strip()]
    for l in lines:
        if "error" in l.lower():
            return l.strip()[:240]
    return (lines[-1].strip() if lines else "?")[:240]


def build(name, blocks=None):
    """The tiny model `name` (seed 0, eval mode); `blocks` layers instead of
    its config's (pipelines of more stages than the fixtures' 2 layers)."""
    import torch
    import transformers
    cls_name, model_type, fields = ARCHS[name]
    if blocks is not None:
        key = "n_layer" if "n_layer" in fields else "num_hidden_layers"
        fields = dict(fields, **{key: blocks})
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


def check(name, archive, model, inputs, tmp, bindir, runs=None):
    """Import, compile, run; returns the table cells (import, parity).

    runs: the batches to run (input dicts); the export's own inputs unless
    given (a dynamic export runs at other shapes)."""
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
    worst, shapes = (0.0, 0.0), []
    for batch in runs or [inputs]:
        result = run_and_compare(model, sharded, batch, tmp, bindir)
        if isinstance(result, str):
            return imported + "; compiles", result
        worst = tuple(max(a, b) for a, b in zip(worst, result))
        shape = "x".join(str(d) for d in batch["input_ids"].shape)
        if "decoder_input_ids" in batch:
            shape += f"→{batch['decoder_input_ids'].shape[1]}"
        shapes.append(shape)
    diff, gdiff = worst
    verdict = "ok" if max(diff, gdiff) <= 1e-5 else "**exceeds 1e-5**"
    at = f" at {', '.join(shapes)}" if runs else ""
    return imported + "; compiles", f"{verdict}{at}: logits {diff:.1e}, grads {gdiff:.1e}"


def run_and_compare(model, sharded, inputs, tmp, bindir):
    """bmt-run --dump on one batch against the eager model: (logits
    difference, largest gradient difference), or the failure as a string."""
    import torch
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    masked = type(model).__name__.endswith("ForMaskedLM")
    seq2seq = "decoder_input_ids" in inputs  # T5: the target, by teacher forcing
    batch = {"input_ids": ids, "attention_mask": mask}
    if masked:
        labels = torch.full_like(ids, -100)
        labels[:, ::3] = ids[:, ::3]
    elif seq2seq:
        decoder = inputs["decoder_input_ids"]
        labels = torch.cat([decoder[:, 1:], torch.ones_like(decoder[:, :1])], dim=1)
        batch["decoder_input_ids"] = decoder
    else:
        labels = ids
    batch["labels"] = labels
    torch.save(batch, tmp + "/in.pt")
    rc, out = run([os.path.join(bindir, "bmt-run"), sharded, "--dump", tmp + "/in.pt",
                   tmp + "/out.pt", "--device", "cpu"])
    if rc:
        return f"bmt-run fails: `{first_line(out)}`"
    got = torch.load(tmp + "/out.pt", weights_only=False)
    model.zero_grad()
    logits = model(**inputs).logits
    vocab = logits.size(-1)
    if masked or seq2seq:
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1),
                                                 ignore_index=-100)
    else:
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab),
                                                 labels[:, 1:].reshape(-1))
    loss.backward()
    if got["logits"].shape != logits.shape:
        return (f"wrong logits shape {list(got['logits'].shape)} "
                f"(eager: {list(logits.shape)})")
    diff = (got["logits"] - logits.detach()).abs().max().item()
    grads = {k[5:]: v for k, v in got.items() if k.startswith("grad/")}
    params = dict(model.named_parameters())
    if set(grads) != set(params):
        return f"gradient names differ: {sorted(set(grads) ^ set(params))[:3]}"
    gdiff = max((grads[k] - p.grad).abs().max().item() for k, p in params.items())
    return diff, gdiff


def export_dynamic(model, inputs):
    """torch.export with dim 0 of every input the batch and dim 1 the
    sequence, as a user writes it: named Dims; where torch refuses the named
    sequence Dim ("Constraints violated (seq)": it cannot prove a guard of
    the model's over the declared range), Dim.DYNAMIC for the sequence.
    Returns (ExportedProgram, how the sequence was declared)."""
    import torch
    Dim = torch.export.Dim

    def export(seq):
        # An encoder-decoder's target has a length of its own.
        shapes = {k: {0: Dim("batch", min=1, max=64),
                      1: Dim("target", min=2, max=64) if k == "decoder_input_ids" else seq}
                  for k in inputs}
        return torch.export.export(model, args=(), kwargs=inputs, dynamic_shapes=shapes,
                                   strict=False)
    try:
        return export(Dim("seq", min=2, max=64)), "named Dims"
    except Exception as e:  # noqa: BLE001
        if "Constraints violated" not in str(e):
            raise
        return export(Dim.DYNAMIC), "seq Dim.DYNAMIC (a named seq Dim: Constraints violated)"


def dynamic_batches(inputs):
    """The inputs at DYN_SHAPES: random ids, all-ones attention mask."""
    import torch
    g = torch.Generator().manual_seed(2)
    out = []
    for b, s in DYN_SHAPES:
        batch = {"input_ids": torch.randint(0, VOCAB, (b, s), generator=g),
                 "attention_mask": torch.ones(b, s, dtype=torch.long)}
        if "decoder_input_ids" in inputs:  # a shorter target (T5)
            batch["decoder_input_ids"] = torch.randint(0, VOCAB, (b, s - 2), generator=g)
        out.append(batch)
    return out

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(os.path.dirname(__file__), "..", "build", "bin"))
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--keep")
    ap.add_argument("--dynamic-only", action="store_true",
                    help="the .pt2 dynamic column only")
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
        if ARCHS[name][1] in SEQ2SEQ:  # teacher forcing: a 5-token target shifted right
            inputs["decoder_input_ids"] = torch.randint(0, VOCAB, (BATCH, 5), generator=g)
            inputs["decoder_input_ids"][:, 0] = 0
        cells = {}
        if not args.dynamic_only:
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
        # torch.export with a dynamic batch and sequence length
        try:
            ep, declared = export_dynamic(model, inputs)
            pt2 = os.path.join(tmp, stem + "-dyn.pt2")
            torch.export.save(ep, pt2)
            imported, parity = check(name, pt2, model, inputs, tmp, args.bin,
                                     runs=dynamic_batches(inputs))
            cells["dyn"] = (f"{declared}; {imported}", parity)
        except Exception as e:  # noqa: BLE001
            cells["dyn"] = (f"torch.export fails: `{exception_line(e)}`", "–")
        if args.dynamic_only:
            row = f"| {name} | {cells['dyn'][0]} | {cells['dyn'][1]} |"
        else:
            row = (f"| {name} | {cells['pt2'][0]} | {cells['pt2'][1]} | {cells['pt'][0]} | "
                   f"{cells['pt'][1]} | {cells['dyn'][0]} | {cells['dyn'][1]} |")
        print(row, flush=True)
        rows.append(row)
    print()
    if args.dynamic_only:
        print("| architecture | .pt2 dynamic import | .pt2 dynamic parity (fp32) |")
        print("|---|---|---|")
    else:
        print("| architecture | .pt2 import | .pt2 parity (fp32) | .pt import | .pt parity (fp32) "
              "| .pt2 dynamic import | .pt2 dynamic parity (fp32) |")
        print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(r)
    return 0

if __name__ == "__main__":
    sys.exit(main())
