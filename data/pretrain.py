"""Pretraining datasets: Megatron-Core's GPT datasets over mock data or an indexed (.bin/.idx) blend.

Built with `BlendedMegatronDatasetBuilder`, exactly as Megatron-LM's `pretrain_gpt.py` does, so that
sample order, blending and the on-disk index caches match what users of Megatron-LM know.

Caveats (megatron-core 0.19, read from its sources):
- No CUDA is needed. `torch.distributed` is optional: without a process group every caller builds
  its own datasets; with one, global rank 0 builds first (and writes the index caches), the others
  wait at a barrier of the default group and then read the caches. So every rank must call this,
  including those for which `is_built_on_rank()` is False (they get None back).
- The index caches go under `cache_dir`, else data.index_cache_dir, else `<first prefix>/cache/`
  next to the data, which must then be writable (set it for read-only shared datasets), in a
  folder `GPTDataset_indices-<key>` whose key hashes the path, size and mtime of every .bin and
  .idx of the blend: a dataset regenerated in place gets new caches instead of Megatron's stale
  ones (which it would trust, keyed as they are by the data's name and document count only). The
  ranks must see the same files (one shared filesystem, or copies that keep their mtimes).
- Before Megatron reads them, every local prefix is checked (data/indexed.py): its index against
  its .bin, and its token ids against the rows of the model's embedding (free when the .bin's type
  cannot hold a larger id, else one scan of the .bin, remembered in `<cache>/indexed_checks/`).
  Global rank 0 checks first and fills that memo; the other ranks read it after a barrier.
- `data.split` is ignored for mock data: Megatron splits its mock stream evenly ("1,1,1").
- A sample holds seq_length + 1 tokens from the stream: `tokens` and `labels` are both seq_length
  long, shifted by one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from config.blend import index_cache_base, parse_blend
from config.finalize import padded_vocab_size
from config.rules.data import check_tokenizer_fits
from data.indexed import IndexedDataError, file_key, inspect_indexed, locate_id
from data.stage import stage_blend

if TYPE_CHECKING:
    from config.finalize import Derived
    from config.schema import TrainingConfig
    from data.batches import SampledBatches


def _always() -> bool:
    return True


def _check_prefixes(path: str, prefixes: list[str]) -> None:
    """Name data.path and the missing files before Megatron fails on an assert deep inside."""
    for prefix in prefixes:
        if "://" in prefix:
            continue  # object storage (s3://, msc://): Megatron reads and checks those itself
        missing = [p for p in (prefix + ".bin", prefix + ".idx") if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(
                f"data.path={path!r}: dataset prefix {prefix!r} lacks {' and '.join(missing)}. "
                "A prefix is the path without .bin/.idx; make one with "
                "`python -m data.tools.jsonl_to_indexed --input x.jsonl --tokenizer tok.json "
                f"--output-prefix {prefix} --append-eod`"
            )


def index_cache_dir(prefixes: list[str], cache_dir: str | None) -> str | None:
    """Megatron's `path_to_cache`: a folder keyed by the data files' path, size and mtime."""
    base = index_cache_base(prefixes, cache_dir)
    if base is None:
        return None  # object storage only: Megatron's own default
    files = [p if "://" in p else p + ext for p in prefixes for ext in (".bin", ".idx")]
    return os.path.join(base, f"GPTDataset_indices-{file_key(files)}")


def check_indexed_data(cfg: TrainingConfig, prefixes: list[str], cache_dir: str | None) -> None:
    """IndexedDataError for a prefix whose .idx does not describe its .bin, or whose token ids do
    not fit the model's embedding (tensor-parallel embeddings zero such ids, so the run would
    train on nothing, its loss stuck near ln(vocab)). Every rank calls it; rank 0 first."""
    import torch.distributed as dist

    m = cfg.model
    tp = cfg.parallel.tensor_model_parallel_size
    rows = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    base = index_cache_base(prefixes, cache_dir)
    memo = os.path.join(base, "indexed_checks") if base else None

    def check() -> None:
        for prefix in prefixes:
            if "://" not in prefix:  # object storage is Megatron's to stream
                _check_prefix_ids(cfg, prefix, rows, memo)

    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    if rank0:
        check()
    if dist.is_initialized():
        dist.barrier()  # rank 0 has scanned and written the memo: the others read it
        if not rank0:
            check()


def _check_prefix_ids(cfg: TrainingConfig, prefix: str, rows: int, memo: str | None) -> None:
    facts = inspect_indexed(prefix, id_bound=rows, cache_dir=memo)
    if facts.min_id is None or facts.max_id is None or (facts.min_id >= 0 and facts.max_id < rows):
        return  # None: the .bin's type cannot hold an id >= rows
    bad, position, document = locate_id(prefix, facts, rows)
    m = cfg.model
    raise IndexedDataError(
        f"data.path={cfg.data.path!r}: {prefix}.bin holds token id {bad} (token {position}, "
        f"document {document}; its ids run {facts.min_id}..{facts.max_id}), but the model's "
        f"embedding has {rows} rows (model.vocab_size={m.vocab_size} padded to a multiple of "
        f"{m.make_vocab_size_divisible_by} x TP {cfg.parallel.tensor_model_parallel_size}), so "
        f"ids must lie in 0..{rows - 1}. Data tokenized with a larger tokenizer than "
        f"data.tokenizer={cfg.data.tokenizer!r} does this: tokenize it again with that one, or "
        "set model.vocab_size to the size of the tokenizer that made the data"
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
    data.split, comes back as None; others hold at least the requested samples (whole epochs).
    `create_attention_mask` is off because a causal model builds its mask itself; on, every sample
    carries a seq_length x seq_length bool mask (64 MiB at 8k tokens).
    """
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset

    data = cfg.data
    cache_dir = cache_dir or data.index_cache_dir
    if data.kind == "mock":
        blend, dataset_cls, path_to_cache = None, MockGPTDataset, cache_dir
    elif data.kind == "indexed":
        if not data.path:
            raise ValueError("data.kind='indexed' needs data.path (a prefix or a weighted blend)")
        blend = parse_blend(data.path)
        _check_prefixes(data.path, blend[0])
        if data.stage_dir:  # node-local copies; the index caches stay with the shared data
            cache_dir = cache_dir or index_cache_base(blend[0], None)
            blend = (stage_blend(blend[0], data.stage_dir), blend[1])
        dataset_cls = GPTDataset
        path_to_cache = index_cache_dir(blend[0], cache_dir)
    else:
        raise ValueError(
            f"data.kind={data.kind!r} is not a pretraining dataset here; build_pretrain_datasets "
            "handles 'mock' and 'indexed'"
        )
    check_tokenizer_fits(cfg, tokenizer.vocab_size)
    for name, n in (("train", train_samples), ("valid", valid_samples), ("test", test_samples)):
        if n < 0:
            raise ValueError(f"{name}_samples must be >= 0, got {n}")
    if blend is not None:
        check_indexed_data(cfg, blend[0], cache_dir)

    config = GPTDatasetConfig(
        random_seed=data.seed,
        sequence_length=cfg.model.seq_length,
        blend=blend,
        split=data.split if blend is not None else None,
        path_to_cache=path_to_cache,
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


def prepare_index_caches(cfg: TrainingConfig) -> str:
    """Megatron's index caches of every split the run reads (train; validation when
    train.eval_interval > 0), built in this one process with the sample counts the ranks ask
    for (`batches`), so that the ranks find them and build nothing: Megatron-LM's
    tools/prepare_cache.py for this project's runs. The cache folder.

    The caches of a staged blend (data.stage_dir) name the node-local copies, which exist on the
    compute nodes only: global rank 0 builds those, once, into the shared cache folder."""
    from data.batches import samples_needed
    from data.tokenizer import build_tokenizer

    data = cfg.data
    if data.kind != "indexed" or not data.path:
        raise ValueError(
            f"data.kind={data.kind!r}: index caches belong to indexed blends (data.kind=indexed "
            "with data.path)"
        )
    if data.stage_dir:
        raise ValueError(
            f"data.stage_dir={data.stage_dir!r}: the caches of a staged blend name its node-local "
            "copies, so the job's rank 0 builds them (once, for every node); set "
            "data.stage_dir=None to build them here for the blend read in place"
        )
    tokenizer = build_tokenizer(cfg)
    parts = ["train"] + (["valid"] if cfg.train.eval_interval else [])
    for part in parts:
        samples = samples_needed(cfg, part)
        build_pretrain_datasets(
            cfg, tokenizer, *((samples, 0) if part == "train" else (0, samples))
        )
    folder = index_cache_dir(parse_blend(data.path)[0], data.index_cache_dir)
    return folder or "Megatron's default"
