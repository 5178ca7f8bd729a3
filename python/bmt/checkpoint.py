"""A Hugging Face checkpoint compiled without loading it (bmt-export-hf
--checkpoint DIR): the model is built with its parameters on the meta device
(the way accelerate's init_empty_weights and transformers' own loading start),
traced or exported weight-free, and the archive records where each weight is
in DIR's safetensors files; bmt-opt then streams them tensor by tensor into
sharded.pt. docs/hf-checkpoints.md describes the whole path and the record.

Nothing here reads tensor data: the safetensors headers give every tensor's
dtype and shape, and transformers' own key renaming (the rules
from_pretrained applies: legacy names, the base-model prefix) maps checkpoint
keys to the model's state-dict names.
"""
import contextlib
import json
import os

import torch

# The extra record of a weight-free model.pt / model.pt2 (TorchScript's
# _extra_files, torch.export.save's extra_files: the archive's extra/ folder).
RECORD = "bmt-checkpoint.json"
FORMAT = "bmt-checkpoint-weights"
VERSION = 1

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOAT_CODES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


class CheckpointError(Exception):
    """A checkpoint bmt cannot stream; the message names the file or tensor."""


class Checkpoint:
    """The safetensors files of a checkpoint directory, by their headers:
    `files` [{name, size, mtime_ns}], `tensors` {key: (file index, dtype
    code, shape)}, `index_dtype` (the index's metadata "dtype", if any)."""

    def __init__(self, directory, files, tensors, index_dtype=None):
        self.directory = directory
        self.files = files
        self.tensors = tensors
        self.index_dtype = index_dtype

    def file_of(self, key):
        return self.files[self.tensors[key][0]]["name"]

    @property
    def nbytes(self):
        return sum(f["size"] for f in self.files)


def open_checkpoint(directory):
    """Reads the headers of DIR's model.safetensors, or of every shard that
    model.safetensors.index.json names. Raises CheckpointError for .bin
    weights, no weights, a missing shard, an unreadable or truncated file,
    an index naming a tensor its file does not hold, a tensor in two files."""
    from safetensors import safe_open
    directory = os.path.realpath(directory)
    index_path = os.path.join(directory, INDEX)
    index_dtype = None
    if os.path.exists(index_path):
        try:
            with open(index_path) as f:
                index = json.load(f)
            weight_map = index["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"cannot read the checkpoint index {index_path}: {e}") from None
        index_dtype = (index.get("metadata") or {}).get("dtype")
        names = sorted(set(weight_map.values()))
    elif os.path.exists(os.path.join(directory, SINGLE)):
        weight_map, names = None, [SINGLE]
    else:
        bins = sorted(n for n in os.listdir(directory) if n.endswith((".bin", ".bin.index.json")))
        if bins:
            raise CheckpointError(
                f"{directory} holds PyTorch .bin weights ({bins[0]}); bmt-export-hf streams "
                f"safetensors only: convert them (load the model and save_pretrained() it, "
                f"transformers writes safetensors), or pass --load-weights to load the model "
                f"into memory")
        raise CheckpointError(f"{directory} has no {SINGLE} or {INDEX}")
    files, tensors = [], {}
    for i, name in enumerate(names):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise CheckpointError(f"the checkpoint index {index_path} names {name}, which does "
                                  f"not exist in {directory}")
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    piece = f.get_slice(key)
                    if key in tensors:
                        raise CheckpointError(f"checkpoint tensor {key} is in two files: "
                                              f"{names[tensors[key][0]]} and {name}")
                    tensors[key] = (i, piece.get_dtype(), list(piece.get_shape()))
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors' errors: truncated, not safetensors
            raise CheckpointError(f"{path}: not a readable safetensors file ({e})") from None
        stat = os.stat(path)
        files.append({"name": name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})
    if weight_map is not None:
        for key, name in sorted(weight_map.items()):
            if tensors.get(key, (None,))[0] is None or names[tensors[key][0]] != name:
                raise CheckpointError(f"the checkpoint index {index_path} names tensor {key} in "
                                      f"{name}, which does not hold it")
    return Checkpoint(directory, files, tensors, index_dtype)


def auto_dtype(config, checkpoint):
    """The dtype from_pretrained's default (dtype="auto") loads the model in:
    config.dtype, else the index's metadata dtype, else the first floating
    tensor's dtype in the first file, else float32."""
    dtype = getattr(config, "dtype", None) or checkpoint.index_dtype
    if dtype is None:
        first = [code for key, (i, code, _) in checkpoint.tensors.items() if i == 0]
        floats = [code for code in first if code in FLOAT_CODES]
        dtype = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                 "BF16": torch.bfloat16}.get(floats[0] if floats else "F32", torch.float32)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    return dtype


@contextlib.contextmanager
def _parameters_on_meta():
    """Every parameter a module registers goes to the meta device; buffers
    stay where they are made (CPU), so they keep their real values."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            meta = torch.nn.Parameter(param.data.to("meta"), requires_grad=param.requires_grad)
            meta.__dict__.update(param.__dict__)
            module._parameters[name] = meta

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


@contextlib.contextmanager
def _default_dtype(dtype):
    old = torch.get_default_dtype()
    if dtype.is_floating_point:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_on_meta(cls, config, dtype):
    """cls(config) as from_pretrained builds it for `dtype` (the default
    dtype while constructing, its keep-in-float32 modules), with the
    parameters on the meta device (no bytes) and the buffers real."""
    with _default_dtype(dtype), _parameters_on_meta():
        model = cls(config)
    plan = model._get_dtype_plan(dtype) if hasattr(model, "_get_dtype_plan") else {}
    if plan:
        from transformers.core_model_loading import build_glob_alternation
        pattern, group_dtype, _ = build_glob_alternation(list(plan))
        for module_name, module in model.named_modules():
            for name, p in list(module._parameters.items()):
                full = f"{module_name}.{name}" if module_name else name
                match = p is not None and pattern.search(full)
                if match:
                    kept = torch.nn.Parameter(p.data.to(plan[group_dtype[match.lastgroup]]),
                                              requires_grad=p.requires_grad)
                    module._parameters[name] = kept
        model.tie_weights()
    model.eval()
    return model


def _tie_groups(model):
    """Names of each parameter, grouped by tensor (tied names together), in
    named_parameters order."""
    groups = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return list(groups.values())


def weight_map(model, checkpoint):
    """{state-dict name: checkpoint key} for every parameter (tied names
    share their tensor's key) and every persistent buffer the checkpoint
    holds, by transformers' own renaming of checkpoint keys. Returns the map
    and the checkpoint keys the model does not use. Raises CheckpointError
    for a parameter the checkpoint lacks, a key that needs a weight
    conversion (not a renaming), a shape or dtype that differs."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
    transforms = get_model_conversion_mapping(model)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    expected = model.state_dict()
    prefix = model.base_model_prefix
    found, unused = {}, []
    for key in sorted(checkpoint.tensors):
        # As transformers' convert_and_load_state_dict_in_model names them.
        name, pattern = rename_source_key(key, renamings, converters, prefix, expected)
        if name not in expected and key in expected:
            name, pattern = rename_source_key(key, [], [], prefix, expected)
        if name not in expected:
            unused.append(key)
            continue
        if pattern is not None:
            raise CheckpointError(
                f"checkpoint tensor {key} becomes {name} through a transformers weight "
                f"conversion ({pattern}), which bmt does not stream; pass --load-weights")
        if name in found:
            raise CheckpointError(f"checkpoint tensors {found[name]} and {key} are both {name}")
        found[name] = key
    mapping = {}
    tie_targets = getattr(model, "all_tied_weights_keys", None) or {}
    for names in _tie_groups(model):
        present = [n for n in names if n in found]
        if not present:
            aliases = f" (tied to {', '.join(names[1:])})" if len(names) > 1 else ""
            raise CheckpointError(
                f"the checkpoint has no tensor for parameter {names[0]}{aliases} of "
                f"{type(model).__name__}: does {checkpoint.directory}/config.json match the "
                f"weights?")
        # A tie's source (not a tie target) wins, as from_pretrained ties
        # the targets to it after loading.
        source = next((n for n in present if n not in tie_targets), present[0])
        for n in names:
            mapping[n] = found[source]
    params = {n for names in _tie_groups(model) for n in names}
    for name in found:
        if name not in params:
            mapping[name] = found[name]  # a persistent buffer
    for name, key in mapping.items():
        tensor = expected[name]
        _, code, shape = checkpoint.tensors[key]
        what = "parameter" if name in params else "buffer"
        if tuple(shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"checkpoint tensor {key} ({checkpoint.file_of(key)}) has shape {shape}, the "
                f"model's {what} {name} has {list(tensor.shape)}: does "
                f"{checkpoint.directory}/config.json match the weights?")
        if not (code in FLOAT_CODES and tensor.is_floating_point()) and \
                code != SAFETENSORS_CODE.get(tensor.dtype):
            raise CheckpointError(
                f"checkpoint tensor {key} ({checkpoint.file_of(key)}) has dtype {code}, the "
                f"model's {what} {name} is {str(tensor.dtype).removeprefix('torch.')}")
    return mapping, unused


SAFETENSORS_CODE = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                    torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                    torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def record(checkpoint, mapping):
    """The JSON text of the archive's extra record (docs/hf-checkpoints.md)."""
    return json.dumps({
        "format": FORMAT, "version": VERSION,
        "directory": checkpoint.directory,
        "files": checkpoint.files,
        "tensors": {name: {"file": checkpoint.tensors[key][0], "key": key,
                           "dtype": checkpoint.tensors[key][1], "shape": checkpoint.tensors[key][2]}
                    for name, key in sorted(mapping.items())},
    })


def _weight_free_parameters(model):
    """{name: zero-stride CPU view of one element} for every parameter name
    (tied names share one object, so that the importers see the tie): the
    program's shapes and dtypes with no bytes. The element is NaN (0 for
    integers), so that weights taken from the placeholders by mistake (a
    bmt-opt that does not read the record) show at the first loss."""
    views = {}
    for names in _tie_groups(model):
        p = model.get_parameter(names[0])
        fill = float("nan") if p.dtype.is_floating_point else 0
        view = torch.nn.Parameter(torch.full((), fill, dtype=p.dtype).expand(p.shape),
                                  requires_grad=p.requires_grad)
        for n in names:
            views[n] = view
    return views


def _set_tensors(module, tensors):
    """Puts tensors[name] in the slot of each dotted name of `module` (an
    nn.Module or a traced ScriptModule)."""
    for name, t in tensors.items():
        owner, _, leaf = name.rpartition(".")
        setattr(module.get_submodule(owner) if owner else module, leaf, t)


def export_weight_free(model, inputs):
    """torch.export of the meta-built `model` with its parameters as
    zero-stride CPU views (export runs on fake tensors: nothing is computed,
    nothing allocated); the ExportedProgram saves a few bytes per
    parameter."""
    _set_tensors(model, _weight_free_parameters(model))
    return torch.export.export(model, args=(), kwargs=inputs, strict=False)


def trace_weight_free(model, inputs):
    """torch.jit.trace of the meta-built `model` on the meta device (shapes
    only, no arithmetic), then made a CPU trace: its Device constants "meta"
    become "cpu", its parameters zero-stride CPU views, its buffers the real
    values. The program is the one a CPU trace records (the tests compare).
    A scalar tensor the forward makes with torch.tensor(..., device=meta)
    is made on the CPU instead (its value is a constant of the program);
    any other meta constant is an error (CheckpointError)."""
    buffers = dict(model.named_buffers(remove_duplicate=False))
    for module in model.modules():
        for name, b in list(module._buffers.items()):
            if b is not None:
                module._buffers[name] = b.to("meta")
    make_tensor = torch.tensor

    def scalar_on_cpu(*args, **kwargs):
        if str(kwargs.get("device", "")) == "meta":
            kwargs["device"] = "cpu"
        return make_tensor(*args, **kwargs)

    torch.tensor = scalar_on_cpu
    try:
        with torch.no_grad():
            traced = torch.jit.trace(model, example_kwarg_inputs={k: v.to("meta") for k, v in
                                                                  inputs.items()},
                                     strict=False, check_trace=False)
    finally:
        torch.tensor = make_tensor
    for module in traced.modules():
        try:
            graph = module.graph
        except RuntimeError:  # a submodule the trace never called has no forward
            continue
        for node in graph.nodes():
            if node.kind() != "prim::Constant" or node.outputsSize() != 1:
                continue
            kind = node.output().type().kind()
            if kind == "DeviceObjType" and node.s("value") == "meta":
                node.s_("value", "cpu")
            elif kind == "TensorType" and node.kindOf("value") == "t" and \
                    node.t("value").device.type == "meta":
                raise CheckpointError(
                    f"the trace holds a tensor constant made on the meta device ({node}), whose "
                    f"value a weight-free trace cannot know")
    _set_tensors(traced, _weight_free_parameters(model))
    _set_tensors(traced, buffers)
    return traced
