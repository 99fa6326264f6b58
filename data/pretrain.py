"""Pretraining datasets: Megatron-Core's GPT datasets over mock data or an indexed (.bin/.idx) blend.

Built with `BlendedMegatronDatasetBuilder`, exactly as Megatron-LM's `pretrain_gpt.py` does, so that
sample order, blending and the on-disk index caches match what users of Megatron-LM know.

Caveats (megatron-core 0.19, read from its sources):
- No CUDA is needed. `torch.distributed` is optional: without a process group every caller builds
  its own datasets; with one, global rank 0 builds first (and writes the index caches), the others
  wait at a barrier of the default group and then read the caches. So every rank must call this,
  including those for which `is_built_on_rank()` is False (they get None back).
- The index caches go to `cache_dir`, or by default to `<prefix>/cache/GPTDataset_indices` next to
  the data, which must then be writable. Pass a run-local folder for read-only shared datasets.
- `data.split` is ignored for mock data: Megatron splits its mock stream evenly ("1,1,1").
- A sample holds seq_length + 1 tokens from the stream: `tokens` and `labels` are both seq_length
  long, shifted by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from config.blend import parse_blend

if TYPE_CHECKING:
    from config.finalize import Derived
    from config.schema import TrainingConfig
    from data.batches import SampledBatches


def _always() -> bool:
    return True


def _check_prefixes(path: str, prefixes: list[str]) -> None:
    """Name data.path and the missing files before Megatron fails on an assert deep inside."""
    import os

    for prefix in prefixes:
        if "://" in prefix:
            continue  # object storage (s3://, msc://): Megatron reads and checks those itself
        missing = [p for p in (prefix + ".bin", prefix + ".idx") if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(
                f"data.path={path!r}: dataset prefix {prefix!r} lacks {' and '.join(missing)}. "
                "A prefix is the path without .bin/.idx; make one with "
                "`python -m data.jsonl_to_indexed --input x.jsonl --tokenizer tok.json "
                f"--output-prefix {prefix} --append-eod`"
            )


def build_pretrain_datasets(
    cfg: TrainingConfig,
    tokenizer: Any,
    train_samples: int,
    valid_samples: int,
    test_samples: int = 0,
    *,
    is_built_on_rank: Callable[[], bool] = _always,
    cache_dir: str | None = None,
    create_attention_mask: bool = False,
) -> tuple[Any, Any, Any]:
    """(train, valid, test) Megatron datasets for cfg.data.kind "mock" or "indexed".

    `tokenizer` is what `data.tokenizer.build_tokenizer(cfg)` returns. `is_built_on_rank` says
    whether this rank reads data at all (Megatron-LM: TP rank 0 on the first and last pipeline
    stages); it must be True on global rank 0. A split with 0 requested samples, or weight 0 in
    data.split, comes back as None; others hold at least the requested samples (whole epochs). `create_attention_mask` is off because a causal model builds its mask itself; on, every
    sample carries a seq_length x seq_length bool mask (64 MiB at 8k tokens).
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    data = cfg.data
    if data.kind == "mock":
        blend, dataset_cls = None, MockGPTDataset
    elif data.kind == "indexed":
        if not data.path:
            raise ValueError("data.kind='indexed' needs data.path (a prefix or a weighted blend)")
        blend = parse_blend(data.path)
        _check_prefixes(data.path, blend[0])
        dataset_cls = GPTDataset
    else:
        raise ValueError(
            f"data.kind={data.kind!r} is not a pretraining dataset here; build_pretrain_datasets "
            "handles 'mock' and 'indexed'"
        )
    if tokenizer.vocab_size > cfg.model.vocab_size:
        # Ids beyond the embedding table fail late and obscurely inside the model.
        raise ValueError(
            f"model.vocab_size={cfg.model.vocab_size} is smaller than the tokenizer's vocabulary "
            f"({tokenizer.vocab_size}, data.tokenizer={data.tokenizer!r}); raise model.vocab_size"
        )
    for name, n in (("train", train_samples), ("valid", valid_samples), ("test", test_samples)):
        if n < 0:
            raise ValueError(f"{name}_samples must be >= 0, got {n}")

    config = GPTDatasetConfig(
        random_seed=data.seed,
        sequence_length=cfg.model.seq_length,
        blend=blend,
        split=data.split if blend is not None else None,
        path_to_cache=cache_dir,
        tokenizer=tokenizer,
        # Documents are concatenated into samples; positions and attention run across their
        # boundaries as in Megatron-LM's defaults.
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=create_attention_mask,
        mmap_bin_files=True,
    )
    sizes = (train_samples, valid_samples, test_samples)
    # 0 requested samples means "not wanted", so that split is not built at all: Megatron would
    # build every split with a weight, and on one without documents (the 0.1% test split of a
    # small dataset) it counts epochs forever. The other splits keep their document ranges.
    config.split_matrix = [
        None if n == 0 else part for part, n in zip(config.split_matrix, sizes, strict=True)
    ]
    builder = BlendedMegatronDatasetBuilder(dataset_cls, list(sizes), is_built_on_rank, config)
    datasets = builder.build()
    train, valid, test = (ds if n > 0 else None for ds, n in zip(datasets, sizes, strict=True))
    return train, valid, test


def batches(
    cfg: TrainingConfig, derived: Derived, dp_rank: int, device: str, part: str = "train"
) -> SampledBatches:
    """The batch source of data.kind mock and indexed (config/registry.py): this rank's share of
    the `part` ("train" or "valid") split, with samples for every step (or evaluation) of the run.

    Every rank must call this: Megatron's dataset builder synchronises the ranks while global
    rank 0 writes the index caches.
    """
    from data.batches import SampledBatches, samples_needed
    from data.tokenizer import build_tokenizer

    samples = samples_needed(cfg, part)
    sizes = (samples, 0) if part == "train" else (0, samples)
    train, valid, _ = build_pretrain_datasets(cfg, build_tokenizer(cfg), *sizes)
    return SampledBatches(cfg, derived, train if part == "train" else valid, dp_rank, device)
