"""The raw corpora `recipes data tokenize` reads: which files a source names, and their documents.

A source is a file, a folder (every supported file under it, and every dataset that
`datasets.Dataset.save_to_disk` wrote), or a glob. A *shard* is one unit of work and of output:
one JSONL (.jsonl, .jsonl.gz, .jsonl.zst), Parquet or Arrow file. Each shard yields its documents
as (where, text): `where` names the file and line (JSONL) or row (Parquet, Arrow), so that bad
input is reported where it is.

The text is a record's field (`text_key`) or a template over its fields (`template`, Python's
format syntax: "{title}\\n\\n{text}"). Bad input (not UTF-8, broken JSON, a missing field, a text
that is not a string) raises BadRecord naming where; the caller decides to skip and count, or stop.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

JSONL = (".jsonl", ".jsonl.gz", ".jsonl.zst")
PARQUET = (".parquet",)
ARROW = (".arrow",)
SUFFIXES = JSONL + PARQUET + ARROW
ROWS_PER_BATCH = 1024  # Parquet/Arrow rows read at a time


class BadRecord(ValueError):
    """One document that cannot be read: `where` is file:line or file:row."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where


class SourceError(ValueError):
    """A source that names nothing readable."""


@dataclass(frozen=True, slots=True)
class Shard:
    path: Path

    @property
    def kind(self) -> str:
        name = self.path.name
        return next(s for s in SUFFIXES if name.endswith(s))

    def key(self) -> dict[str, Any]:
        """What identifies this input's content for a rerun: path, size, mtime."""
        st = self.path.stat()
        return {"source": str(self.path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _supported(path: Path) -> bool:
    return path.is_file() and path.name.endswith(SUFFIXES)


def _arrow_dataset(folder: Path) -> list[Path]:
    """The data files of a `save_to_disk` folder (state.json lists them, in order)."""
    state = json.loads((folder / "state.json").read_text())
    return [folder / f["filename"] for f in state.get("_data_files", [])]


def _in_folder(folder: Path) -> list[Path]:
    if (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file():
        return _arrow_dataset(folder)
    found: list[Path] = []
    for sub in sorted(folder.iterdir()):
        if sub.is_dir():
            found += _in_folder(sub)
        elif _supported(sub):
            found.append(sub)
    return found


def expand(sources: list[str]) -> list[Shard]:
    """Every shard the sources name, each once, in the order given (a folder's sorted)."""
    paths: list[Path] = []
    for src in sources:
        matches = [Path(m) for m in sorted(glob.glob(src))] if glob.has_magic(src) else [Path(src)]
        if not matches:
            raise SourceError(f"{src}: the pattern matches no file")
        for path in matches:
            if path.is_dir():
                found = _in_folder(path)
                if not found:
                    raise SourceError(
                        f"{path}: a folder with no {', '.join(SUFFIXES)} file and no dataset "
                        "saved with datasets' save_to_disk"
                    )
                paths += found
            elif _supported(path):
                paths.append(path)
            elif path.exists():
                raise SourceError(f"{path}: not one of {', '.join(SUFFIXES)} (or such a folder)")
            else:
                raise SourceError(f"{path} does not exist")
    unique = list(dict.fromkeys(p.resolve() for p in paths))
    return [Shard(p) for p in unique]


def text_of(record: Any, where: str, text_key: str, template: str | None) -> str:
    if not isinstance(record, dict):
        raise BadRecord(where, f"expected an object, got {type(record).__name__}")
    if template is not None:
        try:
            return template.format_map(record)
        except KeyError as err:
            keys = ", ".join(sorted(record)) or "none"
            raise BadRecord(
                where, f"no field {err.args[0]!r} for --template (fields: {keys})"
            ) from None
    if text_key not in record:
        keys = ", ".join(sorted(record)) or "none"
        raise BadRecord(
            where, f"no field {text_key!r} (fields: {keys}); choose one with --text-key"
        )
    text = record[text_key]
    if not isinstance(text, str):
        raise BadRecord(where, f"{text_key!r} holds {type(text).__name__}, expected a string")
    return text


def template_fields(template: str) -> list[str]:
    """The field names a --template reads ("{title}\\n{text}" -> title, text)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def _binary(path: Path) -> IO[bytes]:
    """The file's bytes, decompressed; iterating gives its lines."""
    if path.name.endswith(".gz"):
        return cast(IO[bytes], gzip.open(path, "rb"))
    if path.name.endswith(".zst"):
        import zstandard

        raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
        return cast(IO[bytes], io.BufferedReader(raw))
    return path.open("rb")


def _jsonl(
    path: Path, text_key: str, template: str | None
) -> Iterator[tuple[str, str | BadRecord]]:
    with _binary(path) as raw:
        for lineno, line in enumerate(raw, start=1):
            where = f"{path}:{lineno}"
            try:
                decoded = line.decode("utf-8")
            except UnicodeDecodeError as err:
                yield where, BadRecord(where, f"not UTF-8 (byte {err.start + 1} of the line)")
                continue
            if not decoded.strip():
                continue  # a blank line separates nothing: not a document
            try:
                record = json.loads(decoded)
            except json.JSONDecodeError as err:
                yield where, BadRecord(where, f"not valid JSON ({err.msg} at column {err.colno})")
                continue
            try:
                yield where, text_of(record, where, text_key, template)
            except BadRecord as bad:
                yield where, bad


def _open_arrow(path: Path) -> Any:
    """A reader of an Arrow file: the stream format (what save_to_disk writes) or the file
    format; both iterate over record batches and have a schema."""
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source)
    except pa.ArrowInvalid:
        source.seek(0)
        reader = pa.ipc.open_file(source)
        return _FileBatches(reader)


class _FileBatches:
    def __init__(self, reader: Any) -> None:
        self.reader, self.schema = reader, reader.schema

    def __iter__(self) -> Iterator[Any]:
        return (self.reader.get_batch(i) for i in range(self.reader.num_record_batches))


def _column_names(path: Path) -> list[str] | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.name.endswith(".parquet"):
            return list(pq.read_schema(path).names)
        return list(_open_arrow(path).schema.names)
    except (pa.ArrowInvalid, OSError):
        return None


def _table(
    path: Path, text_key: str, template: str | None
) -> Iterator[tuple[str, str | BadRecord]]:
    import pyarrow.parquet as pq

    columns = template_fields(template) if template is not None else [text_key]
    names = _column_names(path)
    if names is None:
        raise BadRecord(str(path), f"not a readable {path.suffix[1:]} file")
    missing = [c for c in columns if c not in names]
    if missing:
        raise BadRecord(
            str(path), f"no column {', '.join(map(repr, missing))} (columns: {', '.join(names)})"
        )
    if path.name.endswith(".parquet"):
        batches: Any = pq.ParquetFile(path).iter_batches(batch_size=ROWS_PER_BATCH, columns=columns)
    else:
        batches = (batch.select(columns) for batch in _open_arrow(path))
    row = 0
    for batch in batches:
        yield from _rows(path, batch, row, text_key, template)
        row += batch.num_rows


def _rows(
    path: Path, batch: Any, first_row: int, text_key: str, template: str | None
) -> Iterator[tuple[str, str | BadRecord]]:
    for i, record in enumerate(batch.to_pylist()):
        where = f"{path}:row {first_row + i + 1}"
        try:
            yield where, text_of(record, where, text_key, template)
        except BadRecord as bad:
            yield where, bad


def documents(
    shard: Shard, text_key: str = "text", template: str | None = None
) -> Iterator[tuple[str, str | BadRecord]]:
    """(where, text) for each document of the shard, or (where, BadRecord) for one that cannot
    be read; raises BadRecord when the whole file cannot be read (a missing column)."""
    if shard.kind in JSONL:
        return _jsonl(shard.path, text_key, template)
    return _table(shard.path, text_key, template)
