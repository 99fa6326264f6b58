"""Text SFT data (data/sft.py): which positions carry loss, padding, packing, order and errors.

A BPE tokenizer is trained here in a fraction of a second, as in test_data.py; the packed-row
attention is checked against the same samples run one by one through the SDPA core attention.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from data.sft import SFTDataError, SFTDataset, pack, read_pairs, split_range
from data.tokenizer import load_tokenizer
from data.tools.make_tokenizer import train_bpe_tokenizer
from models.gpt import attention_mask

SEQ = 48
PAIRS = [
    {"prompt": f"question {i}: what is {i} plus {i}?", "response": f"the answer is {2 * i}"}
    for i in range(40)
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("sft_tok")
    texts = [p["prompt"] + " " + p["response"] for p in PAIRS] * 3
    return load_tokenizer(train_bpe_tokenizer(texts=texts, vocab_size=300, out=root / "tok.json"))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def dataset(
    path: Path, tok, *, packing: bool, num_samples: int = 10, seq: int = SEQ, **split: str
) -> SFTDataset:
    return SFTDataset(
        str(path), tok, seq_length=seq, num_samples=num_samples, packing=packing, seed=7, **split
    )


def test_loss_covers_the_response_and_eod_only(tmp_path: Path, tok) -> None:
    pair = {"prompt": "what is 3 plus 3?", "response": "the answer is 6"}
    ds = dataset(write_jsonl(tmp_path / "one.jsonl", [pair]), tok, packing=False)
    row = ds[0]
    prompt = tok.tokenize(pair["prompt"])
    response = tok.tokenize_batch([pair["response"]], add_special_tokens=False)[0]
    n = len(prompt) + len(response)  # positions with a label: every token but the final eod
    assert row["tokens"][:n].tolist() == prompt + response
    assert row["labels"][:n].tolist() == prompt[1:] + response + [tok.eod]
    # Position j predicts token j + 1: from the prompt's last token on, that is the response.
    assert row["loss_mask"].tolist() == [0.0] * (len(prompt) - 1) + [1.0] * (
        n - len(prompt) + 1
    ) + [0.0] * (SEQ - n)
    assert row["position_ids"][:n].tolist() == list(range(n))
    assert "segment_ids" not in row and all(len(v) == SEQ for v in row.values())


def test_long_pairs_are_cut_and_prompts_that_fill_the_row_skipped(tmp_path: Path, tok) -> None:
    long_answer = {"prompt": "count", "response": " ".join(["plus"] * 200)}
    long_prompt = {"prompt": " ".join(["question"] * 200), "response": "no room"}
    ds = dataset(write_jsonl(tmp_path / "l.jsonl", [long_answer, long_prompt]), tok, packing=False)
    assert ds.skipped == 1 and len(ds.pairs) == 1
    row = ds[0]
    assert row["loss_mask"][-1] == 1.0  # the response runs to the end of the row
    with pytest.raises(SFTDataError, match="model.seq_length"):
        dataset(write_jsonl(tmp_path / "p.jsonl", [long_prompt]), tok, packing=False)


def test_packed_rows_hold_whole_samples_each_once_per_epoch(tmp_path: Path, tok) -> None:
    path = write_jsonl(tmp_path / "all.jsonl", PAIRS)
    plain = dataset(path, tok, packing=False)
    packed = dataset(path, tok, packing=True, num_samples=1)
    assert len(packed.rows) < len(PAIRS) // 2  # several samples per row
    seen = sorted(i for row in packed.rows for i in row)
    assert seen == list(range(len(PAIRS)))
    loss_tokens = sum(plain[i]["loss_mask"].sum() for i in range(len(plain.rows)))
    assert sum(packed[i]["loss_mask"].sum() for i in range(len(packed))) == loss_tokens
    row = packed[0]
    lengths = [len(packed.pairs[i].ids) - 1 for i in packed.rows[int(packed.order[0])]]
    starts = [sum(lengths[:k]) for k in range(len(lengths))]
    assert [int(row["position_ids"][s]) for s in starts] == [0] * len(starts)
    assert "attention_mask" not in row  # built in the forward step, from the segment ids
    mask = attention_mask(row["segment_ids"][None])[0, 0]
    assert mask.shape == (SEQ, SEQ) and mask.dtype == torch.bool
    if len(starts) > 1:  # the second sample's first token sees itself, not the first sample
        assert mask[starts[1], starts[1] - 1] and not mask[starts[1], starts[1]]


def test_order_is_fixed_by_the_seed_and_covers_num_samples(tmp_path: Path, tok) -> None:
    path = write_jsonl(tmp_path / "all.jsonl", PAIRS)
    a, b = dataset(path, tok, packing=False, num_samples=100), dataset(path, tok, packing=False)
    assert len(a) >= 100 and len(a) % len(PAIRS) == 0
    assert torch.equal(a[3]["tokens"], b[3]["tokens"])
    first_epoch = {tuple(a[i]["tokens"].tolist()) for i in range(len(PAIRS))}
    assert len(first_epoch) == len(PAIRS)  # an epoch visits every pair once


def test_pack_is_best_fit_and_never_overfills() -> None:
    assert pack([5, 4, 3, 2, 1], 6) == [[0, 4], [1, 3], [2]]
    # Rooms 3 and 2 are open when the 2 comes: it fills the row with room 2, whichever came first.
    assert pack([3, 4, 2], 6) == [[0], [1, 2]]
    assert pack([4, 3, 2], 6) == [[0, 2], [1]]
    lengths = [(i * 37) % 61 + 1 for i in range(2000)]
    rows = pack(lengths, 64)
    assert sorted(i for row in rows for i in row) == list(range(2000))
    assert all(sum(lengths[i] for i in row) <= 64 for row in rows)
    assert sum(lengths) / (64 * len(rows)) > 0.95


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("not json", "not JSON"),
        ('["a list"]', "JSON object"),
        ('{"prompt": "q"}', "'response' or 'output'"),
        ('{"prompt": 3, "response": "a"}', "must be a string"),
    ],
)
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, words: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(PAIRS[0]) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(SFTDataError, match=words) as err:
        list(read_pairs(path))
    assert f"{path}:2" in str(err.value)


def test_undecodable_and_cut_files_name_file_and_line(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.jsonl"
    latin1.write_bytes(
        json.dumps(PAIRS[0]).encode() + b'\n{"prompt": "caf\xe9", "response": "x"}\n'
    )
    with pytest.raises(SFTDataError, match=r"latin1\.jsonl:2: not UTF-8 \(byte 0xe9 at byte 16"):
        list(read_pairs(latin1))
    whole = gzip.compress(b"".join(json.dumps(p).encode() + b"\n" for p in PAIRS))
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])  # an interrupted copy
    with pytest.raises(SFTDataError, match=r"cut\.jsonl\.gz:\d+: cannot read past line \d+"):
        list(read_pairs(cut))
    plain = tmp_path / "plain.jsonl.gz"  # named .gz, never compressed
    write_jsonl(plain, PAIRS[:2])
    with pytest.raises(SFTDataError, match=r"plain\.jsonl\.gz:1: cannot read past line 0"):
        list(read_pairs(plain))


@pytest.mark.parametrize("pair", [{"prompt": "", "response": ""}, {"prompt": "q", "response": " "}])
def test_an_empty_response_fails_when_the_dataset_is_built(tmp_path: Path, tok, pair) -> None:
    path = write_jsonl(tmp_path / "e.jsonl", [PAIRS[0], pair, PAIRS[1]])
    with pytest.raises(SFTDataError, match=rf"{path}:2: the response is empty"):
        dataset(path, tok, packing=False)  # before the first step, not when its batch comes


def test_missing_file_names_data_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="data.path"):
        list(read_pairs(tmp_path / "nope.jsonl"))


def test_input_output_keys_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "io.jsonl"
    path.write_text('{"input": "q", "output": "a"}\n\n{"prompt": "p", "response": "r"}\n')
    assert list(read_pairs(path)) == [(1, "q", "a"), (3, "p", "r")]


def test_block_mask_keeps_packed_samples_apart() -> None:
    """Two samples packed under the mask give the outputs each gives alone, through SdpaAttention."""
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from models.sdpa import SdpaAttention

    config = TransformerConfig(
        num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2
    )
    attention = SdpaAttention(config, 1, AttnMaskType.causal, "self").eval()
    torch.manual_seed(0)
    segments = [5, 3, 4]  # the last one stands for a row's padding tail
    s = sum(segments)
    q, k, v = torch.randn(s, 1, 4, 8), torch.randn(s, 1, 2, 8), torch.randn(s, 1, 2, 8)
    ids = torch.repeat_interleave(torch.arange(len(segments)), torch.tensor(segments))
    packed = attention(q, k, v, attention_mask(ids[None]))
    alone, start = [], 0
    for n in segments:
        part = slice(start, start + n)
        alone.append(attention(q[part], k[part], v[part], None))
        start += n
    torch.testing.assert_close(packed, torch.cat(alone))
    assert torch.isfinite(packed).all()


def test_split_gives_disjoint_parts(tmp_path: Path, tok) -> None:
    assert split_range(1000, "969,30,1", "train") == (0, 969)
    assert split_range(1000, "969,30,1", "valid") == (969, 999)
    assert split_range(1000, "969,30,1", "test") == (999, 1000)
    assert split_range(7, "1", "train") == (0, 7) and split_range(7, "1", "valid") == (7, 7)
    path = write_jsonl(tmp_path / "all.jsonl", PAIRS)
    parts = {
        part: dataset(path, tok, packing=False, split="80,20,0", part=part)
        for part in ("train", "valid")
    }
    train, valid = ({p.ids.tobytes() for p in ds.pairs} for ds in parts.values())
    assert len(train) == 32 and len(valid) == 8 and not train & valid
    with pytest.raises(SFTDataError, match="data.split"):
        dataset(path, tok, packing=False, split="1,0,0", part="valid")
