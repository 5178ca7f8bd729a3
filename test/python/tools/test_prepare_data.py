"""Tests of bmt-prepare-data (python/bmt/prepare_data.py), run as a
subprocess (python3 -m bmt.prepare_data) and checked against independent
references: the documents the test wrote itself, ids known by construction,
the tokenizer file's own decoding, and the fortune files counted with a
regular expression."""

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from bmt_paths import tool

FORTUNES = "/usr/share/games/fortunes"
EOT = "<|endoftext|>"
META_KEYS = {"format", "version", "dtype", "num_tokens", "num_documents", "vocab_size",
             "eos_id", "mask_id", "pad_id", "sentinel_ids", "tokenizer", "source"}

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def make_docs(n=40):
    """n distinct documents with the shapes real text has: several lines,
    indentation, punctuation, non-ASCII, a '%' inside a line, and a literal
    end-of-text string (which must stay text, not become the eos id)."""
    docs = []
    for i in range(n):
        words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(3 + i % 9)]
        lines = [" ".join(words), f"line two of document {i}: 100% sure."]
        if i % 3 == 0:
            lines.append("    indented, naïve café — ☃ ü")
        if i % 5 == 0:
            lines.append(f"\t-- Author {i}")
        docs.append("\n".join(lines))
    docs[7] = f"the text {EOT} appears literally in document seven"
    return docs


def run_tool(*args):
    return subprocess.run(tool("bmt-prepare-data") + [str(a) for a in args], capture_output=True,
                          text=True, timeout=120)


def read_split(prefix, split):
    with open(f"{prefix}.{split}.json") as f:
        meta = json.load(f)
    ids = np.fromfile(f"{prefix}.{split}.bin", dtype=np.dtype(meta["dtype"]).newbyteorder("<"))
    return meta, ids


def segments(ids, eos_id):
    """The documents' id lists: ids split after each eos (which must end it)."""
    assert ids.size and ids[-1] == eos_id
    cuts = np.flatnonzero(ids == eos_id)
    out, start = [], 0
    for cut in cuts:
        out.append(ids[start:cut].tolist())
        start = cut + 1
    return out


def decoded_documents(prefix):
    """Every document of both splits, decoded with the written tokenizer,
    and the val split's metadata."""
    tok = Tokenizer.from_file(f"{prefix}.tokenizer.json")
    found = []
    for split in ("train", "val"):
        meta, ids = read_split(prefix, split)
        found += [tok.decode(s) for s in segments(ids, meta["eos_id"])]
    return found, meta


def assert_one_error(result):
    """Exit 1, exactly one 'error:' line on stderr, and it is the last line
    (notes about skipped files may come before it), no traceback."""
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith("error: ")] == [lines[-1]], result.stderr
    assert all(line.startswith(("note: ", "error: ")) for line in lines), result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A directory of blank-line separated documents, with the things a real
    directory holds: a binary file, a Latin-1 file, a symlink to a text
    file, a hidden file; and the documents the text files hold."""
    d = tmp_path_factory.mktemp("corpus")
    docs = make_docs()
    (d / "a.txt").write_text("\n\n".join(docs[:25]) + "\n", encoding="utf-8")
    # Several blank lines, whitespace-only lines and CRLF endings still separate.
    body = "\n\n   \n\n".join(docs[25:]).replace("\n", "\r\n")
    (d / "sub").mkdir()
    (d / "sub" / "b.txt").write_bytes(("\r\n\r\n" + body + "\r\n\r\n\r\n").encode("utf-8"))
    (d / "index.dat").write_bytes(b"\x00\x00\x00\x02" + bytes(range(256)))
    (d / "latin1.txt").write_bytes("caf\xe9 in Latin-1\n".encode("latin-1"))
    os.symlink("a.txt", d / "a.u8")
    (d / ".hidden").write_text("hidden document\n")
    return d, docs


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory):
    d, docs = corpus
    out = tmp_path_factory.mktemp("out")
    prefix = out / "c"
    result = run_tool("--input", d, "--train-bpe", 300, "--val-fraction", 0.2, "--output", prefix)
    assert result.returncode == 0, result.stderr
    return prefix, docs, result


def test_tokens_decode_to_the_documents(prepared):
    prefix, docs, _ = prepared
    tok = Tokenizer.from_file(f"{prefix}.tokenizer.json")
    assert tok.token_to_id(EOT) == 0
    found = []
    for split in ("train", "val"):
        meta, ids = read_split(prefix, split)
        segs = segments(ids, meta["eos_id"])
        assert len(segs) == meta["num_documents"]
        split_docs = [tok.decode(s) for s in segs]
        # The whole file decodes to the documents, each followed by the end-of-text token.
        assert tok.decode(ids.tolist(), skip_special_tokens=False) == "".join(
            doc + EOT for doc in split_docs)
        found += split_docs
    assert sorted(found) == sorted(docs)


def test_literal_end_of_text_in_a_document_is_text(prepared):
    prefix, docs, _ = prepared
    eos_count = sum(int((read_split(prefix, s)[1] == 0).sum()) for s in ("train", "val"))
    assert eos_count == len(docs)


def test_metadata(prepared, corpus):
    prefix, docs, result = prepared
    tok = Tokenizer.from_file(f"{prefix}.tokenizer.json")
    metas = {}
    for split in ("train", "val"):
        meta, ids = read_split(prefix, split)
        metas[split] = meta
        assert set(meta) == META_KEYS
        assert meta["format"] == "bmt-tokens" and meta["version"] == 1
        assert meta["dtype"] == "uint16"
        assert meta["num_tokens"] == ids.size
        assert meta["num_tokens"] * 2 == os.path.getsize(f"{prefix}.{split}.bin")
        assert meta["vocab_size"] == tok.get_vocab_size() == 300
        assert int(ids.max()) < meta["vocab_size"]
        assert (meta["eos_id"], meta["mask_id"], meta["pad_id"]) == (0, 1, 2)
        assert meta["sentinel_ids"] is None
        assert tok.id_to_token(1) == "[MASK]" and tok.id_to_token(2) == "[PAD]"
        assert meta["tokenizer"] == os.path.abspath(f"{prefix}.tokenizer.json")
        assert meta["source"] == [str(corpus[0])]
    assert metas["val"]["num_documents"] == round(len(docs) * 0.2)
    assert metas["train"]["num_documents"] + metas["val"]["num_documents"] == len(docs)
    # One summary line per split on stdout, with documents, tokens and tokens/s.
    for split in ("train", "val"):
        line = next(l for l in result.stdout.splitlines() if l.startswith(f"{split}:"))
        assert f"{metas[split]['num_documents']} documents" in line
        assert f"{metas[split]['num_tokens']} tokens" in line
        assert "tokens/s" in line
    assert sorted(os.listdir(os.path.dirname(prefix))) == [
        "c.tokenizer.json", "c.train.bin", "c.train.json", "c.val.bin", "c.val.json"]


def test_binary_and_non_utf8_files_are_skipped_with_a_note(prepared):
    _, _, result = prepared
    notes = [l for l in result.stderr.splitlines() if l.startswith("note: ")]
    assert any("binary" in l and "index.dat" in l for l in notes), result.stderr
    assert any("not UTF-8" in l and "latin1.txt" in l for l in notes), result.stderr
    assert "error" not in result.stderr


def test_split_is_deterministic_given_the_seed(corpus, prepared, tmp_path):
    d, docs = corpus
    prefix, _, _ = prepared
    again, other = tmp_path / "again", tmp_path / "other"
    for p, seed in ((again, 0), (other, 1)):
        r = run_tool("--input", d, "--train-bpe", 300, "--val-fraction", 0.2, "--output", p,
                     "--seed", seed)
        assert r.returncode == 0, r.stderr
    for ext in ("tokenizer.json", "train.bin", "val.bin"):
        assert open(f"{prefix}.{ext}", "rb").read() == open(f"{again}.{ext}", "rb").read(), ext

    def val_docs(p):
        tok = Tokenizer.from_file(f"{p}.tokenizer.json")
        meta, ids = read_split(p, "val")
        return sorted(tok.decode(s) for s in segments(ids, meta["eos_id"]))

    assert val_docs(other) != val_docs(prefix)
    assert len(val_docs(other)) == len(val_docs(prefix)) == 8


def test_split_on_line_fortune_style(tmp_path):
    docs = make_docs(30)
    # fortune files: each cookie ends with a line "%" (the last one too).
    (tmp_path / "cookies").write_text("".join(doc + "\n%\n" for doc in docs))
    prefix = tmp_path / "out" / "f"   # a missing output directory is created
    r = run_tool("--input", tmp_path / "cookies", "--split-on", "%", "--train-bpe", 280,
                 "--output", prefix)
    assert r.returncode == 0, r.stderr
    found, meta = decoded_documents(prefix)
    assert sorted(found) == sorted(docs)
    # default val fraction 0.05 of 30 documents: 2 (rounded), at least 1
    assert read_split(prefix, "val")[0]["num_documents"] == 2


def word_tokenizer(path, size, specials=(EOT,)):
    """A word-level tokenizer.json whose word 'wK' has id K (K < size)."""
    vocab = {f"w{i}": i for i in range(size)}
    vocab["[UNK]"] = size
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if specials:
        tok.add_special_tokens(list(specials))
    tok.save(str(path))
    return tok


def test_t5_style_sentinels(tmp_path):
    # T5's tokenizers: </s>, <pad> and <extra_id_N> counting down from the top.
    tok = word_tokenizer(tmp_path / "t5.json", 20, specials=("</s>", "<pad>"))
    tok.add_special_tokens([f"<extra_id_{i}>" for i in range(3)])
    tok.save(str(tmp_path / "t5.json"))
    (tmp_path / "words.txt").write_text("w1 w2\n\nw3 w4 w5\n\nw6\n")
    r = run_tool("--input", tmp_path / "words.txt", "--tokenizer", tmp_path / "t5.json",
                 "--val-fraction", 0.34, "--output", tmp_path / "t5")
    assert r.returncode == 0, r.stderr
    meta, _ = read_split(tmp_path / "t5", "train")
    vocab = tok.get_vocab(with_added_tokens=True)
    assert meta["sentinel_ids"] == [vocab[f"<extra_id_{i}>"] for i in range(3)]
    assert (meta["eos_id"], meta["pad_id"]) == (vocab["</s>"], vocab["<pad>"])


def test_uint32_for_a_vocabulary_over_65536(tmp_path):
    word_tokenizer(tmp_path / "big.json", 70000)
    expected = [[69999, 3, 65536], [65535, 65536, 65537, 0], [12], [40000, 1, 2, 69998, 7]]
    text = "\n\n".join(" ".join(f"w{i}" for i in doc) for doc in expected)
    (tmp_path / "words.txt").write_text(text + "\n")
    prefix = tmp_path / "w"
    r = run_tool("--input", tmp_path / "words.txt", "--tokenizer", tmp_path / "big.json",
                 "--val-fraction", 0.25, "--output", prefix)
    assert r.returncode == 0, r.stderr
    found = []
    for split in ("train", "val"):
        meta, ids = read_split(prefix, split)
        assert meta["dtype"] == "uint32"
        assert meta["num_tokens"] * 4 == os.path.getsize(f"{prefix}.{split}.bin")
        assert meta["vocab_size"] == 70002       # 70000 words, [UNK], <|endoftext|>
        assert meta["eos_id"] == 70001
        assert meta["mask_id"] is None and meta["pad_id"] is None
        assert meta["tokenizer"] == str(tmp_path / "big.json")
        found += segments(ids, 70001)
    assert sorted(found) == sorted(expected)
    assert not os.path.exists(f"{prefix}.tokenizer.json")   # only a trained one is written


def test_dtype_uint32_forced_holds_the_same_ids(corpus, prepared, tmp_path):
    d, _ = corpus
    prefix, _, _ = prepared
    r = run_tool("--input", d, "--tokenizer", f"{prefix}.tokenizer.json", "--val-fraction", 0.2,
                 "--dtype", "uint32", "--output", tmp_path / "u32")
    assert r.returncode == 0, r.stderr
    for split in ("train", "val"):
        meta, ids = read_split(tmp_path / "u32", split)
        assert meta["dtype"] == "uint32" and ids.dtype.itemsize == 4
        assert np.array_equal(ids, read_split(prefix, split)[1])


def test_hf_tokenizer_directory(corpus, prepared, tmp_path):
    d, _ = corpus
    prefix, _, _ = prepared
    # A local transformers tokenizer directory as save_pretrained writes it
    # for a fast tokenizer (written by hand: importing transformers is slow).
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    shutil.copy(f"{prefix}.tokenizer.json", hf_dir / "tokenizer.json")
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOT,
        "mask_token": "[MASK]", "pad_token": "[PAD]"}))
    r = run_tool("--input", d, "--hf-tokenizer", hf_dir, "--val-fraction", 0.2,
                 "--output", tmp_path / "hf_out")
    assert r.returncode == 0, r.stderr
    for split in ("train", "val"):
        meta, ids = read_split(tmp_path / "hf_out", split)
        assert (meta["eos_id"], meta["mask_id"], meta["pad_id"]) == (0, 1, 2)
        assert meta["tokenizer"] == str(hf_dir)
        assert np.array_equal(ids, read_split(prefix, split)[1])


@pytest.fixture
def bad_inputs(tmp_path):
    """Inputs for the error cases; returns (paths, output dir to stay empty)."""
    (tmp_path / "one.txt").write_text("just one document\n")
    (tmp_path / "two.txt").write_text("first\n\nsecond\n")
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x.dat").write_bytes(b"\x00\x01\x02")
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "a_file").write_text("x")
    word_tokenizer(tmp_path / "noeos.json", 10, specials=())
    word_tokenizer(tmp_path / "big.json", 70000)
    (tmp_path / "words.txt").write_text("w1 w2\n\nw70000\n")
    out = tmp_path / "out"
    out.mkdir()
    return tmp_path, out


BAD_CASES = {
    "missing input": (["--input", "{t}/nope.txt", "--train-bpe", "300"], "does not exist"),
    "empty input": (["--input", "{t}/empty.txt", "--train-bpe", "300"], "no documents"),
    "only binary files": (["--input", "{t}/bin", "--train-bpe", "300"], "no documents"),
    "one document": (["--input", "{t}/one.txt", "--train-bpe", "300"], "at least 2 documents"),
    "missing tokenizer": (["--input", "{t}/two.txt", "--tokenizer", "{t}/nope.json"], "does not exist"),
    "unreadable tokenizer": (["--input", "{t}/two.txt", "--tokenizer", "{t}/garbage.json"],
                             "cannot read tokenizer"),
    "tokenizer without eos": (["--input", "{t}/two.txt", "--tokenizer", "{t}/noeos.json"],
                              "end-of-text"),
    "missing hf tokenizer": (["--input", "{t}/two.txt", "--hf-tokenizer", "{t}/nope"],
                             "does not exist"),
    "vocab too small": (["--input", "{t}/two.txt", "--train-bpe", "258"], "too small"),
    "uint16 too small": (["--input", "{t}/words.txt", "--tokenizer", "{t}/big.json",
                          "--dtype", "uint16"], "uint16"),
    "bad val fraction": (["--input", "{t}/two.txt", "--train-bpe", "300", "--val-fraction", "1"],
                         "--val-fraction"),
    "two tokenizers": (["--input", "{t}/two.txt", "--train-bpe", "300", "--tokenizer",
                        "{t}/big.json"], "not allowed with"),
    "no tokenizer": (["--input", "{t}/two.txt"], "required"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input(case, bad_inputs):
    t, out = bad_inputs
    args, message = BAD_CASES[case]
    r = run_tool(*[a.format(t=t) for a in args], "--output", out / "p")
    assert_one_error(r)
    assert message in r.stderr.splitlines()[-1], r.stderr
    assert os.listdir(out) == []


def test_unwritable_output(bad_inputs):
    t, out = bad_inputs
    # A regular file where the output directory should be.
    r = run_tool("--input", t / "two.txt", "--train-bpe", 300, "--output", t / "a_file" / "sub" / "p")
    assert_one_error(r)
    assert "not a directory" in r.stderr
    # A directory nobody may write to: /proc (root included).
    if os.path.isdir("/proc/self"):
        r = run_tool("--input", t / "two.txt", "--train-bpe", 300, "--output", "/proc/bmt-p")
        assert_one_error(r)
        assert "not writable" in r.stderr
    if os.geteuid() != 0:   # permission bits do not stop root
        (out / "ro").mkdir()
        os.chmod(out / "ro", 0o555)
        r = run_tool("--input", t / "two.txt", "--train-bpe", 300, "--output", out / "ro" / "p")
        assert_one_error(r)
        assert os.listdir(out / "ro") == []
        os.chmod(out / "ro", 0o755)
    assert sorted(os.listdir(out)) in ([], ["ro"])


def fortune_reference(paths):
    """Cookies of fortune files, counted independently: pieces between lines
    that are '%', each real file once, binary (.dat) files left out."""
    docs, seen = [], set()
    for path in paths:
        real = os.path.realpath(path)
        if real in seen or path.endswith(".dat"):
            continue
        seen.add(real)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        docs += [piece.strip("\n") for piece in re.split(r"(?m)^%[ \t]*$", text) if piece.strip()]
    return docs


needs_fortunes = pytest.mark.skipif(
    not os.path.isdir(FORTUNES),
    reason=f"{FORTUNES} is absent (Debian package 'fortunes'; scripts/setup.sh installs it)")


@needs_fortunes
def test_fortunes_subset_roundtrip(tmp_path):
    inputs = [os.path.join(FORTUNES, n) for n in ("linux", "debian", "debian.dat", "debian.u8")]
    inputs = [p for p in inputs if os.path.exists(p)]
    prefix = tmp_path / "fs"
    r = run_tool("--input", *inputs, "--split-on", "%", "--train-bpe", 512, "--output", prefix)
    assert r.returncode == 0, r.stderr
    found, meta = decoded_documents(prefix)
    assert sorted(found) == sorted(fortune_reference(inputs))
    assert meta["source"] == inputs


@needs_fortunes
def test_fortunes_corpus(tmp_path):
    prefix = tmp_path / "fortunes"
    r = run_tool("--input", FORTUNES, "--split-on", "%", "--train-bpe", 512, "--output", prefix)
    assert r.returncode == 0, r.stderr
    files = [os.path.join(FORTUNES, n) for n in sorted(os.listdir(FORTUNES))]
    reference = fortune_reference([p for p in files if os.path.isfile(p)])
    train, train_ids = read_split(prefix, "train")
    val, val_ids = read_split(prefix, "val")
    total = train["num_documents"] + val["num_documents"]
    assert total > 1000
    assert total == len(reference)   # the NAME.u8 -> NAME symlinks are not read twice
    assert val["num_documents"] == round(total * 0.05)
    assert (train_ids == 0).sum() == train["num_documents"]
    tok = Tokenizer.from_file(f"{prefix}.tokenizer.json")
    val_docs = [tok.decode(s) for s in segments(val_ids, 0)]
    assert set(val_docs) <= set(reference)


def test_ctrl_c_during_the_imports(tmp_path):
    """SIGINT while the module's imports run (numpy's takes a while): exit
    130 and one error line, no traceback. A numpy that waits inside its
    import holds the run there."""
    import signal
    from stalled import signal_when_stalled, stalled_module
    env, marker = stalled_module(tmp_path, "numpy")
    status, stderr = signal_when_stalled(
        tool("bmt-prepare-data") + ["--input", tmp_path, "--train-bpe", "300",
                                    "--output", tmp_path / "out" / "p"],
        env, marker, signal.SIGINT)
    assert status == 130, stderr
    assert stderr.strip().splitlines() == ["error: stopped by SIGINT; no output written"], stderr
    assert not (tmp_path / "out").exists()
