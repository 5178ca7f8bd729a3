"""The tiny fixture models of test/fixtures/make_fixtures.py in bfloat16, traced.

Each NAME (gpt2, llama, bert, t5, ...) is built as make_fixtures builds it
(seed 0), converted to bfloat16 and traced with the same example inputs,
so that bench/gpu_parity.py --dtype bfloat16 can compare bmt-run's bf16
plan with the same model in eager PyTorch. Compile the traces with bmt-opt
(the GPU machine has no MLIR) and carry them: `bmt-opt NAME.pt -o
NAME.sharded.pt` for the fused plans (the default pipeline fuses), with
`--fuse-elementwise=false` for the plain ones (bench/gpu_fusion.sh's
tiny-fused-bf16/ and tiny-plain-bf16/).

usage: python3 bench/make_bf16_fixtures.py OUT_DIR NAME...
"""
import os
import sys
import warnings

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__.strip().splitlines()[-1])
    out, names = sys.argv[1], sys.argv[2:]
    unknown = [n for n in names if n not in make_fixtures.MODELS]
    if unknown:
        raise SystemExit(f"unknown fixture model(s): {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(make_fixtures.MODELS))})")
    warnings.filterwarnings("ignore")
    make_fixtures._import_torch()
    os.makedirs(out, exist_ok=True)
    for name in names:
        model = make_fixtures._build_model(name).to(torch.bfloat16)
        inputs = make_fixtures._example_inputs(model)
        with torch.no_grad():
            traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
        path = os.path.join(out, name + ".pt")
        traced.save(path)
        print(f"{path}: {name} in bfloat16")


if __name__ == "__main__":
    main()
