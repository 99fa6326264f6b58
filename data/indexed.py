"""Megatron indexed datasets (.bin token stream + .idx document index): written from JSONL, checked.

Writing: one JSON object per line; the text under `text_key` becomes one document. The files are
written by Megatron-Core's own `IndexedDatasetBuilder`, so `IndexedDataset` and `GPTDataset` read
them as they read the output of Megatron-LM's `preprocess_data.py`. Megatron-Core is imported only
where the files are written: it costs ~5 s, and spawned tokenizer workers do not need it.

Checking (`check_index`, `token_id_range`, `inspect_indexed`): Megatron-Core trusts the index. A
scrambled or truncated .idx, or a .bin from another run, shifts samples silently or fails deep
inside; ids beyond the model's vocabulary train silently under tensor parallelism (the embedding
zeroes them). The checks read the format as `megatron.core.datasets.indexed_dataset` writes it
(version 1):

    .idx: b"MMIDIDX\\x00\\x00", version <Q = 1, dtype code <B, S <Q sequences, D <Q document
          boundaries; then S int32 lengths, S int64 byte pointers, D int64 document boundaries
          (0, ..., S; sequence i of document j is boundaries[j] <= i < boundaries[j + 1])
    .bin: the tokens of every sequence back to back, in the dtype of the code
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import IO, Any

from data.tokenizer import LocalTokenizer, load_tokenizer

BATCH = 512  # texts per tokenizer call: large enough to amortise worker round trips


class JsonlError(ValueError):
    """A line of the input that is not a JSON object with a string under the text key."""


@dataclass(frozen=True, slots=True)
class ConversionStats:
    documents: int  # documents written
    tokens: int  # tokens written, end-of-document tokens included
    skipped_empty: int  # lines whose text had no tokens (Megatron's preprocess_data skips them too)
    bin_path: Path
    idx_path: Path


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def iter_jsonl_texts(path: str | Path, text_key: str = "text") -> Iterator[tuple[int, str]]:
    """Yield (line number, text) for each non-blank line; raise JsonlError naming the line."""
    path = Path(path)
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue  # a trailing newline or blank separator line is not a document
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise JsonlError(
                    f"{where}: not valid JSON ({err.msg} at column {err.colno})"
                ) from err
            if not isinstance(record, dict):
                raise JsonlError(f"{where}: expected a JSON object, got {type(record).__name__}")
            if text_key not in record:
                keys = ", ".join(sorted(record)) or "none"
                raise JsonlError(
                    f"{where}: no key {text_key!r} (keys: {keys}); choose one with --text-key"
                )
            text = record[text_key]
            if not isinstance(text, str):
                raise JsonlError(
                    f"{where}: {text_key!r} holds {type(text).__name__}, expected a string"
                )
            yield lineno, text


def optimal_dtype(vocab_size: int) -> str:
    """The .bin's token type, as Megatron-Core's DType.optimal_dtype picks it (uint16 below
    65500 ids halves the file)."""
    return "uint16" if vocab_size < 65500 else "int32"


class IndexedWriter:
    """Writes a .bin/.idx pair in Megatron-Core's format (version 1, the module docstring) from
    batches of documents, one sequence per document, as `IndexedDatasetBuilder.add_document`
    writes them (tests hold the bytes against it). Written here, without Megatron-Core, so that
    tokenizing imports neither it nor torch (~5 s a process) and writes a batch per call, not a
    document.

    The pair appears only once complete: it is written under `<prefix>.partial`, renamed by
    `finish`, and removed by `discard` (or leaving the `with` block by an exception).
    """

    def __init__(self, prefix: str | Path, vocab_size: int) -> None:
        import numpy

        self.prefix = str(prefix)
        self.partial = self.prefix + ".partial"
        Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        self.dtype = numpy.dtype(optimal_dtype(vocab_size))
        self._bin = open(self.partial + ".bin", "wb")  # noqa: SIM115 (closed in finish/discard)
        self._lengths: list[int] = []
        self.tokens = 0

    def __enter__(self) -> IndexedWriter:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            self.discard()

    def add(self, documents: Sequence[Sequence[int]]) -> None:
        import numpy

        lengths = [len(ids) for ids in documents]
        total = sum(lengths)
        flat = numpy.fromiter((i for ids in documents for i in ids), dtype=self.dtype, count=total)
        self._bin.write(flat.tobytes(order="C"))
        self._lengths += lengths
        self.tokens += total

    @property
    def documents(self) -> int:
        return len(self._lengths)

    def finish(self) -> None:
        import numpy

        self._bin.close()
        lengths = numpy.asarray(self._lengths, dtype=numpy.int64)
        pointers = numpy.zeros(len(lengths), dtype=numpy.int64)
        numpy.cumsum(lengths[:-1] * self.dtype.itemsize, out=pointers[1:])
        code = {v: k for k, v in DTYPE_CODES.items()}[self.dtype.name]
        with open(self.partial + ".idx", "wb") as idx:
            idx.write(INDEX_MAGIC + struct.pack("<Q", 1) + struct.pack("<B", code))
            idx.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(lengths) + 1))
            idx.write(lengths.astype(numpy.int32).tobytes(order="C"))
            idx.write(pointers.tobytes(order="C"))
            idx.write(numpy.arange(len(lengths) + 1, dtype=numpy.int64).tobytes(order="C"))
        for ext in (".bin", ".idx"):
            os.replace(self.partial + ext, self.prefix + ext)

    def discard(self) -> None:
        self._bin.close()
        for ext in (".bin", ".idx"):
            Path(self.partial + ext).unlink(missing_ok=True)


def write_indexed(
    documents: Iterable[Sequence[int]], output_prefix: str | Path, *, vocab_size: int
) -> tuple[int, int]:
    """Write token-id documents to `output_prefix`.bin/.idx; return (documents, tokens). The
    files appear only once complete (IndexedWriter)."""
    docs = iter(documents)
    with IndexedWriter(output_prefix, vocab_size) as writer:
        for batch in iter(lambda: list(islice(docs, BATCH)), []):
            writer.add(batch)
        writer.finish()
    return writer.documents, writer.tokens


# --- tokenizer workers (spawned: safe next to the tokenizer's and torch's threads) ---------------
_WORKER_TOKENIZER: LocalTokenizer | None = None


def _init_worker(tokenizer_path: str) -> None:
    global _WORKER_TOKENIZER
    # One process per core already; the tokenizer's own thread pool would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_TOKENIZER = load_tokenizer(tokenizer_path)


def _tokenize_in_worker(texts: list[str]) -> list[list[int]]:
    assert _WORKER_TOKENIZER is not None  # set by _init_worker
    return _WORKER_TOKENIZER.tokenize_batch(texts)


def _batches(items: Iterator[tuple[int, str]], size: int) -> Iterator[list[str]]:
    while batch := [text for _, text in islice(items, size)]:
        yield batch


def jsonl_to_indexed(
    input_path: str | Path,
    tokenizer_path: str | Path,
    output_prefix: str | Path,
    *,
    text_key: str = "text",
    append_eod: bool = False,
    workers: int = 1,
) -> ConversionStats:
    """Tokenize every document of a JSONL (or .jsonl.gz) file into `output_prefix`.bin/.idx.

    `append_eod` ends each document with the tokenizer's end-of-document token, which is what lets
    a GPT dataset that concatenates documents into fixed-length samples mark their boundaries.
    `workers` > 1 tokenizes in that many spawned processes; the order of documents is kept.
    """
    input_path = Path(input_path)
    if not input_path.is_file():
        raise FileNotFoundError(f"--input {input_path} does not exist")
    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    tokenizer = load_tokenizer(tokenizer_path)
    skipped = 0

    def finish(encoded: Iterable[list[list[int]]]) -> Iterator[list[int]]:
        nonlocal skipped
        for batch in encoded:
            for ids in batch:
                if not ids:
                    skipped += 1
                    continue
                yield [*ids, tokenizer.eod] if append_eod else ids

    def documents() -> Iterator[list[int]]:
        texts = _batches(iter_jsonl_texts(input_path, text_key), BATCH)
        if workers == 1:
            yield from finish(map(tokenizer.tokenize_batch, texts))
            return
        # A JsonlError raised while the pool reads `texts` comes back here, in order.
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(workers, initializer=_init_worker, initargs=(str(tokenizer_path),)) as pool:
            yield from finish(pool.imap(_tokenize_in_worker, texts))

    n_docs, n_tokens = write_indexed(documents(), output_prefix, vocab_size=tokenizer.vocab_size)
    prefix = str(output_prefix)
    return ConversionStats(
        documents=n_docs,
        tokens=n_tokens,
        skipped_empty=skipped,
        bin_path=Path(prefix + ".bin"),
        idx_path=Path(prefix + ".idx"),
    )


# --- checking a .bin/.idx pair --------------------------------------------------------------------
INDEX_MAGIC = b"MMIDIDX\x00\x00"  # Megatron-Core's _INDEX_HEADER
HEADER_BYTES = 34  # magic 9 + version 8 + dtype code 1 + sequence count 8 + boundary count 8
# Megatron-Core's DType codes (indexed_dataset.DType): the type of the token ids in the .bin.
DTYPE_CODES = {
    1: "uint8",
    2: "int8",
    3: "int16",
    4: "int32",
    5: "int64",
    6: "float64",
    7: "float32",
    8: "uint16",
}
SCAN_CHUNK = 1 << 24  # tokens per reduction of the id scan: 64 MiB of int32 at a time
_INSPECTED: dict[str, IndexFacts] = {}  # by file_key: what this process has checked already


def _remake(prefix: str) -> str:
    return (
        "Make the pair again: python -m data.tools.jsonl_to_indexed --input DOCS.jsonl --tokenizer "
        f"TOKENIZER --output-prefix {prefix} --append-eod"
    )


class IndexedDataError(ValueError):
    """A .bin/.idx pair that Megatron-Core would misread: the message names the file."""


@dataclass(frozen=True, slots=True)
class IndexFacts:
    """What the checks learned about one prefix; `min_id`/`max_id` are None until scanned."""

    dtype: str  # numpy name of the token ids' type
    sequences: int
    documents: int
    tokens: int
    min_id: int | None = None
    max_id: int | None = None


def _index_arrays(idx: str, sequences: int, boundaries: int) -> tuple[Any, Any, Any]:
    """(lengths, pointers, boundaries) read from the .idx, as Megatron-Core reads them."""
    import numpy as np

    raw = np.memmap(idx, dtype=np.uint8, mode="r")
    lengths = np.frombuffer(raw, np.int32, sequences, HEADER_BYTES)
    pointers = np.frombuffer(raw, np.int64, sequences, HEADER_BYTES + 4 * sequences)
    bounds = np.frombuffer(raw, np.int64, boundaries, HEADER_BYTES + 12 * sequences)
    return lengths, pointers, bounds


def check_index(prefix: str) -> IndexFacts:
    """IndexedDataError unless PREFIX.idx describes PREFIX.bin exactly; vectorised, reads the .idx
    once (a few ms per million documents) and of the .bin only its size."""
    import numpy as np

    idx, bin_ = prefix + ".idx", prefix + ".bin"
    fix = _remake(prefix)
    idx_size, bin_size = os.path.getsize(idx), os.path.getsize(bin_)
    if idx_size < HEADER_BYTES:
        what = "empty" if idx_size == 0 else f"{idx_size} bytes, truncated"
        raise IndexedDataError(
            f"{idx}: {what}; a Megatron index starts with a {HEADER_BYTES}-byte header. {fix}"
        )
    with open(idx, "rb") as f:
        head = f.read(HEADER_BYTES)
    (version, code, sequences, boundaries) = struct.unpack("<QBQQ", head[9:])
    if head[:9] != INDEX_MAGIC or version != 1:
        raise IndexedDataError(
            f"{idx}: not a Megatron index (starts {head[:9]!r}, version {version}; expected "
            f"{INDEX_MAGIC!r}, version 1). {fix}"
        )
    if code not in DTYPE_CODES:
        raise IndexedDataError(
            f"{idx}: token type code {code} is none of Megatron's "
            f"({', '.join(f'{k}={v}' for k, v in DTYPE_CODES.items())}). {fix}"
        )
    dtype = np.dtype(DTYPE_CODES[code])
    expected = HEADER_BYTES + 12 * sequences + 8 * boundaries
    if idx_size != expected:
        raise IndexedDataError(
            f"{idx}: {idx_size} bytes, but its header counts {sequences} sequences and "
            f"{boundaries} document boundaries, which take {HEADER_BYTES} + 12 x {sequences} + "
            f"8 x {boundaries} = {expected} bytes: truncated or overwritten. {fix}"
        )
    if sequences == 0 or bin_size == 0:
        empty = bin_ if bin_size == 0 else idx
        raise IndexedDataError(
            f"{empty}: holds no tokens ({sequences} sequences in {idx}, {bin_size} bytes in "
            f"{bin_}); drop the prefix from data.path. {fix}"
        )
    lengths, pointers, bounds = _index_arrays(idx, sequences, boundaries)
    ends = pointers + lengths.astype(np.int64) * dtype.itemsize
    starts = np.concatenate(([0], ends[:-1]))
    bad = np.flatnonzero((lengths < 0) | (pointers != starts))
    if bad.size:
        i = int(bad[0])
        raise IndexedDataError(
            f"{idx}: sequence {i} ({lengths[i]} tokens) starts at byte {pointers[i]} of the .bin, "
            f"but the sequences before it end at byte {starts[i]}: the lengths and pointers "
            f"disagree ({bad.size} of {sequences} sequences), so the index is scrambled. {fix}"
        )
    if ends[-1] != bin_size:
        raise IndexedDataError(
            f"{bin_}: {bin_size} bytes, but {idx} says its {sequences} sequences of {dtype.name} "
            f"tokens end at byte {ends[-1]}: the .bin is truncated or longer, or the two files "
            f"come from different runs. {fix}"
        )
    falls = np.flatnonzero(np.diff(bounds) < 0)
    if boundaries < 2 or bounds[0] != 0 or bounds[-1] != sequences or falls.size:
        shape = f"{bounds[:3].tolist()} ... {bounds[-3:].tolist()}"
        if falls.size:
            shape += f", falling after boundary {int(falls[0])}"
        raise IndexedDataError(
            f"{idx}: its {boundaries} document boundaries must rise from 0 to the sequence count "
            f"{sequences}, but run {shape}. {fix}"
        )
    return IndexFacts(
        dtype=dtype.name,
        sequences=sequences,
        documents=boundaries - 1,
        tokens=int(ends[-1]) // dtype.itemsize,
    )


def dtype_bound(dtype: str) -> int | None:
    """Every id a .bin of this type can hold is below this (None: signed or float, so scan)."""
    import numpy as np

    kind = np.dtype(dtype)
    return 1 << (8 * kind.itemsize) if kind.kind == "u" else None


def token_id_range(prefix: str, dtype: str, tokens: int) -> tuple[int | None, int | None]:
    """(smallest, largest) token id in PREFIX.bin, reduced chunk by chunk through a memory map:
    the file is read once, at disk speed, and never held in memory. (None, None) for no tokens."""
    import numpy as np

    data = np.memmap(prefix + ".bin", dtype=dtype, mode="r", shape=(tokens,))
    lo, hi = None, None
    for start in range(0, tokens, SCAN_CHUNK):
        chunk = data[start : start + SCAN_CHUNK]
        c_lo, c_hi = int(chunk.min()), int(chunk.max())
        lo = c_lo if lo is None else min(lo, c_lo)
        hi = c_hi if hi is None else max(hi, c_hi)
    return lo, hi


def locate_id(prefix: str, facts: IndexFacts, bound: int) -> tuple[int, int, int]:
    """(id, token position, document) of the first id < 0 or >= bound in PREFIX.bin, for the
    message of a failed check (a second pass, paid only then)."""
    import numpy as np

    data = np.memmap(prefix + ".bin", dtype=facts.dtype, mode="r", shape=(facts.tokens,))
    for start in range(0, facts.tokens, SCAN_CHUNK):
        chunk = data[start : start + SCAN_CHUNK]
        bad = np.flatnonzero((chunk < 0) | (chunk >= bound))
        if bad.size:
            position = start + int(bad[0])
            lengths, _, bounds = _index_arrays(
                prefix + ".idx", facts.sequences, facts.documents + 1
            )
            sequence = int(np.searchsorted(np.cumsum(lengths, dtype=np.int64), position, "right"))
            document = int(np.searchsorted(bounds, sequence, "right")) - 1
            return int(chunk[bad[0]]), position, document
    raise ValueError(f"{prefix}.bin holds no id outside [0, {bound})")


def file_key(paths: Iterable[str]) -> str:
    """A short hash of each file's absolute path, size and modification time: it changes when a
    file is rewritten in place, so that nothing computed from the old one is reused."""
    import hashlib

    parts: list[list[str | int]] = []
    for path in paths:
        if "://" in path:  # object storage: the name is all there is to go by
            parts.append([path])
            continue
        st = os.stat(path)
        parts.append([os.path.abspath(path), st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def inspect_indexed(prefix: str, *, id_bound: int, cache_dir: str | None = None) -> IndexFacts:
    """`check_index`, then the id range of the .bin unless its type already keeps every id below
    `id_bound`; remembered as JSON in `cache_dir` under a name keyed by both files' path, size and
    mtime (`file_key`), so that a large .bin is scanned once, and a regenerated one again. A memo
    that cannot be written (a read-only dataset folder) only costs the check next time."""

    def scanned_enough(facts: IndexFacts) -> bool:
        bound = dtype_bound(facts.dtype)
        return facts.max_id is not None or (bound is not None and bound <= id_bound)

    key = file_key([prefix + ".bin", prefix + ".idx"])
    seen = _INSPECTED.get(key)  # the validation split's source asks again in the same process
    if seen is not None and scanned_enough(seen):
        return seen
    memo = Path(cache_dir, f"{Path(prefix).name}-{key}.json") if cache_dir else None
    if memo is not None and memo.is_file():
        try:
            facts = IndexFacts(**json.loads(memo.read_text()))
        except (ValueError, TypeError):
            facts = None  # a damaged or older memo: check again
        if facts is not None and scanned_enough(facts):
            _INSPECTED[key] = facts
            return facts
    facts = check_index(prefix)
    if not scanned_enough(facts):
        lo, hi = token_id_range(prefix, facts.dtype, facts.tokens)
        facts = IndexFacts(**{**asdict(facts), "min_id": lo, "max_id": hi})
    _INSPECTED[key] = facts
    if memo is not None:
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            partial = memo.with_suffix(f".{os.getpid()}.partial")
            partial.write_text(json.dumps(asdict(facts)))
            os.replace(partial, memo)
        except OSError:
            pass
    return facts
