"""bmt-to-hf: export a bmt-run checkpoint to a Hugging Face model directory.

    bmt-to-hf CHECKPOINT -o DIR [--max-shard-size 5GB] [--config FILE] [--sharded sharded.pt]
              [--tokenizer PATH] [--chat-template FILE]

CHECKPOINT is a complete checkpoint folder of `bmt-run --checkpoint-dir D`
(D/step-00000010; docs/checkpoint-format.md). DIR gets what
`model.save_pretrained(DIR)` writes, and `AutoModelFor...from_pretrained(DIR)`
loads it:

  config.json                       the model's Hugging Face config
  generation_config.json            when the model has one
  tokenizer.json, ...               the tokenizer's files, when the checkpoint
                                    carries them or --tokenizer names them
  model.safetensors                 the trained parameters, or, beyond
  model-0000k-of-0000n.safetensors  --max-shard-size, shards and
  model.safetensors.index.json      their index (weight_map)

The config comes from the checkpoint (bmt-run copies the one sharded.pt
carries, which bmt-export-hf stored with the model, into every checkpoint
as hf/config.json), else from --sharded's record bmt/hf/config.json, or
from --config (a model traced by hand). The original model is not needed:
transformers builds the config's class on the meta device (no memory) only
to learn its state-dict names and which tied names it omits
(save_pretrained's remove_tied_weights_from_state_dict: of tied names, the
ones in the class's tied-weights keys are left out, e.g. GPT-2's
lm_head.weight; the tie itself is in the config).

Frozen parameters (bmt-opt --freeze, LoRA's base) are not in checkpoints:
with --sharded, the run's sharded.pt, they are read from it. --adapter
(with --sharded) writes instead peft's adapter folder of a bmt-opt --lora
run: adapter_config.json (from the plan's bmt.lora attribute) and
adapter_model.safetensors (the checkpoint's adapters under peft's names),
for peft.PeftModel.from_pretrained(base_model, DIR). --merge (with
--sharded) writes the full model with the adapters merged into the base
weights, as peft's merge_and_unload.

The parameters are streamed: each one's pieces are read from the rank files
that hold them (one pread per piece of at most 16 MiB, the layout of
checkpoint.json's spaces) and written into the output shards through a
safetensors writer of the format's own (header first, then the bytes in
order), so that memory stays flat whatever the model's size; the peak RSS
is printed. Every rank file's tensors are read in order and checked against
their CRC-32s as they stream.

Exit status 0 on success. On bad input (a folder that is not a complete
checkpoint, a missing or truncated rank file, a checksum mismatch, no
config, a config whose class does not have the checkpoint's parameters)
one "error: ..." line and status 1, and no DIR: it is written as a
temporary folder beside DIR and renamed at the end.
"""

import argparse
import json
import os
import re
import resource
import shutil
import struct
import sys
import tempfile
import time
import warnings

from bmt.checkpoint_files import (CHUNK, ELEMENT_SIZE, SAFETENSORS_DTYPE, Failure, RankFile,
                                  _read, read_checkpoint)
from bmt.sharded_run import (TORCH_DTYPE, check_no_buffer_moved, check_sharded_is_the_runs,
                             frozen_bytes, frozen_parameters, lora_config, merged_bytes,
                             tensor_of)
from bmt.signals import run_stoppable

# The Hugging Face files a checkpoint (hf/) and sharded.pt (bmt/hf/) carry:
# the config, then the tokenizer's (plan::kHfFileNames, include/bmt/Plan/Archive.h).
HF_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
            "chat_template.json", "tokenizer.model", "spiece.model", "vocab.json", "merges.txt",
            "vocab.txt")
TOKENIZER_FILES = HF_FILES[2:]
def peak_rss_mib():
    """This process's peak resident set size so far, MiB: Linux's VmHWM
    (/proc/self/status), which starts afresh at exec, where getrusage's
    ru_maxrss keeps the parent's at fork (a big parent, such as pytest,
    would hide ours); getrusage elsewhere."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --- reading the checkpoint --------------------------------------------------
# --- the Hugging Face files ---------------------------------------------------
def tokenizer_files(path):
    """{name: bytes} of --tokenizer PATH: a folder's tokenizer files (what
    a tokenizer's save_pretrained writes), or one tokenizer.json file (what
    bmt-prepare-data --tokenizer / --train-bpe use)."""
    if os.path.isdir(path):
        files = {n: _read(os.path.join(path, n)) for n in TOKENIZER_FILES
                 if os.path.isfile(os.path.join(path, n))}
        if not files:
            raise Failure(f"{path}: no tokenizer files (tokenizer.json, tokenizer_config.json, "
                          "...) in this folder")
        return files
    return {"tokenizer.json": _read(path)}


def hf_files(folder, args):
    """{name: bytes} of config.json (and generation_config.json, the
    tokenizer's files) and where the config came from. --tokenizer's files
    replace the carried tokenizer's."""
    files, where = _carried_files(folder, args)
    if args.tokenizer:
        files = {n: v for n, v in files.items() if n not in TOKENIZER_FILES}
        files.update(tokenizer_files(args.tokenizer))
    if args.chat_template:
        files["chat_template.jinja"] = _read(args.chat_template)
    return files, where


def _carried_files(folder, args):
    if args.config:
        files = {"config.json": _read(args.config)}
        generation = os.path.join(os.path.dirname(os.path.abspath(args.config)),
                                  "generation_config.json")
        if os.path.exists(generation):
            files["generation_config.json"] = _read(generation)
        return files, args.config
    files = {}
    for name in HF_FILES:
        path = os.path.join(folder, "hf", name)
        if os.path.exists(path):
            files[name] = _read(path)
    if files:
        return files, os.path.join(folder, "hf")
    if args.sharded:
        import zipfile
        try:
            with zipfile.ZipFile(args.sharded) as z:
                for record in z.namelist():
                    top, _, rest = record.partition("/")
                    if rest.startswith("bmt/hf/") and rest[len("bmt/hf/"):] in HF_FILES:
                        files[rest[len("bmt/hf/"):]] = z.read(record)
        except (OSError, zipfile.BadZipFile) as e:
            raise Failure(f"{args.sharded}: not a sharded.pt archive ({e})") from None
        if "config.json" in files:
            return files, args.sharded
        raise Failure(f"{args.sharded} has no Hugging Face config (bmt/hf/config.json): its "
                      "model was not exported by bmt-export-hf; give --config config.json")
    raise Failure(f"{folder} has no Hugging Face config (hf/config.json): give --sharded "
                  "sharded.pt or --config config.json")


def model_class(config_text, where, meta, transformers, tmp):
    """The config and the transformers class it names (config.architectures,
    else the class of the plan's model_type), built from `tmp`/config.json."""
    try:
        fields = json.loads(config_text)  # bytes: UTF-8 (json.loads decodes it)
        if not isinstance(fields, dict) or "model_type" not in fields:
            raise ValueError("no model_type")
    except ValueError as e:
        raise Failure(f"{where}: not a Hugging Face config.json ({e})") from None
    names = fields.get("architectures") or []
    plan_type = meta.get("plan", {}).get("model_type", "")
    name = names[0] if names else plan_type.rsplit(".", 1)[-1]
    cls = getattr(transformers, name, None)
    if cls is None or not hasattr(cls, "from_pretrained"):
        raise Failure(f"{where}: transformers {transformers.__version__} has no model class "
                      f"'{name}'")
    try:
        config = transformers.AutoConfig.from_pretrained(tmp, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any loader failure is one line
        raise Failure(f"{where}: transformers cannot read this config: {e}") from None
    return cls, config


def hf_names(cls, config, torch):
    """The names save_pretrained writes for `cls(config)`, in state-dict
    order (its state dict without the tied names it omits: transformers'
    own remove_tied_weights_from_state_dict on a model on the meta device),
    and each one's shape."""
    from transformers.modeling_utils import remove_tied_weights_from_state_dict
    with torch.device("meta"):
        model = cls(config)
    state = model.state_dict()
    kept = remove_tied_weights_from_state_dict(dict(state), model)
    names = [n for n in state if n in kept]
    return names, {n: list(state[n].shape) for n in names}


# --- writing -----------------------------------------------------------------

class Tensor:
    """An output tensor: its name, dtype code, shape and where its bytes are
    (a member of a checkpoint space)."""

    def __init__(self, name, dtype, shape, space, offset, slices=None):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.space, self.offset = space, offset
        # Tensor parallelism: [(space, offset, split)] of its slice in each
        # TP rank's space, or None (one piece).
        self.slices = slices
        self.numel = 1
        for d in shape:
            self.numel *= d
        self.nbytes = self.numel * ELEMENT_SIZE[dtype]


def split_into_files(tensors, max_size):
    """{file name: tensors}, in order: as huggingface_hub's
    split_state_dict_into_shards_factory splits a state dict for
    save_pretrained (a new file when the next tensor would take the current
    one past max_size; a tensor larger than max_size alone), except that a
    large tensor's file keeps its place in the order, so that the rank files
    are read front to back. model.safetensors when one file holds them all,
    else model-0000k-of-0000n.safetensors."""
    groups, current, size = [], [], 0
    for t in tensors:
        if current and size + t.nbytes > max_size:
            groups.append(current)
            current, size = [], 0
        current.append(t)
        size += t.nbytes
    if current:
        groups.append(current)
    if len(groups) == 1:
        return {"model.safetensors": groups[0]}
    n = len(groups)
    return {f"model-{k + 1:05d}-of-{n:05d}.safetensors": g for k, g in enumerate(groups)}


def local_numel(split):
    """The elements of a TP rank's slice, from its split's local_shape."""
    n = 1
    for d in split["local_shape"]:
        n *= d
    return n


def consecutive_rows(t):
    """Whether tensor t's slices, split on dim 0 without padding, hold
    consecutive rows in slice order (an expert parameter split over the
    expert group: position p holds experts [p*X/E, (p+1)*X/E)), so that
    their bytes one after another are the tensor's."""
    if t.split["dim"] != 0:
        return False
    at = 0
    for _, _, split in t.slices:
        ranges = split["ranges"]
        if (len(ranges) != 1 or ranges[0][0] != 0 or ranges[0][1] != at
                or ranges[0][2] != split["local_shape"][0]):
            return False
        at += ranges[0][2]
    return at == t.shape[0]


def global_tensor(t, data, torch):
    """The bytes of tensor t (row-major, its global shape) from the bytes
    of its T slices `data` (TP rank order). Each slice's split records, as
    bmt-run wrote it from the runtime's split rule, its local shape and the
    ranges [local, global, length] of the split dim it holds (the rest is
    padding, dropped)."""
    dim = t.split["dim"]
    dtype = getattr(torch, TORCH_DTYPE[t.dtype])
    whole = torch.empty(t.shape, dtype=dtype)
    covered = 0
    for d, (_, _, split) in zip(data, t.slices):
        s = torch.frombuffer(bytearray(d), dtype=dtype).view(split["local_shape"])
        for local, start, length in split["ranges"]:
            whole.narrow(dim, start, length).copy_(s.narrow(dim, local, length))
            covered += length
    if covered != t.shape[dim]:
        raise Failure(f"{t.name}: its slices' ranges cover {covered} of {t.shape[dim]} "
                      f"along dim {dim} (a bad checkpoint.json)")
    return whole.view(-1).view(torch.uint8).numpy().tobytes()


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_safetensors(path, tensors, stream):
    """A safetensors file of `tensors` (in order), their bytes from
    stream(tensor) chunk by chunk: header (JSON padded to 8 bytes, as the
    safetensors library writes it), then the data."""
    header, offset = {}, 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": t.shape,
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, struct.pack("<Q", len(text)) + text)
        for t in tensors:
            written = 0
            for chunk in stream(t):
                write_all(fd, chunk)
                written += len(chunk)
            if written != t.nbytes:
                raise Failure(f"{t.name}: {written} bytes read, {t.nbytes} expected")
    finally:
        os.close(fd)


def _size(text):
    """argparse type: a byte count, '5GB' (10^9, as transformers reads it),
    '500MB', '2GiB' (2^30), ... at least 1."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in units or float(m.group(1)) * units[m.group(2).upper()] < 1:
        raise argparse.ArgumentTypeError(f"expects a size such as 5GB or 500MB, got "
                                         f"'{text}'")
    return int(float(m.group(1)) * units[m.group(2).upper()])


class _Parser(argparse.ArgumentParser):
    """argparse with bmt's error convention: one 'error:' line, exit 1."""

    def error(self, message):
        print(f"error: {message} (see bmt-to-hf --help)", file=sys.stderr)
        sys.exit(1)


def convert(args):
    start = time.time()
    folder = args.checkpoint.rstrip("/") or "/"
    meta = read_checkpoint(folder)
    if args.adapter and args.merge:
        raise Failure("--adapter and --merge exclude each other")
    if meta.get("plan", {}).get("adapters") and not (args.adapter or args.merge):
        raise Failure(f"{folder} trained LoRA adapters, not the whole model: write peft's "
                      "adapter folder with --adapter --sharded SHARDED.pt, or the model with "
                      "the adapters merged in with --merge --sharded SHARDED.pt")
    adapter = lora_config(args.sharded) if args.adapter else None
    merge = lora_config(args.sharded) if args.merge else None
    lora_members, lora_values = [], {}  # --merge: the adapters, read first
    files, where = ({}, None) if adapter else hf_files(folder, args)
    out = os.path.abspath(args.output)
    if os.path.exists(out) and not (os.path.isdir(out) and not os.listdir(out)):
        raise Failure(f"{args.output} exists; bmt-to-hf writes a new directory (remove it or "
                      "choose another -o)")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise Failure(f"{args.output}: the directory {parent} does not exist")
    # Rank files, opened and checked before anything is written.
    world = meta["world_size"]
    spaces = meta["spaces"]
    tp = meta.get("tensor_parallel", 1)
    ep = meta.get("expert_parallel", 1)

    def copy_of(s):
        """The group a space's copies run over (T TP ranks, E expert-group
        positions, or 1) and the copy it is."""
        if "ep_rank" in s:
            return ep, s["ep_rank"]
        return tp, s.get("tp_rank", 0)

    stage_ranks = world // meta.get("pipeline_stages", 1)

    def rank_of(k, q):
        """The rank whose file holds shard q of space k: q * T + its tp_rank,
        q * E + its ep_rank (an expert-split group), else q; from the first
        rank of the pipeline stage that wrote it (its "stage" s: s * D)."""
        size, position = copy_of(spaces[k])
        return spaces[k].get("stage", 0) * stage_ranks + q * size + position

    needed = sorted({0} | {rank_of(k, q) for k, s in enumerate(spaces)
                           for q in range(s["shards"])})
    ranks = {r: RankFile(folder, r, meta["rank_bytes"][r], world) for r in needed}
    for k, s in enumerate(spaces):
        for q in range(s["shards"]):
            ranks[rank_of(k, q)].entry(f"s{k}.param", SAFETENSORS_DTYPE[s["dtype"]],
                                       s["shard_size"])
    # Where each TP rank's or expert-group position's slice of a member is.
    copies = {}
    for k, s in enumerate(spaces):
        for m in s["members"]:
            copies.setdefault(m["tensor"], {})[copy_of(s)[1]] = (k, m["offset"], m.get("split"))

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    import transformers

    if args.sharded:
        plan = check_sharded_is_the_runs(meta, folder, args.sharded, torch)
        if adapter:
            check_no_buffer_moved(ranks[0], plan, args.sharded)

    tmp = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out)}.tmp-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # as os.makedirs would make it (mkdtemp: 0700)
        for name, content in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(content)
        shapes = {}  # name -> the shape the config's class gives it
        if adapter:  # peft's names of the adapters, which are all that trains
            cls = None
            names = ["base_model.model." + m["tensor"] for s in spaces if copy_of(s)[1] == 0
                     for m in s["members"]]
            bad = [n for n in names if ".lora_A." not in n and ".lora_B." not in n]
            if bad:
                raise Failure(f"{folder} trains {bad[0][len('base_model.model.'):]}, which is "
                              "not a LoRA adapter (--adapter exports a bmt-opt --lora run)")
        else:
            cls, config = model_class(files["config.json"], where, meta, transformers, tmp)
            names, shapes = hf_names(cls, config, torch)
        wanted = set(names)

        # The output tensors, in the checkpoint's layout order (so that every
        # rank file is read front to back, its checksums checked on the way).
        tensors, seen, ties = [], set(), []
        for k, s in enumerate(spaces):
            group, position = copy_of(s)
            if position != 0:
                continue  # the other copies' slices are read with copy 0's
            for m in sorted(s["members"], key=lambda m: m["offset"]):
                slices = None
                if "split" in m:
                    have = copies[m["tensor"]]
                    if sorted(have) != list(range(group)):
                        what = "expert-group positions" if "ep_rank" in s else "TP ranks"
                        raise Failure(f"{folder}/checkpoint.json: bad layout ({m['tensor']} is "
                                      f"in the spaces of {what} {sorted(have)} of {group})")
                    slices = [have[r] for r in range(group)]
                if merge and (".lora_A." in m["tensor"] or ".lora_B." in m["tensor"]):
                    t = Tensor(m["tensor"], SAFETENSORS_DTYPE[s["dtype"]], list(m["shape"]), k,
                               m["offset"], slices)
                    t.split = m.get("split")
                    lora_members.append(t)
                    continue
                all_names = [("base_model.model." if adapter else "") + m["tensor"],
                             *m["aliases"]]
                mine = [n for n in all_names if n in wanted]
                if not mine:
                    raise Failure(f"the checkpoint's parameter {m['tensor']} is not a weight "
                                  f"of {cls.__name__} ({where}): another model's config?")
                for n in mine:
                    t = Tensor(n, SAFETENSORS_DTYPE[s["dtype"]], list(m["shape"]), k,
                               m["offset"], slices)
                    t.split = m.get("split")
                    tensors.append(t)
                    seen.add(n)
                ties += [f"{n} = {mine[0]}" for n in all_names if n not in mine]
        # The buffers training moves (a router's score-correction bias,
        # bmt-run --moe-bias-update-rate): rank 0's file holds them.
        for n in names:
            if n not in seen and f"buffer.{n}" in ranks[0].entries:
                code, shape, _ = ranks[0].entries[f"buffer.{n}"]
                t = Tensor(n, code, list(shape), None, 0)
                t.split, t.buffer = None, True
                tensors.append(t)
                seen.add(n)
        missing = [n for n in names if n not in seen]
        if missing and args.sharded and not adapter:
            # Frozen parameters: not in checkpoints, read from sharded.pt.
            frozen = frozen_parameters(args.sharded, torch)
            for n in missing:
                if n in frozen:
                    member, offset, dtype, shape = frozen[n]
                    t = Tensor(n, dtype, shape, None, offset)
                    t.record = member
                    tensors.append(t)
                    seen.add(n)
            missing = [n for n in names if n not in seen]
        if missing:
            raise Failure(f"{cls.__name__} has {len(missing)} weight(s) the checkpoint does not "
                          f"hold: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
                          "(bmt-run checkpoints hold the trainable parameters; give the "
                          "run's --sharded sharded.pt for its frozen ones; buffers are not "
                          "exported)")

        for t in tensors:  # a config of another size loads into no model
            if t.name in shapes and shapes[t.name] != list(t.shape):
                raise Failure(f"{t.name} is {list(t.shape)} in the checkpoint but "
                              f"{shapes[t.name]} in {cls.__name__} of {where}: another model's "
                              "config?")
        files_of = ({"adapter_model.safetensors": tensors} if adapter else
                    split_into_files(tensors, args.max_shard_size))
        if adapter:
            with open(os.path.join(tmp, "adapter_config.json"), "w", encoding="utf-8") as f:
                f.write(json.dumps(adapter, indent=2, sort_keys=True) + "\n")

        def pieces(k, offset, numel, dtype):
            """The bytes of elements [offset, offset + numel) of space k's
            parameters, in pieces of at most CHUNK bytes."""
            s = spaces[k]
            shard_size, size = s["shard_size"], ELEMENT_SIZE[dtype]
            field = f"s{k}.param"
            at, end = offset, offset + numel
            while at < end:
                q = at // shard_size
                upto = min(end, (q + 1) * shard_size, at + CHUNK // size)
                yield ranks[rank_of(k, q)].read(field, (at - q * shard_size) * size,
                                                (upto - at) * size, dtype, shard_size)
                at = upto

        def stream(t):
            if getattr(t, "buffer", False):
                data = ranks[0].read(f"buffer.{t.name}", 0, t.nbytes, t.dtype, t.numel)
                ranks[0].finish(f"buffer.{t.name}", t.dtype, t.numel)
                yield data
                return
            module = t.name.removesuffix(".weight")
            if merge and module + ".lora_A.weight" in lora_values:
                yield merged_bytes(t, b"".join(frozen_bytes(args.sharded, t)),
                                   lora_values[module + ".lora_A.weight"],
                                   lora_values[module + ".lora_B.weight"], merge, torch)
                return
            if getattr(t, "record", None):
                yield from frozen_bytes(args.sharded, t)
                return
            if t.slices is None:
                yield from pieces(t.space, t.offset, t.numel, t.dtype)
                return
            if consecutive_rows(t):
                # Split on dim 0 into consecutive rows (experts over the
                # expert group): the slices in order are the tensor.
                for k, offset, split in t.slices:
                    yield from pieces(k, offset, local_numel(split), t.dtype)
                return
            # A TP-split tensor: its T slices read whole, put back together.
            whole = global_tensor(t, [b"".join(pieces(k, offset, local_numel(split), t.dtype))
                                      for k, offset, split in t.slices], torch)
            for at in range(0, len(whole), CHUNK):
                yield whole[at:at + CHUNK]

        for t in lora_members:  # in layout order: the rank files read front to back
            lora_values[t.name] = tensor_of(b"".join(stream(t)), t, torch)
        before_weights = peak_rss_mib()
        for filename, group in files_of.items():
            write_safetensors(os.path.join(tmp, filename), group, stream)
        # The padding after each space's last member, for the checksums.
        for k, s in enumerate(spaces):
            for q in range(s["shards"]):
                ranks[rank_of(k, q)].finish(f"s{k}.param", SAFETENSORS_DTYPE[s["dtype"]],
                                            s["shard_size"])
        if len(files_of) > 1:
            index = {"metadata": {"total_parameters": sum(t.numel for t in tensors),
                                  "total_size": sum(t.nbytes for t in tensors)},
                     "weight_map": {t.name: f for f, group in files_of.items() for t in group}}
            with open(os.path.join(tmp, "model.safetensors.index.json"), "w",
                      encoding="utf-8") as f:
                f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
        for name in [*os.listdir(tmp), "."]:  # on disk before the rename
            fd = os.open(os.path.join(tmp, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        if os.path.isdir(out):
            os.rmdir(out)  # empty (checked above)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for f in ranks.values():
            f.close()
    largest = max(t.nbytes for t in tensors)
    weights = sum(t.nbytes for t in tensors)
    print(f"bmt-to-hf: wrote {args.output}: "
          f"{cls.__name__ if cls else 'LoRA adapter (adapter_config.json)'}, {len(tensors)} tensors "
          f"({weights} bytes) in " + (next(iter(files_of)) if len(files_of) == 1 else
                                      f"{len(files_of)} files with an index")
          + f", step {meta['step']} "
          f"of {folder}" + (f"; tied, omitted as transformers does: {', '.join(ties)}"
                            if ties else "") + f"; {time.time() - start:.1f} s")
    print(f"bmt-to-hf: peak RSS {peak_rss_mib():.0f} MiB ({before_weights:.0f} MiB before the "
          f"weights; weights {weights / 2**20:.0f} MiB, largest tensor {largest / 2**20:.0f} MiB)")
    return 0


def main(argv=None):
    parser = _Parser(prog="bmt-to-hf",
                     description="Exports a bmt-run checkpoint folder to a Hugging Face model "
                                 "directory (config.json + safetensors) that "
                                 "from_pretrained loads.")
    parser.add_argument("checkpoint", help="a complete checkpoint folder (D/step-00000010 of "
                                           "bmt-run --checkpoint-dir D)")
    parser.add_argument("-o", "--output", required=True,
                        help="the directory to write (must not exist, or be empty)")
    parser.add_argument("--max-shard-size", type=_size, default="5GB",
                        help="largest safetensors file before splitting into shards with an "
                             "index (default 5GB, huggingface_hub's; transformers 5's "
                             "save_pretrained uses 50GB)")
    source = parser
    source.add_argument("--sharded", help="the run's sharded.pt: its frozen parameters "
                                          "(not in checkpoints), and config.json for a "
                                          "checkpoint without hf/config.json")
    source.add_argument("--config", help="a config.json to use (a model traced without one); "
                                         "generation_config.json beside it is taken too")
    parser.add_argument("--adapter", action="store_true",
                        help="write peft's adapter folder (adapter_config.json + "
                             "adapter_model.safetensors, for PeftModel.from_pretrained on the "
                             "base model) of a bmt-opt --lora run; needs --sharded")
    parser.add_argument("--merge", action="store_true",
                        help="write the full model of a bmt-opt --lora run with its adapters "
                             "merged into the base weights (as peft's merge_and_unload); needs "
                             "--sharded")
    parser.add_argument("--tokenizer", help="write this tokenizer with the model: a folder's "
                                            "tokenizer files (tokenizer.json, "
                                            "tokenizer_config.json, ...) or a tokenizer.json "
                                            "file (bmt-prepare-data's --tokenizer); default: "
                                            "the one the checkpoint carries, if any")
    parser.add_argument("--chat-template", help="write this Jinja file as chat_template.jinja "
                                                "(bmt-prepare-data's --chat-template)")
    args = parser.parse_args(argv)
    try:
        return run_stoppable(convert, args)
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
    except OSError as e:
        print(f"error: {e.filename or args.output}: {e.strerror or e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
