"""Answer accuracy of a causal LM on held-out conversations, by greedy decoding.

    python3 examples/sft/evaluate.py MODEL_DIR --tokenizer tokenizer.json \
        --chat-template examples/sft/chat_template.jinja --data val.jsonl

MODEL_DIR is a Hugging Face directory (bmt-to-hf of a checkpoint); --adapter DIR
loads a peft adapter folder (bmt-to-hf --adapter) onto it with PeftModel. For each
conversation the model gets the system turn and the first question, rendered by
the chat template with its generation prompt, and writes at most
--max-new-tokens tokens greedily (up to its end-of-text token); the answer
counts as right when it equals the first assistant reply exactly (stripped of
surrounding spaces), and as well-formed when it has the reply's form (an
integer for arithmetic, one word otherwise) and ends with end-of-text. Prints
both rates, overall and per kind of question.
"""

import argparse
import json
import re
import sys

import torch
import transformers


def kind_of(question):
    return "arithmetic" if question.startswith("What is") and question[8:9].isdigit() else "words"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokenizer", required=True, help="tokenizer.json")
    parser.add_argument("--chat-template", required=True)
    parser.add_argument("--data", required=True, help="JSON lines of {'messages': [...]}")
    parser.add_argument("--limit", type=int, default=200, help="conversations to ask (default 200)")
    parser.add_argument("--max-new-tokens", type=int, default=12)
    parser.add_argument("--label", default="", help="name printed with the result")
    parser.add_argument("--adapter", help="peft adapter folder to load onto MODEL_DIR")
    parser.add_argument("--answers", help="write each greedy reply, one a line, to this file")
    args = parser.parse_args(argv)

    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=args.tokenizer,
                                                     eos_token="<|endoftext|>")
    tokenizer.chat_template = open(args.chat_template).read()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model).eval()
    if args.adapter:
        import peft
        model = peft.PeftModel.from_pretrained(model, args.adapter).eval()
    replies = []
    right, formed, asked = {}, {}, {}
    with open(args.data) as f:
        chats = [json.loads(line)["messages"] for line in f][: args.limit]
    for messages in chats:
        prompt, answer = messages[:2], messages[2]["content"]
        ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=args.max_new_tokens,
                                 eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.eos_token_id)
        new = out[0, ids.shape[1]:]
        ended = bool((new == tokenizer.eos_token_id).any())
        reply = tokenizer.decode(new, skip_special_tokens=True).strip()
        replies.append(reply)
        kind = kind_of(prompt[1]["content"])
        shape = r"-?[0-9]+" if kind == "arithmetic" else r"[A-Za-z]+"
        asked[kind] = asked.get(kind, 0) + 1
        right[kind] = right.get(kind, 0) + (reply == answer.strip())
        formed[kind] = formed.get(kind, 0) + (ended and re.fullmatch(shape, reply) is not None)
    if args.answers:
        with open(args.answers, "w") as f:
            f.writelines(r.replace("\n", " ") + "\n" for r in replies)
    n = len(chats)
    def rate(counts):
        total = sum(counts.values())
        parts = ", ".join(f"{k} {counts[k]}/{asked[k]}" for k in sorted(asked))
        return f"{total}/{n} ({100.0 * total / n:.1f} %; {parts})"
    print(f"{args.label + ': ' if args.label else ''}right {rate(right)}; "
          f"well-formed {rate(formed)}")


if __name__ == "__main__":
    sys.exit(main())
