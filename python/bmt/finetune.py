"""bmt-prepare-data for records (JSON lines, Parquet, datasets folders):
documents of a text field, or conversations rendered by the tokenizer's chat
template with a loss mask on the assistant's tokens; tokenized by worker
processes and streamed to token files v2 (docs/token-files.md).

Layouts of a record:
  text      {TEXT_FIELD: "..."}: the text's tokens then the end-of-text id;
            no mask (every token is a target). Empty texts are skipped.
  messages  {MESSAGES_FIELD: [{"role": "system"|"user"|"assistant",
            "content": "..."}, ...]}: rendered by the chat template.
  prompt    {PROMPT_FIELD: "...", RESPONSE_FIELD: "..."}: the conversation
            [user: prompt, assistant: response], rendered the same way.

The response tokens of a conversation are found by rendering it prefix by
prefix (as transformers' apply_chat_template renders it, into text): the
text of assistant message i is what the rendering of messages[:i + 1] adds
to the rendering of messages[:i] with the generation prompt, so it holds the
message's content and whatever the template closes it with (end-of-turn,
eos); a token is a target when its characters (the fast tokenizer's offsets
into the whole rendering) overlap such a span. This works with any template,
unlike return_assistant_tokens_mask, which needs {% generation %} markers
that few templates have; a template that renders a message differently
inside the whole conversation than at the end of a prefix is refused.
"""

import collections
import os
import sys
import time

import numpy as np

from bmt.records import Source, UserError, kind_of, parse_line
from bmt.tokenfile import SplitWriter, output_names
from bmt.workers import OrderedPool, WorkerDied

ROLES = ("system", "user", "assistant")
# Truncated or skipped documents: counts and the first few places.
SHOWN = 3


def choose_layout(args, record, where):
    """('text' | 'messages' | 'prompt', [field names]) from the options, or
    from the first record's fields when no field option is given."""
    if args.prompt_field or args.response_field:
        return "prompt", [args.prompt_field or "prompt", args.response_field or "response"]
    if args.messages_field:
        return "messages", [args.messages_field]
    if args.text_field:
        return "text", [args.text_field]
    if "text" in record:
        return "text", ["text"]
    if "messages" in record:
        return "messages", ["messages"]
    if "prompt" in record and "response" in record:
        return "prompt", ["prompt", "response"]
    raise UserError(f"{where}: none of the fields text, messages, or prompt and response "
                    f"(fields: {', '.join(map(str, record)) or 'none'}); name one with "
                    f"--text-field, --messages-field or --prompt-field/--response-field")


def field(record, name, where):
    if name not in record:
        raise UserError(f"{where}: no field '{name}' (fields: {', '.join(map(str, record)) or 'none'})")
    return record[name]


def string_field(record, name, where):
    value = field(record, name, where)
    if not isinstance(value, str):
        raise UserError(f"{where}: field '{name}' is {type(value).__name__}, not a string")
    return value


def conversation(layout, fields, record, where):
    """The record's messages [{"role", "content"}], checked."""
    if layout == "prompt":
        prompt = string_field(record, fields[0], where)
        response = string_field(record, fields[1], where)
        if not response.strip():
            raise UserError(f"{where}: empty response in field '{fields[1]}'")
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    raw = field(record, fields[0], where)
    if not isinstance(raw, (list, tuple)) or not raw:
        raise UserError(f"{where}: field '{fields[0]}' must be a non-empty list of "
                        f"{{\"role\", \"content\"}} messages")
    messages = []
    for j, m in enumerate(raw):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise UserError(f"{where}: message {j} of '{fields[0]}' is not a "
                            f"{{\"role\", \"content\"}} object")
        role, content = m["role"], m["content"]
        if role not in ROLES:
            raise UserError(f"{where}: message {j} has unknown role {role!r} "
                            f"(known: {', '.join(ROLES)})")
        if not isinstance(content, str):
            raise UserError(f"{where}: message {j} ({role}) has content of type "
                            f"{type(content).__name__}, not a string")
        if role == "assistant" and not content.strip():
            raise UserError(f"{where}: message {j} is an empty assistant response")
        messages.append({"role": role, "content": content})
    if not any(m["role"] == "assistant" for m in messages):
        raise UserError(f"{where}: the conversation has no assistant message (nothing to train on)")
    if messages[0]["role"] == "assistant":
        # A reply's tokens are what it adds to the rendering of the messages
        # before it with the generation prompt; there is none before the first.
        raise UserError(f"{where}: the conversation opens with an assistant message; a reply "
                        f"needs a system or user message before it")
    return messages


class ChatRenderer:
    """A conversation rendered by a chat template into text, with the
    character spans of the assistant messages (see the module's doc)."""

    def __init__(self, hf_tokenizer, template):
        self.tok, self.template = hf_tokenizer, template

    def render(self, messages, generation_prompt, where):
        try:
            text = self.tok.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                add_generation_prompt=generation_prompt)
        except Exception as e:  # noqa: BLE001 - jinja's errors and raise_exception() of templates
            raise UserError(f"{where}: the chat template failed: {str(e).splitlines()[0]}") from e
        if not isinstance(text, str):
            raise UserError(f"{where}: the chat template did not render to text")
        return text

    def spans(self, messages, where):
        full = self.render(messages, False, where)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before = self.render(messages[:i], True, where)
            upto = full if i == len(messages) - 1 else self.render(messages[:i + 1], False, where)
            if not (full.startswith(before) and full.startswith(upto) and len(upto) > len(before)):
                raise UserError(f"{where}: the chat template renders message {i} differently inside "
                                f"the conversation than at the end of its prefix; cannot find the "
                                f"response's tokens")
            spans.append((len(before), len(upto)))
        return full, spans


class Encoder:
    """Turns chunks of records into documents: (ids, mask or None, status)
    per record, status one of OK, TRUNCATED, EMPTY (skipped), NO_TARGET
    (a truncated conversation without a response token left: skipped)."""

    OK, TRUNCATED, EMPTY, NO_TARGET = range(4)

    def __init__(self, layout, fields, tokenizer, renderer, backend, dtype, max_length, overlong):
        self.layout, self.fields = layout, fields
        self.tokenizer, self.renderer, self.backend = tokenizer, renderer, backend
        self.dtype = np.dtype(dtype)
        self.limit = np.iinfo(self.dtype).max
        self.max_length, self.overlong = max_length, overlong

    def records(self, kind, items):
        for where, payload in items:
            yield where, (parse_line(*payload) if kind == "jsonl" else payload)

    def encode(self, chunk):
        kind, items = chunk
        if self.layout == "text":
            return self.encode_texts(kind, items)
        return self.encode_chats(kind, items)

    def finish(self, where, ids, mask):
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() > self.limit):
            raise UserError(f"{where}: token id {ids.max()} does not fit {self.dtype.name}")
        status = self.OK
        if self.max_length is not None and ids.size > self.max_length:
            if self.overlong == "error":
                raise UserError(f"{where}: {ids.size} tokens, more than --max-length "
                                f"{self.max_length}")
            status = self.TRUNCATED
            if mask is None:    # keep the end-of-text id that closes every text
                ids = np.concatenate([ids[:self.max_length - 1], ids[-1:]])
            else:
                ids, mask = ids[:self.max_length], mask[:self.max_length]
                if not mask.any():
                    return None, None, self.NO_TARGET
        return ids.astype(self.dtype), mask, status

    def encode_texts(self, kind, items):
        out, texts, places = [None] * len(items), [], []
        for k, (where, record) in enumerate(self.records(kind, items)):
            text = string_field(record, self.fields[0], where)
            if text.strip():
                texts.append(text)
                places.append((k, where))
            else:
                out[k] = (None, None, self.EMPTY)
        eos = self.tokenizer.eos_id
        for (k, where), ids in zip(places, self.tokenizer.encode(texts) if texts else []):
            out[k] = self.finish(where, list(ids) + [eos], None)
        return out

    def encode_chats(self, kind, items):
        rendered = []
        for where, record in self.records(kind, items):
            messages = conversation(self.layout, self.fields, record, where)
            text, spans = self.renderer.spans(messages, where)
            rendered.append((where, text, spans))
        encodings = self.backend.encode_batch([text for _, text, _ in rendered],
                                              add_special_tokens=False)
        out = []
        for (where, text, spans), enc in zip(rendered, encodings):
            offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
            mask = np.zeros(len(enc.ids), dtype=np.uint8)
            for start, end in spans:
                inside = (offsets[:, 1] > start) & (offsets[:, 0] < end)
                if not inside.any():
                    raise UserError(f"{where}: an assistant response has no tokens")
                mask |= inside.astype(np.uint8)
            out.append(self.finish(where, enc.ids, mask))
        return out


_ENCODER = None   # the worker processes' Encoder, inherited through fork


def _encode(chunk):
    return _ENCODER.encode(chunk)


def chat_tools(tokenizer, template_file, where_data):
    """(transformers tokenizer that renders, tokenizers.Tokenizer that
    encodes with special tokens recognised, template text or None for the
    tokenizer's own) for chat layouts; UserError when there is no template."""
    template = None
    if template_file is not None:
        try:
            with open(template_file, encoding="utf-8") as f:
                template = f.read()
        except OSError as e:
            raise UserError(f"cannot read --chat-template {template_file}: {e.strerror}") from e
        if not template.strip():
            raise UserError(f"--chat-template {template_file} is empty")
    hf = getattr(tokenizer, "tok", None)
    import transformers
    if not isinstance(hf, transformers.PreTrainedTokenizerBase):
        # A tokenizer.json: wrapped for apply_chat_template, with the eos
        # that templates may name as eos_token.
        hf = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer.tok, eos_token=tokenizer.tok.id_to_token(tokenizer.eos_id))
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        raise UserError(f"tokenizer {tokenizer.path} is not a fast tokenizer (tokenizer.json): "
                        f"conversations need its offsets")
    backend.encode_special_tokens = False   # the template's special tokens are special
    backend.no_padding()                    # whole conversations (see TokTokenizer)
    backend.no_truncation()
    if template is None and not getattr(hf, "chat_template", None):
        raise UserError(f"{where_data} holds conversations, but tokenizer {tokenizer.path} has no "
                        f"chat template; give one with --chat-template FILE")
    return hf, backend, template


def input_sources(inputs):
    """Sources of record inputs, in order, each once; plain text files
    reached through a folder are skipped (returned apart), a plain text file
    named on the command line is an error."""
    sources, skipped, seen = [], [], set()

    def add(path, kind):
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            sources.append(Source(path, kind))

    for path in inputs:
        if not os.path.exists(path):
            raise UserError(f"input {path} does not exist")
        kind = kind_of(path)
        if kind in ("jsonl", "parquet", "datasets"):
            add(path, kind)
        elif os.path.isdir(path):
            for root, dirs, names in os.walk(path, followlinks=True):
                dirs.sort()
                keep = []
                for d in dirs:
                    full = os.path.join(root, d)
                    if d.startswith("."):
                        continue
                    if kind_of(full) == "datasets":
                        add(full, "datasets")
                    else:
                        keep.append(d)
                dirs[:] = keep
                for name in sorted(names):
                    full = os.path.join(root, name)
                    if name.startswith(".") or not os.path.isfile(full):
                        continue
                    k = kind_of(full)
                    if k == "text":
                        skipped.append(full)
                    else:
                        add(full, k)
        else:
            raise UserError(f"input {path} is a plain text file; it cannot be mixed with "
                            f"JSON lines, Parquet or datasets inputs")
    return sources, skipped


def has_records(inputs):
    """Whether any input is (or a folder holds) JSON lines, Parquet or a
    datasets folder: then bmt-prepare-data reads records, not plain text."""
    for path in inputs:
        if not os.path.exists(path):
            continue
        if kind_of(path) in ("jsonl", "parquet", "datasets"):
            return True
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path, followlinks=True):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                if any(kind_of(os.path.join(root, d)) == "datasets" for d in dirs):
                    return True
                if any(kind_of(os.path.join(root, n)) in ("jsonl", "parquet")
                       for n in names if not n.startswith(".")):
                    return True
    return False


def val_selection(n, seed, val_fraction):
    """bool [n]: which records go to val (round(n * val_fraction) of them,
    at least 1 and at most n - 1, drawn with the seed; none when
    val_fraction is 0)."""
    if n < (2 if val_fraction > 0 else 1):
        raise UserError(f"need at least 2 records to make a train and a val split, found {n}"
                        if n else "found no records")
    n_val = min(max(1, round(n * val_fraction)), n - 1) if val_fraction > 0 else 0
    chosen = np.random.default_rng(seed).choice(n, size=n_val, replace=False)
    is_val = np.zeros(n, dtype=bool)
    is_val[chosen] = True
    return is_val


def shown(places, count):
    more = f" and {count - len(places)} more" if count > len(places) else ""
    return ", ".join(places) + more


def prepare_records(args, tokenizer, dtype, writer, prefix, note):
    """Reads, tokenizes and writes the records of args.input; returns
    (SplitWriters {train, val}, stats dict). Raises UserError."""
    global _ENCODER
    sources, skipped_text = input_sources(args.input)
    if skipped_text:
        note(f"skipped {len(skipped_text)} plain text file{'s' if len(skipped_text) > 1 else ''} "
             f"among the record inputs: {shown(skipped_text[:SHOWN], len(skipped_text))}")
    first, where, first_source = None, None, None
    for source in sources:
        first, where = source.first_record()
        if first is not None:
            first_source = source.path
            break
    if first is None:
        raise UserError(f"no records in {', '.join(args.input)}")
    layout, fields = choose_layout(args, first, where)
    if layout == "text" and args.chat_template is not None:
        raise UserError(f"--chat-template renders conversations, but the records are texts "
                        f"(field '{fields[0]}'); give --messages-field or --prompt-field, or "
                        f"leave out --chat-template")
    for source in sources:
        source.check_columns(fields)
    renderer = backend = None
    if layout != "text":
        hf, backend, template = chat_tools(tokenizer, args.chat_template, first_source)
        renderer = ChatRenderer(hf, template)
    supervised = layout != "text"

    start = time.perf_counter()
    counts = [source.count() for source in sources]
    total = sum(counts)
    is_val = val_selection(total, args.seed, args.val_fraction)
    count_seconds = time.perf_counter() - start

    names = ("train", "val") if args.val_fraction > 0 else ("train",)
    splits = {name: SplitWriter(writer, prefix, name, dtype, 2, supervised) for name in names}
    if "val" not in splits:
        for path in output_names(prefix, "val").values():
            writer.remove_on_commit(path)
    _ENCODER = Encoder(layout, fields, tokenizer, renderer, backend, dtype, args.max_length,
                       args.overlong)
    stats = {"layout": layout, "fields": fields, "records": total, "truncated": 0,
             "truncated_at": [], "empty": 0, "empty_at": [], "no_target": 0, "no_target_at": [],
             "count_seconds": count_seconds}

    def chunks():
        for source in sources:
            yield from source.chunks(None if source.kind == "jsonl" else fields)

    index = 0
    workers = max(1, args.workers)
    pool = bar = None
    finished = False
    start = time.perf_counter()
    try:
        if workers > 1:
            # Each worker encodes with one thread: the tokenizers library's
            # own thread pool would fight the processes for the cores.
            # Forked before the progress bar starts its monitor thread.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            pool = OrderedPool(workers, _encode)
        from tqdm import tqdm
        bar = tqdm(total=total, unit=" records", file=sys.stderr, dynamic_ncols=True, leave=False,
                   disable=args.quiet or not sys.stderr.isatty(), desc="tokenizing")

        def consume(chunk, results):
            nonlocal index
            for (where, _), (ids, mask, status) in zip(chunk[1], results):
                if status in (Encoder.EMPTY, Encoder.NO_TARGET):
                    key = "empty" if status == Encoder.EMPTY else "no_target"
                    stats[key] += 1
                    if len(stats[key + "_at"]) < SHOWN:
                        stats[key + "_at"].append(where)
                else:
                    if status == Encoder.TRUNCATED:
                        stats["truncated"] += 1
                        if len(stats["truncated_at"]) < SHOWN:
                            stats["truncated_at"].append(where)
                    splits["val" if is_val[index] else "train"].add(
                        ids, mask, truncated=status == Encoder.TRUNCATED)
                index += 1
            bar.update(len(results))

        if pool is None:
            for chunk in chunks():
                consume(chunk, _ENCODER.encode(chunk))
        else:
            # The pool hands results back in input order: documents are
            # written in input order. A chunk is kept with its result.
            sent = collections.deque()

            def remembered():
                for chunk in chunks():
                    sent.append(chunk)
                    yield chunk

            for results in pool.map(remembered()):
                consume(sent.popleft(), results)
        finished = True
    except WorkerDied as e:
        raise UserError(f"{e}; out of memory? try fewer --workers") from e
    finally:
        if bar is not None:
            bar.close()
        if pool is not None:
            pool.close(kill=not finished)
        for split in splits.values():
            split.close()
    stats["seconds"] = time.perf_counter() - start
    if index != total:
        raise UserError(f"the inputs changed while they were read ({total} records counted, "
                        f"{index} read)")
    for name, split in splits.items():
        if split.num_documents == 0:
            raise UserError(f"the {name} split has no documents (all its records were skipped)")
    return splits, stats
