#!/usr/bin/env bash
# Supervised fine-tuning, end to end on 2 CPU ranks: pretrain a small GPT-2 on
# fortune cookies, then fine-tune it on chat conversations with the loss on the
# assistant's replies only, and measure what it learned on held-out questions.
#   1. bmt-prepare-data   fortunes -> byte-level BPE (4096) -> token files
#   2. bmt-run            pretrain GPT-2 (4 layers, random init), checkpoint
#   3. bmt-to-hf          checkpoint -> Hugging Face directory
#   4. make_conversations synthetic chats (arithmetic and word questions)
#      bmt-prepare-data   chats -> chat template -> token files v2 with a loss mask
#   5. bmt-export-hf      the pretrained directory, traced with position_ids
#      bmt-opt            -> sharded.pt (weights streamed from the directory)
#   6. bmt-run            validation loss before; SFT with packed sequences
#                         (documents kept apart); validation loss after
#   7. bmt-to-hf + evaluate.py: greedy answers to held-out questions before/after
# LORA=1 fine-tunes LoRA adapters (r=16 on every linear layer, the base frozen)
# instead of every weight, and writes them for peft with bmt-to-hf --adapter:
# evaluate.py loads them onto the pretrained model with PeftModel, and the
# merged model (bmt-to-hf --merge) is asked the same questions.
# Outputs go to out/sft (OUT_DIR; out/sft-lora with LORA=1). PRETRAIN_STEPS /
# SFT_STEPS change the steps.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/examples/sft"
BUILD_DIR="${BUILD_DIR:-$root/build}"
LORA="${LORA:-0}"
OUT_DIR="${OUT_DIR:-$root/out/sft$([ "$LORA" = 1 ] && echo -lora)}"
PRETRAIN_STEPS="${PRETRAIN_STEPS:-200}"
SFT_STEPS="${SFT_STEPS:-150}"
export BUILD_DIR
bash "$root/scripts/build.sh"
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
py="${PYTHON:-python3}"
bin="$BUILD_DIR/bin"
torchrun=(torchrun)
command -v torchrun >/dev/null || torchrun=(python3 -m torch.distributed.run)
run2() { "${torchrun[@]}" --standalone --nproc_per_node=2 --no-python "$bin/bmt-run" "$@" --device cpu; }
mkdir -p "$OUT_DIR"
cd "$OUT_DIR"
rm -rf pretrain-ckpt pretrained sft-ckpt finetuned adapter merged
# Full fine-tuning trains every weight at 1e-3; LoRA trains only the adapters
# (B starts at zero: step 0 is the pretrained model), at a larger rate.
lora=() lr=1e-3
if [ "$LORA" = 1 ]; then lora=(--lora r=16,alpha=32,targets=all-linear) lr=3e-3; fi

# 1-3. Pretraining (the README's main example, shorter, with a checkpoint).
"$py" -m bmt.prepare_data --input /usr/share/games/fortunes --split-on % \
  --train-bpe 4096 --output fortunes -q
"$py" -m bmt.export_hf --config gpt2 --set vocab_size=4096 --set n_layer=4 --set n_embd=256 \
  --set n_head=4 --set n_positions=256 --set bos_token_id=0 --set eos_token_id=0 -o gpt2.pt
"$bin/bmt-opt" gpt2.pt -o gpt2.sharded.pt --world-size 2 --micro-batch 8 --seq-len 128 \
  > /dev/null 2>&1
run2 gpt2.sharded.pt --data fortunes.train.bin --steps "$PRETRAIN_STEPS" --micro-batch 8 \
  --seq-len 128 --lr 1e-3 --warmup 30 --schedule cosine --log-every 50 \
  --checkpoint-dir pretrain-ckpt --checkpoint-every 100000
# The tokenizer and chat template go with the model (and on into the
# fine-tuned directory: bmt-export-hf --checkpoint carries them).
"$py" -m bmt.to_hf "pretrain-ckpt/step-$(printf %08d "$PRETRAIN_STEPS")" -o pretrained \
  --tokenizer fortunes.tokenizer.json --chat-template "$here/chat_template.jinja"

# 4. Conversations: the loss mask covers the assistant's replies and the
# end-of-text token that closes each (the chat template's markup and the
# system and user turns are not trained on).
"$py" "$here/make_conversations.py" -o chats --train 4000 --val 200
"$py" -m bmt.prepare_data --input chats/train.jsonl --tokenizer fortunes.tokenizer.json \
  --chat-template "$here/chat_template.jinja" --output chats -q

# 5. The pretrained model with position_ids as an input, so that packed
# documents restart their positions and do not attend to each other.
"$py" -m bmt.export_hf --checkpoint pretrained --position-ids --seq-len 16 -o sft.pt
"$bin/bmt-opt" sft.pt -o sft.sharded.pt --world-size 2 --micro-batch 8 --seq-len 128 \
  "${lora[@]}" > /dev/null

# 6. Fine-tuning: several conversations packed to each 129-token row.
run2 sft.sharded.pt --eval-only --eval-data chats.val.bin --sequences packed \
  --micro-batch 8 --seq-len 128 --log-file before.jsonl
run2 sft.sharded.pt --data chats.train.bin --eval-data chats.val.bin --sequences packed \
  --steps "$SFT_STEPS" --micro-batch 8 --seq-len 128 --lr "$lr" --warmup 15 --schedule cosine \
  --eval-every 50 --log-every 25 --log-file sft.jsonl \
  --checkpoint-dir sft-ckpt --checkpoint-every 100000
ckpt="sft-ckpt/step-$(printf %08d "$SFT_STEPS")"
if [ "$LORA" = 1 ]; then
  # peft's adapter folder (the frozen base read from sft.sharded.pt), and the
  # full model with each adapter merged into its weight.
  "$py" -m bmt.to_hf "$ckpt" -o adapter --adapter --sharded sft.sharded.pt
  "$py" -m bmt.to_hf "$ckpt" -o merged --merge --sharded sft.sharded.pt
else
  "$py" -m bmt.to_hf "$ckpt" -o finetuned
fi
"$py" -m bmt.plot sft.jsonl -o sft.png

# 7. What changed, on questions the training never asked.
"$py" - before.jsonl sft.jsonl <<'PY'
import json, sys
def last_eval(path):
    return [r for r in map(json.loads, open(path)) if r.get("kind") == "eval"][-1]
b, a = last_eval(sys.argv[1]), last_eval(sys.argv[2])
print(f"validation loss on the replies' tokens: {b['val_loss']:.3f} before, "
      f"{a['val_loss']:.3f} after {a['step']} steps ({a['tokens']} target tokens)")
PY
ask() {
  "$py" "$here/evaluate.py" "$@" --tokenizer fortunes.tokenizer.json \
    --chat-template "$here/chat_template.jinja" --data chats/val.jsonl 2> /dev/null
}
ask pretrained --label pretrained
if [ "$LORA" = 1 ]; then
  ask pretrained --adapter adapter --label "pretrained + adapter (peft)" --answers peft.txt
  ask merged --label merged --answers merged.txt
  # The same function computed in another order (W x + s B A x against
  # (W + s B A) x): a near tie may decode differently, nothing more.
  "$py" - peft.txt merged.txt <<'PY'
import sys
a, b = (open(p).read().splitlines() for p in sys.argv[1:])
print(f"peft's adapter and the merged model give the same reply to "
      f"{sum(x == y for x, y in zip(a, b))} of {len(a)} questions")
PY
else
  ask finetuned --label finetuned
fi
