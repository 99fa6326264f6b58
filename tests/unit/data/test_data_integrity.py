"""Bad indexed data never trains silently: every error names the file, before the first step.

Every test makes a small .bin/.idx pair with the project's own writer (`write_indexed`, through
Megatron-Core's IndexedDatasetBuilder), damages it the way a fault-injection probe did (ids from a
larger tokenizer, a scrambled or cut index, a dataset regenerated in place), and builds the
datasets as a run does. The SFT file errors are in test_sft.py, the launcher's tokenizer check in
test_inputs.py.
"""

from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from config.hardware import Cluster
from config.rules import derive
from config.schema import DataConfig, ModelConfig, ParallelConfig, TrainConfig, TrainingConfig
from data import indexed
from data.batches import SampledBatches
from data.indexed import IndexedDataError, check_index, inspect_indexed, write_indexed
from data.pretrain import build_pretrain_datasets
from data.tokenizer import load_tokenizer
from data.tools.make_tokenizer import train_bpe_tokenizer
from tests.support import children

SEQ = 8


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("integrity_tok")
    texts = ["the model trains on tokens while gradients flow"] * 20
    return load_tokenizer(train_bpe_tokenizer(texts=texts, vocab_size=300, out=root / "tok.json"))


@pytest.fixture(autouse=True)
def _fresh_process_memo() -> None:
    indexed._INSPECTED.clear()  # each test sees the files as a new run would


def make(prefix: Path, docs: list[list[int]], vocab_size: int = 300) -> str:
    """PREFIX.bin/.idx holding `docs`; vocab_size picks the .bin's type (uint16 below 65500)."""
    write_indexed(docs, prefix, vocab_size=vocab_size)
    return str(prefix)


def config(path: str, tok, *, vocab_size: int = 300, tp: int = 1) -> TrainingConfig:
    model = ModelConfig(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        seq_length=SEQ,
        vocab_size=vocab_size,
    )
    return TrainingConfig(
        name="t",
        model=model,
        parallel=ParallelConfig(tensor_model_parallel_size=tp),
        train=TrainConfig(global_batch_size=2),
        data=DataConfig(kind="indexed", path=path, tokenizer=tok.path, split="1,0,0"),
    )


def docs(n: int, length: int, first_id: int = 1) -> list[list[int]]:
    return [[first_id + (i + j) % 50 for j in range(length)] for i in range(n)]


# --- token ids against the embedding --------------------------------------------------------
def test_ids_from_a_larger_tokenizer_are_refused_before_the_builder(tmp_path: Path, tok) -> None:
    # Tokenized with a 100k vocabulary (int32 ids), trained with 300 ids padded to 128 x TP 2 = 512.
    prefix = make(tmp_path / "big", [[1, 2, 3], [4, 5, 700, 6]], vocab_size=100_000)
    cfg = config(prefix, tok, tp=2)
    with pytest.raises(IndexedDataError) as err:
        build_pretrain_datasets(cfg, tok, 4, 0, cache_dir=str(tmp_path / "cache"))
    assert (
        f"{prefix}.bin holds token id 700 (token 5, document 1; its ids run 1..700), but the "
        "model's embedding has 512 rows (model.vocab_size=300 padded to a multiple of 128 x TP 2)"
    ) in str(err.value)
    assert str(err.value).startswith(f"data.path={prefix!r}")
    cfg.model.vocab_size = 700  # padded to 768: fits
    build_pretrain_datasets(cfg, tok, 4, 0, cache_dir=str(tmp_path / "cache"))


def test_the_id_scan_is_paid_once_per_version_of_the_file(
    tmp_path: Path, tok, monkeypatch: pytest.MonkeyPatch
) -> None:
    scans = []
    real = indexed.token_id_range
    monkeypatch.setattr(indexed, "token_id_range", lambda *a: scans.append(a[0]) or real(*a))
    prefix = make(tmp_path / "d", docs(20, 10))
    memo = str(tmp_path / "memo")
    first = inspect_indexed(prefix, id_bound=512, cache_dir=memo)
    assert (first.dtype, first.min_id, first.max_id, first.tokens) == ("uint16", 1, 29, 200)
    indexed._INSPECTED.clear()  # a new run: only the memo on disk remains
    assert inspect_indexed(prefix, id_bound=512, cache_dir=memo) == first
    assert len(scans) == 1
    make(tmp_path / "d", docs(20, 10, first_id=100))  # regenerated in place: scanned again
    os.utime(prefix + ".bin", ns=(1, os.stat(prefix + ".bin").st_mtime_ns + 10**9))
    assert inspect_indexed(prefix, id_bound=512, cache_dir=memo).max_id == 128
    assert len(scans) == 2
    # A uint16 .bin cannot hold an id past a 65536-row embedding: no scan at all.
    indexed._INSPECTED.clear()
    assert inspect_indexed(prefix, id_bound=65536).max_id is None and len(scans) == 2


def test_a_batch_with_an_id_past_the_embedding_names_the_data_and_the_id() -> None:
    cfg = TrainingConfig(
        name="t",
        model=ModelConfig(
            num_layers=2,
            hidden_size=64,
            ffn_hidden_size=128,
            num_attention_heads=4,
            seq_length=3,
            vocab_size=300,
        ),
        parallel=ParallelConfig(tensor_model_parallel_size=2),
        train=TrainConfig(global_batch_size=4, micro_batch_size=2),
        data=DataConfig(kind="sft", path="/d/chat.jsonl", tokenizer="/d/tokenizer"),
    )
    derived = derive(cfg, Cluster(num_nodes=1, gpus_per_node=4))  # DP 2, 512 rows
    rows = [
        {"tokens": torch.tensor([1, 2, 3]), "labels": torch.tensor([2, 3, 4])} for _ in range(8)
    ]
    rows[6]["labels"][1] = 600
    batches = SampledBatches(cfg, derived, rows, dp_rank=1, device="cpu")
    batches.next_step()  # samples 0-3: this rank reads 2 and 3
    with pytest.raises(ValueError) as err:
        batches.next_step()  # samples 4-7: this rank reads 6 and 7
    assert str(err.value).startswith(
        "data.path='/d/chat.jsonl': sample 6 holds token id 600 in its labels, but the model's "
        "embedding has 512 rows (model.vocab_size=300, padded), so ids must lie in 0..511"
    )


# --- the index against its .bin --------------------------------------------------------------
def _rewrite(path: str, edit) -> None:
    data = bytearray(Path(path).read_bytes())
    Path(path).write_bytes(bytes(edit(data)))


def _swap_first_lengths(data: bytearray) -> bytearray:
    """Lengths 0 and 1 exchanged: Megatron would read every later sample from a shifted place."""
    a, b = struct.unpack_from("<ii", data, 34)
    struct.pack_into("<ii", data, 34, b, a)
    return data


def _last_boundary(data: bytearray) -> bytearray:
    struct.pack_into("<q", data, len(data) - 8, 3)
    return data


DAMAGES = {
    # name: (file, damage, words of the error)
    "scrambled lengths": (
        ".idx",
        _swap_first_lengths,
        "sequence 1 (4 tokens) starts at byte 8 of the .bin, but the sequences before it end at "
        "byte 6: the lengths and pointers disagree",
    ),
    "truncated index": (".idx", lambda d: d[:-8], "bytes, but its header counts 4 sequences"),
    "empty index": (".idx", lambda d: b"", "empty; a Megatron index starts with a 34-byte"),
    "foreign file": (".idx", lambda d: b"PK\x03\x04" + d[4:], "not a Megatron index"),
    "unknown type": (".idx", lambda d: d[:17] + b"\x09" + d[18:], "token type code 9"),
    "truncated data": (".bin", lambda d: d[:-2], "bytes, but"),
    "empty data": (".bin", lambda d: b"", "holds no tokens"),
    "bad boundaries": (".idx", _last_boundary, "document boundaries must rise from 0"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_pair_is_named_before_megatron_reads_it(tmp_path: Path, tok, damage: str) -> None:
    prefix = make(tmp_path / "web", [[1, 2, 3, 4], [5, 6, 7], [8, 9], [10, 11, 12, 13, 14]])
    check_index(prefix)  # sound as written
    ext, edit, words = DAMAGES[damage]
    _rewrite(prefix + ext, edit)
    with pytest.raises(IndexedDataError, match="Make the pair again") as err:
        build_pretrain_datasets(config(prefix, tok), tok, 4, 0, cache_dir=str(tmp_path / "c"))
    message = str(err.value)
    assert message.startswith(prefix + ext) or message.startswith(prefix + ".bin"), message
    assert words in message, message


# --- Megatron's sample index caches ---------------------------------------------------------
def test_a_dataset_regenerated_in_place_gets_fresh_index_caches(tmp_path: Path, tok) -> None:
    prefix = make(tmp_path / "d", docs(20, 10))
    cfg = config(prefix, tok)
    train, _, _ = build_pretrain_datasets(cfg, tok, 16, 0)  # caches beside the data, by default
    assert int(train[0]["tokens"].max()) <= 50
    # The same path and document count, other lengths and ids: Megatron's own cache names match.
    make(tmp_path / "d", docs(20, 4, first_id=200))
    for ext in (".bin", ".idx"):  # a later rewrite, whatever the filesystem's clock resolution
        os.utime(prefix + ext, ns=(1, os.stat(prefix + ext).st_mtime_ns + 10**9))
    train, _, _ = build_pretrain_datasets(cfg, tok, 16, 0)
    tokens = np.concatenate([train[i]["tokens"].numpy() for i in range(len(train))])
    assert tokens.min() >= 200, "a sample was read through the old data's index"
    assert len(list((tmp_path / "d" / "cache").glob("GPTDataset_indices-*"))) == 2


def test_data_index_cache_dir_moves_the_caches_off_the_data(tmp_path: Path, tok) -> None:
    prefix = make(tmp_path / "d", docs(20, 10))
    cfg = config(prefix, tok)
    cfg.data.index_cache_dir = str(tmp_path / "elsewhere")
    build_pretrain_datasets(cfg, tok, 16, 0)
    assert list((tmp_path / "elsewhere").glob("GPTDataset_indices-*"))
    assert not (tmp_path / "d" / "cache").exists()


# --- Energon's loader state in a checkpoint: unpickled with its own classes only -----------------


class _RunsACommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_energon_loader_state_runs_no_code(tmp_path: Path) -> None:
    from data.energon import load_loader_state

    marker = tmp_path / "pwned"
    with pytest.raises(ValueError, match="refusing to load posix.system"):
        load_loader_state(pickle.dumps({"state": _RunsACommand(marker)}))
    assert not marker.exists()


@pytest.mark.parametrize(
    "name",
    [
        "torch.distributed.checkpoint.metadata.Metadata",  # a dataclass reached by a walk
        "FlexState",  # one of Energon's own, imported there: a genuine state names its home
    ],
)
def test_an_energon_loader_state_names_each_class_exactly(name: str) -> None:
    """A protocol-4 name with dots walks attributes from the module on; only a class under its
    own module and name is taken."""
    import torch.distributed.checkpoint.metadata  # noqa: F401  (the walk's end, as on a rank)

    from data.energon import load_loader_state
    from tests.unit.training.test_checkpoint_integrity import calling

    module = "megatron.energon.savable_loader"
    with pytest.raises(ValueError, match=f"refusing to load {module}.{name}"):
        load_loader_state(calling(module, name))


SAVE_A_LOADER_STATE = """
import pickle, sys
from pathlib import Path
import megatron.core  # as on a rank: it makes storages pickle its own way
from data.energon import build_loader
from data.tools.synthetic_vlm import make_synthetic_vlm
from recipes.registry import resolve

if __name__ == "__main__":
    out = Path(sys.argv[1])
    make_synthetic_vlm(out / "vlm", samples=32, log=False)
    overrides = [f"data.path={out / 'vlm'}", f"data.tokenizer={out / 'vlm/tokenizer.json'}"]
    _, cfg = resolve("tiny_llava_pretrain", overrides)
    loader = build_loader(cfg, 0, 2, num_workers=2)
    batches = iter(loader)
    next(batches), next(batches)
    (out / "state.pkl").write_bytes(pickle.dumps(loader.save_state_rank()))
"""


def test_an_energon_loader_state_loads_back_as_saved(tmp_path: Path) -> None:
    """A real state (two workers: numpy arrays, tensors, Energon's dataclasses) passes the
    allowlist unchanged. Made in a fresh interpreter: forking loader workers from this one, where
    other tests left process-group threads, can crash them."""
    import sys

    from data.energon import load_loader_state

    repo = Path(__file__).resolve().parents[3]
    script = tmp_path / "save_state.py"
    script.write_text(SAVE_A_LOADER_STATE)
    env = os.environ | {"PYTHONPATH": str(repo)}
    children.run([sys.executable, str(script), str(tmp_path)], check=True, cwd=repo, env=env)
    blob = (tmp_path / "state.pkl").read_bytes()
    assert repr(load_loader_state(blob)) == repr(pickle.loads(blob))
