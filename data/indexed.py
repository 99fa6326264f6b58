"""JSONL text -> Megatron indexed dataset (.bin token stream + .idx document index).

One JSON object per line; the text under `text_key` becomes one document. The files are written by
Megatron-Core's own `IndexedDatasetBuilder`, so `IndexedDataset` and `GPTDataset` read them as they
read the output of Megatron-LM's `preprocess_data.py`. Megatron-Core is imported only where the
files are written: it costs ~5 s, and spawned tokenizer workers do not need it.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import IO

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


def write_indexed(
    documents: Iterable[Sequence[int]], output_prefix: str | Path, *, vocab_size: int
) -> tuple[int, int]:
    """Write token-id documents to `output_prefix`.bin/.idx; return (documents, tokens).

    The files appear only once complete (written under a `.partial` prefix, then renamed), so an
    interrupted conversion never leaves a dataset that looks valid.
    """
    import numpy
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    prefix = str(output_prefix)
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    partial = prefix + ".partial"
    # uint16 below 65500 ids halves the file; Megatron picks the same way in preprocess_data.
    dtype = DType.optimal_dtype(vocab_size)
    builder = IndexedDatasetBuilder(partial + ".bin", dtype=dtype)
    n_docs = n_tokens = 0
    try:
        for ids in documents:
            builder.add_document(numpy.asarray(ids, dtype=dtype), [len(ids)])
            n_docs += 1
            n_tokens += len(ids)
        builder.finalize(partial + ".idx")
    except BaseException:
        builder.data_file.close()
        for ext in (".bin", ".idx"):
            Path(partial + ext).unlink(missing_ok=True)
        raise
    for ext in (".bin", ".idx"):
        os.replace(partial + ext, prefix + ext)
    return n_docs, n_tokens


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
