"""Megatron-FSDP (parallel.use_megatron_fsdp): what it needs, as Megatron-LM 0.19's validate_args
and Megatron-Core's FSDP adapter ask, and what this engine does not run with it yet."""

from __future__ import annotations

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig

OFF = "or set parallel.use_megatron_fsdp=false (Megatron DDP with the distributed optimizer)"


def fsdp(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    if not cfg.parallel.use_megatron_fsdp:
        return []
    out = []
    if not cfg.optimizer.use_distributed_optimizer:
        # Megatron-Core's optimizer steps Megatron-FSDP's shards through its DistributedOptimizer
        # (Megatron-LM turns it on with a warning); saying so beats a silent change.
        out.append(
            Problem(
                "optimizer.use_distributed_optimizer",
                "Megatron-FSDP steps its sharded weights through Megatron-Core's distributed "
                f"optimizer; set optimizer.use_distributed_optimizer=true, {OFF}",
            )
        )
    pp = cfg.parallel.pipeline_model_parallel_size
    if pp > 1:
        # Stricter than Megatron-Core, which nothing in Megatron-LM runs with PP either: the
        # fsdp_dtensor checkpoint keys a stage's layers from 0, so stages would overwrite each
        # other's.
        out.append(
            Problem(
                "parallel.pipeline_model_parallel_size",
                f"PP={pp} with Megatron-FSDP: its checkpoints here hold one model chunk, whose "
                "layer numbers every pipeline stage would reuse; use PP 1 (Megatron-FSDP shards "
                f"the weights over data parallelism instead), {OFF}",
            )
        )
    if cfg.model.arch != "gpt":
        out.append(
            Problem(
                "parallel.use_megatron_fsdp",
                f"model.arch={cfg.model.arch!r}: Megatron-FSDP runs here with GPT models only "
                "(its unit of sharding is the decoder's transformer layer; a vision encoder's "
                "has not been run with it); set parallel.use_megatron_fsdp=false",
            )
        )
    if cfg.peft.scheme != "none":
        # Stricter than Megatron-Core: a LoRA run's checkpoints hold its adapters alone, which the
        # fsdp_dtensor checkpoint path here does not split out.
        out.append(
            Problem(
                "parallel.use_megatron_fsdp",
                f"peft.scheme={cfg.peft.scheme!r}: adapter checkpoints are written with "
                "Megatron-Core's torch_dist format, which Megatron-FSDP cannot save into; set "
                "parallel.use_megatron_fsdp=false (LoRA's frozen weights need no optimizer state "
                "to shard)",
            )
        )
    if cfg.checkpoint.pretrained_dir:
        # Stricter than Megatron-Core: the weights of a Hugging Face folder or a torch_dist
        # checkpoint load into Megatron DDP's plain parameters, not into Megatron-FSDP's DTensor
        # shards.
        out.append(
            Problem(
                "checkpoint.pretrained_dir",
                f"checkpoint.pretrained_dir={cfg.checkpoint.pretrained_dir!r}: pretrained weights "
                "load into Megatron DDP's parameters, not into Megatron-FSDP's shards; fine-tune "
                f"without it ({OFF}), or pretrain from scratch with Megatron-FSDP",
            )
        )
    return out
