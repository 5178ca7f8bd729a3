"""Make the Llama-3.2-1B-shaped model of bench/RESULTS.md as a small TorchScript file.

Hugging Face LLaMA architecture: 16 layers, hidden 2048, 32 heads, 8
key/value heads, FFN 8192, vocab 128256, tied embeddings, RoPE theta
500000 (Llama 3.2's; its rope scaling is left out: the same work per token).
As bench/make_gpt2_1p3b.py does, the model is built on the meta device and
every parameter becomes a zero-stride view of one element; the rotary
inverse frequencies (a buffer) are computed for real. Compile with
`bmt-opt llama-1b.pt -o llama-1b.sharded.pt --random-init`.

`--config 8b` makes the Llama-3-8B shape instead (32 layers, hidden 4096,
32 heads, 8 key/value heads, FFN 14336, vocab 128256, untied), the model of
the multi-GPU tensor-parallel benchmark (bench/gpu_tensor_parallel.py --arch llama-8b).

`--contiguous` makes each parameter a contiguous view, at an offset of its
own, into one buffer of normal(0, 0.02) values of the largest parameter's
size instead: the trace's
matrix products then run at full speed (a zero-stride weight takes the CPU's
naive GEMM, seconds per product: over half an hour for the 8B shape), and
the file holds that buffer (1 GiB for the 8B shape's embedding).

`--hidden H --vocab V` shrink the shape for CPU dry runs (bench/gpu_speed.py
--device cpu): the FFN keeps the config's ratio to the hidden size (4 or 3.5).

usage: python3 bench/make_llama_1b.py OUT.pt [--config 1b|8b] [--layers N] [--dtype bfloat16]
           [--contiguous] [--hidden H] [--vocab V]
"""
import argparse
import warnings

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--config", choices=["1b", "8b"], default="1b")
    ap.add_argument("--layers", type=int, help="default: the config's (16 or 32)")
    ap.add_argument("--hidden", type=int, help="default: the config's (2048 or 4096)")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--contiguous", action="store_true",
                    help="contiguous views into one shared buffer (fast to trace, larger file)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    from transformers.models.llama import modeling_llama
    shape = {"1b": dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=8192,
                        tie_word_embeddings=True),
             "8b": dict(num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
                        tie_word_embeddings=False)}[args.config]
    if args.layers is not None:
        shape["num_hidden_layers"] = args.layers
    if args.hidden is not None:  # dry runs: the FFN keeps its ratio (4 or 3.5)
        ratio = shape["intermediate_size"] / shape["hidden_size"]
        shape["hidden_size"], shape["intermediate_size"] = args.hidden, int(ratio * args.hidden)
    config = transformers.LlamaConfig(
        **shape, num_attention_heads=32, num_key_value_heads=8, vocab_size=args.vocab,
        max_position_embeddings=1024, rope_theta=500000.0, attention_dropout=0.0,
        use_cache=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model.eval()
    dtype = getattr(torch, args.dtype)
    params = list(model.parameters())
    # Normal(0, 0.02) values, not zeros: a plan that keeps them (a frozen
    # base) must not train on zeros, on which GEMMs also run faster.
    shared = (torch.randn(max(p.numel() for p in params) + len(params),
                          generator=torch.Generator().manual_seed(0)) * 0.02).to(dtype) \
        if args.contiguous else None
    offset = 0
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            if shared is None:
                view = torch.zeros(1, dtype=dtype).expand(p.shape)
            else:  # the importer tells parameters apart by storage offset
                view = shared.as_strided(p.shape, torch.empty(p.shape, device="meta").stride(),
                                         offset)
                offset += 1
            module._parameters[name] = torch.nn.Parameter(view)
    rotary = modeling_llama.LlamaRotaryEmbedding(config)  # on the CPU: real inv_freq
    for name, b in list(model.model.rotary_emb.named_buffers(recurse=False)):
        model.model.rotary_emb._buffers[name] = getattr(rotary, name)
    for mname, module in model.named_modules():
        for name, b in module.named_buffers(recurse=False):
            if b.is_meta:
                raise SystemExit(f"unexpected meta buffer {mname}.{name}")
    model.tie_weights()
    n = sum(p.numel() for p in model.parameters())
    inputs = {"input_ids": torch.zeros(1, 8, dtype=torch.long),
              "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
    traced.save(args.out)
    print(f"{args.out}: LLaMA {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
          f"{n:,} parameters, {args.dtype}")


if __name__ == "__main__":
    main()
