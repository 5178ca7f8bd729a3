"""bmt-to-hf: a bmt-run checkpoint to a Hugging Face directory.

For GPT-2 (tied embeddings; float32 and bfloat16), LLaMA (untied, and tied
with tie_word_embeddings), BERT (masked LM: tied decoder weight and bias) and T5
(span corruption's seq2seq: three names tied to shared.weight): the fixture
model's config exported by bmt-export-hf (which stores config.json with the
model), compiled, trained 2 steps on 2 CPU ranks under torchrun with a
checkpoint and --save-params, exported by bmt-to-hf. The references are
independent of bmt-to-hf: transformers' from_pretrained of the directory
(the plan's class, no missing, unexpected or mismatched keys), whose
weights must equal bmt-run's own --save-params of the same run bit for
bit, and transformers' save_pretrained of the loaded model, which must
write the same tensor names (the tied aliases omitted alike). Then:
sharding with an index, a .pt2 carrying the config, the errors, and the
memory of a conversion of a 245 MiB GPT-2 (peak RSS flat while the weights
stream).
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
import zipfile

import pytest
import torch

from bmt_paths import REPO, binary, tool

sys.path.insert(0, os.path.join(REPO, "test", "fixtures"))
import make_fixtures  # noqa: E402  (the tiny model configs)

warnings.filterwarnings("ignore")

AUTO_CLASS = {"causal-lm": "AutoModelForCausalLM", "masked-lm": "AutoModelForMaskedLM",
              "span-corruption": "AutoModelForSeq2SeqLM"}
MODELS = {  # name: (fixture config, more bmt-export-hf arguments)
    "gpt2": ("gpt2", []),
    "gpt2-bf16": ("gpt2", ["--dtype", "bfloat16"]),
    "llama": ("llama", []),
    "llama-tied": ("llama", ["--set", "tie_word_embeddings=true"]),
    "bert": ("bert", []),
    "t5": ("t5", []),
}
STEPS = 2


def torchrun(n, *args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={n}", "--no-python", binary("bmt-run"), *map(str, args),
           "--device", "cpu"]
    env = dict(os.environ, OMP_NUM_THREADS="1", BMT_COMM_TIMEOUT_S="120")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def run_tool(*args):
    """bmt-to-hf as a command (its own process: its exit status, its peak RSS)."""
    return subprocess.run([*tool("bmt-to-hf"), *map(str, args)], capture_output=True, text=True)


def convert(capsys, *args):
    """bmt-to-hf in this process (transformers imported once): main()'s
    status, stdout and stderr, as run_tool gives them."""
    from bmt import to_hf
    capsys.readouterr()
    try:
        code = to_hf.main([str(a) for a in args])
    except SystemExit as e:  # argparse's errors
        code = e.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def assert_one_error(result, *fragments):
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


def no_output_left(out):
    """Neither the directory nor a temporary one beside it."""
    parent, name = os.path.split(str(out))
    return not os.path.exists(out) and not [x for x in os.listdir(parent) if name + ".tmp" in x]


def export(name, tmp, suffix=".pt"):
    """bmt-export-hf of the fixture's config (as a config.json file)."""
    import transformers
    from bmt import export_hf
    fixture, more = MODELS[name]
    _, config = make_fixtures.MODELS[fixture](transformers)
    config.to_json_file(str(tmp / "fixture-config.json"))
    out = tmp / f"{name}{suffix}"
    args = ["--config", str(tmp / "fixture-config.json"), "-o", str(out), "--seq-len", "8"]
    assert export_hf.main(args + more) == 0
    return out


def plan_of(sharded):
    with zipfile.ZipFile(sharded) as z:
        top = z.namelist()[0].split("/")[0]
        import io
        return torch.load(io.BytesIO(z.read(f"{top}/bmt/plan.pkl")), weights_only=False), {
            n.split("/bmt/hf/")[1]: z.read(n).decode() for n in z.namelist() if "/bmt/hf/" in n}


def training_args(name, tmp, vocab):
    """Data for 2 steps of 2 ranks: fixed batches, or for BERT a token file."""
    g = torch.Generator().manual_seed(3)
    if name == "bert":
        tokens = torch.randint(5, vocab, (4000,), generator=g).numpy().astype("uint16")
        tokens.tofile(tmp / "tokens.bin")
        with open(tmp / "tokens.json", "w") as f:
            json.dump({"format": "bmt-tokens", "version": 1, "dtype": "uint16",
                       "num_tokens": int(tokens.size), "num_documents": 1, "vocab_size": vocab,
                       "eos_id": 0, "mask_id": 3, "pad_id": None, "tokenizer": "synthetic",
                       "source": []}, f)
        return ["--data", tmp / "tokens.bin", "--seq-len", 8, "--micro-batch", 2]
    if name == "t5":
        batches = {"input_ids": torch.randint(0, vocab, (STEPS, 4, 9), generator=g),
                   "labels": torch.randint(0, vocab, (STEPS, 4, 6), generator=g)}
    else:
        batches = torch.randint(0, vocab, (STEPS, 4, 9), generator=g)
    torch.save(batches, tmp / "batches.pt")
    return ["--batches", tmp / "batches.pt"]


@pytest.fixture(scope="module", params=list(MODELS))
def trained(request, tmp_path_factory):
    """Exported, compiled, trained on 2 ranks with a checkpoint and
    --save-params; the checkpoint exported by bmt-to-hf."""
    name = request.param
    tmp = tmp_path_factory.mktemp(name)
    pt = export(name, tmp)
    sharded = tmp / "sharded.pt"
    r = subprocess.run([binary("bmt-opt"), pt, "-o", sharded, "--world-size", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    plan, hf = plan_of(sharded)
    vocab = json.loads(hf["config.json"])["vocab_size"]
    params = tmp / "params.safetensors"
    r = torchrun(2, sharded, *training_args(name, tmp, vocab), "--steps", STEPS, "--lr", "1e-2",
                 "--checkpoint-dir", tmp / "ck", "--checkpoint-every", STEPS,
                 "--save-params", params)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    checkpoint = tmp / "ck" / f"step-{STEPS:08d}"
    from bmt import to_hf
    assert to_hf.main([str(checkpoint), "-o", str(tmp / "hf")]) == 0
    return {"name": name, "tmp": tmp, "pt": pt, "sharded": sharded, "plan": plan, "hf_files": hf,
            "params": params, "checkpoint": checkpoint, "out": tmp / "hf"}


def test_from_pretrained_loads_the_trained_weights(trained):
    import transformers
    from safetensors.torch import load_file
    plan, out = trained["plan"], trained["out"]
    auto = getattr(transformers, AUTO_CLASS[plan["objective"]])
    dtype = getattr(torch, json.loads(trained["hf_files"]["config.json"])["dtype"])
    model, info = auto.from_pretrained(str(out), output_loading_info=True, dtype=dtype)
    assert type(model).__name__ == plan["model_type"].rsplit(".", 1)[-1]
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"] and not info["error_msgs"], info
    # bmt-run's --save-params of the same run: every state-dict name, tied ones too.
    want = load_file(trained["params"])
    got = model.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
    # The weights trained: they are not the initial ones of sharded.pt.
    first = next(t for t in plan["tensors"] if t["requires_grad"])
    traced = torch.jit.load(str(trained["pt"])).state_dict()
    assert not torch.equal(want[first["name"]], traced[first["name"]])
    # The config travelled unchanged: export -> sharded.pt -> checkpoint -> directory.
    config_text = open(out / "config.json").read()
    assert config_text == trained["hf_files"]["config.json"]
    assert open(trained["checkpoint"] / "hf" / "config.json").read() == config_text
    assert json.loads(config_text)["tie_word_embeddings"] == model.config.tie_word_embeddings


def test_names_are_those_save_pretrained_writes(trained, tmp_path):
    """The tied aliases are omitted as transformers omits them."""
    import transformers
    from safetensors import safe_open
    plan, out = trained["plan"], trained["out"]
    model = getattr(transformers, AUTO_CLASS[plan["objective"]]).from_pretrained(str(out))
    model.save_pretrained(str(tmp_path / "ref"))
    with safe_open(str(tmp_path / "ref" / "model.safetensors"), "pt") as f:
        want = set(f.keys())
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        got = set(f.keys())
        assert f.metadata() == {"format": "pt"}
    assert got == want
    aliases = {a for t in plan["tensors"] for a in t["aliases"]}
    if trained["name"] == "llama":
        assert not aliases
    else:
        assert aliases and aliases - got, aliases  # some tied name was left out
    # The same files (generation_config.json for a model that generates).
    assert sorted(os.listdir(out)) == sorted(os.listdir(tmp_path / "ref"))


def test_shards_and_index(trained, tmp_path, capsys):
    """Beyond --max-shard-size: model-0000k-of-0000n files and the index,
    which transformers loads the same."""
    if trained["name"] != "t5":
        pytest.skip("one model is enough")
    import transformers
    from safetensors import safe_open
    out = tmp_path / "sharded-hf"
    r = convert(capsys, trained["checkpoint"], "-o", out, "--max-shard-size", "20KB")
    assert r.returncode == 0, r.stderr
    index = json.load(open(out / "model.safetensors.index.json"))
    files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
    n = len(files)
    assert n > 2 and files == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    sizes = {}
    for f in files:
        with safe_open(str(out / f), "pt") as s:
            here = {k: s.get_tensor(k).numel() * 4 for k in s.keys()}
        assert all(index["weight_map"][k] == f for k in here)
        # at most 20 KB of tensors, unless one tensor alone is larger
        assert sum(here.values()) <= 20000 or len(here) == 1, (f, here)
        sizes.update(here)
    assert set(sizes) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(sizes.values())
    model, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    one = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(trained["out"])).state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, one[k]), k


def test_a_pt2_carries_the_config(tmp_path):
    """bmt-export-hf -o NAME.pt2 stores config.json as an extra file,
    bmt-opt copies it into sharded.pt (bmt/hf/config.json)."""
    import transformers
    pt2 = export("gpt2", tmp_path, ".pt2")
    with zipfile.ZipFile(pt2) as z:
        extra = {n.split("/extra/")[1]: z.read(n).decode() for n in z.namelist() if "/extra/" in n}
    assert set(extra) == {"config.json", "generation_config.json"}
    config = json.loads(extra["config.json"])
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["dtype"] == "float32"
    _, fixture = make_fixtures.MODELS["gpt2"](transformers)
    assert config["n_embd"] == fixture.n_embd and config["vocab_size"] == fixture.vocab_size
    sharded = tmp_path / "sharded.pt"
    r = subprocess.run([binary("bmt-opt"), pt2, "-o", sharded], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert plan_of(sharded)[1] == extra


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "the cat sat"}]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def save_tokenizer(folder):
    """A word-level tokenizer (trained here, offline) with a chat template,
    as its save_pretrained writes it; the tokenizer files it wrote."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.train_from_iterator(["be brief hello there the cat sat on a mat"] * 3,
                            tokenizers.trainers.WordLevelTrainer(
                                special_tokens=["<unk>", "<eos>", "<|system|>", "<|user|>",
                                                "<|assistant|>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<unk>",
                                   chat_template=TEMPLATE)
    fast.save_pretrained(folder)
    from bmt import to_hf
    return sorted(n for n in os.listdir(folder) if n in to_hf.TOKENIZER_FILES)


def assert_same_tokenizer(out, original):
    from transformers import AutoTokenizer
    got, want = AutoTokenizer.from_pretrained(out), AutoTokenizer.from_pretrained(original)
    text = got.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert text == want.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert "<|assistant|>the cat sat<eos>" in text, text
    assert got(text)["input_ids"] == want(text)["input_ids"]


def test_the_tokenizer_travels_with_the_model(tmp_path, capsys):
    """bmt-export-hf --checkpoint DIR carries DIR's tokenizer files (chat
    template included) through sharded.pt and the checkpoint into
    bmt-to-hf's directory, byte for byte; bmt-to-hf --tokenizer DIR
    --chat-template FILE adds them to a checkpoint that carries none."""
    import transformers
    cls, config = make_fixtures.MODELS["gpt2"](transformers)
    torch.manual_seed(0)
    cls(config).save_pretrained(tmp_path / "hf")
    names = save_tokenizer(tmp_path / "hf")
    assert "tokenizer.json" in names and "tokenizer_config.json" in names, names
    pt, sharded = tmp_path / "m.pt", tmp_path / "m.sharded.pt"
    r = subprocess.run([*tool("bmt-export-hf"), "--checkpoint", tmp_path / "hf", "--seq-len", "8",
                        "-o", pt], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([binary("bmt-opt"), pt, "-o", sharded], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    torch.save(torch.randint(0, 16, (1, 2, 9), generator=torch.Generator().manual_seed(1)),
               tmp_path / "b.pt")
    r = subprocess.run([binary("bmt-run"), sharded, "--batches", tmp_path / "b.pt", "--steps", "1",
                        "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", "1",
                        "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ck = tmp_path / "ck" / "step-00000001"
    assert convert(capsys, ck, "-o", tmp_path / "out").returncode == 0
    for name in names:
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "hf" / name).read_bytes(), name
    assert_same_tokenizer(tmp_path / "out", tmp_path / "hf")
    # A checkpoint without them (its hf/ holds the config only), and a
    # tokenizer.json plus a Jinja template as bmt-prepare-data takes them.
    for name in names:
        os.remove(ck / "hf" / name)
    (tmp_path / "chat.jinja").write_text(TEMPLATE)
    r = convert(capsys, ck, "-o", tmp_path / "out2", "--tokenizer", tmp_path / "hf" / "tokenizer.json",
                "--chat-template", tmp_path / "chat.jinja")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path / "out2")) == ["chat_template.jinja", "config.json",
                                                    "generation_config.json",
                                                    "model.safetensors", "tokenizer.json"]
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast.from_pretrained(tmp_path / "out2", eos_token="<eos>")
    assert tok.apply_chat_template(CHAT, tokenize=False) == transformers.AutoTokenizer.from_pretrained(
        tmp_path / "hf").apply_chat_template(CHAT, tokenize=False)


def test_bad_input(trained, tmp_path, capsys):
    if trained["name"] != "gpt2":
        pytest.skip("one model is enough")
    ck = trained["checkpoint"]
    out = tmp_path / "hf"
    # Not a checkpoint: the checkpoint-dir itself (the command's exit
    # status), a folder without COMPLETE.
    assert_one_error(run_tool(ck.parent, "-o", out), "not a complete checkpoint")
    broken = tmp_path / "broken"
    shutil.copytree(ck, broken)
    os.remove(broken / "COMPLETE")
    assert_one_error(convert(capsys, broken, "-o", out), "not a complete checkpoint")
    assert no_output_left(out)
    # A missing rank file.
    shutil.copy(ck / "COMPLETE", broken / "COMPLETE")
    os.remove(broken / "rank-00001.safetensors")
    assert_one_error(convert(capsys, broken, "-o", out), "rank-00001.safetensors: missing")
    # A truncated rank file.
    data = open(ck / "rank-00001.safetensors", "rb").read()
    open(broken / "rank-00001.safetensors", "wb").write(data[:len(data) // 2])
    assert_one_error(convert(capsys, broken, "-o", out), "rank-00001.safetensors", "truncated")
    assert no_output_left(out)
    # A flipped byte in a parameter shard: found by its CRC-32 while streaming,
    # after output files were begun; none is left.
    header = int.from_bytes(data[:8], "little")
    meta = json.loads(data[8:8 + header])
    begin = 8 + header + meta["s0.param"]["data_offsets"][0]
    flipped = bytearray(data)
    flipped[begin + 5] ^= 0x40
    open(broken / "rank-00001.safetensors", "wb").write(bytes(flipped))
    assert_one_error(convert(capsys, broken, "-o", out),
                     "rank-00001.safetensors: corrupt tensor s0.param", "checksum")
    assert no_output_left(out)
    # checkpoint.json changed (one digit, still valid JSON): its CRC-32 in COMPLETE.
    shutil.copy(ck / "rank-00001.safetensors", broken / "rank-00001.safetensors")
    text = (ck / "checkpoint.json").read_text()
    at = text.index('"seq_len": ') + len('"seq_len": ')  # what bmt-to-hf reads nothing of
    (broken / "checkpoint.json").write_text(text[:at] + "1" + text[at:])
    assert_one_error(convert(capsys, broken, "-o", out), f"{broken}/checkpoint.json: checksum "
                     "mismatch (CRC-32 ", "its COMPLETE file says")
    assert no_output_left(out)
    shutil.copy(ck / "checkpoint.json", broken / "checkpoint.json")
    # A range read again for a second (tied) name must give the bytes of its
    # first read, checked then (a disk that returns other bytes the second
    # time: the file's bytes changed under the export).
    from bmt import to_hf
    meta = json.loads(data[8:8 + header])
    rank = to_hf.RankFile(str(ck), 1, len(data), 2)
    numel = (meta["s0.param"]["data_offsets"][1] - meta["s0.param"]["data_offsets"][0]) // 4
    first = rank.read("s0.param", 0, 64, "F32", numel)
    assert rank.read("s0.param", 0, 64, "F32", numel) == first  # the same bytes again: fine
    clean = rank._pread
    rank._pread = lambda at, n: bytes([clean(at, n)[0] ^ 0x01]) + clean(at, n)[1:]
    with pytest.raises(to_hf.Failure, match=r"corrupt tensor s0.param \(bytes \[0, 64\) of its "
                       r"data, read again for a tied name, differ from their first read\)"):
        rank.read("s0.param", 0, 64, "F32", numel)
    with pytest.raises(to_hf.Failure, match="differ from their first read"):  # a range not read so
        rank.read("s0.param", 8, 16, "F32", numel)
    rank.close()
    # Another model's config: its class has other parameters.
    llama = tmp_path / "llama.json"
    import transformers
    _, config = make_fixtures.MODELS["llama"](transformers)
    config.architectures = ["LlamaForCausalLM"]
    config.to_json_file(str(llama))
    assert_one_error(convert(capsys, ck, "-o", out, "--config", llama),
                     "is not a weight of LlamaForCausalLM")
    assert no_output_left(out)
    # The same model's config of another size: its weights would not load.
    wider = tmp_path / "wider.json"
    cfg = json.load(open(ck / "hf" / "config.json"))
    cfg["n_inner"] = 2 * (cfg["n_inner"] or 4 * cfg["n_embd"])  # the MLP twice as wide
    wider.write_text(json.dumps(cfg))
    assert_one_error(convert(capsys, ck, "-o", out, "--config", wider),
                     "in the checkpoint but")
    assert no_output_left(out)
    # No config anywhere.
    no_config = tmp_path / "no-config"
    shutil.copytree(ck, no_config)
    shutil.rmtree(no_config / "hf")
    assert_one_error(convert(capsys, no_config, "-o", out), "no Hugging Face config")
    # --sharded supplies it.
    r = convert(capsys, no_config, "-o", out, "--sharded", trained["sharded"])
    assert r.returncode == 0, r.stderr
    # An output that exists.
    assert_one_error(convert(capsys, ck, "-o", out), "exists")
    assert_one_error(convert(capsys, ck, "-o", tmp_path / "x", "--max-shard-size", "big"),
                     "--max-shard-size")


@pytest.mark.parametrize("trained", ["gpt2"], indirect=True)
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT"])
def test_a_signal_while_writing_leaves_no_output(trained, signame, tmp_path):
    """SIGTERM (a job scheduler) or SIGINT (Ctrl-C) after the temporary
    folder exists: status 128 + the signal, one error line, no traceback, and
    neither the output nor its temporary folder left. A transformers
    that waits when the model class is looked up holds the run there."""
    from stalled import signal_when_stalled, stalled_module
    env, marker = stalled_module(tmp_path, "transformers", when="getattr")
    out = tmp_path / "hf"

    def temporary_folder_exists():
        assert [x for x in os.listdir(tmp_path) if x.startswith(".hf.tmp-")]

    signum = getattr(signal, signame)
    status, stderr = signal_when_stalled([*tool("bmt-to-hf"), trained["checkpoint"], "-o", out],
                                         env, marker, signum, temporary_folder_exists)
    assert status == 128 + signum, stderr
    assert stderr.strip().splitlines() == [f"error: stopped by {signame}; no output written"], stderr
    assert no_output_left(out)


def test_memory_stays_flat_while_the_weights_stream(tmp_path):
    """A 245 MiB GPT-2 (random init by rule, 1 step, checkpoint): the
    conversion's peak RSS grows by less than 64 MiB while its weights
    stream (the peak before them is the Python, torch and transformers of
    the process), and the files hold the checkpoint's values."""
    import transformers
    from bmt.export_hf import hf_files
    config = transformers.GPT2Config(n_layer=1, n_embd=1024, n_head=16, n_positions=64,
                                     vocab_size=50304, use_cache=False)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config)
    model.eval()
    for module in model.modules():  # zero-stride parameters: a trace of (almost) no bytes
        for name, p in list(module.named_parameters(recurse=False)):
            module._parameters[name] = torch.nn.Parameter(torch.zeros(1).expand(p.shape))
    model.tie_weights()
    inputs = {"input_ids": torch.zeros(1, 8, dtype=torch.long),
              "attention_mask": torch.ones(1, 8, dtype=torch.long)}
    pt = tmp_path / "big.pt"
    torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False).save(
        str(pt), _extra_files=hf_files(model))
    sharded = tmp_path / "big.sharded.pt"
    r = subprocess.run([binary("bmt-opt"), pt, "-o", sharded, "--random-init"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    torch.save(torch.randint(0, 50304, (1, 1, 9), generator=torch.Generator().manual_seed(0)),
               tmp_path / "b.pt")
    r = subprocess.run([binary("bmt-run"), sharded, "--batches", tmp_path / "b.pt", "--steps", "1",
                        "--checkpoint-dir", tmp_path / "ck", "--checkpoint-every", "1",
                        "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "hf"
    r = run_tool(tmp_path / "ck" / "step-00000001", "-o", out, "--max-shard-size", "100MB")
    assert r.returncode == 0, r.stderr
    print(r.stdout)
    m = re.search(r"peak RSS (\d+) MiB \((\d+) MiB before the weights; weights (\d+) MiB, "
                  r"largest tensor (\d+) MiB\)", r.stdout)
    assert m, r.stdout
    peak, before, weights, largest = map(int, m.groups())
    assert weights >= 240 and largest >= 196, r.stdout  # wte: 50304 x 1024 x 4 bytes
    assert peak - before < 64, r.stdout
    assert peak < 2048 + largest, r.stdout
    # 100 MB files: wte (206 MB) alone, the rest (50 MB) in another.
    index = json.load(open(out / "model.safetensors.index.json"))
    wte_file = index["weight_map"].pop("transformer.wte.weight")
    assert {wte_file, *index["weight_map"].values()} == {
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
    assert wte_file not in index["weight_map"].values()
    # The values: each member of the checkpoint's shards, read independently.
    from safetensors import safe_open
    index["weight_map"]["transformer.wte.weight"] = wte_file
    meta = json.load(open(tmp_path / "ck" / "step-00000001" / "checkpoint.json"))
    with safe_open(str(tmp_path / "ck" / "step-00000001" / "rank-00000.safetensors"), "pt") as f:
        checked = 0
        for k, space in enumerate(meta["spaces"]):
            flat = f.get_tensor(f"s{k}.param")
            for member in space["members"]:
                n = torch.Size(member["shape"]).numel()
                value = flat[member["offset"]:member["offset"] + n].view(member["shape"])
                name = member["tensor"]
                with safe_open(str(out / index["weight_map"][name]), "pt") as g:
                    assert torch.equal(g.get_tensor(name), value), name
                checked += 1
    assert checked == len(index["weight_map"]) == 16  # lm_head.weight omitted: tied
