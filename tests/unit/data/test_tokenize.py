"""`recipes data tokenize` and `recipes data blend` (data/tools/tokenize.py, sources.py, blend.py).

The oracles: transformers' own call of the tokenizer (what Megatron-LM's preprocess_data.py does
with an HF tokenizer folder: `tokenizer(text).input_ids`, then the EOD token) for the ids;
Megatron-Core's IndexedDataset for reading the shards and its IndexedDatasetBuilder for their
bytes; `datasets.save_to_disk`, pyarrow and zstandard for the inputs as users bring them.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import sys
from pathlib import Path

import pytest

from config.blend import parse_blend
from data.indexed import IndexedWriter
from data.tools.make_tokenizer import train_bpe_tokenizer
from data.tools.tokenize import Settings, TokenizeError, finish, plan, run
from tests.support import children

WORDS = "the model trains on tokens while gradients flow through every layer of a network".split()


def _docs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 25))), "title": f"t{i}"}
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def hf_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An HF tokenizer folder that adds a BOS to every text, as Llama 3's does."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tok")
    texts = [d["text"] for d in _docs(200, 0)]
    path = train_bpe_tokenizer(
        texts=texts, vocab_size=400, out=root / "tok.json", special_tokens=("<|endoftext|>", "<s>")
    )
    tok = Tokenizer.from_file(str(path))
    tok.post_processor = TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    folder = root / "hf"
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|endoftext|>"
    ).save_pretrained(folder)
    return folder


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, list[dict]]:
    """A folder of mixed JSONL (plain, gz, zst), Parquet and a save_to_disk dataset."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    docs = _docs(250, 1)
    src = tmp_path / "src"
    (src / "web").mkdir(parents=True)
    (src / "books").mkdir()
    lines = [json.dumps(d) + "\n" for d in docs]
    (src / "web" / "a.jsonl").write_text("".join(lines[:80]))
    with gzip.open(src / "web" / "b.jsonl.gz", "wt") as f:
        f.write("".join(lines[80:120]))
    (src / "web" / "c.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress("".join(lines[120:160]).encode())
    )
    pq.write_table(pa.Table.from_pylist(docs[160:200]), src / "books" / "d.parquet")
    datasets.Dataset.from_list(docs[200:]).save_to_disk(str(src / "books" / "saved"))
    return src, docs


def _read(prefix: str) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix)
    return [ds[i].tolist() for i in range(len(ds))]


def test_every_kind_of_file_gives_transformers_ids(hf_tokenizer: Path, corpus: tuple) -> None:
    from transformers import AutoTokenizer

    src, docs = corpus
    out = src.parent / "out"
    p = plan([str(src)], out, Settings(tokenizer=str(hf_tokenizer)))
    assert len(p.shards) == 5 and run(p, workers=2, progress=False)
    manifest = finish(p)
    oracle = AutoTokenizer.from_pretrained(hf_tokenizer)
    eod = oracle.eos_token_id
    # The shards in the blend's order: folders sorted (books before web), files sorted.
    prefixes, weights = parse_blend(str(out / "blend.json"))
    got = [doc for prefix in prefixes for doc in _read(prefix)]
    order = [*range(160, 250), *range(160)]
    expected = [ids + [eod] for i in order if (ids := oracle(docs[i]["text"]).input_ids)]
    assert got == expected
    # An empty text is still its BOS: a document, as in Megatron-LM's tool.
    assert manifest["documents"] == len(expected) == 250 and manifest["skipped_empty"] == 0
    assert weights == [float(len(sum(_read(p), []))) for p in prefixes]  # by tokens
    # Every shard went through the word cache (data/tools/word_cache.py): a byte-level BPE.
    assert {r["encoder"] for r in manifest["shards"]} == {"word cache"}


def test_a_word_cache_that_disagrees_gives_the_shard_to_the_library(
    hf_tokenizer: Path, corpus: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard's first documents are encoded both ways; a difference hands the whole shard
    to the library, whose ids are written, and its record says so."""
    from data.tools import tokenize as tk

    src, _ = corpus
    settings = Settings(tokenizer=str(hf_tokenizer))
    p = plan([str(src / "web" / "a.jsonl")], src.parent / "out", settings)
    (p.out / "shards").mkdir(parents=True)
    tk._init(tk.tokenizer_spec(settings), settings, 1, None)
    job = (p.shards[0], str(p.out), p.names[0], settings, p.digest)
    prefix = str(p.out / "shards" / p.names[0])
    assert tk.tokenize_shard(job).encoder == "word cache"
    right = _read(prefix)
    monkeypatch.setattr(tk._ENCODE, "fast", lambda texts: [[3] for _ in texts])
    record = tk.tokenize_shard(job)
    assert record.encoder == "tokenizers (the word cache differed on this shard)"
    assert _read(prefix) == right and record.tokens == sum(map(len, right))


def test_the_writer_writes_megatron_cores_bytes(tmp_path: Path) -> None:
    import numpy
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    rng = random.Random(2)
    for vocab in (300, 70_000):  # uint16 and int32
        docs = [[rng.randrange(vocab) for _ in range(rng.randint(1, 40))] for _ in range(50)]
        builder = IndexedDatasetBuilder(f"{tmp_path}/ref{vocab}.bin", DType.optimal_dtype(vocab))
        for d in docs:
            builder.add_document(numpy.array(d), [len(d)])
        builder.finalize(f"{tmp_path}/ref{vocab}.idx")
        with IndexedWriter(tmp_path / f"ours{vocab}", vocab) as writer:
            writer.add(docs[:20])
            writer.add(docs[20:])
            writer.finish()
        for ext in (".bin", ".idx"):
            ours = (tmp_path / f"ours{vocab}{ext}").read_bytes()
            assert ours == (tmp_path / f"ref{vocab}{ext}").read_bytes(), (vocab, ext)


def test_a_rerun_redoes_only_what_is_unfinished(hf_tokenizer: Path, corpus: tuple) -> None:
    src, _ = corpus
    out = src.parent / "out"
    settings = Settings(tokenizer=str(hf_tokenizer))
    p = plan([str(src)], out, settings)
    run(p, workers=1, progress=False)
    shards = out / "shards"
    before = {f.name: f.stat().st_mtime_ns for f in shards.glob("*.bin")}
    first = p.names[0]
    (shards / f"{first}.json").unlink()  # stopped before its record was written
    (shards / f"{first}.partial.bin").write_bytes(b"half")
    (src / "web" / "a.jsonl").write_text(json.dumps({"text": "the model"}) + "\n")  # changed
    redone = run(plan([str(src)], out, settings), workers=1, progress=False)
    assert sorted(p.names[i] for i in redone) == sorted([first, p.names[2]])  # books/d, web/a
    after = {f.name: f.stat().st_mtime_ns for f in shards.glob("*.bin")}
    kept = [n for n in before if not n.startswith((first, p.names[2]))]
    assert kept and all(after[n] == before[n] for n in kept)
    assert not list(shards.glob("*.partial*"))
    assert len(_read(str(out / "shards" / p.names[2]))) == 1  # the new a.jsonl: one document
    other = Settings(tokenizer=str(hf_tokenizer), append_eod=False)
    assert len(run(plan([str(src)], out, other), workers=1, progress=False)) == 5


@pytest.mark.parametrize(
    "line, why",
    [
        (b'{"text": "caf\xe9"}\n', "not UTF-8"),
        (b'{"text": "unterminated\n', "not valid JSON"),
        (b'{"body": "x"}\n', "no field 'text' (fields: body)"),
        (b'{"text": 3}\n', "'text' holds int"),
    ],
)
def test_bad_records_are_named_then_stop_or_are_skipped(
    hf_tokenizer: Path, tmp_path: Path, line: bytes, why: str
) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "the model"}\n' + line + b'{"text": "a layer"}\n')
    out = tmp_path / "out"
    with pytest.raises(TokenizeError, match=rf"in.jsonl:2: {re.escape(why)}.*--on-error skip"):
        run(plan([str(src)], out, Settings(tokenizer=str(hf_tokenizer))), 1, progress=False)
    assert list((out / "shards").iterdir()) == []  # nothing that looks finished
    p = plan([str(src)], out, Settings(tokenizer=str(hf_tokenizer), on_error="skip"))
    run(p, 1, progress=False)
    record = finish(p)["shards"][0]
    assert record["documents"] == 2 and record["skipped_bad"] == 1
    assert record["bad"][0].startswith(f"{src}:2: {why}")


def test_the_cli_end_to_end(hf_tokenizer: Path, corpus: tuple) -> None:
    """Twice the same source and a glob are one input each; a template joins fields; `check`
    takes the blend; `data blend` weighs corpora as given."""
    src, _ = corpus
    root = src.parent

    def recipes(*argv: str) -> tuple[int, str]:
        done = children.run(
            [sys.executable, "-m", "recipes", *argv], capture_output=True, text=True, timeout=300
        )
        return done.returncode, done.stdout + done.stderr

    code, text = recipes(
        "data", "tokenize", str(src / "web"), str(src / "web"), f"{src}/books/*.parquet",
        str(root / "a"), "--tokenizer", str(hf_tokenizer), "--template", "{title}: {text}",
        "--workers", "2", "--quiet",
    )  # fmt: skip
    assert code == 0 and "4 shard(s)" in text, text
    blend = root / "a" / "blend.json"
    assert f"data.path={blend}" in text
    code, text = recipes("data", "tokenize", str(src / "books"), str(root / "b"), "--tokenizer",
                         str(hf_tokenizer), "--quiet")  # fmt: skip
    assert code == 0, text
    code, text = recipes("data", "blend", str(root / "a"), str(root / "b" / "blend.json"),
                         "-o", str(root / "mix.json"), "--weights", "0.7,0.3")  # fmt: skip
    assert code == 0, text
    sources = json.loads((root / "mix.json").read_text())["sources"]
    assert round(sum(s["weight"] for s in sources[:4]), 6) == 0.7
    check = ["check", "tiny_gpt_pretrain", "data.kind=indexed", f"data.path={root / 'mix.json'}",
             f"data.tokenizer={hf_tokenizer}", "--gpu", "cpu"]  # fmt: skip
    code, text = recipes(*check)
    assert code == 0, text
    code, text = recipes(*check, "model.vocab_size=256")
    assert code == 2 and "model.vocab_size: 256, but" in text, text
    (root / "a" / "shards" / f"{Path(sources[0]['prefix']).name}.bin").unlink()
    code, text = recipes(*check)
    assert code == 2 and "without their .bin/.idx" in text, text
    code, text = recipes("data", "tokenize", str(root / "nothing*"), str(root / "c"),
                         "--tokenizer", str(hf_tokenizer))  # fmt: skip
    assert code == 2 and "matches no file" in text, text


def test_array_tasks_share_the_shards_and_the_last_writes_the_blend(
    hf_tokenizer: Path, corpus: tuple
) -> None:
    src, _ = corpus
    out = src.parent / "out"
    settings = Settings(tokenizer=str(hf_tokenizer))
    first = run(plan([str(src)], out, settings), 1, task=0, tasks=2, progress=False)
    assert first == [0, 2, 4]
    with pytest.raises(TokenizeError, match="2 of 5 shards are not finished"):
        finish(plan([str(src)], out, settings))
    assert run(plan([str(src)], out, settings), 1, task=1, tasks=2, progress=False) == [1, 3]
    assert finish(plan([str(src)], out, settings))["documents"] > 0


def test_a_missing_parquet_column_names_the_columns(hf_tokenizer: Path, corpus: tuple) -> None:
    src, _ = corpus
    p = plan([str(src / "books" / "d.parquet")], src.parent / "o", Settings(
        tokenizer=str(hf_tokenizer), text_key="body"))  # fmt: skip
    with pytest.raises(
        TokenizeError, match=r"d.parquet: no column 'body' \(columns: text, title\)"
    ):
        run(p, 1, progress=False)


def test_prepared_index_caches_are_the_ones_the_ranks_read(
    hf_tokenizer: Path, corpus: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`recipes data cache`: afterwards the ranks' own dataset build (data/pretrain.py batches:
    the same sample counts) is a cache hit; Megatron builds an index only with numpy.save."""
    import numpy

    from config.schema import DataConfig
    from data.batches import samples_needed
    from data.pretrain import build_pretrain_datasets, prepare_index_caches
    from data.tokenizer import build_tokenizer
    from tests.unit.data.test_data import _cfg

    src, _ = corpus
    out = src.parent / "out"
    p = plan([str(src)], out, Settings(tokenizer=str(hf_tokenizer)))
    run(p, 1, progress=False)
    finish(p)
    cfg = _cfg(
        DataConfig(
            kind="indexed",
            path=str(out / "blend.json"),
            tokenizer=str(hf_tokenizer),
            index_cache_dir=str(src.parent / "caches"),
        ),
        vocab_size=400,
    )
    cfg.train.max_steps = 20
    assert prepare_index_caches(cfg).startswith(str(src.parent / "caches"))

    def no_build(*args: object, **kwargs: object) -> None:
        raise AssertionError("Megatron built an index the prepared caches should hold")

    monkeypatch.setattr(numpy, "save", no_build)
    tok = build_tokenizer(cfg)
    train, _, _ = build_pretrain_datasets(cfg, tok, samples_needed(cfg, "train"), 0)
    assert len(train) >= samples_needed(cfg, "train")
    cfg.train.max_steps = 21  # another run's sample count: not prepared, so built
    with pytest.raises(AssertionError, match="Megatron built an index"):
        build_pretrain_datasets(cfg, tok, samples_needed(cfg, "train"), 0)


def test_the_plain_load_gives_transformers_ids(hf_tokenizer: Path, tmp_path: Path) -> None:
    """The parent skips transformers (6 CPU-seconds) only where transformers would run the
    folder's tokenizer.json unchanged: same ids, end-of-document id and vocabulary."""
    import shutil

    from data.tokenizer import load_plain_tokenizer, load_tokenizer

    plain, full = load_plain_tokenizer(hf_tokenizer), load_tokenizer(hf_tokenizer)
    assert plain is not None and not plain.transformers_tokenizer
    assert (plain.eod, plain.vocab_size) == (full.eod, full.vocab_size)
    texts = [d["text"] for d in _docs(60, 4)] + ["", "<|endoftext|> the <s>"]
    assert plain.tokenize_batch(texts) == full.tokenize_batch(texts)
    for change in ({"tokenizer_class": "LlamaTokenizerFast"}, {"add_bos_token": True}):
        folder = tmp_path / next(iter(change))
        shutil.copytree(hf_tokenizer, folder)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps(config | change))
        assert load_plain_tokenizer(folder) is None
