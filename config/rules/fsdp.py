"""Megatron-FSDP (parallel.use_megatron_fsdp): what it needs, as Megatron-LM 0.19's validate_args
and Megatron-Core's FSDP adapter ask, and what this engine does not run with it yet."""

from __future__ import annotations

from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig

OFF = "or set parallel.use_megatron_fsdp=false (Megatron DDP with the distributed optimizer)"


def fsdp(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
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
    if cfg.model.num_moe_experts:
        # Stricter than Megatron-Core, on measurements here (megatron-core 0.19.2, the CPU mode):
        # with EP=2 (expert DP 1) and two microbatches a step, its expert gradients came out ~20%
        # smaller than Megatron DDP's (the dense ones equal; with one microbatch all equal: the
        # accumulation over microbatches), and with EP=1 its first save failed (the experts'
        # shards fail its own DTensor check).
        out.append(
            Problem(
                "parallel.use_megatron_fsdp",
                f"model.num_moe_experts={cfg.model.num_moe_experts}: Megatron-FSDP with MoE layers "
                "does not train or save correctly here yet (its expert gradients and checkpoints "
                "differ from Megatron DDP's); set parallel.use_megatron_fsdp=false",
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
    if d.preset is not None and d.preset.params_dtype == "fp32":
        # Stricter than Megatron-Core: its fsdp_dtensor handlers find parameters through the
        # 16-bit model wrapper (Float16Module) that precision=fp32 goes without (measured: the
        # first save fails).
        out.append(
            Problem(
                "precision",
                f"precision={cfg.precision} with Megatron-FSDP: its checkpoints need the BF16/FP16 "
                "model wrapper; use bf16_mixed (FP32 master weights either way), "
                "or set parallel.use_megatron_fsdp=false",
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
