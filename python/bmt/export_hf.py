"""bmt-export-hf: export a Hugging Face transformers model to a TorchScript
archive (-o NAME.pt) or a torch.export archive (-o NAME.pt2, static shapes:
it runs at --batch x --seq-len) that `bmt-opt` imports, the way a
transformers-5 user does it:

    model.eval()
    traced = torch.jit.trace(model, example_kwarg_inputs={...}, strict=False)
    traced.save(OUT)

The model comes from a config, never from a hub (no network here):
  --config gpt2            the architecture's default config in transformers
                           (for gpt2: GPT-2 small, 124 M parameters)
  --config path/config.json  a config file (e.g. from a local checkpoint)
  --checkpoint DIR         a local checkpoint directory (config + safetensors
                           weights): the model is built on the meta device and
                           traced weight-free; the archive records where each
                           weight is in DIR, and bmt-opt streams them into
                           sharded.pt tensor by tensor, so neither tool holds
                           the model in memory (docs/hf-checkpoints.md).
                           --load-weights loads it with from_pretrained instead
                           and saves the weights in the archive.
Config fields can be overridden: --set n_layer=4 --set n_embd=256 (a field
the config class lacks is taken when transformers' modeling code of the
architecture reads it with getattr, e.g. Qwen3-MoE's head_dim).
Attention is what transformers chooses for the architecture (SDPA where it
has it, else eager), as in the user's model; --attn-implementation picks one.
Weights are random (seeded) unless --checkpoint gives them.
--dtype float32|bfloat16|float16 converts the model (model.to(dtype)) before
tracing: its parameters, storage groups and forward/backward are in that
dtype, and bmt-run trains it with float32 master weights (mixed precision;
for float16 with dynamic loss scaling). Without --dtype a --config model is
float32 and a --checkpoint model has the dtype from_pretrained gives it (its
config's dtype, else its weights').

Examples:
  bmt-export-hf --config gpt2 -o gpt2.pt
  bmt-export-hf --config bloom --set n_layer=2 --batch 8 --seq-len 128 -o bloom.pt2
  bmt-export-hf --config llama --set num_hidden_layers=2 --set hidden_size=64 -o llama.pt
  bmt-export-hf --config t5 --set num_layers=2 --seq-len 128 -o t5.pt
  bmt-export-hf --checkpoint llama-3-8b/ --dtype bfloat16 -o llama.pt   # weights stay in llama-3-8b/

--position-ids traces the forward with input_ids and position_ids and without
attention_mask: the program bmt-run --sequences packed trains, documents packed
into rows with position_ids that restart at 0 at each one (transformers' own
packed-sequence detection keeps them from attending to each other).

Encoder-decoders (T5) are exported with decoder_input_ids as well; bmt-run
trains them with T5's span corruption (--seq-len is the encoder input's).

--labels exports forward(..., labels=...) as well: the program computes the
model's own loss (transformers' loss function, returned first as "loss"),
and bmt-run trains on it, feeding the labels transformers expects
(docs/runtime/objectives.md). find-blocks, ZeRO and recompute work as
without it: the loss ops are outside the blocks.

The archive carries the model's Hugging Face config.json (and
generation_config.json when the model generates), as save_pretrained writes
them, and with --checkpoint the folder's tokenizer files (tokenizer.json,
tokenizer_config.json with its chat template, chat_template.jinja, ...,
verbatim), as extra files (extra/config.json); bmt-opt keeps them in
sharded.pt, bmt-run in every checkpoint, and bmt-to-hf writes them into the
Hugging Face directory it exports.

Exit status 0 on success; on bad input (unknown architecture, unreadable
config, a model that cannot be traced; for --checkpoint: .bin weights, a
missing shard, a truncated file, a tensor the files lack or of another shape
or dtype than the model's) one "error: ..." line and status 1, and no output
file (the archive is written to a temporary name and renamed).
"""

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

from bmt.signals import run_stoppable

# The model class used for each architecture's config (`model_type`).
TASK_CLASS = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "opt": "OPTForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "bloom": "BloomForCausalLM",
    "falcon": "FalconForCausalLM",
    "phi": "PhiForCausalLM",
    "gptj": "GPTJForCausalLM",
    "bert": "BertForMaskedLM",
    "t5": "T5ForConditionalGeneration",
    "mt5": "MT5ForConditionalGeneration",
}


def task_class(config, transformers):
    """The model class to export: TASK_CLASS's, else the one the config
    names (`architectures`, as a checkpoint's config.json does) if it is a
    causal or masked LM or seq2seq class of transformers, else the causal LM
    class transformers maps the model_type to."""
    name = TASK_CLASS.get(config.model_type)
    if name is None:
        for arch in getattr(config, "architectures", None) or []:
            if arch.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM",
                              "ForConditionalGeneration")) and hasattr(transformers, arch):
                name = arch
                break
    if name is None:
        cls = transformers.AutoModelForCausalLM._model_mapping.get(type(config), None)
        if cls is None:
            error(f"no causal, masked or seq2seq LM class known for architecture "
                  f"'{config.model_type}'")
        return cls
    return getattr(transformers, name)


def error(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def _first_line(e):
    """An exception's message on one line (at most 300 characters)."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    text = text or type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def span_corruption_target_length(encoder_len, density=0.15, mean_span=3.0):
    """The target length bmt-run's span corruption gives an encoder input of
    encoder_len tokens at its default settings (runtime/objectives/Corruption.cpp:
    spanCorruptionWindow, then spanCorruptionLengths; round() rounds half to
    even as there)."""
    def sizes(window):
        noise = min(max(round(window * density), 1), window - 1)
        spans = min(max(round(noise / mean_span), 1), noise, window - noise)
        return window - noise + spans + 1, noise + spans + 1
    window = 2
    while sizes(window + 1)[0] <= encoder_len:
        window += 1
    return sizes(window)[1]


def parse_value(text):
    """'4' -> 4, '0.1' -> 0.1, 'true' -> True, anything else stays a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def build_config(args, transformers):
    if args.checkpoint:
        if args.set:
            error("--set applies to --config; a checkpoint is exported with its own config.json "
                  "(edit a copy of the folder to change it)")
        if not os.path.isdir(args.checkpoint):
            error(f"checkpoint {args.checkpoint} is not a directory")
        try:
            config = transformers.AutoConfig.from_pretrained(args.checkpoint, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - report any loader failure as one line
            error(f"cannot read the checkpoint config in {args.checkpoint}: {_first_line(e)}")
    else:
        overrides = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep or not key:
                error(f"--set expects KEY=VALUE, got '{item}'")
            overrides[key] = parse_value(value)
        if args.config.endswith(".json") or os.path.sep in args.config:
            try:
                with open(args.config) as f:
                    fields = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                error(f"cannot read config {args.config}: {e}")
            if not isinstance(fields, dict) or "model_type" not in fields:
                error(f"config {args.config} has no model_type")
            model_type = fields.pop("model_type")
        else:
            model_type, fields = args.config, {}
        try:
            defaults = transformers.AutoConfig.for_model(model_type)
        except ValueError:
            error(f"unknown architecture '{model_type}': transformers has no config of that "
                  f"model_type (e.g. {', '.join(sorted(TASK_CLASS)[:6])}, mixtral, qwen3)")
        for key in overrides:
            if not hasattr(defaults, key) and not _model_reads(model_type, key):
                error(f"config of {model_type} has no field '{key}'")
        # Passing the overrides to the constructor (not setting them after)
        # lets fields derived from them follow (e.g. phi's key/value heads).
        try:
            config = transformers.AutoConfig.for_model(model_type, **{**fields, **overrides})
        except Exception as e:  # noqa: BLE001 - invalid values, reported as one line
            error(f"invalid config for {model_type}: {_first_line(e)}")
        args.set = []
    if hasattr(config, "use_cache"):
        config.use_cache = False
    # The attention the user's model runs: transformers' own choice (SDPA
    # where the architecture has it, else eager) unless asked otherwise, so
    # that the exported program computes what the model computes.
    if args.attn_implementation:
        config._attn_implementation = args.attn_implementation
    return config


def hf_files(model):
    """config.json and generation_config.json as model.save_pretrained
    writes them (architectures and dtype of the model), by name, for the
    archive's extra files. use_cache goes back to the config class's
    default: it is off only for tracing."""
    import copy
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    config.dtype = str(model.dtype).removeprefix("torch.")
    if hasattr(config, "use_cache"):
        config.use_cache = getattr(type(config)(), "use_cache", True)
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        config.save_pretrained(tmp)
        if model.can_generate() and model.generation_config is not None:
            generation = copy.deepcopy(model.generation_config)
            if hasattr(generation, "use_cache"):
                generation.use_cache = config.use_cache
            generation.save_pretrained(tmp)
        for name in ("config.json", "generation_config.json"):
            if os.path.exists(os.path.join(tmp, name)):
                with open(os.path.join(tmp, name), encoding="utf-8") as f:
                    files[name] = f.read()
    return files


# The tokenizer files of a Hugging Face folder that the archive carries
# beside config.json (plan::kHfFileNames, include/bmt/Plan/Archive.h).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja", "chat_template.json",
                   "tokenizer.model", "spiece.model", "vocab.json", "merges.txt", "vocab.txt")


def tokenizer_files(folder, text_only):
    """The tokenizer's files in `folder` (verbatim), by name, for the
    archive's extra files. A .pt2 stores text only (torch.export.save's
    extra_files): a binary one (a SentencePiece .model) is left out there,
    with a note saying how to add it."""
    files = {}
    for name in TOKENIZER_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            content = f.read()
        if text_only:
            try:
                content = content.decode("utf-8")
            except UnicodeDecodeError:
                print(f"note: {name} is binary and a .pt2 carries text files only: give "
                      f"bmt-to-hf --tokenizer {folder} to write it with the model")
                continue
        files[name] = content
    return files


def _positive(text):
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects an integer, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse with bmt's error convention: one 'error:' line, exit 1."""

    def error(self, message):
        error(f"{message} (see bmt-export-hf --help)")


def _model_reads(model_type, key):
    """Whether transformers' modeling code of `model_type` reads the config
    attribute `key` although its config class has no such field (Qwen3-MoE's
    `getattr(config, "head_dim", ...)`): its source names it."""
    import importlib
    import inspect
    import re
    module = model_type.replace("-", "_")
    try:
        source = inspect.getsource(importlib.import_module(
            f"transformers.models.{module}.modeling_{module}"))
    except (ImportError, OSError, TypeError):
        return False
    return re.search(r"getattr\(\s*(self\.)?config\s*,\s*[\"']" + re.escape(key) + r"[\"']",
                     source) is not None


def main(argv=None):
    return run_stoppable(_main, argv)


def _main(argv):
    parser = _Parser(prog="bmt-export-hf",
                     description="Exports a Hugging Face transformers model to a TorchScript "
                                 "(.pt) or torch.export (.pt2) archive for bmt-opt.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="architecture name (gpt2, llama, ...) or config.json path")
    source.add_argument("--checkpoint", help="local checkpoint directory (config.json + weights)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field (repeatable)")
    parser.add_argument("-o", "--output", required=True,
                        help="output archive: NAME.pt (TorchScript) or NAME.pt2 (torch.export)")
    parser.add_argument("--seq-len", type=_positive, default=8,
                        help="example sequence length in tokens (default 8; a .pt2 runs at "
                             "--batch x --seq-len only)")
    parser.add_argument("--batch", type=_positive, default=2,
                        help="example batch size (default 2)")
    parser.add_argument("--decoder-seq-len", type=_positive,
                        help="encoder-decoders (T5): the example decoder input's length "
                             "(default: the target length of bmt-run's span corruption for "
                             "an encoder input of --seq-len tokens, which a .pt2 is fixed to)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the exported model's parameters (model.to(dtype) "
                             "before tracing; default: float32 for --config, the checkpoint's "
                             "for --checkpoint)")
    parser.add_argument("--load-weights", action="store_true",
                        help="--checkpoint: load the model with from_pretrained and save its "
                             "weights in the archive, instead of recording where they are in "
                             "the checkpoint's safetensors files (needs the model in memory; "
                             "reads .bin checkpoints too)")
    parser.add_argument("--attn-implementation", choices=["sdpa", "eager"],
                        help="attention to export: sdpa (scaled_dot_product_attention) or eager "
                             "(matmul and softmax); default: transformers' own choice for the "
                             "architecture (sdpa where it has it)")
    parser.add_argument("--labels", action="store_true",
                        help="export with labels: the program returns the model's own loss "
                             "(first, as 'loss'), which bmt-run then trains on")
    parser.add_argument("--position-ids", action="store_true",
                        help="trace the forward with input_ids and position_ids and without "
                             "attention_mask, for bmt-run --sequences packed: transformers "
                             "then keeps packed documents apart (its packed-sequence mask from "
                             "position_ids, which restart at 0 at each document)")
    parser.add_argument("--head", choices=["lm", "none"], default="lm",
                        help="lm: the architecture's language-model class (default); "
                             "none: the bare model (AutoModel: hidden states, no head)")
    args = parser.parse_args(argv)
    if args.labels and args.head == "none":
        error("--labels needs a model with a head (--head lm): the bare model computes no loss")
    if args.load_weights and not args.checkpoint:
        error("--load-weights is for --checkpoint DIR")
    if not args.output.endswith((".pt", ".pth", ".pt2")):
        error(f"output {args.output} must end in .pt (TorchScript) or .pt2 (torch.export)")
    use_export = args.output.endswith(".pt2")

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import transformers

    from bmt import checkpoint

    config = build_config(args, transformers)
    if args.head == "none":
        cls = transformers.AutoModel._model_mapping[type(config)]
        class_name = cls.__name__
    else:
        cls = task_class(config, transformers)
        class_name = cls.__name__
    torch.manual_seed(args.seed)
    start = time.time()
    streamed = args.checkpoint and not args.load_weights
    if streamed:
        model, weights = _build_streamed(args, cls, config, class_name, torch)
    else:
        try:
            if args.checkpoint:
                model = cls.from_pretrained(args.checkpoint, local_files_only=True, config=config)
            else:
                model = cls(config)
        except Exception as e:  # noqa: BLE001
            error(f"cannot build {class_name} from this config: {_first_line(e)}")
        model.eval()
        if args.dtype:
            model.to(getattr(torch, args.dtype))

    vocab = config.vocab_size
    inputs = {
        "input_ids": torch.randint(0, vocab, (args.batch, args.seq_len)),
        "attention_mask": torch.ones(args.batch, args.seq_len, dtype=torch.long),
    }
    if args.position_ids:
        # transformers builds its packed-sequence mask only when attention_mask is None.
        del inputs["attention_mask"]
        inputs["position_ids"] = torch.arange(args.seq_len).expand(args.batch, -1).contiguous()
    decoder_len = None
    if getattr(config, "is_encoder_decoder", False):
        if args.position_ids:
            error(f"--position-ids is for decoder-only models; {class_name} is an encoder-decoder")
        # Teacher forcing: bmt-run feeds the target shifted right as
        # decoder_input_ids.
        decoder_len = args.decoder_seq_len or (span_corruption_target_length(args.seq_len)
                                               if args.seq_len >= 3 else args.seq_len)
        inputs["decoder_input_ids"] = torch.randint(0, vocab, (args.batch, decoder_len))
    elif args.decoder_seq_len is not None:
        error(f"--decoder-seq-len is for encoder-decoders; {class_name} has no decoder input")
    if args.labels:
        # The labels transformers' loss takes (docs/runtime/objectives.md): the decoder's
        # target, the masked-LM targets (-100 elsewhere), or input_ids (the
        # causal-LM loss shifts them). A tensor of its own: one passed twice
        # would be one input of the program.
        if decoder_len is not None:
            labels = torch.randint(0, vocab, (args.batch, decoder_len))
        elif class_name.endswith("ForMaskedLM"):
            labels = torch.full_like(inputs["input_ids"], -100)
            labels[:, ::3] = inputs["input_ids"][:, ::3]
        else:
            labels = inputs["input_ids"].clone()
        inputs["labels"] = labels
    try:
        if streamed:
            traced = (checkpoint.export_weight_free if use_export
                      else checkpoint.trace_weight_free)(model, inputs)
        elif use_export:
            # Static shapes: the program runs at the example's batch x seq-len.
            traced = torch.export.export(model, args=(), kwargs=inputs, strict=False)
        else:
            with torch.no_grad():
                traced = torch.jit.trace(model, example_kwarg_inputs=inputs, strict=False)
    except Exception as e:  # noqa: BLE001 - tracing failures are user errors here
        hint = "; pass --load-weights to trace the loaded model" if streamed else ""
        error(f"cannot {'export' if use_export else 'trace'} {class_name}"
              f"{' on the meta device' if streamed else ''}: {_first_line(e)}{hint}")

    out_dir = os.path.dirname(os.path.abspath(args.output))
    try:
        os.makedirs(out_dir, exist_ok=True)
        # torch.jit.save names the archive's top folder after the file, so
        # save under the final name inside a temporary directory, then move it.
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            tmp_path = os.path.join(tmp, os.path.basename(args.output))
            extra = hf_files(model)
            if args.checkpoint:
                extra.update(tokenizer_files(args.checkpoint, text_only=use_export))
            if streamed:  # where the weights are (docs/hf-checkpoints.md)
                extra[checkpoint.RECORD] = checkpoint.record(*weights[:2])
            if use_export:
                torch.export.save(traced, tmp_path, extra_files=extra)
            else:
                traced.save(tmp_path, _extra_files=extra)
            os.replace(tmp_path, args.output)
    except OSError as e:
        error(f"cannot write {args.output}: {e.strerror or e}")
    except Exception as e:  # noqa: BLE001 - e.g. a Python autograd function in the model
        error(f"cannot save the traced {class_name}: {_first_line(e)}")

    params = sum(p.numel() for p in model.parameters())
    print(f"exported {class_name} ({config.model_type}, {params / 1e6:.1f} M parameters, "
          f"{config.num_hidden_layers} layers, {model.config._attn_implementation} attention) "
          f"to {args.output} in {time.time() - start:.1f} s")
    if args.labels:
        print(f"with labels {list(inputs['labels'].shape)}: the program returns the model's own "
              f"loss first; bmt-run trains on it (docs/runtime/objectives.md, The model's own loss)")
    if decoder_len is not None:
        print(f"encoder-decoder: example encoder input {args.batch} x {args.seq_len}, decoder "
              f"input {args.batch} x {decoder_len}"
              + (" (a .pt2 runs at these shapes: bmt-run's span corruption gives them at "
                 f"--seq-len {args.seq_len} --micro-batch {args.batch})" if use_export else ""))
    if streamed:
        ckpt, mapping, unused = weights
        print(f"weights not copied: {len(set(mapping.values()))} tensors stay in {ckpt.directory} "
              f"({len(ckpt.files)} safetensors file{'s' if len(ckpt.files) != 1 else ''}, "
              f"{ckpt.nbytes} bytes); bmt-opt {args.output} -o NAME.pt streams them into sharded.pt")
        if unused:
            print(f"note: {len(unused)} checkpoint tensor{'s are' if len(unused) != 1 else ' is'} "
                  f"not used by {class_name}: {', '.join(unused[:3])}"
                  f"{', ...' if len(unused) > 3 else ''}")
    return 0


def _build_streamed(args, cls, config, class_name, torch):
    """The --checkpoint model built on the meta device, and where its
    weights are: (model, (checkpoint, {state-dict name: key}, unused keys))."""
    from bmt import checkpoint
    try:
        ckpt = checkpoint.open_checkpoint(args.checkpoint)
        dtype = checkpoint.auto_dtype(config, ckpt)
    except checkpoint.CheckpointError as e:
        error(str(e))
    try:
        model = checkpoint.build_on_meta(cls, config, dtype)
    except Exception as e:  # noqa: BLE001
        error(f"cannot build {class_name} from this config: {_first_line(e)}")
    # transformers routes experts by its GPU code path on the meta device (the
    # expert ids as int32, which CPU ops such as histc refuse at run time).
    if any(type(m).__name__.endswith("Experts") for m in model.modules()):
        error(f"{class_name} is a mixture of experts, whose routing bmt cannot trace on the meta "
              f"device (transformers takes its GPU path there): pass --load-weights")
    if args.dtype:
        model.to(getattr(torch, args.dtype))
    try:
        mapping, unused = checkpoint.weight_map(model, ckpt)
    except checkpoint.CheckpointError as e:
        error(str(e))
    return model, (ckpt, mapping, unused)


if __name__ == "__main__":
    sys.exit(main())
