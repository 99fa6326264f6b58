"""LoRA (peft.*): the target modules the architecture has, and what the adapted model can run.

The adapters wrap Megatron-Core's own tensor-parallel linear layers (training/lora.py), so an
adapted model is built with them and with torch's SDPA attention, not with Transformer Engine's
fused layers: no FP8, and no context parallelism (SDPA has none; models/specs.py).
"""

from __future__ import annotations

from config.finalize import Partial
from config.hardware import Cluster
from config.lora import present, targets
from config.problems import Problem
from config.schema import LORA_TARGETS, TrainingConfig


def peft(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    p = cfg.peft
    if p.scheme == "none":
        return []
    out = []
    names = targets(p.target_modules)
    unknown = [n for n in names if n not in LORA_TARGETS]
    have = present(cfg.model)
    if not names:
        out.append(
            Problem(
                "peft.target_modules",
                f"is empty; name the layers to adapt, e.g. {','.join(have)}",
            )
        )
    elif unknown:
        out.append(
            Problem(
                "peft.target_modules",
                f"names {unknown}, which are not linear layers LoRA adapts; the choices are "
                f"{', '.join(LORA_TARGETS)} (this model has {', '.join(have)})",
            )
        )
    else:
        absent = [n for n in names if n not in have]
        if absent:
            why = (
                " (every MLP of this model is a routed expert, and experts are not adapted)"
                if {"linear_fc1", "linear_fc2"} & set(absent)
                else ""
            )
            out.append(
                Problem(
                    "peft.target_modules",
                    f"names {absent}, which this architecture does not have{why}; its adaptable "
                    f"layers are {', '.join(have)}",
                )
            )
    if p.rank > cfg.model.hidden_size:
        out.append(
            Problem(
                "peft.rank",
                f"is {p.rank}, above model.hidden_size={cfg.model.hidden_size}: the adapter "
                "would hold more than the layer it adapts; LoRA uses 8 to 64",
            )
        )
    if cfg.model.arch != "gpt":
        out.append(
            Problem(
                "peft.scheme",
                f"is lora, but model.arch={cfg.model.arch!r}: LoRA is built for GPT models; use "
                "full fine-tuning (peft.scheme=none)",
            )
        )
    preset = d.preset
    if preset is not None and preset.fp8_recipe is not None:
        out.append(
            Problem(
                "precision",
                f"is {cfg.precision}, but LoRA adapts Megatron-Core's own linear layers, which "
                "have no FP8 (Transformer Engine's do); use precision=bf16_mixed",
            )
        )
    if cfg.parallel.context_parallel_size > 1:
        out.append(
            Problem(
                "parallel.context_parallel_size",
                f"is {cfg.parallel.context_parallel_size}, but a LoRA model runs torch's SDPA "
                "attention, which has no context parallelism; use "
                "parallel.context_parallel_size=1 (more TP or PP instead)",
            )
        )
    return out
