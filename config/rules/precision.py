"""The precision preset against the GPU, and what the CPU smoke mode cannot run."""

from __future__ import annotations

from config.finalize import Derived
from config.hardware import GPUS, Cluster
from config.precision import PRESETS, gpu_runs
from config.problems import Problem
from config.schema import TrainingConfig


def precision(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    preset = d.preset
    if preset is None:
        names = ", ".join(PRESETS)
        return [Problem("precision", f"unknown preset '{cfg.precision}'; choose one of {names}")]
    if cluster.gpu in GPUS and not gpu_runs(GPUS[cluster.gpu], preset):
        able = [g for g, spec in GPUS.items() if gpu_runs(spec, preset)]
        runs_here = [n for n, p in PRESETS.items() if gpu_runs(GPUS[cluster.gpu], p)]
        return [
            Problem(
                "precision",
                f"{cfg.precision} needs {preset.needs.upper()} tensor cores, which {cluster.gpu.upper()} does not have "
                f"(it runs {', '.join(sorted(set(p.split('_with')[0] + '_mixed' if '_with' in p else p for p in runs_here)))}). "
                f"Use precision=bf16_mixed here, or a GPU in {', '.join(able)}",
            )
        ]
    return []


def cpu(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    """What the CPU smoke mode cannot run (Megatron-Core needs CUDA for these)."""
    if cluster.gpu != "cpu" and cfg.train.device != "cpu":
        return []
    par, out = cfg.parallel, []
    why = "needs a GPU; the CPU smoke mode runs TP, PP (with virtual stages), DP and EP over gloo"
    if par.context_parallel_size > 1:
        out.append(Problem("parallel.context_parallel_size", f"context parallel {why}"))
    if par.sequence_parallel:
        out.append(Problem("parallel.sequence_parallel", f"sequence parallel {why}"))
    if cfg.model.num_moe_experts and cfg.model.moe_token_dispatcher_type != "allgather":
        out.append(
            Problem(
                "model.moe_token_dispatcher_type",
                f"'{cfg.model.moe_token_dispatcher_type}' {why}; use allgather",
            )
        )
    if d.preset is not None and d.preset.fp8_recipe is not None:
        out.append(Problem("precision", f"{cfg.precision} {why}; use bf16_mixed"))
    return out
