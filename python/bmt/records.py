"""Records of fine-tuning datasets for bmt-prepare-data, read as a stream.

Inputs are JSON lines files (.jsonl, .ndjson or .json, each optionally
compressed: .gz, .zst), Parquet files (.parquet, read with pyarrow) and
folders written by `datasets`' save_to_disk (read with datasets.load_from_disk,
which memory-maps the folder's Arrow files and applies its metadata). A record
is a dict; its place is named by a locator: "FILE:LINE" for JSON lines (1-based
line numbers, blank lines skipped), "FILE row N" for Parquet and datasets
folders (0-based rows, as pyarrow and datasets count them).

Records travel in chunks (a few hundred records, at most CHUNK_BYTES of JSON
text) so that the worker processes parse and tokenize them while the reader
goes on; JSON lines travel unparsed and are parsed by parse_line().
"""

import gzip
import io
import json
import os

CHUNK_RECORDS = 256
CHUNK_BYTES = 4 << 20
READ_ROWS = 256               # rows per pyarrow / datasets batch
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSED_SUFFIXES = ("", ".gz", ".zst")


class UserError(Exception):
    """Bad input, with the place it was found in; an 'error: ...' line."""


def is_datasets_folder(path):
    """A folder written by Dataset.save_to_disk (or DatasetDict's)."""
    return os.path.isdir(path) and (
        os.path.isfile(os.path.join(path, "state.json")) or
        os.path.isfile(os.path.join(path, "dataset_dict.json")))


def kind_of(path):
    """'jsonl', 'parquet', 'datasets', or 'text' for anything else."""
    if os.path.isdir(path):
        return "datasets" if is_datasets_folder(path) else None
    name = path.lower()
    for suffix in JSONL_SUFFIXES:
        for comp in COMPRESSED_SUFFIXES:
            if name.endswith(suffix + comp):
                return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


class ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a .zst file of one or more frames; a file
    that ends inside a frame raises EOFError (zstandard's stream_reader
    reports such a file as a short one, without an error)."""

    def __init__(self, raw):
        import zstandard
        self.raw, self.zstd = raw, zstandard.ZstdDecompressor()
        self.frame, self.pending, self.started = self.zstd.decompressobj(), b"", False

    def readable(self):
        return True

    def readinto(self, buffer):
        while not self.pending:
            chunk = self.raw.read(1 << 20)
            if not chunk:
                if self.started and not self.frame.eof:
                    raise EOFError("the file ends inside a zstd frame (truncated?)")
                return 0
            while chunk:
                if self.frame.eof:   # the next frame
                    self.frame = self.zstd.decompressobj()
                self.started = True
                self.pending += self.frame.decompress(chunk)
                chunk = self.frame.unused_data if self.frame.eof else b""
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def close(self):
        self.raw.close()
        super().close()


def open_binary(path):
    """A binary stream of the file's bytes, decompressed by its suffix."""
    try:
        if path.endswith(".gz"):
            return gzip.open(path, "rb")
        if path.endswith(".zst"):
            return io.BufferedReader(ZstdFrames(open(path, "rb")), 1 << 20)
        return open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from e


def jsonl_lines(path):
    """(line number, line bytes) of the file's non-blank lines."""
    f = open_binary(path)
    try:
        with f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    yield number, line
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path}: {e}") from e
    except Exception as e:  # noqa: BLE001 - zstandard.ZstdError and other decoder failures
        if type(e).__name__ == "ZstdError":
            raise UserError(f"cannot read {path}: {e}") from e
        raise


def parse_line(path, number, line):
    """The JSON object of one line; UserError naming FILE:LINE."""
    where = f"{path}:{number}"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{where}: not UTF-8 (byte {e.start + 1})") from e
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: malformed JSON: {e.msg} (column {e.colno})") from e
    if not isinstance(record, dict):
        raise UserError(f"{where}: a JSON line must be an object, not {type(record).__name__}")
    return record


def open_parquet(path):
    import pyarrow.parquet as pq
    try:
        return pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError ...
        raise UserError(f"cannot read Parquet file {path}: {str(e).splitlines()[0]}") from e


def open_datasets_folder(path):
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        splits = sorted(d for d in os.listdir(path) if is_datasets_folder(os.path.join(path, d)))
        raise UserError(f"{path} holds a DatasetDict; give one split's folder "
                          f"({', '.join(os.path.join(path, s) for s in splits) or 'none found'})")
    import datasets
    datasets.disable_progress_bars()
    try:
        return datasets.load_from_disk(path)
    except Exception as e:  # noqa: BLE001 - any loader failure is a user error
        raise UserError(f"cannot read datasets folder {path}: {str(e).splitlines()[0]}") from e


class Source:
    """One input: a JSON lines file, a Parquet file or a datasets folder."""

    def __init__(self, path, kind):
        self.path, self.kind = path, kind

    def columns(self):
        """Column names (Parquet, datasets), or None for JSON lines."""
        if self.kind == "parquet":
            return open_parquet(self.path).schema_arrow.names
        if self.kind == "datasets":
            return open_datasets_folder(self.path).column_names
        return None

    def first_record(self):
        """The first record (a dict) and its locator, or (None, None) if empty."""
        if self.kind == "jsonl":
            for number, line in jsonl_lines(self.path):
                return parse_line(self.path, number, line), f"{self.path}:{number}"
            return None, None
        for _, chunk in self.chunks(None):
            return chunk[0][1], chunk[0][0]
        return None, None

    def count(self):
        """Number of records (JSON lines: non-blank lines)."""
        if self.kind == "jsonl":
            return sum(1 for _ in jsonl_lines(self.path))
        if self.kind == "parquet":
            return open_parquet(self.path).metadata.num_rows
        return len(open_datasets_folder(self.path))

    def check_columns(self, fields):
        columns = self.columns()
        if columns is None:
            return
        for field in fields:
            if field not in columns:
                what = "Parquet file" if self.kind == "parquet" else "datasets folder"
                raise UserError(f"{what} {self.path} has no column '{field}' "
                                  f"(columns: {', '.join(columns)})")

    def chunks(self, fields):
        """Chunks ('jsonl' | 'rows', [(locator, payload), ...]): payloads are
        (path, line number, line bytes) for JSON lines, else record dicts of
        the columns `fields` (all when None)."""
        if self.kind == "jsonl":
            items, size = [], 0
            for number, line in jsonl_lines(self.path):
                items.append((f"{self.path}:{number}", (self.path, number, line)))
                size += len(line)
                if len(items) >= CHUNK_RECORDS or size >= CHUNK_BYTES:
                    yield "jsonl", items
                    items, size = [], 0
            if items:
                yield "jsonl", items
            return
        row = 0
        for batch in self._row_batches(fields):
            items = []
            for record in batch:
                items.append((f"{self.path} row {row}", record))
                row += 1
            if items:
                yield "rows", items

    def _row_batches(self, fields):
        if self.kind == "parquet":
            pf = open_parquet(self.path)
            try:
                for batch in pf.iter_batches(batch_size=READ_ROWS, columns=fields):
                    yield batch.to_pylist()
            except Exception as e:  # noqa: BLE001 - a corrupt page
                raise UserError(f"cannot read Parquet file {self.path}: "
                                  f"{str(e).splitlines()[0]}") from e
            return
        ds = open_datasets_folder(self.path)
        if fields is not None:
            ds = ds.select_columns(fields)
        for batch in ds.with_format(None).iter(batch_size=READ_ROWS):
            names = list(batch)
            yield [dict(zip(names, values)) for values in zip(*(batch[n] for n in names))]
