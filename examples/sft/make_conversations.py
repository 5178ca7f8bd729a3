"""Synthetic instruction conversations with answers that can be checked:
arithmetic and string questions, a system turn, some with a follow-up turn.

    python3 examples/sft/make_conversations.py -o data/sft --train 2000 --val 200

writes DIR/train.jsonl and DIR/val.jsonl, one {"messages": [{"role",
"content"}, ...]} per line (the layout bmt-prepare-data reads with its
default --messages-field). The same --seed gives the same files; the val
conversations are drawn after the train ones from the same stream, and a
question asked in train is not asked again in val (held out).
"""

import argparse
import json
import os
import random

SYSTEM = "You are a careful assistant. Answer with the result only."
WORDS = ("apple", "river", "stone", "cloud", "garden", "pencil", "window", "forest", "candle",
         "silver", "rocket", "planet", "harbor", "meadow", "lantern", "bridge")


def arithmetic(rng):
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    op = rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    question = f"What is {a} {op} {b}?"
    c = rng.randint(2, 9)
    follow = (f"And that times {c}?", str(value * c))
    return question, str(value), follow


def string_task(rng):
    word = rng.choice(WORDS)
    kind = rng.choice(("reverse", "upper", "length", "first"))
    if kind == "reverse":
        question, answer = f"Reverse the word '{word}'.", word[::-1]
    elif kind == "upper":
        question, answer = f"Write '{word}' in capital letters.", word.upper()
    elif kind == "length":
        question, answer = f"How many letters does '{word}' have?", str(len(word))
    else:
        question, answer = f"What is the first letter of '{word}'?", word[0]
    follow = ("And its last letter?", word[-1])
    return question, answer, follow


def conversation(rng):
    question, answer, (follow_q, follow_a) = (arithmetic if rng.random() < 0.6 else string_task)(rng)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
                {"role": "assistant", "content": answer}]
    if rng.random() < 0.3:   # multi-turn: a follow-up that needs the first answer
        messages += [{"role": "user", "content": follow_q},
                     {"role": "assistant", "content": follow_a}]
    return question, messages


def generate(n_train, n_val, seed):
    """(train, val) lists of conversations; no val question is in train."""
    rng = random.Random(seed)
    train, val, asked = [], [], set()
    while len(train) < n_train:
        question, messages = conversation(rng)
        asked.add(question)
        train.append(messages)
    tries = 0
    while len(val) < n_val:
        question, messages = conversation(rng)
        tries += 1
        if tries > 100 * (n_val + 1):
            raise SystemExit("error: too few distinct questions left for the val split; "
                             "ask for fewer conversations")
        if question not in asked:
            asked.add(question)
            val.append(messages)
    return train, val


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output-dir", required=True)
    parser.add_argument("--train", type=int, default=2000, help="train conversations (default 2000)")
    parser.add_argument("--val", type=int, default=200, help="val conversations (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train, val = generate(args.train, args.val, args.seed)
    os.makedirs(args.output_dir, exist_ok=True)
    for name, chats in (("train", train), ("val", val)):
        with open(os.path.join(args.output_dir, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            for messages in chats:
                f.write(json.dumps({"messages": messages}) + "\n")
    print(f"wrote {len(train)} train and {len(val)} val conversations to {args.output_dir}")


if __name__ == "__main__":
    main()
