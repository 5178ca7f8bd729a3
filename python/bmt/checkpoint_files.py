"""Reading a bmt-run checkpoint folder (docs/checkpoint-format.md) for
bmt-to-hf: checkpoint.json, and each rank file's tensors streamed in pieces
and checked against their CRC-32s (RankFile). Bad input raises Failure
with one line.
"""
import json
import os
import re
import struct
import zlib

CHUNK = 16 << 20  # bytes per read and write
CHECKPOINT_FORMAT = "bmt-checkpoint"
CHECKPOINT_VERSION = 1
TP_VERSION = 2  # a checkpoint of tensor parallelism: its spaces hold TP slices
# expert weights split over the expert group: their spaces hold each
# expert-group position's experts ("ep_rank")
EP_VERSION = 3
# a pipelined run's: each space written by the ranks of one stage ("stage")
PP_VERSION = 4
# a pipelined run's with tensor parallelism or virtual stages: version 4's
# spaces, each once per TP rank ("tp_rank") as in version 2
PP_TP_VERSION = 5
VERSIONS = (CHECKPOINT_VERSION, TP_VERSION, EP_VERSION, PP_VERSION, PP_TP_VERSION)

# The checkpoint's dtype names (plan::dtypeName) -> safetensors dtype codes.
SAFETENSORS_DTYPE = {
    "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}
ELEMENT_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U8": 1, "BOOL": 1}


class Failure(Exception):
    """Bad input or a failed write: one error line."""


def latest_checkpoint(folder):
    """The newest complete step-NNNNNNNN folder in `folder` (a --checkpoint-dir),
    or None."""
    try:
        names = sorted(n for n in os.listdir(folder)
                       if re.fullmatch(r"step-[0-9]{8}", n)
                       and os.path.isfile(os.path.join(folder, n, "COMPLETE")))
    except OSError:
        return None
    return os.path.join(folder, names[-1]) if names else None


def read_checkpoint(folder):
    """checkpoint.json of a complete checkpoint folder, checked."""
    if not os.path.isdir(folder):
        raise Failure(f"{folder}: no such checkpoint folder")
    try:
        with open(os.path.join(folder, "COMPLETE"), encoding="utf-8") as f:
            complete = f.read()
    except OSError:
        complete = ""
    words = complete.split()
    # "bmt-checkpoint <version> step <step> checkpoint.json <CRC-32, hex>"
    # (checkpoints written before that checksum end after the step).
    crc = words[5] if len(words) == 6 and words[4] == "checkpoint.json" else None
    if (len(words) not in (4, 6) or (len(words) == 6 and crc is None)
            or words[0] != CHECKPOINT_FORMAT or words[2] != "step"
            or not words[3].isdigit()
            or (crc is not None and not re.fullmatch(r"[0-9a-f]{8}", crc))):
        latest = latest_checkpoint(folder)
        raise Failure(f"{folder}: not a complete checkpoint (no valid COMPLETE file: the save "
                      "did not finish, or this is not a checkpoint folder)"
                      + (f"; the newest complete checkpoint in it is {latest}" if latest else ""))
    if words[1] not in map(str, VERSIONS):
        raise Failure(f"{folder}: checkpoint format version {words[1]}; bmt-to-hf reads "
                      f"{', '.join(map(str, VERSIONS[:-1]))} and {VERSIONS[-1]}")
    path = os.path.join(folder, "checkpoint.json")
    try:
        with open(path, "rb") as f:
            text = f.read()
        if crc is not None and zlib.crc32(text) != int(crc, 16):
            raise Failure(f"{path}: checksum mismatch (CRC-32 {zlib.crc32(text):08x}, its "
                          f"COMPLETE file says {crc}): damaged or changed after the save")
        meta = json.loads(text.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Failure(f"{path}: cannot read it ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise Failure(f"{path}: not a bmt checkpoint")
    if meta.get("version") != int(words[1]) or meta.get("step") != int(words[3]):
        raise Failure(f"{path}: version {meta.get('version')}, step {meta.get('step')} do not "
                      f"match the COMPLETE file's ({words[1]}, step {words[3]})")
    try:
        for space in meta["spaces"]:
            for key in ("name", "dtype", "size", "shards", "shard_size", "members"):
                space[key]  # noqa: B018 - presence check
            if space["dtype"] not in SAFETENSORS_DTYPE:
                raise Failure(f"{path}: space {space['name']} has dtype {space['dtype']}, "
                              "which safetensors has no code for")
            for m in space["members"]:
                m["tensor"], m["shape"], m["offset"], m["aliases"]  # noqa: B018
                if "split" in m:
                    if "ranges" not in m["split"]:
                        raise Failure(f"{path}: {m['tensor']} is split without its slice ranges "
                                      f"(a checkpoint format version {meta['version']} written "
                                      "before bmt-run recorded them): resume it with bmt-run "
                                      "and save again to export it")
                    m["split"]["dim"], m["split"]["local_shape"]  # noqa: B018
                    for local, start, length in m["split"]["ranges"]:
                        int(local), int(start), int(length)
            if meta.get("tensor_parallel", 1) > 1:
                int(space["tp_rank"])
            if "ep_rank" in space:
                int(space["ep_rank"])
        int(meta["world_size"])
        rank_bytes = meta["rank_bytes"]
    except (KeyError, TypeError) as e:
        raise Failure(f"{path}: bad layout (no {e})") from None
    tp = meta.get("tensor_parallel", 1)
    if ((meta["version"] == TP_VERSION and tp <= 1)
            or (tp > 1 and meta["version"] not in (TP_VERSION, PP_TP_VERSION))
            or meta["world_size"] % tp):
        raise Failure(f"{path}: bad layout (version {meta['version']} with tensor_parallel {tp}, "
                      f"world size {meta['world_size']})")
    ep = meta.get("expert_parallel", 1)
    if ((meta["version"] == EP_VERSION) != (ep > 1) or meta["world_size"] % ep
            or any("ep_rank" in s and not 0 <= s["ep_rank"] < ep for s in meta["spaces"])):
        raise Failure(f"{path}: bad layout (version {meta['version']} with expert_parallel {ep}, "
                      f"world size {meta['world_size']})")
    stages = meta.get("pipeline_stages", 1)
    if ((meta["version"] in (PP_VERSION, PP_TP_VERSION)) != (stages > 1)
            or meta["world_size"] % (stages * tp)
            or any(not 0 <= s.get("stage", 0) < stages for s in meta["spaces"])):
        raise Failure(f"{path}: bad layout (version {meta['version']} with pipeline_stages "
                      f"{stages}, world size {meta['world_size']})")
    if len(rank_bytes) != meta["world_size"]:
        raise Failure(f"{path}: bad layout (rank_bytes of {len(rank_bytes)} ranks, world size "
                      f"{meta['world_size']})")
    return meta


class RankFile:
    """One rank's safetensors file, read by byte ranges (pread), its
    tensors' CRC-32s checked as they are read in order."""

    def __init__(self, folder, rank, expected_bytes, world_size):
        self.path = os.path.join(folder, f"rank-{rank:05d}.safetensors")
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise Failure(f"{self.path}: missing (the checkpoint of {world_size} ranks has no "
                          f"file of rank {rank})") from None
        except OSError as e:
            raise Failure(f"{self.path}: cannot open ({e.strerror})") from None
        size = os.fstat(self.fd).st_size
        if size != expected_bytes:
            raise Failure(f"{self.path}: {size} bytes, checkpoint.json says {expected_bytes} "
                          "(a truncated or replaced file)")
        head = os.pread(self.fd, 8, 0)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else size
        try:
            if length > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(os.pread(self.fd, length, 8))
            metadata = header.pop("__metadata__", {})
            if metadata.get("format") != CHECKPOINT_FORMAT:
                raise ValueError("no bmt-checkpoint metadata")
            self.crc = {k: int(v, 16) for k, v in json.loads(metadata["crc32"]).items()}
            self.start = 8 + length
            self.entries = {k: (v["dtype"], v["shape"], v["data_offsets"])
                            for k, v in header.items()}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise Failure(f"{self.path}: not a bmt checkpoint shard ({e})") from None
        self.running = {}  # tensor -> [bytes checked so far, crc so far]
        self.pieces = {}  # (tensor, offset, nbytes) -> CRC-32 of the bytes first read there

    def entry(self, name, dtype, numel):
        """The byte range of tensor `name`, checked to be `numel` elements of `dtype`."""
        if name not in self.entries:
            raise Failure(f"{self.path}: has no tensor {name}")
        code, shape, (begin, end) = self.entries[name]
        count = 1
        for d in shape:
            count *= d
        if code != dtype or count != numel or end - begin != numel * ELEMENT_SIZE[dtype]:
            raise Failure(f"{self.path}: tensor {name} is {code} {shape}, checkpoint.json says "
                          f"{dtype} [{numel}]")
        return self.start + begin, self.start + end

    def read(self, name, offset, nbytes, dtype, numel):
        """Bytes [offset, offset + nbytes) of tensor `name`. Read front to back
        (a range again for a second name of the same bytes), so that the
        bytes before it (padding between members) and these go into the
        tensor's CRC-32 as they are read; finish() checks it. A range read
        again (a second name of the same bytes) must give the bytes it gave
        the first time, whose CRC-32 is kept: every byte read is checked."""
        begin, _ = self.entry(name, dtype, numel)
        done, crc = self.running.setdefault(name, (0, 0))
        if offset < done:  # the same bytes again
            data = self._pread(begin + offset, nbytes)
            first = self.pieces.get((name, offset, nbytes))
            if first is None:  # not a range read before: check the tensor so far again
                first = self._recheck(name, begin, done, crc, offset, nbytes)
            if zlib.crc32(data) != first:
                raise Failure(f"{self.path}: corrupt tensor {name} (bytes [{offset}, "
                              f"{offset + nbytes}) of its data, read again for a tied name, "
                              "differ from their first read): checksum mismatch")
            return data
        while done < offset:
            n = min(CHUNK, offset - done)
            crc = zlib.crc32(self._pread(begin + done, n), crc)
            done += n
        data = self._pread(begin + offset, nbytes)
        self.running[name] = (offset + nbytes, zlib.crc32(data, crc))
        self.pieces[(name, offset, nbytes)] = zlib.crc32(data)
        return data

    def _recheck(self, name, begin, done, crc, offset, nbytes):
        """Reads bytes [0, done) of tensor `name` again, checks them against
        the CRC-32 of their first read and returns the CRC-32 of bytes
        [offset, offset + nbytes) (which end before `done`) among them."""
        if offset + nbytes > done:
            raise Failure(f"{self.path}: tensor {name}: bytes [{offset}, {offset + nbytes}) "
                          "read out of order")
        again, piece = 0, 0
        for at in range(0, done, CHUNK):
            data = self._pread(begin + at, min(CHUNK, done - at))
            again = zlib.crc32(data, again)
            lo, hi = max(offset, at), min(offset + nbytes, at + len(data))
            if lo < hi:
                piece = zlib.crc32(data[lo - at:hi - at], piece)
        if again != crc:
            raise Failure(f"{self.path}: corrupt tensor {name} (bytes [0, {done}) of its data "
                          "differ from their first read): checksum mismatch")
        return piece

    def finish(self, name, dtype, numel):
        """Reads the rest of tensor `name` (the padding after its last member)
        and checks its CRC-32 against the file's."""
        begin, end = self.entry(name, dtype, numel)
        done, _ = self.running.get(name, (0, 0))
        if done < end - begin:
            self.read(name, end - begin, 0, dtype, numel)
        if self.running[name][1] != self.crc.get(name):
            raise Failure(f"{self.path}: corrupt tensor {name} (checksum mismatch)")

    def _pread(self, at, nbytes):
        data = os.pread(self.fd, nbytes, at)
        if len(data) != nbytes:
            raise Failure(f"{self.path}: unexpected end of file")
        return data

    def close(self):
        os.close(self.fd)

def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise Failure(f"{path}: cannot read ({e.strerror})") from None
