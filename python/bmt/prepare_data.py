"""bmt-prepare-data: turn text, documents or conversations into token files that bmt-run memory-maps.

    bmt-prepare-data --input /usr/share/games/fortunes --split-on % \\
                     --train-bpe 4096 --output data/fortunes
    bmt-prepare-data --input chats.jsonl.zst --hf-tokenizer DIR --max-length 2048 \\
                     --output data/chats

The format of the outputs is in docs/token-files.md.

Plain text inputs (--input PATH..., repeatable) are text files or
directories (walked recursively in name order; hidden entries skipped; a file
reached twice, e.g. through a symlink such as fortune's NAME.u8 -> NAME, is
read once). Binary files (a NUL byte, or not valid UTF-8, e.g. fortune's .dat
indexes) are skipped with a note on stderr.  Documents are separated by a
blank line, or with --split-on LINE by a line consisting only of LINE (`%` for
fortune cookie files); leading/trailing blank lines of a document are dropped
and empty documents are ignored. They are shuffled with --seed and split by
--val-fraction (at least one document per split).

Records (bmt/finetune.py, bmt/records.py) are JSON lines files (.jsonl,
.ndjson, .json; plain, .gz or .zst), Parquet files (.parquet) and folders
written by datasets' save_to_disk (read with datasets.load_from_disk), given
or found in the given directories (plain text files among them are skipped
with a note). Layouts: --text-field NAME (a document per record), or
--messages-field NAME (a list of {"role": system|user|assistant, "content"}),
or --prompt-field/--response-field (a user and an assistant message); without
one, the first record's text, messages or prompt and response fields decide.
Conversations are rendered by the tokenizer's chat template (--chat-template
FILE gives one) and masked: 1 on each assistant message's tokens and on what
the template closes it with, 0 elsewhere. Records are tokenized by --workers
processes and written in input order as they are done (memory bounded: a few
chunks in flight); val gets round(n * --val-fraction) records (at least 1 and
at most n - 1) drawn by numpy.random.default_rng(--seed).choice without
replacement. Records with an empty text are skipped with a note.

Tokenizer, exactly one of:
  --train-bpe VOCAB_SIZE  (plain text only) train a byte-level BPE (HF
                          tokenizers) on the training documents, special
                          tokens <|endoftext|> (id 0), [MASK] (1), [PAD] (2);
                          saved as PREFIX.tokenizer.json
  --tokenizer FILE        an existing tokenizer.json
  --hf-tokenizer DIR      a local transformers tokenizer directory
The end-of-text token is looked up by name (<|endoftext|>, </s>, <eos>, ...;
override with --eos-token); in documents, text that spells a special token is
tokenized as plain text, so only the appended separators carry the end-of-text
id (conversations are tokenized as transformers' apply_chat_template does,
special tokens recognised, so that the template's markers are special).

--max-length N: a longer document keeps its first N tokens (a text document:
its first N - 1 and the end-of-text id; a conversation with no response token
left is skipped with a note); the count goes to stderr and to the json
("truncated"); --overlong error refuses it, naming the record instead.

Outputs, for each SPLIT in train, val:
  PREFIX.SPLIT.bin       flat little-endian token ids (uint16 when the
                         vocabulary has <= 65536 ids, else uint32; --dtype
                         forces one); a text document's tokens are followed by
                         the end-of-text id
  PREFIX.SPLIT.docs.bin  (version 2) int64 [num_documents + 1]: where each
                         document starts, then num_tokens
  PREFIX.SPLIT.mask.bin  (version 2, conversations) uint8 [num_tokens]: 1 on
                         the tokens that are training targets
  PREFIX.SPLIT.json      {"format": "bmt-tokens", "version", "dtype",
                         "num_tokens", "num_documents", "vocab_size", "eos_id",
                         "mask_id", "pad_id", "sentinel_ids", "tokenizer",
                         "source"} and in version 2 "documents", "loss_mask",
                         "supervised", "truncated", "max_length",
                         "chat_template" (docs/token-files.md)
Records give version 2; plain text gives version 1 (one stream of tokens;
bmt-run reads both), or version 2 (with its documents, which bmt-run's
--sequences padded|packed can train on) with --max-length or --format-version 2.

Exit status 0 on success; on bad input (missing or empty input, unreadable
tokenizer, unwritable output, too small a vocabulary, a record without the
field or with malformed JSON (FILE:LINE), an empty response, an unknown role,
conversations without a chat template, a Parquet file without the column, ...)
one "error: ..." line and status 1, and no output files (all are written under
temporary names and renamed at the end). Files of PREFIX that the run does not
write are removed then (with a note for a val split that --val-fraction 0
drops), and so are temporary files of PREFIX's outputs that a killed run left.
SIGINT (Ctrl-C) or SIGTERM: one "error: stopped by ..." line and status 128 +
the signal.
"""

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import time

try:
    # numpy's import takes a while (0.2 s warm, seconds cold): Ctrl-C during
    # it is a stop like any other (main()), not a traceback.
    import numpy as np

    from bmt.records import UserError
    from bmt.signals import run_stoppable
    from bmt.tokenfile import AtomicWriter, SplitWriter, output_names
except KeyboardInterrupt:
    print("error: stopped by SIGINT; no output written", file=sys.stderr)
    sys.exit(128 + signal.SIGINT)

BPE_SPECIALS = ["<|endoftext|>", "[MASK]", "[PAD]"]
EOS_NAMES = ["<|endoftext|>", "</s>", "<eos>", "<|end_of_text|>", "<|eot_id|>", "[SEP]", "<|im_end|>"]
MASK_NAMES = ["[MASK]", "<mask>", "<|mask|>"]
PAD_NAMES = ["[PAD]", "<pad>", "<|pad|>", "<|padding|>"]
BINARY_PROBE = 8192          # bytes looked at for a NUL before decoding
ENCODE_CHUNK = 2048          # documents per encode call (progress granularity)


def error(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


@contextlib.contextmanager
def written_together(out_dir, output, names):
    """An AtomicWriter for the block: its files are renamed into place when the
    block ends normally and removed when it raises (an OSError becomes a
    UserError naming the outputs PREFIX.*). names: every output path of
    PREFIX (output_paths). After the commit, a note names what it removed of
    an earlier run: a val split that --val-fraction 0 does not write, and
    temporary files of a run that was killed."""
    writer = AtomicWriter(out_dir, names)
    try:
        yield writer
        writer.commit()
    except OSError as e:
        writer.abort()
        raise UserError(f"cannot write {output}.*: {e.strerror or e}") from e
    except BaseException:
        writer.abort()
        raise
    val = output_names(os.path.join(out_dir, os.path.basename(output)), "val")
    if val["json"] in writer.removed:   # no val split written, one was there
        removed_val = [os.path.basename(p) for p in writer.removed if p in val.values()]
        note(f"removed the val split of an earlier run ({', '.join(removed_val)}): "
             f"--val-fraction 0 writes none")
    if writer.removed_temporaries:
        note(f"removed {len(writer.removed_temporaries)} temporary files of an earlier run that "
             f"was killed: {', '.join(os.path.basename(p) for p in writer.removed_temporaries)}")


def output_paths(prefix):
    """Every file a run into PREFIX may write."""
    paths = [path for split in ("train", "val") for path in output_names(prefix, split).values()]
    return paths + [f"{prefix}.tokenizer.json"]


def note(message):
    print(f"note: {message}", file=sys.stderr)


def progress_bar(label, total, quiet):
    """A tqdm bar on stderr, off with --quiet or when stderr is no terminal."""
    from tqdm import tqdm
    return tqdm(total=total, desc=label, file=sys.stderr, dynamic_ncols=True, leave=False,
                disable=quiet or not sys.stderr.isatty())


# --------------------------------------------------------------------------
# Reading documents

def list_files(inputs):
    """Input files in order, each real file once."""
    files, seen = [], set()

    def add(path):
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            files.append(path)

    for path in inputs:
        if not os.path.exists(path):
            raise UserError(f"input {path} does not exist")
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path, followlinks=True):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    full = os.path.join(root, name)
                    if not name.startswith(".") and os.path.isfile(full):
                        add(full)
        elif os.path.isfile(path):
            add(path)
        else:
            raise UserError(f"input {path} is not a regular file or directory")
    return files


def read_text(path):
    """(text, None), or (None, reason) for a binary file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from e
    if b"\0" in data[:BINARY_PROBE]:
        return None, "binary"
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    return text.replace("\r\n", "\n").replace("\r", "\n"), None


def split_documents(text, split_on=None):
    """Documents of a text: separated by lines equal to split_on (trailing
    whitespace ignored), or by blank lines when split_on is None."""
    docs, lines = [], []

    def flush():
        doc = "\n".join(lines)
        if doc.strip():
            # Drop blank lines around the document, keep its indentation.
            body = doc.split("\n")
            while not body[0].strip():
                body.pop(0)
            while not body[-1].strip():
                body.pop()
            docs.append("\n".join(body))
        lines.clear()

    for line in text.split("\n"):
        if (line.rstrip() == split_on) if split_on is not None else not line.strip():
            flush()
        else:
            lines.append(line)
    flush()
    return docs


def read_documents(inputs, split_on, quiet=False):
    files = list_files(inputs)
    docs, used, skipped = [], 0, {}
    progress = progress_bar("reading files", len(files), quiet)
    for path in files:
        progress.update(1)
        text, reason = read_text(path)
        if text is None:
            skipped.setdefault(reason, []).append(path)
            continue
        found = split_documents(text, split_on)
        if found:
            used += 1
        docs.extend(found)
    progress.close()
    for reason, paths in skipped.items():   # one note per kind, not per file
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        note(f"skipped {len(paths)} {reason} file{'s' if len(paths) > 1 else ''}: {shown}")
    if not docs:
        shown = ", ".join(inputs)
        raise UserError(f"no documents in {shown} ({len(files)} files, none with text)")
    return docs, used, len(files)


def shuffle_split(docs, seed, val_fraction):
    """(train, val) document lists: shuffled with seed, val first; val is
    empty when val_fraction is 0."""
    n = len(docs)
    if n < (2 if val_fraction > 0 else 1):
        raise UserError(f"need at least 2 documents to make a train and a val split, found {n}"
                        if n else "found no documents")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_val = min(max(1, round(n * val_fraction)), n - 1) if val_fraction > 0 else 0
    val = [docs[i] for i in order[:n_val]]
    train = [docs[i] for i in order[n_val:]]
    return train, val


# --------------------------------------------------------------------------
# Tokenizers: a uniform view (encode a list of texts, vocab, special ids)

def find_sentinels(vocab):
    """Ids of T5's span-corruption sentinels <extra_id_0>, <extra_id_1>, ...
    (consecutive from 0), or None when the vocabulary has none."""
    ids = []
    while f"<extra_id_{len(ids)}>" in vocab:
        ids.append(int(vocab[f"<extra_id_{len(ids)}>"]))
    return ids or None


def find_id(vocab, names):
    for name in names:
        if name in vocab:
            return vocab[name]
    return None


class TokTokenizer:
    """An HF `tokenizers` Tokenizer (trained here or from tokenizer.json)."""

    def __init__(self, tok, path, eos_token=None):
        self.tok, self.path = tok, path
        tok.encode_special_tokens = True   # text "<|endoftext|>" is not an EOS
        # Whole documents: no padding or truncation a tokenizer.json may
        # carry (sentence-transformers' pad and cut to 128 tokens).
        tok.no_padding()
        tok.no_truncation()
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1
        specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
        special_vocab = {k: v for k, v in vocab.items() if k in specials}
        if eos_token is not None:
            if eos_token not in vocab:
                raise UserError(f"--eos-token {eos_token} is not in the vocabulary of {path}")
            self.eos_id = vocab[eos_token]
        else:
            # Special tokens first: a plain vocabulary entry of the same name
            # is a fallback only.
            self.eos_id = find_id(special_vocab, EOS_NAMES)
            if self.eos_id is None:
                self.eos_id = find_id(vocab, EOS_NAMES)
            if self.eos_id is None:
                raise UserError(f"tokenizer {path} has no end-of-text token "
                                f"({', '.join(EOS_NAMES)}); name one with --eos-token")
        self.mask_id = find_id(special_vocab, MASK_NAMES)
        if self.mask_id is None:
            self.mask_id = find_id(vocab, MASK_NAMES)
        self.pad_id = find_id(special_vocab, PAD_NAMES)
        if self.pad_id is None:
            self.pad_id = find_id(vocab, PAD_NAMES)
        self.sentinel_ids = find_sentinels(vocab)

    def encode(self, texts):
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        return [e.ids for e in encode(texts, add_special_tokens=False)]


class HFTokenizer:
    """A transformers tokenizer loaded from a local directory."""

    def __init__(self, tok, path, eos_token=None):
        self.tok, self.path = tok, path
        vocab = tok.get_vocab()
        self.vocab_size = max(max(vocab.values()) + 1, len(tok))
        if eos_token is not None:
            if eos_token not in vocab:
                raise UserError(f"--eos-token {eos_token} is not in the vocabulary of {path}")
            self.eos_id = vocab[eos_token]
        else:
            self.eos_id = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
            if self.eos_id is None:
                raise UserError(f"tokenizer {path} has no eos (or sep) token; name one with --eos-token")
        self.mask_id = tok.mask_token_id
        self.pad_id = tok.pad_token_id
        self.sentinel_ids = find_sentinels(vocab)

    def encode(self, texts):
        return self.tok(texts, add_special_tokens=False)["input_ids"]


def train_bpe(docs, vocab_size):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=BPE_SPECIALS, show_progress=sys.stderr.isatty(),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def load_tokenizer_file(path, eos_token):
    from tokenizers import Tokenizer

    if not os.path.isfile(path):
        raise UserError(f"tokenizer file {path} does not exist")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - any parse failure is a user error
        raise UserError(f"cannot read tokenizer {path}: {str(e).splitlines()[0]}") from e
    return TokTokenizer(tok, os.path.abspath(path), eos_token)


def load_hf_tokenizer(path, eos_token):
    if not os.path.isdir(path):
        raise UserError(f"tokenizer directory {path} does not exist")
    import warnings
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    try:
        tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True,
                                                         split_special_tokens=True)
    except Exception as e:  # noqa: BLE001 - any loader failure is a user error
        raise UserError(f"cannot load tokenizer from {path}: {str(e).splitlines()[0]}") from e
    return HFTokenizer(tok, os.path.abspath(path), eos_token)


# --------------------------------------------------------------------------
# Output

def check_output_dir(prefix):
    """Fail early if the output directory (or its nearest existing ancestor,
    which would hold the created directories) cannot take new files."""
    directory = os.path.dirname(os.path.abspath(prefix))
    probe = directory
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UserError(f"output directory {directory} cannot be created: {probe} is not a directory")
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".bmt-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        raise UserError(f"output directory {probe} is not writable: {e.strerror}") from e
    if os.path.basename(prefix) == "":
        raise UserError(f"output prefix {prefix} names a directory; give PREFIX as DIR/NAME")


def human_bytes(n):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024



def plain_text_documents(tokenizer, docs, max_length, overlong, quiet, label):
    """(ids with the end-of-text id appended, truncated or not) per document
    of a plain text split, in order; a document over max_length keeps its
    first max_length - 1 tokens and the end-of-text id."""
    progress = progress_bar(f"tokenizing {label}", len(docs), quiet)
    for i in range(0, len(docs), ENCODE_CHUNK):
        part = docs[i:i + ENCODE_CHUNK]
        for k, ids in enumerate(tokenizer.encode(part)):
            ids = np.asarray(list(ids) + [tokenizer.eos_id], dtype=np.int64)
            truncated = max_length is not None and ids.size > max_length
            if truncated:
                if overlong == "error":
                    first = part[k].split("\n", 1)[0][:60]
                    raise UserError(f"{label} document {i + k} ({first!r}...) has {ids.size} "
                                    f"tokens, more than --max-length {max_length}")
                ids = np.concatenate([ids[:max_length - 1], ids[-1:]])
            yield ids, truncated
        progress.update(len(part))
    progress.close()


class Parser(argparse.ArgumentParser):
    def error(self, message):
        error(f"{message} (see {self.prog} --help)")


def main(argv=None):
    parser = Parser(prog="bmt-prepare-data", description=__doc__.splitlines()[0],
                    epilog="Token files: docs/token-files.md.")
    parser.add_argument("--input", nargs="+", action="extend", required=True, metavar="PATH",
                        help="text file or directory, JSON lines file (.jsonl, .ndjson, .json; "
                             ".gz, .zst), Parquet file, datasets save_to_disk folder (repeatable)")
    parser.add_argument("--split-on", metavar="LINE",
                        help="plain text: a line consisting only of LINE separates documents "
                             "(default: a blank line)")
    tokenizer_group = parser.add_mutually_exclusive_group(required=True)
    tokenizer_group.add_argument("--train-bpe", type=int, metavar="VOCAB_SIZE",
                                 help="train a byte-level BPE with this vocabulary size "
                                      "(plain text only)")
    tokenizer_group.add_argument("--tokenizer", metavar="FILE", help="an existing tokenizer.json")
    tokenizer_group.add_argument("--hf-tokenizer", metavar="DIR",
                                 help="a local transformers tokenizer directory")
    parser.add_argument("--eos-token", help="end-of-text token (default: looked up by name)")
    records = parser.add_argument_group("records (JSON lines, Parquet, datasets folders)")
    records.add_argument("--text-field", metavar="NAME",
                         help="documents are the text in field NAME (default, when no field "
                              "option is given: text, messages, or prompt and response, whichever "
                              "the first record has)")
    records.add_argument("--messages-field", metavar="NAME",
                         help="conversations: a list of {role, content} messages in field NAME "
                              "(default name: messages)")
    records.add_argument("--prompt-field", metavar="NAME",
                         help="instruction pairs: the prompt's field (default name: prompt)")
    records.add_argument("--response-field", metavar="NAME",
                         help="instruction pairs: the response's field (default name: response)")
    records.add_argument("--chat-template", metavar="FILE",
                         help="a Jinja chat template to render conversations with (default: the "
                              "tokenizer's own)")
    records.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 8), metavar="N",
                         help="tokenizing processes (default: min(CPU count, 8))")
    parser.add_argument("--max-length", type=int, metavar="N",
                        help="a document over N tokens is truncated to N (counted in the json)")
    parser.add_argument("--overlong", choices=["truncate", "error"], default="truncate",
                        help="what a document over --max-length gets (default truncate)")
    parser.add_argument("--format-version", type=int, choices=[1, 2],
                        help="token file version (default: 2 for records or with --max-length, "
                             "else 1)")
    parser.add_argument("-o", "--output", required=True, metavar="PREFIX",
                        help="writes PREFIX.{train,val}.{bin,json} (v2: and .docs.bin, .mask.bin)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    parser.add_argument("--val-fraction", type=float, default=0.05,
                        help="fraction of documents for validation (default 0.05; 0: no val "
                             "split, and an earlier run's val files of PREFIX are removed, "
                             "with a note)")
    parser.add_argument("--dtype", choices=["uint16", "uint32"],
                        help="token id type (default: uint16 if the vocabulary fits)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    try:
        return run_stoppable(run, args)
    except UserError as e:
        error(str(e))


def check_options(args, records):
    if not 0.0 <= args.val_fraction < 1.0:
        raise UserError(f"--val-fraction must be at least 0 and below 1, got {args.val_fraction}")
    if args.split_on is not None and (args.split_on.strip() == "" or "\n" in args.split_on):
        raise UserError("--split-on needs a non-blank single line (the default splits on blank lines)")
    if args.train_bpe is not None and args.train_bpe < 256 + len(BPE_SPECIALS):
        raise UserError(f"--train-bpe {args.train_bpe} is too small: a byte-level BPE needs at "
                        f"least 256 byte tokens + {len(BPE_SPECIALS)} special tokens = "
                        f"{256 + len(BPE_SPECIALS)}")
    if args.max_length is not None and args.max_length < 2:
        raise UserError(f"--max-length must be at least 2, got {args.max_length}")
    if args.workers < 1:
        raise UserError(f"--workers must be at least 1, got {args.workers}")
    if args.format_version == 1 and (records or args.max_length is not None):
        raise UserError("--format-version 1 cannot hold " +
                        ("records' documents" if records else "--max-length's counts") +
                        ": use version 2")
    record_options = [name for name in ("text_field", "messages_field", "prompt_field",
                                        "response_field", "chat_template")
                      if getattr(args, name) is not None]
    if records:
        if args.split_on is not None:
            raise UserError("--split-on applies to plain text inputs, not to JSON lines, "
                            "Parquet or datasets inputs")
        if args.train_bpe is not None:
            raise UserError("--train-bpe trains on plain text inputs only; give the model's "
                            "tokenizer (--hf-tokenizer DIR or --tokenizer FILE) for JSON lines, "
                            "Parquet or datasets inputs")
        if len([n for n in ("text_field", "messages_field", "prompt_field") if
                getattr(args, n) is not None]) > 1 or (
                args.text_field and args.response_field) or (
                args.messages_field and args.response_field):
            raise UserError("give one layout: --text-field, --messages-field, or "
                            "--prompt-field/--response-field")
    elif record_options:
        raise UserError(f"--{record_options[0].replace('_', '-')} applies to JSON lines, Parquet "
                        f"or datasets inputs; {', '.join(args.input)} holds plain text")


def run(args):
    from bmt.finetune import has_records
    records = has_records(args.input)
    check_options(args, records)
    check_output_dir(args.output)
    # No output may be one of the inputs (PREFIX.train.bin given as --input).
    outputs = output_paths(args.output)
    for out in outputs:
        for given in args.input:
            if os.path.exists(out) and os.path.exists(given) and (
                    os.path.samefile(out, given) or
                    (os.path.isdir(given) and os.path.abspath(out).startswith(
                        os.path.abspath(given) + os.sep))):
                raise UserError(f"--output {args.output} would overwrite the input {out}")

    # The tokenizer first when it is given, so a bad one fails before the reading.
    tokenizer = None
    if args.tokenizer:
        tokenizer = load_tokenizer_file(args.tokenizer, args.eos_token)
    elif args.hf_tokenizer:
        tokenizer = load_hf_tokenizer(args.hf_tokenizer, args.eos_token)
    prefix = os.path.abspath(args.output)
    out_dir = os.path.dirname(prefix)
    if records:
        return run_records(args, tokenizer, prefix, out_dir)

    start = time.perf_counter()
    docs, used_files, num_files = read_documents(args.input, args.split_on, args.quiet)
    print(f"read {len(docs)} documents from {used_files} of {num_files} files "
          f"in {time.perf_counter() - start:.2f} s")
    train, val = shuffle_split(docs, args.seed, args.val_fraction)

    tokenizer_json = None
    if tokenizer is None:
        start = time.perf_counter()
        tok = train_bpe(train, args.train_bpe)
        tokenizer_json = tok.to_str(pretty=True)   # before TokTokenizer changes its settings
        tokenizer = TokTokenizer(tok, prefix + ".tokenizer.json", args.eos_token)
        print(f"trained byte-level BPE: vocabulary {tok.get_vocab_size()} (asked {args.train_bpe}) "
              f"on {len(train)} train documents in {time.perf_counter() - start:.2f} s")
    dtype = choose_dtype(args, tokenizer)
    version = args.format_version or (2 if args.max_length is not None else 1)

    os.makedirs(out_dir, exist_ok=True)
    summary = []
    with written_together(out_dir, args.output, output_paths(prefix)) as writer:
        if tokenizer_json is not None:
            writer.write_bytes(prefix + ".tokenizer.json", tokenizer_json.encode())
        splits = []
        limit = np.iinfo(dtype).max
        for name, split_docs in [("train", train), ("val", val)]:
            if args.val_fraction == 0 and name == "val":   # no val split
                for path in output_names(prefix, name).values():
                    writer.remove_on_commit(path)
                continue
            start = time.perf_counter()
            split = SplitWriter(writer, prefix, name, dtype, version, supervised=False)
            try:
                for ids, cut in plain_text_documents(tokenizer, split_docs, args.max_length,
                                                     args.overlong, args.quiet, name):
                    if ids.size and (ids.min() < 0 or ids.max() > limit):
                        raise UserError(f"token id {ids.max()} does not fit {dtype}")
                    split.add(ids, truncated=cut)
            finally:
                split.close()
            splits.append(split)
            summary.append((name, split, time.perf_counter() - start))
        common = common_meta(tokenizer, args.input)
        for split in splits:   # metadata last: it vouches for the .bin
            split.write_meta(split.meta(common, args.max_length, chat_template=False))
            if split.num_truncated:
                note(f"{split.names['bin']}: {split.num_truncated} documents truncated to "
                     f"--max-length {args.max_length} tokens")

    for name, split, seconds in summary:
        rate = split.num_tokens / seconds if seconds > 0 else float("inf")
        print(f"{name}: {split.num_documents} documents, {split.num_tokens} tokens "
              f"({split.num_tokens / split.num_documents:.1f}/document), tokenized at "
              f"{rate / 1e6:.2f} M tokens/s -> {args.output}.{name}.bin "
              f"({dtype}, {human_bytes(split.num_tokens * np.dtype(dtype).itemsize)})")
    return 0


def choose_dtype(args, tokenizer):
    dtype = args.dtype or ("uint16" if tokenizer.vocab_size <= 65536 else "uint32")
    if dtype == "uint16" and tokenizer.vocab_size > 65536:
        raise UserError(f"--dtype uint16 cannot hold a vocabulary of {tokenizer.vocab_size} ids")
    return dtype


def common_meta(tokenizer, inputs):
    """The json fields every split shares (after format, version, dtype,
    num_tokens, num_documents)."""
    return {
        "vocab_size": int(tokenizer.vocab_size), "eos_id": int(tokenizer.eos_id),
        "mask_id": None if tokenizer.mask_id is None else int(tokenizer.mask_id),
        "pad_id": None if tokenizer.pad_id is None else int(tokenizer.pad_id),
        "sentinel_ids": tokenizer.sentinel_ids,
        "tokenizer": tokenizer.path,
        "source": [os.path.abspath(p) for p in inputs],
    }


def run_records(args, tokenizer, prefix, out_dir):
    """JSON lines, Parquet and datasets inputs: token files v2 (bmt.finetune)."""
    from bmt.finetune import prepare_records, shown

    dtype = choose_dtype(args, tokenizer)
    os.makedirs(out_dir, exist_ok=True)
    with written_together(out_dir, args.output, output_paths(prefix)) as writer:
        splits, stats = prepare_records(args, tokenizer, dtype, writer, prefix, note)
        common = common_meta(tokenizer, args.input)
        for split in splits.values():   # metadata last: it vouches for the .bin
            split.write_meta(split.meta(common, args.max_length,
                                        chat_template=stats["layout"] != "text"))

    fields = " and ".join(f"'{f}'" for f in stats["fields"])
    layout = {"text": "texts", "messages": "conversations",
              "prompt": "prompt/response pairs"}[stats["layout"]] + f" of {fields}"
    tokens = sum(split.num_tokens for split in splits.values())
    rate = tokens / stats["seconds"] if stats["seconds"] > 0 else float("inf")
    print(f"read {stats['records']} records ({layout}) with {args.workers} worker"
          f"{'s' if args.workers > 1 else ''} in {stats['seconds']:.2f} s "
          f"(+ {stats['count_seconds']:.2f} s counting), tokenized at {rate / 1e6:.2f} M tokens/s")
    if stats["empty"]:
        note(f"skipped {stats['empty']} records with an empty text: "
             f"{shown(stats['empty_at'], stats['empty'])}")
    if stats["truncated"]:
        note(f"truncated {stats['truncated']} documents to --max-length {args.max_length} "
             f"tokens: {shown(stats['truncated_at'], stats['truncated'])}")
    if stats["no_target"]:
        note(f"skipped {stats['no_target']} conversations without a response token in the "
             f"first --max-length {args.max_length} tokens: "
             f"{shown(stats['no_target_at'], stats['no_target'])}")
    for name, split in splits.items():
        targets = (f", {split.num_targets} targets ({100 * split.num_targets / split.num_tokens:.1f} %)"
                   if split.supervised else "")
        print(f"{name}: {split.num_documents} documents, {split.num_tokens} tokens "
              f"({split.num_tokens / split.num_documents:.1f}/document){targets} "
              f"-> {args.output}.{name}.bin "
              f"({dtype}, {human_bytes(split.num_tokens * np.dtype(dtype).itemsize)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
