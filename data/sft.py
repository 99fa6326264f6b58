"""Supervised fine-tuning on text (data.kind=sft): JSONL prompt/response pairs, loss on the response.

Input: `data.path`, a JSONL file (or `.jsonl.gz`) with one object per line holding `prompt` and
`response` (or `input` and `output`), both strings. A sample's tokens are the prompt as the
tokenizer encodes a text (with its own BOS, as Llama 3's adds), the response without special
tokens, and eod; only the response and the closing eod carry loss, so the model learns to answer
rather than to repeat the question. A pair longer than model.seq_length + 1 tokens loses the end of
its response; one whose prompt leaves no room for a response token is skipped, and the count is
printed on the first rank.

Errors: every line is read and tokenized when the dataset is built, before the first step. A line
that is not UTF-8, not a JSON object with string prompt and response, or whose response is empty,
and a .gz cut short, are SFTDataErrors naming the file and the line.

Rows: without `data.sequence_packing` every sample is one row, padded to seq_length (the pad carries
no loss and comes after the text, so causal attention never lets the text see it). With packing,
whole samples fill rows best-fit; position ids restart at each sample and each row carries
`segment_ids`, from which the forward step builds a block-diagonal causal attention mask
(models/gpt.py `attention_mask`) that keeps every sample to itself, so a packed row trains as its samples would
one by one. The padding tail of a row is a segment of its own: a query that may attend to nothing
would turn into NaN.

Order: the pairs are shuffled with data.seed, split by the weights of data.split (train,
validation, test; the validation part feeds train.eval_interval), then packed, then the rows are visited epoch after
epoch, each epoch in its own seeded order. A row is one sample of train.global_batch_size, packed
or not. Index i is always the same row, so resuming from
`consumed_samples` continues with exactly the rows an uninterrupted run would see.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from config.blend import split_weights
from config.finalize import Derived
from config.rules.data import check_tokenizer_fits
from config.schema import TrainingConfig
from data.batches import SampledBatches, samples_needed
from data.records import SFTDataError, read_pairs

BATCH = 512  # pairs per tokenizer call


@dataclass(frozen=True, slots=True)
class Pair:
    """One tokenized sample: prompt, response and eod ids, and how many of them are the prompt."""

    ids: np.ndarray  # int32: a Python int per token would not fit a large SFT set in memory
    prompt_len: int

    def loss_mask(self) -> list[float]:
        """Per (input, label) position: 1 where the label is a response token or the eod (label
        j is token j + 1, so from the prompt's last position on)."""
        quiet = max(self.prompt_len - 1, 0)
        return [0.0] * quiet + [1.0] * (len(self.ids) - 1 - quiet)


def tokenize_pairs(
    pairs: Iterator[tuple[int, str, str]], tokenizer: Any, max_tokens: int, path: str
) -> tuple[list[Pair], int]:
    """Token ids of every (line, prompt, response), cut to `max_tokens`; also how many pairs had
    no room to answer. A pair that gives no token is an SFTDataError naming `path` and its line."""
    out: list[Pair] = []
    skipped = 0
    batch: list[tuple[int, str, str]] = []

    def flush() -> None:
        nonlocal skipped
        prompts = tokenizer.tokenize_batch([p for _, p, _ in batch])
        responses = tokenizer.tokenize_batch([r for _, _, r in batch], add_special_tokens=False)
        for (line, _, _), prompt, response in zip(batch, prompts, responses, strict=True):
            if not response:
                raise SFTDataError(
                    f"{path}:{line}: the response gives no token with data.tokenizer; fill it in "
                    "or drop the line"
                )
            if len(prompt) >= max_tokens:
                skipped += 1
                continue
            ids = (list(prompt) + list(response) + [tokenizer.eod])[:max_tokens]
            out.append(Pair(np.asarray(ids, dtype=np.int32), len(prompt)))
        batch.clear()

    for pair in pairs:
        batch.append(pair)
        if len(batch) == BATCH:
            flush()
    if batch:
        flush()
    return out, skipped


def pack(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of samples per row, best fit in the given order; every row holds <= capacity.

    Each sample goes to the open row with the least room that still takes it (a new row if
    none does), found by bisection over the rows sorted by room: O(n log rows), so a million
    pairs pack in seconds.
    """
    rows: list[list[int]] = []
    by_room: list[tuple[int, int]] = []  # (room left, row), sorted
    for index, length in enumerate(lengths):
        at = bisect.bisect_left(by_room, (length, -1))
        if at == len(by_room):
            rows.append([index])
            row, room = len(rows) - 1, capacity - length
        else:
            room, row = by_room.pop(at)
            rows[row].append(index)
            room -= length
        if room > 0:
            bisect.insort(by_room, (room, row))
    return rows


def split_range(n: int, split: str, part: str) -> tuple[int, int]:
    """[first, last) of `part` ("train", "valid" or "test") among n shuffled pairs, by the weights
    of data.split ("969,30,1": train, validation, test), as Megatron splits a corpus."""
    weights = split_weights(split)
    total = sum(weights)
    bounds = [0]
    for w in weights:
        bounds.append(bounds[-1] + round(n * w / total))
    bounds[-1] = n
    k = ("train", "valid", "test").index(part)
    return bounds[k], bounds[k + 1]


class TokenRows(Dataset):
    """Rows of `seq_length` tokens made of tokenized samples: labels, loss mask, position ids (and
    segment ids if packed). A sample has `ids` (int32, ending with the token that closes it) and
    `loss_mask()`, one value per (input, label) position. The data kinds that tokenize samples
    their own way (sft here, chat in data/chat.py) share the order, split, packing and rows."""

    error: type[ValueError] = SFTDataError
    noun = "samples"  # what a sample is, in error messages

    def __init__(
        self,
        samples: Sequence[Any],
        *,
        path: str,
        seq_length: int,
        num_samples: int,
        packing: bool,
        seed: int,
        split: str,
        part: str,
        pad: int,
    ) -> None:
        self.seq_length = seq_length
        self.packing = packing
        self.pad = pad  # any valid id: pad positions carry no loss
        order = np.random.default_rng(seed).permutation(len(samples))
        first, last = split_range(len(samples), split, part)
        self.samples = [samples[i] for i in order[first:last]]
        if not self.samples:
            raise self.error(
                f"data.split={split!r} leaves the {part} part of data.path={path!r} empty "
                f"({len(samples)} usable {self.noun}); give that part a larger weight"
            )
        if packing:
            self.rows = pack([len(s.ids) - 1 for s in self.samples], seq_length)
        else:
            self.rows = [[i] for i in range(len(self.samples))]
        self.epochs = -(-num_samples // len(self.rows))
        rng = np.random.default_rng(seed + 1)
        self.order = np.concatenate([rng.permutation(len(self.rows)) for _ in range(self.epochs)])

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens: list[int] = []
        labels: list[int] = []
        loss_mask: list[float] = []
        positions: list[int] = []
        segments: list[int] = []
        for k, i in enumerate(self.rows[int(self.order[index])]):
            sample = self.samples[i]
            n = len(sample.ids) - 1
            tokens += sample.ids[:-1].tolist()
            labels += sample.ids[1:].tolist()
            loss_mask += sample.loss_mask()
            positions += range(n)
            segments += [k] * n
        pad = self.seq_length - len(tokens)
        if pad:
            tokens += [self.pad] * pad
            labels += [self.pad] * pad
            loss_mask += [0.0] * pad
            positions += range(pad)
            segments += [segments[-1] + 1] * pad
        row = {
            "tokens": torch.tensor(tokens, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "loss_mask": torch.tensor(loss_mask, dtype=torch.float),
            "position_ids": torch.tensor(positions, dtype=torch.long),
        }
        if self.packing:
            row["segment_ids"] = torch.tensor(segments, dtype=torch.long)
        return row


class SFTDataset(TokenRows):
    """The prompt/response pairs of data.path as rows (TokenRows)."""

    noun = "pairs"

    def __init__(
        self,
        path: str,
        tokenizer: Any,
        *,
        seq_length: int,
        num_samples: int,
        packing: bool,
        seed: int,
        split: str = "1,0,0",
        part: str = "train",
    ) -> None:
        # A sample of n ids gives n - 1 (input, label) positions; a row holds seq_length of them.
        pairs, self.skipped = tokenize_pairs(
            read_pairs(path), tokenizer, seq_length + 1, str(Path(path).expanduser())
        )
        if not pairs and not self.skipped:
            raise SFTDataError(f"data.path={path!r} holds no prompt/response pair: it is empty")
        if not pairs:
            raise SFTDataError(
                f"data.path={path!r} holds no usable prompt/response pair "
                f"({self.skipped} prompts leave no room for a response within "
                f"model.seq_length={seq_length}); raise model.seq_length or shorten the prompts"
            )
        super().__init__(
            pairs,
            path=path,
            seq_length=seq_length,
            num_samples=num_samples,
            packing=packing,
            seed=seed,
            split=split,
            part=part,
            pad=tokenizer.eod,
        )

    @property
    def pairs(self) -> list[Pair]:
        return self.samples


def on_first_rank(message: str) -> None:
    """Print `message` once per run: on rank 0, or in a process without torch.distributed."""
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(message, flush=True)


def build_rows(dataset_class: Any, cfg: Any, tokenizer: Any, num_samples: int, part: str) -> Any:
    """A TokenRows dataset (SFT pairs, chat conversations) of data.path for a run: every rank
    reads and tokenizes it the same way and takes the `part` that data.split gives it."""
    check_tokenizer_fits(cfg, tokenizer.vocab_size)
    return dataset_class(
        cfg.data.path,
        tokenizer,
        seq_length=cfg.model.seq_length,
        num_samples=num_samples,
        packing=cfg.data.sequence_packing,
        seed=cfg.data.seed,
        split=cfg.data.split,
        part=part,
    )


def build_sft_dataset(
    cfg: Any, tokenizer: Any, num_samples: int, part: str = "train"
) -> SFTDataset:
    """data.kind=sft for a run: every rank reads and tokenizes data.path the same way, and takes
    the `part` of the shuffled pairs that data.split gives it."""
    dataset = build_rows(SFTDataset, cfg, tokenizer, num_samples, part)
    if part == "train" and dataset.skipped:
        on_first_rank(
            f"sft data: skipped {dataset.skipped} pairs whose prompt fills "
            f"model.seq_length={cfg.model.seq_length}"
        )
    return dataset


def batches(
    cfg: TrainingConfig, derived: Derived, dp_rank: int, device: str, part: str = "train"
) -> SampledBatches:
    """The batch source of data.kind=sft (config/registry.py): this rank's share of the `part`
    ("train" or "valid") rows, enough for every step (or evaluation) of the run."""
    return rows_batches(build_sft_dataset, cfg, derived, dp_rank, device, part)


def rows_batches(
    build: Any, cfg: TrainingConfig, derived: Derived, dp_rank: int, device: str, part: str
) -> SampledBatches:
    """The batch source of a token-rows kind (sft, chat): `build(cfg, tokenizer, samples, part)`
    makes its dataset, of as many rows as the run's steps (or evaluations) need."""
    from data.tokenizer import build_tokenizer

    dataset = build(cfg, build_tokenizer(cfg), samples_needed(cfg, part), part)
    return SampledBatches(cfg, derived, dataset, dp_rank, device)
