"""The Energon batch source of data.kind=energon: multimodal microbatches with a savable position.

data.path is an Energon dataset folder (`recipes data prepare`, `energon prepare`) or a
metadataset YAML that blends several with weights; Energon reads either. Each data-parallel rank
gets its own share of the samples (WorkerConfig rank = DP rank; the TP and PP ranks of a replica
share it and so read the same samples), through `data.num_workers` loader processes with
`data.prefetch_factor` batches each in flight, a shuffle buffer of `data.shuffle_buffer_size`
samples and at most `data.max_samples_per_sequence` consecutive samples from one shard.

Position in the data: the savable loader's own state (`save_state_rank`), which knows what its
workers had prefetched, so a resumed run continues with exactly the samples an uninterrupted run
would have seen. `state_dict()` returns it (pickled into a uint8 tensor, which every checkpoint
format can hold) together with `consumed_samples`; `load_state_dict()` restores it before the first
batch is read. Each DP rank has its own state: the checkpoint must keep one per DP rank.

Test mode: with RECIPES_SAMPLE_LOG=DIR set, every rank appends the sample keys of each step to
DIR/rank<R>.jsonl, so tests can compare the samples of a resumed run with an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from config.finalize import Derived
from config.schema import TrainingConfig, VisionConfig
from data.batches import on_device
from data.vlm_encoder import EncoderConfig, VLMBatch, VLMTaskEncoder

SAMPLE_LOG_ENV = "RECIPES_SAMPLE_LOG"


def _vision(cfg: TrainingConfig) -> VisionConfig:
    v = cfg.model.vision
    if v is None:
        raise ValueError("data.kind=energon feeds images and needs model.vision (model.arch=llava)")
    return v


def image_tokens(cfg: TrainingConfig) -> int:
    """LM positions one image takes: the patches, plus the class token when the encoder has one."""
    v = _vision(cfg)
    return (v.image_size // v.patch_size) ** 2 + int(v.class_token)


def encoder_config(cfg: TrainingConfig) -> EncoderConfig:
    if not cfg.data.tokenizer:
        raise ValueError(
            "data.kind=energon needs data.tokenizer (a local tokenizer.json or folder)"
        )
    return EncoderConfig(
        tokenizer=cfg.data.tokenizer,
        seq_length=cfg.model.seq_length,
        image_size=_vision(cfg).image_size,
        image_tokens=image_tokens(cfg),
    )


def packing_buffer_size(micro_batch_size: int) -> int:
    """Samples the packer chooses from: enough for well-filled rows, small enough to start fast."""
    return max(32, 8 * micro_batch_size)


def build_loader(
    cfg: TrainingConfig, dp_rank: int, dp_size: int, *, num_workers: int | None = None
) -> Any:
    """Energon's SavableDataLoader of VLMBatch microbatches for one data-parallel rank."""
    from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset

    data = cfg.data
    if data.path is None:
        raise ValueError(
            "data.kind=energon needs data.path: prepare an Energon dataset with `recipes data "
            "prepare SRC OUT` (or `recipes data make-synthetic-vlm OUT`) and point data.path at OUT"
        )
    if "://" not in data.path and not Path(data.path).exists():  # Energon also reads msc:// URLs
        raise FileNotFoundError(
            f"data.path={data.path!r} does not exist; prepare an Energon dataset with `recipes data "
            "prepare SRC OUT` (or `recipes data make-synthetic-vlm OUT`) and point data.path at OUT"
        )
    if not Path(data.tokenizer or "").expanduser().exists():  # once here, not in every worker
        raise FileNotFoundError(
            f"data.tokenizer={data.tokenizer!r} does not exist; give the language model's local "
            "tokenizer.json or HF tokenizer folder (make-synthetic-vlm writes OUT/tokenizer.json)"
        )
    workers = data.num_workers if num_workers is None else num_workers
    worker_config = WorkerConfig(
        rank=dp_rank, world_size=dp_size, num_workers=workers, seed_offset=data.seed
    )
    dataset = get_train_dataset(
        data.path,
        worker_config=worker_config,
        batch_size=cfg.train.micro_batch_size,
        shuffle_buffer_size=data.shuffle_buffer_size,
        max_samples_per_sequence=data.max_samples_per_sequence,
        packing_buffer_size=(
            packing_buffer_size(cfg.train.micro_batch_size) if data.sequence_packing else None
        ),
        task_encoder=VLMTaskEncoder(encoder_config(cfg)),
    )
    return get_savable_loader(dataset, prefetch_factor=max(1, data.prefetch_factor))


def to_dict(batch: VLMBatch) -> dict[str, torch.Tensor]:
    """What the forward step reads (models/llava.py `forward`)."""
    return {
        "images": batch.images,
        "tokens": batch.tokens,
        "labels": batch.labels,
        "loss_mask": batch.loss_mask,
    }


class EnergonBatches:
    """The microbatches of each step from Energon, for one rank (the batch source interface of
    config/registry.py)."""

    def __init__(
        self,
        cfg: TrainingConfig,
        derived: Derived,
        dp_rank: int,
        device: str,
    ) -> None:
        self.num_microbatches = derived.num_microbatches
        self.global_batch_size = cfg.train.global_batch_size
        self.consumed_samples = 0
        self.device = device
        self.loader = build_loader(cfg, dp_rank, derived.data_parallel_size)
        # Energon's loader always asks for pinned memory; that helps only on the way to a GPU.
        self.loader.pin_memory = cfg.data.pin_memory and device == "cuda"
        # Started on the first batch, after a possible load_state_dict.
        self._iterator: Iterator[VLMBatch] | None = None
        log_dir = os.environ.get(SAMPLE_LOG_ENV)
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self._log = Path(log_dir) / f"rank{rank}.jsonl" if log_dir else None
        self._dp_rank = dp_rank

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """This rank's microbatches of the next global batch, on the training device."""
        if self._iterator is None:
            self._iterator = iter(self.loader)
        batches: list[VLMBatch] = [next(self._iterator) for _ in range(self.num_microbatches)]
        self.consumed_samples += self.global_batch_size
        if self._log is not None:
            self._write_keys(self._log, batches)
        return on_device([to_dict(b) for b in batches], self.device)

    def _write_keys(self, log: Path, batches: list[VLMBatch]) -> None:
        step = self.consumed_samples // self.global_batch_size
        row = {"step": step, "dp_rank": self._dp_rank, "keys": [b.__key__ for b in batches]}
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def state_dict(self) -> dict[str, Any]:
        state = self.loader.save_state_rank()
        blob = torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)
        return {"consumed_samples": self.consumed_samples, "energon_state": blob}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where the saved loader stopped; call before the first next_step().

        Without the loader's own state (a checkpoint of another world size or layout: the states
        are per data-parallel rank) only the count carries over, and the loader starts afresh."""
        if self._iterator is not None:
            raise RuntimeError("restore the Energon loader before reading the first batch")
        self.consumed_samples = int(state["consumed_samples"])
        if "energon_state" in state:
            blob = state["energon_state"]
            self.loader.restore_state_rank(load_loader_state(blob.numpy().tobytes()))


# What Energon's loader state pickles to: its own state dataclasses (and FlexState, a dict), numpy
# arrays and torch tensors. A checkpoint may come from someone else: nothing else is unpickled.
_NUMPY = {
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "_reconstruct"),
}
_PLAIN = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2")}


# How a tensor's storage pickles: torch's own loader (which unpickles anything), or the weights-only
# one that Megatron-Core installs when it is imported (a training process).
_STORAGES = {
    ("torch.storage", "_load_from_bytes"),
    ("megatron.core.safe_globals", "safe_load_from_bytes"),
}


class _StateUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _STORAGES:  # either way, loaded weights-only
            from megatron.core.safe_globals import safe_load_from_bytes

            return safe_load_from_bytes
        if (module, name) in _NUMPY | _PLAIN:
            return super().find_class(module, name)
        # Energon's own state classes, each under the module and name it is defined with: a
        # dotted name would walk attributes from an Energon module to anywhere.
        if module.startswith("megatron.energon.") and "." not in name:
            found = super().find_class(module, name)
            if (
                isinstance(found, type)
                and (found.__module__, found.__qualname__) == (module, name)
                and (dataclasses.is_dataclass(found) or dict in found.__mro__)
            ):
                return found
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a loader state")


def load_loader_state(blob: bytes) -> Any:
    """The Energon loader state saved by `EnergonBatches.state_dict`, unpickled with only the
    classes such a state holds (ValueError otherwise)."""
    try:
        return _StateUnpickler(io.BytesIO(blob)).load()
    except Exception as err:  # damaged or crafted: pickle raises many kinds of error
        raise ValueError(f"the Energon loader state is not safe to load: {err}") from None


def batches(
    cfg: TrainingConfig, derived: Derived, dp_rank: int, device: str, part: str = "train"
) -> EnergonBatches:
    """The batch source of data.kind=energon (config/registry.py); training data only."""
    if part != "train":
        raise ValueError("data.kind=energon has no validation loader (the checker refuses it)")
    return EnergonBatches(cfg, derived, dp_rank, device)
