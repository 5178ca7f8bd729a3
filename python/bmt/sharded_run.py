"""What a run's sharded.pt says for bmt-to-hf: its plan, LoRA settings
(peft's adapter_config.json) and frozen parameters (streamed from the
archive), and whether it is the plan a checkpoint trained.
"""
import struct

from bmt.checkpoint_files import CHUNK, ELEMENT_SIZE, SAFETENSORS_DTYPE, Failure

TORCH_DTYPE = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64",
               "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8",
               "BOOL": "bool"}


def lora_config(sharded):
    """peft's adapter_config.json for the bmt-opt --lora plan `sharded` (its
    program's bmt.lora attribute, written by bmt-lora)."""
    import re
    import zipfile
    if not sharded:
        raise Failure("--adapter and --merge need --sharded sharded.pt (the LoRA plan the run "
                      "trained)")
    try:
        with zipfile.ZipFile(sharded) as z:
            name = next((n for n in z.namelist() if n.endswith("/bmt/program.mlir")), None)
            text = z.read(name).decode() if name else ""
    except (OSError, zipfile.BadZipFile) as e:
        raise Failure(f"{sharded}: not a sharded.pt archive ({e})") from None
    m = re.search(r"bmt\.lora = \{([^}]*)\}", text)
    if not m:
        raise Failure(f"{sharded} has no LoRA adapters (compile with bmt-opt --lora)")
    fields = dict(re.findall(r'(\w+) = ("[^"]*"|[^,]+)', m.group(1)))

    def number(key):
        return float(fields[key].split(":")[0].strip())
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": None,
            "r": int(number("r")), "lora_alpha": number("alpha"),
            "lora_dropout": number("dropout"),
            "fan_in_fan_out": fields["fan_in_fan_out"].strip() == "true",
            "target_modules": fields["target_modules"].strip('"').split(","),
            "bias": "none", "inference_mode": True}

def tensor_of(data, t, torch):
    """Tensor `t`'s bytes as a torch tensor of its dtype and shape."""
    return torch.frombuffer(bytearray(data), dtype=getattr(torch, TORCH_DTYPE[t.dtype])).view(
        t.shape).clone()


def merged_bytes(t, base, a, b, config, torch):
    """The bytes of base weight `t` with its adapter merged as peft's
    merge_and_unload does: W + (B @ A) * (alpha / r), transposed for
    fan_in_fan_out (Conv1D, W [in, out])."""
    w = tensor_of(base, t, torch)
    delta = (b @ a) * (config["lora_alpha"] / config["r"])
    if config["fan_in_fan_out"]:
        delta = delta.T
    return (w + delta.to(w.dtype)).contiguous().numpy().tobytes() if w.dtype != torch.bfloat16 \
        else (w + delta.to(w.dtype)).contiguous().view(torch.int16).numpy().tobytes()


def sharded_plan(sharded, torch):
    """(plan dict, the archive's top folder, program text) of sharded.pt."""
    import io
    import zipfile
    try:
        with zipfile.ZipFile(sharded) as z:
            names = z.namelist()
            plan_name = next((n for n in names if n.endswith("/bmt/plan.pkl")), None)
            program = next((n for n in names if n.endswith("/bmt/program.mlir")), None)
            if plan_name is None or program is None:
                raise Failure(f"{sharded}: not a sharded.pt archive (no bmt/plan.pkl)")
            plan = torch.load(io.BytesIO(z.read(plan_name)), weights_only=False)
            text = z.read(program).decode()
    except (OSError, zipfile.BadZipFile) as e:
        raise Failure(f"{sharded}: not a sharded.pt archive ({e})") from None
    return plan, plan_name[:-len("bmt/plan.pkl")], text


def frozen_identity(plan):
    """runtime::frozenIdentity of `plan` (FNV-1a 64 of the frozen
    parameters' names, dtypes, shapes, CRC-32s and init rules), "" when
    nothing is frozen."""
    h, frozen = 1469598103934665603, False

    def add(data):
        nonlocal h
        for byte in data:
            h = ((h ^ byte) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    for t in plan["tensors"]:
        if t["is_parameter"] and not t["requires_grad"]:
            frozen = True
            add(t["name"].encode() + b"\0")
            add(t["dtype"].encode() + b"\0")
            for d in t["shape"]:
                add(struct.pack("<q", d))
            add(struct.pack("<q", t["crc32"]))
            add(t["init"].encode() + b"\0")
    return f"{h:016x}" if frozen else ""


def adapter_settings(text):
    """plan::adapterSettings: the program's `bmt.lora = {...}` text, or ""."""
    at = text.find("bmt.lora = {")
    if at < 0:
        return ""
    end = text.find("}", at + len("bmt.lora = {"))
    return text[at:] if end < 0 else text[at:end + 1]


def check_sharded_is_the_runs(meta, folder, sharded, torch):
    """Refuses a --sharded plan other than the one the checkpoint trained:
    other frozen parameters, or other LoRA settings (checkpoint.json's
    plan.frozen_base and plan.adapters, where the checkpoint records them)."""
    plan, _, text = sharded_plan(sharded, torch)
    saved = meta.get("plan", {})
    if "frozen_base" in saved and saved["frozen_base"] != frozen_identity(plan):
        raise Failure(f"{folder} was trained against other frozen parameters than {sharded}'s "
                      f"(identity {saved['frozen_base'] or 'none'} there, "
                      f"{frozen_identity(plan) or 'none'} here): give the sharded.pt the run "
                      "trained")
    if "adapters" in saved and saved["adapters"] != adapter_settings(text):
        raise Failure(f"{folder} was trained with LoRA settings {saved['adapters'] or 'none'}, "
                      f"{sharded} has {adapter_settings(text) or 'none'}: give the sharded.pt "
                      "the run trained")
    return plan


def check_no_buffer_moved(rank0, plan, sharded):
    """--adapter: a peft adapter holds only the adapters, so refuses a
    checkpoint whose buffers training moved (a router's score-correction
    bias, rank 0's buffer.<name>) away from their values in sharded.pt."""
    import zipfile
    with zipfile.ZipFile(sharded) as z:
        top = next(n for n in z.namelist() if n.endswith("/bmt/plan.pkl"))[:-len("bmt/plan.pkl")]
        for t in plan["tensors"]:
            entry = f"buffer.{t['name']}"
            if t["is_parameter"] or entry not in rank0.entries or not t["record"]:
                continue
            code, shape, (begin, end) = rank0.entries[entry]
            numel = (end - begin) // ELEMENT_SIZE[code]
            saved = rank0.read(entry, 0, end - begin, code, numel)
            rank0.finish(entry, code, numel)
            with z.open(top + t["record"]) as f:
                f.seek(t["offset"])
                initial = f.read(end - begin)
            if saved != initial:
                raise Failure(f"the run moved {t['name']} (bmt-run --moe-bias-update-rate), "
                              "which a peft adapter cannot carry: export with --merge")


def _member_segments(plan, top, g, index, nbytes):
    """[(zip member, byte offset, bytes)] of tensor `index` in storage group
    `g` (its record, or the parts it spans); None when the group has no bytes."""
    size = ELEMENT_SIZE[SAFETENSORS_DTYPE[g["dtype"]]]
    at = g["offsets"][g["members"].index(index)] * size
    if g.get("record"):
        return [(top + g["record"], at, nbytes)]
    if not g.get("parts"):
        return None
    part_bytes = g["part_size"] * size
    segments, end = [], at + nbytes
    while at < end:
        k = at // part_bytes
        upto = min(end, (k + 1) * part_bytes)
        segments.append((top + g["parts"][k], at - k * part_bytes, upto - at))
        at = upto
    return segments


def tp_slices(plan, top, index, t):
    """A frozen parameter split over the TP group: {"slices": [segments of
    TP rank r's slice, r = 0..T-1], "local_shape", "ranges": [[local, global,
    length] per rank]} (the plan's split rule, plan::tpRanges); None when it
    has no bytes."""
    split, tp = t["split"], plan["tensor_parallel"]
    dim, size, chunks = split["dim"], t["shape"][split["dim"]], split["chunks"]
    padded = split.get("padded_size") or size
    local_shape = list(t["shape"])
    local_shape[dim] = padded // tp
    nbytes = ELEMENT_SIZE[SAFETENSORS_DTYPE[t["dtype"]]]
    for d in local_shape:
        nbytes *= d
    name = plan["groups"][t["group"]]["name"]
    copies = {g.get("tp_rank", -1): g for g in plan["groups"] if g["name"] == name}
    slices, ranges = [], []
    chunk = padded // chunks
    piece = chunk // tp
    for r in range(tp):
        segments = _member_segments(plan, top, copies[r], index, nbytes)
        if segments is None:
            return None
        slices.append(segments)
        ranges.append([[c * piece, c * chunk + r * piece, min(piece, size - (c * chunk + r * piece))]
                       for c in range(chunks) if size - (c * chunk + r * piece) > 0])
    return {"slices": slices, "local_shape": local_shape, "ranges": ranges, "dim": dim}


def frozen_parameters(sharded, torch):
    """{name (and each alias): (segments, 0, dtype code, shape)} of the frozen
    parameters (requires_grad false) of sharded.pt's plan that have bytes in
    it, segments being [(zip member, byte offset, bytes), ...]: one for a
    tensor of its own or a member of a frozen storage group in one record,
    one per record it spans in a group split into parts (docs/sharded-format.md);
    for one split over the TP group (a LoRA base at T > 1), tp_slices'
    dict instead."""
    plan, top, _ = sharded_plan(sharded, torch)
    out = {}
    for index, t in enumerate(plan["tensors"]):
        if not t["is_parameter"] or t["requires_grad"]:
            continue
        split = t.get("split")
        if split and split.get("over") == "expert":
            continue
        nbytes = ELEMENT_SIZE[SAFETENSORS_DTYPE[t["dtype"]]]
        for d in t["shape"]:
            nbytes *= d
        if split and split["dim"] >= 0 and t["group"] >= 0:
            segments = tp_slices(plan, top, index, t)
        elif t["record"]:
            segments = [(top + t["record"], t["offset"], nbytes)]
        elif t["group"] >= 0:
            segments = _member_segments(plan, top, plan["groups"][t["group"]], index, nbytes)
        else:
            segments = None
        if segments is None:
            continue  # no bytes (an init rule)
        entry = (segments, 0, SAFETENSORS_DTYPE[t["dtype"]], list(t["shape"]))
        for n in [t["name"], *t["aliases"]]:
            out[n] = entry
    return out


def _read_segments(z, sharded, name, segments):
    for record, offset, nbytes in segments:
        with z.open(record) as f:
            f.seek(offset)
            left = nbytes
            while left > 0:
                piece = f.read(min(CHUNK, left))
                if not piece:
                    raise Failure(f"{sharded}: {record} ends before {name}'s bytes")
                left -= len(piece)
                yield piece


def frozen_bytes(sharded, t):
    """The bytes of frozen tensor `t` (frozen_parameters' segments in
    t.record) in pieces of at most CHUNK bytes; a TP-split one put back
    together from its slices (its padding dropped)."""
    import zipfile
    with zipfile.ZipFile(sharded) as z:
        if isinstance(t.record, dict):
            import torch
            r = t.record
            dtype = getattr(torch, TORCH_DTYPE[t.dtype])
            whole = torch.empty(t.shape, dtype=dtype)
            for segments, ranges in zip(r["slices"], r["ranges"]):
                data = bytearray(b"".join(_read_segments(z, sharded, t.name, segments)))
                s = torch.frombuffer(data, dtype=dtype).view(r["local_shape"])
                for local, start, length in ranges:
                    whole.narrow(r["dim"], start, length).copy_(s.narrow(r["dim"], local, length))
            data = whole.view(-1).view(torch.uint8).numpy().tobytes()
            for at in range(0, len(data), CHUNK):
                yield data[at:at + CHUNK]
            return
        yield from _read_segments(z, sharded, t.name, t.record)
