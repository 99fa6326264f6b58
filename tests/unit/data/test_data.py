"""Data path, end to end and small: a BPE tokenizer trained here, JSONL -> .bin/.idx, read back by
Megatron-Core's IndexedDataset, then GPT datasets built by BlendedMegatronDatasetBuilder.

The tokenizer is generated at test time (a fraction of a second) rather than shipped, so the
test data can never drift from the code that makes it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from config.blend import parse_blend
from config.schema import DataConfig, ModelConfig, TrainConfig, TrainingConfig
from data.indexed import JsonlError, iter_jsonl_texts, jsonl_to_indexed
from data.pretrain import build_pretrain_datasets
from data.tokenizer import build_tokenizer, load_tokenizer
from data.tools.jsonl_to_indexed import main as jsonl_cli
from data.tools.make_tokenizer import EOD, train_bpe_tokenizer

WORDS = (
    "the model trains on tokens while gradients flow through every layer of the network and "
    "the optimizer updates weights across nodes with pipeline tensor data parallel ranks"
).split()
N_LINES = 200
SEQ = 32


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    # Every 50th document is empty: the converter must skip it, as Megatron's preprocess_data does.
    return [
        "" if i % 50 == 49 else " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("corpus")
    tok_path = train_bpe_tokenizer(texts=_texts(300, seed=0), vocab_size=512, out=root / "tok.json")
    texts = _texts(N_LINES, seed=1)
    jsonl = root / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    prefix = root / "out" / "docs"
    stats = jsonl_to_indexed(jsonl, tok_path, prefix, append_eod=True)
    return {
        "root": root,
        "tok": tok_path,
        "texts": texts,
        "jsonl": jsonl,
        "prefix": prefix,
        "stats": stats,
    }


def _cfg(data: DataConfig, vocab_size: int = 512) -> TrainingConfig:
    model = ModelConfig(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        seq_length=SEQ,
        vocab_size=vocab_size,
    )
    return TrainingConfig(name="t", model=model, train=TrainConfig(global_batch_size=2), data=data)


# --- tokenizer --------------------------------------------------------------------------------
def test_tokenizer_round_trip(corpus: dict) -> None:
    tok = load_tokenizer(corpus["tok"])
    assert 256 < tok.vocab_size <= 512
    assert tok.eod == tok.vocab[EOD] == 0
    assert tok.pad == -1  # no pad token: Megatron's own "none" value
    text = "the model trains — ünïcode too"
    assert tok.detokenize(tok.tokenize(text)) == text
    json.dumps(tok.unique_identifiers)  # hashed into Megatron's cache names


def test_tokenizer_folder_and_errors(corpus: dict, tmp_path: Path) -> None:
    folder = tmp_path / "hf_tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(Path(corpus["tok"]).read_text())
    config = {"eos_token": EOD, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_tokenizer(folder).eod == 0

    with pytest.raises(FileNotFoundError, match="data.tokenizer=.*does not exist"):
        load_tokenizer(tmp_path / "meta-llama/Llama-3-8B")
    no_eod = train_bpe_tokenizer(
        texts=_texts(20, 0), vocab_size=300, out=tmp_path / "x.json", special_tokens=()
    )
    with pytest.raises(ValueError, match="ends a document"):
        load_tokenizer(no_eod)
    with pytest.raises(ValueError, match="vocab-size 100"):
        train_bpe_tokenizer(texts=["a"], vocab_size=100, out=tmp_path / "y.json")


def test_null_tokenizer_for_mock_data() -> None:
    tok = build_tokenizer(_cfg(DataConfig(kind="mock"), vocab_size=256))
    assert (tok.vocab_size, tok.eod) == (256, 255)
    with pytest.raises(ValueError, match="data.tokenizer is unset"):
        build_tokenizer(_cfg(DataConfig(kind="indexed", path="x")))


# --- JSONL -> .bin/.idx -------------------------------------------------------------------------
def test_indexed_round_trip(corpus: dict) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    tok = load_tokenizer(corpus["tok"])
    expected = [tok.tokenize(t) + [tok.eod] for t in corpus["texts"] if t]
    stats = corpus["stats"]
    assert (stats.documents, stats.skipped_empty) == (len(expected), N_LINES - len(expected))
    assert stats.tokens == sum(map(len, expected))

    ds = IndexedDataset(str(corpus["prefix"]))
    assert len(ds) == len(expected)
    # One sequence per document: document i is sequence i, and ends with the EOD token.
    assert ds.document_indices.tolist() == list(range(len(expected) + 1))
    assert ds.sequence_lengths.tolist() == [len(e) for e in expected]
    for i in (0, 1, len(expected) // 2, len(expected) - 1):
        assert ds[i].tolist() == expected[i]
    assert ds[0].dtype.name == "uint16"  # a 512-token vocabulary fits in two bytes


def test_workers_give_identical_files(corpus: dict, tmp_path: Path) -> None:
    prefix = tmp_path / "w2"
    jsonl_to_indexed(corpus["jsonl"], corpus["tok"], prefix, append_eod=True, workers=2)
    for ext in (".bin", ".idx"):
        assert (Path(str(prefix) + ext)).read_bytes() == Path(
            str(corpus["prefix"]) + ext
        ).read_bytes()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"text": "ok",}', r"bad\.jsonl:3: not valid JSON"),
        ('{"body": "no text key"}', r"bad\.jsonl:3: no key 'text' \(keys: body\)"),
        ('{"text": 42}', r"bad\.jsonl:3: 'text' holds int"),
        ('["a list"]', r"bad\.jsonl:3: expected a JSON object"),
    ],
)
def test_bad_line_is_named(corpus: dict, tmp_path: Path, line: str, message: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "first"}\n\n' + line + '\n{"text": "last"}\n')  # line 2 is blank
    with pytest.raises(JsonlError, match=message):
        jsonl_to_indexed(bad, corpus["tok"], tmp_path / "bad")
    assert not list(tmp_path.glob("bad.*.bin")) and not (tmp_path / "bad.bin").exists()


def test_cli_reports_errors(corpus: dict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "x"}\n')
    args = [
        "--input",
        str(bad),
        "--tokenizer",
        str(corpus["tok"]),
        "--output-prefix",
        str(tmp_path / "o"),
    ]
    assert jsonl_cli(args) == 2
    assert "bad.jsonl:1: no key 'text'" in capsys.readouterr().err
    assert jsonl_cli([*args, "--text-key", "content"]) == 0
    assert list(iter_jsonl_texts(bad, "content")) == [(1, "x")]


# --- GPT datasets ---------------------------------------------------------------------------------
@pytest.fixture
def process_group(tmp_path: Path):
    """A one-process gloo group: the builder's rank-0-first path and barriers, without a GPU."""
    import torch.distributed as dist

    if dist.is_initialized():  # another test's group: use it as it is
        yield
        return
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_pretrain_datasets_indexed(corpus: dict, tmp_path: Path, process_group: None) -> None:
    cfg = _cfg(
        DataConfig(
            kind="indexed",
            path=str(corpus["prefix"]),
            tokenizer=str(corpus["tok"]),
            split="90,10,0",
        )
    )
    tok = build_tokenizer(cfg)
    train, valid, test = build_pretrain_datasets(cfg, tok, 40, 4, cache_dir=str(tmp_path / "cache"))
    assert test is None and len(train) >= 40 and len(valid) >= 4
    sample = train[0]
    assert sample["tokens"].shape == sample["labels"].shape == (SEQ,)
    assert sample["labels"][:-1].tolist() == sample["tokens"][1:].tolist()  # shifted by one
    text, _, _ = train._query_document_sample_shuffle_indices(0)
    assert len(text) == SEQ + 1  # seq_length + 1 tokens drawn from the stream
    assert int(max(train[i]["tokens"].max() for i in range(len(train)))) < tok.vocab_size
    # Under a folder keyed by the data files' size and mtime; the id check's memo beside it.
    assert list(
        (tmp_path / "cache").glob("GPTDataset_indices-*/*GPTDataset-train-shuffle_index.npy")
    )
    assert len(list((tmp_path / "cache" / "indexed_checks").glob("docs-*.json"))) == 1

    # A weighted blend of two prefixes: exactly the requested number of samples.
    cfg.data.path = f"0.7 {corpus['prefix']} 0.3 {corpus['prefix']}"
    train, _, _ = build_pretrain_datasets(cfg, tok, 30, 3, cache_dir=str(tmp_path / "cache"))
    assert type(train).__name__ == "BlendedDataset" and len(train) == 30


def test_pretrain_datasets_mock(process_group: None) -> None:
    cfg = _cfg(DataConfig(kind="mock"), vocab_size=128)
    train, valid, test = build_pretrain_datasets(cfg, build_tokenizer(cfg), 8, 2)
    assert type(train).__name__ == "MockGPTDataset" and test is None
    assert train[0]["tokens"].shape == (SEQ,) and len(valid) >= 2


def test_missing_prefix_names_data_path(corpus: dict, tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "shard"
    cfg = _cfg(
        DataConfig(
            kind="indexed", path=f"1 {corpus['prefix']} 1 {missing}", tokenizer=str(corpus["tok"])
        )
    )
    with pytest.raises(
        FileNotFoundError, match=r"data\.path=.*nope/shard.*lacks .*shard\.bin and .*shard\.idx"
    ):
        build_pretrain_datasets(cfg, build_tokenizer(cfg), 4, 1)
    cfg.data.path = str(corpus["prefix"])
    cfg.model.vocab_size = 256  # smaller than the tokenizer
    with pytest.raises(ValueError, match="model.vocab_size=256"):
        build_pretrain_datasets(cfg, build_tokenizer(cfg), 4, 1)


def test_parse_blend() -> None:
    assert parse_blend("/d/a") == (["/d/a"], None)
    assert parse_blend("/d/a /d/b") == (["/d/a", "/d/b"], None)
    assert parse_blend("0.7 /d/a 0.3 /d/b") == (["/d/a", "/d/b"], [0.7, 0.3])
    for bad in ("0.7 /d/a 0.3", "/d/a 0.3", "0.5 0.5", "", "0 /d/a"):
        with pytest.raises(ValueError, match="data.path"):
            parse_blend(bad)
