"""Training batches: the dataset (chosen by data.kind), each data-parallel rank's slice, in order.

The position in the data is one number, `consumed_samples` (global samples handed out so far,
always a whole number of global batches at a step boundary). A resumed run rebuilds its batches
with the saved number and continues with exactly the samples that follow, whatever the
DataLoader had prefetched when the checkpoint was taken.

Every rank of a data-parallel replica (all its TP and PP ranks) reads the same samples: the
first pipeline stage needs the tokens, the last the labels and loss mask; reading them on every
rank is cheaper than broadcasting them and keeps the microbatch streams of all stages aligned.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from config.finalize import Derived
from config.schema import TrainingConfig


def on_device(micro: list[dict[str, torch.Tensor]], device: str) -> list[dict[str, torch.Tensor]]:
    """A step's microbatches on the training device (the CPU mode uses them where they are)."""
    if device != "cuda":
        return micro
    return [{k: v.cuda(non_blocking=True) for k, v in m.items()} for m in micro]


def build_dataset(cfg: TrainingConfig, num_samples: int, part: str = "train") -> Dataset:
    """The `part` ("train" or "valid") split for cfg.data.kind, holding at least `num_samples`.

    Every rank must call this: Megatron's dataset builder synchronises the ranks while global
    rank 0 writes the index caches.
    """
    kind = cfg.data.kind
    if kind in ("mock", "indexed"):
        # Megatron's MockGPTDataset / GPTDataset through its BlendedMegatronDatasetBuilder, with the
        # run's tokenizer (a null one for mock data): see data/pretrain.py.
        from data.pretrain import build_pretrain_datasets
        from data.tokenizer import build_tokenizer

        sizes = (num_samples, 0) if part == "train" else (0, num_samples)
        train, valid, _ = build_pretrain_datasets(cfg, build_tokenizer(cfg), *sizes)
        return train if part == "train" else valid
    if kind == "sft":  # prompt/response pairs, loss on the response: data/sft.py
        from data.sft import build_sft_dataset
        from data.tokenizer import build_tokenizer

        return build_sft_dataset(cfg, build_tokenizer(cfg), num_samples, part)
    if kind == "energon":
        return None  # Energon's loader is its own dataset: data/energon.py EnergonBatches
    # The checker refuses any other kind before a rank starts; this guards direct callers.
    raise ValueError(
        f"data.kind={kind!r} has no batch source in the engine; use 'mock', 'indexed', 'sft' or "
        "'energon'"
    )


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


class TrainBatches:
    """The microbatches of each step, from `consumed_samples` on."""

    def __init__(
        self,
        cfg: TrainingConfig,
        derived: Derived,
        dataset: Dataset,
        dp_rank: int,
        device: str,
        consumed_samples: int = 0,
    ) -> None:
        self.num_microbatches = derived.num_microbatches
        self.global_batch_size = cfg.train.global_batch_size
        self.consumed_samples = consumed_samples
        self.device = device
        sampler = DataParallelSampler(
            len(dataset),
            consumed_samples,
            cfg.train.micro_batch_size,
            dp_rank,
            derived.data_parallel_size,
        )
        # On the CPU the ranks already occupy every core: loader workers would only compete with them.
        workers = cfg.data.num_workers if device == "cuda" else 0
        self._loader = iter(
            DataLoader(
                dataset,
                batch_sampler=sampler,
                num_workers=workers,
                pin_memory=cfg.data.pin_memory and device == "cuda",
                persistent_workers=workers > 0,
            )
        )

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """This rank's microbatches of the next global batch, on the training device."""
        micro = [next(self._loader) for _ in range(self.num_microbatches)]
        self.consumed_samples += self.global_batch_size
        return on_device(micro, self.device)

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_samples": self.consumed_samples}
