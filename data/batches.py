"""Batches from a map-style dataset: each data-parallel rank's slice of the global batches, in order.

The batch source of the `mock`, `indexed`, `sft` and `chat` data kinds (data/pretrain.py,
data/sft.py, data/chat.py; see config/registry.py for the interface every kind's source has).

The position in the data is one number, `consumed_samples` (global samples handed out so far,
always a whole number of global batches at a step boundary). A resumed run loads the saved number
(`load_state_dict`) and continues with exactly the samples that follow, whatever the DataLoader
had prefetched when the checkpoint was taken; at another world size too.

Every microbatch's token and label ids are checked against the rows of the model's embedding
before the step: a tensor-parallel embedding zeroes an id past them and the run would train on
nothing, silently. The error names data.path, the sample and the id.

Every rank of a data-parallel replica (all its TP and PP ranks) reads the same samples: the
first pipeline stage needs the tokens, the last the labels and loss mask; reading them on every
rank is cheaper than broadcasting them and keeps the microbatch streams of all stages aligned.
"""

from __future__ import annotations

from collections.abc import Iterator, Sized
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, Dataset

from config.finalize import Derived
from config.schema import TrainingConfig


def on_device(micro: list[dict[str, torch.Tensor]], device: str) -> list[dict[str, torch.Tensor]]:
    """A step's microbatches on the training device (the CPU mode uses them where they are)."""
    if device != "cuda":
        return micro
    return [{k: v.cuda(non_blocking=True) for k, v in m.items()} for m in micro]


def samples_needed(cfg: TrainingConfig, part: str) -> int:
    """Global samples a run reads from `part`: every step's for "train", one evaluation's for
    "valid" (each evaluation reads the same batches again)."""
    steps = cfg.train.max_steps if part == "train" else cfg.train.eval_iters
    return steps * cfg.train.global_batch_size


class DataParallelSampler:
    """Index lists of one microbatch each: this DP rank's slice of consecutive global samples.

    Samples [c, c + micro x DP) form one round; rank r takes [c + r x micro, c + (r+1) x micro).
    """

    def __init__(
        self, total: int, consumed_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int
    ):
        self.total = total
        self.consumed_samples = consumed_samples
        self.micro = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size

    def __iter__(self) -> Iterator[list[int]]:
        round_size = self.micro * self.dp_size
        start = self.consumed_samples
        while start + round_size <= self.total:
            first = start + self.dp_rank * self.micro
            yield list(range(first, first + self.micro))
            start += round_size

    def __len__(self) -> int:
        return max(0, (self.total - self.consumed_samples) // (self.micro * self.dp_size))


class SampledBatches:
    """The microbatches of each step, from `consumed_samples` on."""

    def __init__(
        self, cfg: TrainingConfig, derived: Derived, dataset: Dataset, dp_rank: int, device: str
    ) -> None:
        self.num_microbatches = derived.num_microbatches
        self.global_batch_size = cfg.train.global_batch_size
        self.micro_batch_size = cfg.train.micro_batch_size
        self.dataset, self.dp_rank, self.dp_size = dataset, dp_rank, derived.data_parallel_size
        self.device = device
        # Ids must index the embedding: a tensor-parallel one zeroes any other id silently.
        self.embedding_rows, self.vocab_size = derived.padded_vocab_size, cfg.model.vocab_size
        self.data_name = (
            f"data.path={cfg.data.path!r}" if cfg.data.path else f"data.kind={cfg.data.kind}"
        )
        # On the CPU the ranks already occupy every core: loader workers would only compete with them.
        self.workers = cfg.data.num_workers if device == "cuda" else 0
        self.pin_memory = cfg.data.pin_memory and device == "cuda"
        self._start(consumed_samples=0)

    def _start(self, consumed_samples: int) -> None:
        self.consumed_samples = consumed_samples
        self._loader: Iterator[dict[str, torch.Tensor]] | None = None  # made by the first read

    def _open(self) -> Iterator[dict[str, torch.Tensor]]:
        sampler = DataParallelSampler(
            len(cast(Sized, self.dataset)),  # a map-style dataset; torch's Dataset declares no len
            self.consumed_samples,
            self.micro_batch_size,
            self.dp_rank,
            self.dp_size,
        )
        # Its own generator: a DataLoader draws its workers' base seed when it starts, and from
        # torch's global generator that draw would shift the dropout masks of a resumed run (it
        # opens its loader after the RNG states are restored, the uninterrupted run before).
        seeds = torch.Generator().manual_seed(self.consumed_samples)
        return iter(
            DataLoader(
                self.dataset,
                batch_sampler=sampler,
                num_workers=self.workers,
                pin_memory=self.pin_memory,
                persistent_workers=self.workers > 0,
                generator=seeds,
            )
        )

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """This rank's microbatches of the next global batch, on the training device."""
        if self._loader is None:
            self._loader = self._open()
        micro = [next(self._loader) for _ in range(self.num_microbatches)]
        self._check_ids(micro)
        self.consumed_samples += self.global_batch_size
        return on_device(micro, self.device)

    def _check_ids(self, micro: list[dict[str, torch.Tensor]]) -> None:
        """ValueError naming the sample and the id when one is outside the embedding: one min/max
        pass over each microbatch's tokens and labels on the CPU, small next to a step."""
        rows = self.embedding_rows
        for k, batch in enumerate(micro):
            for key in ("tokens", "labels"):
                lo, hi = (int(v) for v in torch.aminmax(batch[key]))
                if lo >= 0 and hi < rows:
                    continue
                bad = hi if hi >= rows else lo
                row = int((batch[key] == bad).any(dim=-1).int().argmax())
                # DataParallelSampler's order: microbatch k of this rank, row `row` in it.
                round_start = self.consumed_samples + k * self.micro_batch_size * self.dp_size
                sample = round_start + self.dp_rank * self.micro_batch_size + row
                raise ValueError(
                    f"{self.data_name}: sample {sample} holds token id {bad} in its {key}, but "
                    f"the model's embedding has {rows} rows (model.vocab_size={self.vocab_size}, "
                    f"padded), so ids must lie in 0..{rows - 1}. The data does not match "
                    "data.tokenizer or model.vocab_size: tokenize it with the model's tokenizer"
                )

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue with the samples that follow `consumed_samples` (0: from the start again)."""
        self._start(int(state["consumed_samples"]))
