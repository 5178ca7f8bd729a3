#!/usr/bin/env bash
# The README's main command. For now (the compiler's first stage): export
# Hugging Face GPT-2 small (124 M parameters, random weights) to TorchScript,
# import it into the bmt dialect, and print the IR of one transformer block
# and the parameter summary. Outputs go to out/ (OUT_DIR).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$root/build}"
OUT_DIR="${OUT_DIR:-$root/out}"
export BUILD_DIR

bash "$root/scripts/build.sh" >/dev/null
mkdir -p "$OUT_DIR"
if [ ! -f "$OUT_DIR/gpt2.pt" ]; then
  "$root/tools/bin/bmt-export-hf" --config gpt2 -o "$OUT_DIR/gpt2.pt"
fi
"$BUILD_DIR/bin/bmt-opt" "$OUT_DIR/gpt2.pt" --bmt-summary -o "$OUT_DIR/gpt2.mlir" 2> "$OUT_DIR/summary.txt"

echo "== IR of one transformer block (full IR: $OUT_DIR/gpt2.mlir) =="
awk '/func.func private @transformer.h.0.forward\(/,/^  }$/' "$OUT_DIR/gpt2.mlir"
echo
echo "== $(grep -c 'bmt.parameter' "$OUT_DIR/gpt2.mlir") parameter symbols, e.g. =="
grep -m 3 'bmt.parameter' "$OUT_DIR/gpt2.mlir"
echo
cat "$OUT_DIR/summary.txt"
