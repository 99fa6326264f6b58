"""`recipes data tokenize SRC... OUT --tokenizer DIR`: raw corpora -> Megatron indexed shards + a blend.

Every input shard (data/tools/sources.py: a JSONL, .jsonl.gz, .jsonl.zst, Parquet or Arrow file)
becomes one .bin/.idx pair under OUT/shards/, written under a temporary name and renamed when
whole, then recorded by a small JSON file beside it (its source's path, size and mtime, the
tokenizer's digest, documents, tokens, what was skipped). That record is the mark of a finished
shard: a rerun skips the shards whose record matches, and redoes the others (a stopped run's
partial files are removed first). When every shard is done, OUT/manifest.json lists them all
and OUT/blend.json weighs them by their tokens (config/blend.py reads it as data.path).

Work is spread over `workers` processes, one shard at a time each. A byte-level BPE tokenizer is
encoded by data/tools/word_cache.py (the library's BPE once per distinct word, about 3-6x the
library's speed per core), checked against the library on each shard's first documents; other
tokenizers by the `tokenizers` library, whose batch encoding runs a process's share of threads
where there are fewer shards than workers. Nothing here imports torch or Megatron-Core, nor
transformers where the folder's tokenizer.json is used as written: the files are written by
data/indexed.py's IndexedWriter, in Megatron-Core's format.

The ids are those of Megatron-LM's tools/preprocess_data.py with an HF tokenizer folder: the
tokenizer's own special tokens (e.g. a BOS) per document, the end-of-document token appended
(unless --no-eod), documents without tokens skipped.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from config.blend import BLEND_FORMAT, tokenizer_digest
from data.tools.sources import BadRecord, Shard, documents, expand

BATCH = 1000  # documents per tokenizer call
BAD_SHOWN = 5  # bad records named per shard in its record (all are counted)


class TokenizeError(ValueError):
    """Stops the run: names the shard and the record (file:line or file:row)."""


@dataclass(frozen=True, slots=True)
class Settings:
    tokenizer: str
    text_key: str = "text"
    template: str | None = None
    append_eod: bool = True
    on_error: str = "stop"  # "skip": count and name bad records; "stop": fail on the first


@dataclass(slots=True)
class ShardRecord:
    """What OUT/shards/<name>.json says of a finished shard."""

    source: dict[str, Any]  # Shard.key(): path, size, mtime_ns
    prefix: str  # relative to OUT
    tokenizer_sha256: str
    vocab_size: int
    settings: dict[str, Any]
    documents: int = 0
    tokens: int = 0
    skipped_empty: int = 0
    skipped_bad: int = 0
    bad: list[str] = field(default_factory=list)  # the first BAD_SHOWN, file:line: why
    encoder: str = ""  # "word cache" or "tokenizers (why not the word cache)"
    seconds: float = 0.0


def shard_name(shard: Shard, root: Path) -> str:
    """A file name for a shard's output: its path under the sources' common folder, made
    safe, plus a digest of its whole path (two `part-0.jsonl` of different folders differ)."""
    try:
        rel = shard.path.relative_to(root)
    except ValueError:
        rel = Path(shard.path.name)
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(rel))
    for suffix in (".gz", ".zst", ".jsonl", ".parquet", ".arrow"):
        stem = stem.removesuffix(suffix)
    digest = hashlib.sha256(str(shard.path).encode()).hexdigest()[:8]
    return f"{stem[-80:]}-{digest}"


def _record_path(out: Path, name: str) -> Path:
    return out / "shards" / f"{name}.json"


def finished(out: Path, name: str, shard: Shard, digest: str, settings: Settings) -> bool:
    """Whether the shard's output is whole and of this input, tokenizer and settings."""
    path = _record_path(out, name)
    if not path.is_file():
        return False
    record = json.loads(path.read_text())
    prefix = out / record["prefix"]
    return (
        record["source"] == shard.key()
        and record["tokenizer_sha256"] == digest
        and record["settings"] == asdict(settings)
        and all(Path(f"{prefix}{ext}").is_file() for ext in (".bin", ".idx"))
    )


# --- one shard, in a worker process ------------------------------------------------------------
VERIFY_DOCS = 64  # a shard's first documents, encoded both ways when the word cache is used
# Above this many threads a process's library encoder outruns the one-core word cache (about 3x
# the library's speed per core: BENCHMARKS.md), so it takes the library's threads instead.
WORD_CACHE_MAX_THREADS = 3


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """What a worker needs of the tokenizer, loaded once by the parent: the `tokenizers`
    definition as transformers set it up (None where there is none: the worker loads the
    folder itself), the end-of-document id and the vocabulary size."""

    backend_json: str | None
    eod: int
    vocab_size: int


def tokenizer_spec(settings: Settings) -> TokenizerSpec:
    from data.tokenizer import load_plain_tokenizer, load_tokenizer

    tokenizer = load_plain_tokenizer(settings.tokenizer) or load_tokenizer(settings.tokenizer)
    library = tokenizer.library_tokenizer
    text = library.to_str() if library is not None else None
    return TokenizerSpec(text, tokenizer.eod, tokenizer.vocab_size)


_ENCODE: Any = None  # this worker's encoders (_init)
_PROGRESS: Any = None  # the queue of (bytes read, tokens written) to the parent's bar


@dataclass(slots=True)
class _Encoders:
    spec: TokenizerSpec
    library: Any  # texts -> id lists, by the `tokenizers` library (or transformers)
    fast: Any  # the word cache (data/tools/word_cache.py), or None
    why_not: str  # why there is no word cache


def _init(spec: TokenizerSpec, settings: Settings, threads: int, progress: Any) -> None:
    global _ENCODE, _PROGRESS
    # The tokenizers library's thread pool: this process's share of the cores.
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    _PROGRESS = progress
    if spec.backend_json is None:
        from data.tokenizer import load_tokenizer

        library = load_tokenizer(settings.tokenizer).tokenize_batch
        _ENCODE = _Encoders(spec, library, None, "no tokenizers backend")
        return
    from tokenizers import Tokenizer

    from data.tools.word_cache import library_encoder, word_encoder

    backend = Tokenizer.from_str(spec.backend_json)
    fast, why = word_encoder(backend) if threads <= WORD_CACHE_MAX_THREADS else (None, "")
    _ENCODE = _Encoders(spec, library_encoder(backend), fast, why or f"{threads} threads a process")


def tokenize_shard(job: tuple[Shard, str, str, Settings, str]) -> ShardRecord:
    """Tokenize one shard into OUT/<prefix>.bin/.idx and write its record; TokenizeError on the
    first bad record under on_error="stop" (nothing of the shard is left behind)."""
    from data.indexed import IndexedWriter

    shard, out, name, settings, digest = job
    spec = _ENCODE.spec
    start = time.monotonic()
    prefix = f"shards/{name}"
    record = ShardRecord(
        source=shard.key(),
        prefix=prefix,
        tokenizer_sha256=digest,
        vocab_size=spec.vocab_size,
        settings=asdict(settings),
    )
    eod = [spec.eod] if settings.append_eod else []
    encode = _ENCODE.fast or _ENCODE.library
    record.encoder = "word cache" if _ENCODE.fast else f"tokenizers ({_ENCODE.why_not})"
    unchecked = VERIFY_DOCS if _ENCODE.fast else 0
    size, seen = record.source["size"], 0  # the input's bytes; characters read so far

    def flush(texts: list[str], writer: IndexedWriter) -> None:
        nonlocal encode, unchecked, seen
        encoded = encode(texts)
        if unchecked:  # the word cache's first documents against the library's
            if encoded[:unchecked] != _ENCODE.library(texts[:unchecked]):
                encode = _ENCODE.library
                record.encoder = "tokenizers (the word cache differed on this shard)"
                encoded = encode(texts)
            unchecked = 0
        docs = [ids + eod for ids in encoded if ids]
        record.skipped_empty += len(texts) - len(docs)
        writer.add(docs)
        if _PROGRESS is not None:
            read = min(sum(map(len, texts)), max(size - seen, 0))
            seen += read
            _PROGRESS.put((read, writer.tokens - record.tokens))
        record.tokens = writer.tokens

    with IndexedWriter(Path(out) / prefix, spec.vocab_size) as writer:
        texts: list[str] = []
        try:
            for _, text in documents(shard, settings.text_key, settings.template):
                if isinstance(text, BadRecord):
                    if settings.on_error == "stop":
                        raise TokenizeError(
                            f"{text} (--on-error skip counts and skips such records)"
                        )
                    record.skipped_bad += 1
                    if len(record.bad) < BAD_SHOWN:
                        record.bad.append(str(text))
                    continue
                texts.append(text)
                if len(texts) == BATCH:
                    flush(texts, writer)
                    texts = []
        except BadRecord as err:  # the whole file: a missing column, not a table
            raise TokenizeError(str(err)) from None
        if texts:
            flush(texts, writer)
        writer.finish()
    record.documents = writer.documents
    record.seconds = time.monotonic() - start
    if _PROGRESS is not None:  # the rest of the shard's bytes (compressed, or multi-byte text)
        _PROGRESS.put((max(size - seen, 0), 0))
    path = _record_path(Path(out), name)
    tmp = path.with_suffix(".json.partial")
    tmp.write_text(json.dumps(asdict(record), indent=1) + "\n")
    os.replace(tmp, path)  # the mark of a finished shard, after its pair is in place
    return record


# --- the whole run -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Plan:
    out: Path
    shards: list[Shard]
    names: list[str]
    digest: str
    settings: Settings

    def todo(self) -> list[int]:
        return [
            i
            for i, (shard, name) in enumerate(zip(self.shards, self.names, strict=True))
            if not finished(self.out, name, shard, self.digest, self.settings)
        ]


def plan(sources: list[str], out: str | Path, settings: Settings) -> Plan:
    shards = expand(sources)
    root = Path(os.path.commonpath([s.path.parent for s in shards]))
    names = [shard_name(s, root) for s in shards]
    return Plan(Path(out), shards, names, tokenizer_digest(settings.tokenizer), settings)


def _clean_partials(out: Path) -> None:
    for partial in (out / "shards").glob("*.partial*"):
        partial.unlink()


def run(
    p: Plan, workers: int, *, task: int = 0, tasks: int = 1, progress: bool = True
) -> list[int]:
    """Tokenize the shards not yet finished (of this array task's share: every `tasks`-th from
    `task`); the indices done. Raises TokenizeError on a bad record under on_error="stop"."""
    (p.out / "shards").mkdir(parents=True, exist_ok=True)
    if tasks == 1:
        _clean_partials(p.out)  # a stopped run's; an array's tasks share the folder
    todo = [i for i in p.todo() if i % tasks == task]
    if not todo:
        return []
    procs = max(1, min(workers, len(todo)))
    threads = max(1, workers // procs)
    spec = tokenizer_spec(p.settings)
    jobs = [(p.shards[i], str(p.out), p.names[i], p.settings, p.digest) for i in todo]
    total_bytes = sum(p.shards[i].path.stat().st_size for i in todo)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    bar = _Progress(total_bytes, len(todo), enabled=progress)
    with ctx.Pool(procs, initializer=_init, initargs=(spec, p.settings, threads, queue)) as pool:
        pending = pool.imap_unordered(tokenize_shard, jobs)
        try:
            for _ in _drain(pending, queue, bar):
                pass
        finally:
            bar.close()
    return todo


def _drain(pending: Iterator[ShardRecord], queue: Any, bar: _Progress) -> Iterator[ShardRecord]:
    """The finished shards, while the workers' progress (bytes, tokens) reaches the bar."""
    import queue as queues
    import threading

    results: list[Any] = []
    done = threading.Event()

    def collect() -> None:
        try:
            results.extend(pending)
        except BaseException as err:  # noqa: BLE001 - handed to the main thread
            results.append(err)
        finally:
            done.set()

    thread = threading.Thread(target=collect, daemon=True)
    thread.start()
    while not (done.is_set() and queue.empty()):
        try:
            bar.update(*queue.get(timeout=0.2))
        except queues.Empty:
            continue
    thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
        yield result


class _Progress:
    """A tqdm bar over the input's bytes with tokens/s; nothing when disabled."""

    def __init__(self, total_bytes: int, shards: int, enabled: bool) -> None:
        self.start = time.monotonic()
        self.tokens = 0
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc=f"{shards} shard(s)")

    def update(self, read: int, tokens: int) -> None:
        self.tokens += tokens
        if self.bar is not None:
            self.bar.update(read)
            rate = self.tokens / max(time.monotonic() - self.start, 1e-9)
            self.bar.set_postfix_str(f"{rate / 1e3:,.0f}k tokens/s", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def finish(p: Plan) -> dict[str, Any]:
    """OUT/manifest.json and OUT/blend.json, once every shard is finished; the manifest."""
    left = p.todo()
    if left:
        raise TokenizeError(
            f"{len(left)} of {len(p.shards)} shards are not finished (first: "
            f"{p.shards[left[0]].path}); run the same command again to finish them"
        )
    records = [json.loads(_record_path(p.out, n).read_text()) for n in p.names]
    manifest = {
        "format": BLEND_FORMAT,
        "tokenizer": p.settings.tokenizer,
        "tokenizer_sha256": p.digest,
        "vocab_size": records[0]["vocab_size"] if records else None,
        "documents": sum(r["documents"] for r in records),
        "tokens": sum(r["tokens"] for r in records),
        "skipped_empty": sum(r["skipped_empty"] for r in records),
        "skipped_bad": sum(r["skipped_bad"] for r in records),
        "shards": records,
    }
    _write_json(p.out / "manifest.json", manifest)
    blend = {
        "format": BLEND_FORMAT,
        "tokenizer_sha256": p.digest,
        "vocab_size": manifest["vocab_size"],
        # Weighted by tokens: each shard is sampled in proportion to its size, as one corpus.
        "sources": [
            {"prefix": r["prefix"], "weight": r["tokens"], "tokens": r["tokens"]}
            for r in records
            if r["tokens"]
        ],
    }
    _write_json(p.out / "blend.json", blend)
    return manifest


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
