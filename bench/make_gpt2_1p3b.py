"""Make the 1.3 B-parameter GPT-2 of bench/RESULTS.md as a small TorchScript file.

Hugging Face GPT-2 architecture, 24 layers, hidden 2048, 16 heads, 1024
positions, vocab 50304. The model is built on the meta device and every
parameter becomes a zero-stride view of one element, so the trace holds the
program and the shapes but (almost) no bytes; compile it with
`bmt-opt gpt2-1p3b.pt -o gpt2-1p3b.sharded.pt --random-init`, which writes a
weights-free plan (the runtime initializes the parameters by rule).

usage: python3 bench/make_gpt2_1p3b.py OUT.pt [--layers 24 --hidden 2048 --heads 16]
                                            [--dtype float32|bfloat16|float16]
"""
import argparse
import warnings

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--positions", type=int, default=1024)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                    help="parameter dtype of the trace (the runtime keeps fp32 master weights)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    config = transformers.GPT2Config(n_layer=args.layers, n_embd=args.hidden, n_head=args.heads,
                                     n_positions=args.positions, vocab_size=args.vocab,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     use_cache=False)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
    model.eval()
    for module in model.modules():
        for name, p in list(module.named_parameters(recurse=False)):
            module._parameters[name] = torch.nn.Parameter(
                torch.zeros(1, dtype=getattr(torch, args.dtype)).expand(p.shape))
        for name, b in list(module.named_buffers(recurse=False)):
            raise SystemExit(f"unexpected buffer {name}: this script only handles parameters")
    model.tie_weights()
    n = sum(p.numel() for p in model.parameters())
    inputs = {"input_ids": torch.zeros(1, 8, dtype=torch.long),
              "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
    traced.save(args.out)
    print(f"{args.out}: GPT-2 {args.layers} layers, hidden {args.hidden}, {n:,} parameters, "
          f"{args.dtype}")


if __name__ == "__main__":
    main()
