"""Token files that bmt-run memory-maps (docs/token-files.md has the format):
written under temporary names and renamed together at the end, so that a
failed run leaves nothing behind.

Version 1: PREFIX.SPLIT.bin (flat little-endian uint16/uint32 token ids) and
PREFIX.SPLIT.json. Version 2 adds PREFIX.SPLIT.docs.bin (int64 [D + 1]: the
token offset where each document starts, then num_tokens) and, for supervised
data, PREFIX.SPLIT.mask.bin (uint8 [num_tokens]: 1 where the token is a
training target).
"""

import json
import os
import re
import tempfile

import numpy as np

FORMAT = "bmt-tokens"


# path_for()'s temporary names: tempfile.mkstemp's 8 random characters
# between ".NAME." and ".tmp".
TEMPORARY = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


class AtomicWriter:
    """Files written under temporary names, renamed together by commit().

    names: the final paths (in `directory`) of every output this kind of run
    may write; commit() also removes the temporary files of those names that
    an earlier run left when it was killed (SIGKILL: no chance to clean up).
    After commit(), `removed` lists the stale final paths it removed (those
    that existed) and `removed_temporaries` those temporary files."""

    def __init__(self, directory, names=()):
        self.directory = directory
        self.names = {os.path.basename(n) for n in names}
        self.pending = []   # (temporary path, final path)
        self.stale = []     # final paths an earlier run may have left: removed by commit()
        self.removed, self.removed_temporaries = [], []

    def path_for(self, final):
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{os.path.basename(final)}.",
                                   suffix=".tmp")
        os.close(fd)
        self.pending.append((tmp, final))
        return tmp

    def write_bytes(self, final, data):
        with open(self.path_for(final), "wb") as f:
            f.write(data)

    def remove_on_commit(self, final):
        """final (say PREFIX.train.mask.bin of an earlier supervised run) is
        not written this time; commit() removes it, so that no file of the
        outputs' names is left from another run."""
        self.stale.append(final)

    def commit(self):
        for tmp, final in self.pending:
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
        for final in self.stale:
            try:
                os.unlink(final)
                self.removed.append(final)
            except FileNotFoundError:
                pass
        ours = {os.path.basename(tmp) for tmp, _ in self.pending}
        for entry in sorted(os.listdir(self.directory)) if self.names else ():
            m = TEMPORARY.fullmatch(entry)
            if m and m.group("name") in self.names and entry not in ours:
                try:
                    os.unlink(os.path.join(self.directory, entry))
                    self.removed_temporaries.append(os.path.join(self.directory, entry))
                except (FileNotFoundError, IsADirectoryError, PermissionError):
                    pass
        self.pending, self.stale = [], []

    def abort(self):
        for tmp, _ in self.pending:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self.pending = []


def output_names(prefix, split):
    """The files of one split: {kind: path} for bin, docs, mask, json."""
    return {"bin": f"{prefix}.{split}.bin", "docs": f"{prefix}.{split}.docs.bin",
            "mask": f"{prefix}.{split}.mask.bin", "json": f"{prefix}.{split}.json"}


class SplitWriter:
    """Streams one split's documents to its files (through an AtomicWriter):
    add() appends a document; meta() is its json once close() is done."""

    def __init__(self, writer, prefix, split, dtype, version, supervised):
        self.names = output_names(prefix, split)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.version, self.supervised = version, supervised
        self.writer = writer
        self.num_tokens = self.num_documents = self.num_targets = self.num_truncated = 0
        self.bin = open(writer.path_for(self.names["bin"]), "wb")
        self.docs = self.mask = None
        if version >= 2:
            self.docs = open(writer.path_for(self.names["docs"]), "wb")
            self.docs.write(np.zeros(1, "<i8").tobytes())
        if supervised:
            self.mask = open(writer.path_for(self.names["mask"]), "wb")
        for kind, opened in (("docs", self.docs), ("mask", self.mask)):
            if opened is None:
                writer.remove_on_commit(self.names[kind])

    def add(self, ids, mask=None, truncated=False):
        """One document: ids (integers < 2**bits of dtype), mask (uint8, same
        length) for supervised data; truncated: it was cut to --max-length."""
        self.num_truncated += bool(truncated)
        self.bin.write(np.asarray(ids).astype(self.dtype, copy=False).tobytes())
        self.num_tokens += len(ids)
        self.num_documents += 1
        if self.docs is not None:
            self.docs.write(np.array([self.num_tokens], "<i8").tobytes())
        if self.mask is not None:
            self.mask.write(np.asarray(mask, np.uint8).tobytes())
            self.num_targets += int(np.count_nonzero(mask))

    def close(self):
        for f in (self.bin, self.docs, self.mask):
            if f is not None:
                f.close()

    def meta(self, common, max_length=None, chat_template=False):
        """The split's json: v1's fields (`common` gives the tokenizer's and
        the sources'), and v2's when version is 2."""
        meta = {"format": FORMAT, "version": self.version, "dtype": self.dtype.name,
                "num_tokens": self.num_tokens, "num_documents": self.num_documents}
        meta.update(common)
        if self.version >= 2:
            meta.update({
                "documents": os.path.basename(self.names["docs"]),
                "loss_mask": os.path.basename(self.names["mask"]) if self.supervised else None,
                "supervised": self.supervised, "truncated": self.num_truncated,
                "max_length": max_length, "chat_template": bool(chat_template)})
        return meta

    def write_meta(self, meta):
        self.writer.write_bytes(self.names["json"], (json.dumps(meta, indent=2) + "\n").encode())
