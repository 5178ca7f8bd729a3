"""Make the Qwen3-MoE-shaped model of bench/RESULTS.md as a small TorchScript file.

Hugging Face Qwen3-MoE architecture: 16 layers, hidden 1536, 12 heads of 128
(4 key/value heads), 32 experts of FFN 1024 in every layer, top 4 (weights
not renormalised, as Qwen3-MoE's default), vocab 151936, untied: 2.98 B
parameters, 0.87 B active a token. As bench/make_llama_1b.py does, the model
is built on the meta device, every parameter becomes a zero-stride view of
one element (the 3-D expert weights: of one expert's matrix, at an offset of
their own, as aten::_grouped_mm checks the inner strides and the importer
tells parameters apart by storage offset) and the rotary inverse frequencies
are computed for real; the experts are transformers' grouped_mm implementation (one aten::_grouped_mm
per projection), which a trace records for every shape. Compile with
`bmt-opt qwen3-moe.pt -o qwen3-moe.sharded.pt --random-init`.

usage: python3 bench/make_qwen3_moe.py OUT.pt [--layers N] [--experts X] [--hidden H]
           [--dtype bfloat16]

--experts scales the model to more GPUs (bench/gpu_speed.py --gpus N with
expert parallelism); --hidden (heads of 128, a third of them key/value heads)
and a small --vocab make tiny models for dry runs on CPU ranks.
"""
import argparse
import warnings

import torch


def config(layers=16, vocab=151936, experts=32, hidden=1536):
    import transformers
    heads = max(hidden // 128, 1)
    c = transformers.Qwen3MoeConfig(
        num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        num_key_value_heads=max(heads // 3, 1), head_dim=min(128, hidden),
        intermediate_size=4096 * hidden // 1536,  # (not used: every layer is MoE)
        moe_intermediate_size=max(8, 1024 * hidden // 1536 // 8 * 8),  # 16-byte strides
        num_experts=experts,
        num_experts_per_tok=4, vocab_size=vocab, max_position_embeddings=1024,
        tie_word_embeddings=False, attention_dropout=0.0, use_cache=False)
    c._experts_implementation = "grouped_mm"
    return c


def active_parameters(model, cfg):
    """Parameters a token uses: all but the experts it is not routed to."""
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
    return total - experts + experts * cfg.num_experts_per_tok // cfg.num_experts


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    from transformers.models.qwen3_moe import modeling_qwen3_moe
    cfg = config(args.layers, args.vocab, args.experts, args.hidden)
    with torch.device("meta"):
        model = transformers.Qwen3MoeForCausalLM(cfg)
    model.eval()
    dtype = getattr(torch, args.dtype)
    expert_shapes = [p.shape for n, p in model.named_parameters() if p.dim() == 3]
    matrix = max(s[1] * s[2] for s in expert_shapes)
    experts = torch.zeros(matrix + len(expert_shapes), dtype=dtype)  # one matrix, shared
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if p.dim() == 3:
                offset = sum(1 for q in model.parameters() if q.dim() == 3 and not q.is_meta)
                view = experts.as_strided(p.shape, (0, p.shape[2], 1), offset)
            else:
                view = torch.zeros(1, dtype=dtype).expand(p.shape)
            module._parameters[name] = torch.nn.Parameter(view)
    rotary = modeling_qwen3_moe.Qwen3MoeRotaryEmbedding(cfg)  # on the CPU: real inv_freq
    for name, b in list(model.model.rotary_emb.named_buffers(recurse=False)):
        model.model.rotary_emb._buffers[name] = getattr(rotary, name)
    for mname, module in model.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b.is_meta:
                raise SystemExit(f"unexpected meta buffer {mname}.{name}")
    n = sum(p.numel() for p in model.parameters())
    inputs = {"input_ids": torch.zeros(1, 8, dtype=torch.long),
              "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
    traced.save(args.out)
    print(f"{args.out}: Qwen3-MoE {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_experts} experts top {cfg.num_experts_per_tok}, {n:,} parameters "
          f"({active_parameters(model, cfg):,} active), {args.dtype}")


if __name__ == "__main__":
    main()
