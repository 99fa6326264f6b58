"""Which layers the ranks build: Transformer Engine's, or Megatron-Core's own ("local") ones.

GPUs build Transformer Engine's layer spec when it imports (models/specs.py `choose_backend`).
Some runs build Megatron-Core's local spec whatever the machine has, and the checker holds them to
what that spec can build (config/rules/model.py): the answer lives here, torch-free, for both.
"""

from __future__ import annotations

from config.hardware import Cluster
from config.precision import PrecisionPreset
from config.schema import TrainingConfig


def run_device(cfg: TrainingConfig, cluster: Cluster) -> str:
    """ "cpu" or "cuda": where the ranks of `cfg` on `cluster` train, as the checker sees it."""
    return "cpu" if cluster.gpu == "cpu" or cfg.train.device == "cpu" else "cuda"


def local_layers(lora: bool, device: str) -> str | None:
    """Why the model is built from Megatron-Core's local layers (its own linear layers and norms,
    no Transformer Engine) on every machine, or None where GPUs build Transformer Engine's."""
    if lora:
        return "LoRA's adapters wrap Megatron-Core's own linear layers (peft.scheme=lora)"
    if device != "cuda":
        return "the CPU runs without Transformer Engine"
    return None


def local_reason(cfg: TrainingConfig, cluster: Cluster) -> str | None:
    """`local_layers` for `cfg` on `cluster`: why its ranks build Megatron-Core's local layers,
    or None where they build Transformer Engine's."""
    return local_layers(cfg.peft.scheme != "none", run_device(cfg, cluster))


def te_layers(cfg: TrainingConfig, cluster: Cluster) -> bool:
    """Whether `cfg` on `cluster` builds Transformer Engine's layers, and with them its fused cross
    entropy for the loss (models/gpt.py `transformer_config`), as the checker sees it."""
    return local_reason(cfg, cluster) is None


def fp8_weights(cfg: TrainingConfig, preset: PrecisionPreset | None) -> bool:
    """Whether the decoder's weights live in FP8 alone (Transformer Engine's FP8 parameters,
    Megatron-Core's fp8_param and fp8_param_gather): where the preset asks for it and the
    distributed optimizer keeps the FP32 masters and all-gathers the FP8 weights. BF16 weights
    stay with Megatron-FSDP, and in a run that starts from checkpoint.pretrained_dir: a Hugging
    Face folder is written into the parameters box by box (training/checkpoint/hf_weights.py),
    slices that not every TE quantized tensor takes in place. The engine (models/gpt.py,
    training/build.py) and the memory estimate read it from here."""
    return (
        preset is not None
        and preset.fp8_param_gather
        and cfg.optimizer.use_distributed_optimizer
        and not cfg.parallel.use_megatron_fsdp
        and not cfg.checkpoint.pretrained_dir
    )
