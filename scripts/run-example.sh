#!/usr/bin/env bash
# The README's main command: train a GPT-2-architecture model from scratch on
# real English text (the fortune cookies of Debian's `fortunes` package), on
# CPU with 2 ranks (ZeRO-3), through the whole pipeline:
#   bmt-prepare-data  text -> byte-level BPE (4096) -> token files
#   bmt-export-hf     GPT-2 (4 layers, hidden 256, random init) -> TorchScript
#   bmt-opt           TorchScript -> bmt IR -> default pipeline (find blocks,
#                     ZeRO-3 storage groups, checkpointing, prefetch) -> sharded.pt
#   torchrun bmt-run  2 CPU ranks (--nproc_per_node=2, NPROC=N changes it):
#                     300 AdamW steps, cosine schedule, evaluation on held-out text
#   bmt-plot          loss and tokens/s against step -> PNG
# Outputs go to out/ (OUT_DIR). STEPS=N changes the number of steps.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$root/build}"
OUT_DIR="${OUT_DIR:-$root/out}"
STEPS="${STEPS:-300}"
NPROC="${NPROC:-2}"
export BUILD_DIR

bash "$root/scripts/build.sh"
mkdir -p "$OUT_DIR"
# The Python tools of this checkout (python/bmt), the programs that
# `pip install .` (scripts/setup.sh) puts on PATH as bmt-prepare-data,
# bmt-export-hf and bmt-plot; run from here so that another checkout's
# install cannot stand in for them.
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"

if [ ! -f "$OUT_DIR/fortunes.train.json" ]; then
  "$py" -m bmt.prepare_data --input /usr/share/games/fortunes --split-on % \
    --train-bpe 4096 --output "$OUT_DIR/fortunes"
fi
if [ ! -f "$OUT_DIR/gpt2-fortunes.pt" ]; then
  "$py" -m bmt.export_hf --config gpt2 --set vocab_size=4096 --set n_layer=4 \
    --set n_embd=256 --set n_head=4 --set n_positions=256 -o "$OUT_DIR/gpt2-fortunes.pt"
fi
# The default pipeline; --checkpoint auto keeps every block's activations
# that fit the 1 GiB per-rank budget (here all: no recompute).
"$BUILD_DIR/bin/bmt-opt" "$OUT_DIR/gpt2-fortunes.pt" -o "$OUT_DIR/gpt2-fortunes.sharded.pt" \
  --world-size "$NPROC" --micro-batch $((16 / NPROC)) --seq-len 128 \
  --checkpoint auto --memory-budget-gib 1

# torchrun ships with the torch wheel; `python3 -m torch.distributed.run` is
# the same program when the wheel's scripts are not on PATH. 16 sequences of
# 128 tokens per step in all, split over the ranks.
torchrun=(torchrun)
command -v torchrun >/dev/null || torchrun=(python3 -m torch.distributed.run)
"${torchrun[@]}" --standalone --nproc_per_node="$NPROC" --no-python \
  "$BUILD_DIR/bin/bmt-run" "$OUT_DIR/gpt2-fortunes.sharded.pt" \
  --data "$OUT_DIR/fortunes.train.bin" --eval-data "$OUT_DIR/fortunes.val.bin" \
  --steps "$STEPS" --micro-batch $((16 / NPROC)) --seq-len 128 --lr 1e-3 --warmup 30 \
  --schedule cosine --eval-every 100 --eval-batches $((20 * NPROC)) --log-every 10 \
  --log-file "$OUT_DIR/metrics.jsonl" --device cpu

"$py" -m bmt.plot "$OUT_DIR/metrics.jsonl" -o "$OUT_DIR/training.png"
python3 - "$OUT_DIR/metrics.jsonl" <<'PY'
import json, math, sys
evals = [r for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "eval"]
last = evals[-1]
print(f"validation loss {last['val_loss']:.3f} (perplexity {last['val_ppl']:.1f}) after step "
      f"{last['step']}; ln(vocab) = {math.log(4096):.3f} is the loss of a uniform guess")
PY
