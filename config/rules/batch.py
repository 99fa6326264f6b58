"""The batch: global batch = micro batch x DP x microbatches, and what the interleaved schedule needs."""

from __future__ import annotations

from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig


def batch(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    train = cfg.train
    out: list[Problem] = []
    dp = d.data_parallel_size
    if dp is None or train.micro_batch_size < 1 or train.global_batch_size < 1:
        return out  # the world does not divide (the parallel rule), or config/rules/ranges.py
    if train.global_batch_size % (train.micro_batch_size * dp):
        step = train.micro_batch_size * dp
        lower = train.global_batch_size // step * step
        out.append(
            Problem(
                "train.global_batch_size",
                f"{train.global_batch_size} is not divisible by micro_batch_size x data_parallel_size = "
                f"{train.micro_batch_size} x {dp} = {step}; use a multiple of {step} "
                f"(e.g. {max(lower, step)} or {lower + step})",
            )
        )
    pp, vpp = (
        cfg.parallel.pipeline_model_parallel_size,
        cfg.parallel.virtual_pipeline_model_parallel_size,
    )
    if d.num_microbatches is not None and vpp and vpp > 1 and d.num_microbatches % pp:
        out.append(
            Problem(
                "train.global_batch_size",
                f"the interleaved schedule needs the number of microbatches ({d.num_microbatches} = "
                f"{train.global_batch_size} / ({train.micro_batch_size} x DP {dp})) to be a multiple of PP={pp}",
            )
        )
    return out
