"""The precision preset against the GPU, and what the CPU smoke mode cannot run."""

from __future__ import annotations

from config.backend import run_device
from config.finalize import Partial
from config.hardware import GPUS, Cluster, GpuSpec
from config.precision import PRESETS, PrecisionPreset, gpu_runs
from config.problems import Problem
from config.schema import TrainingConfig

# What a GPU without a preset's number format runs instead, nearest first: block scaling to the
# finest block scaling it has, FP8 to BF16/FP16 (None: the plain mixed preset of the same dtype).
_FALLBACK = {"nvfp4": "mxfp8", "mxfp8": "blockwise", "blockwise": "tensorwise", "tensorwise": None}


def closest_runnable(preset: PrecisionPreset, gpu: GpuSpec) -> str:
    """The preset nearest to `preset` that `gpu` runs, in the same parameter dtype."""
    # The presets of the same dtype, without the alias names.
    same_dtype = [
        p for n, p in PRESETS.items() if p.name == n and p.params_dtype == preset.params_dtype
    ]
    recipe = preset.fp8_recipe
    while recipe is not None:
        recipe = _FALLBACK.get(recipe)
        for candidate in same_dtype:
            if candidate.fp8_recipe == recipe and gpu_runs(gpu, candidate):
                return candidate.name
    return f"{preset.params_dtype}_mixed"


def precision(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    preset = d.preset
    if preset is None:
        return []  # an unknown name: the choices rule lists the presets
    needs = preset.needs  # None: any GPU runs it
    if needs is not None and cluster.gpu in GPUS and not gpu_runs(GPUS[cluster.gpu], preset):
        gpu = GPUS[cluster.gpu]
        able = [g for g, spec in GPUS.items() if gpu_runs(spec, preset)]
        # Every preset this GPU runs, without the alias names.
        runs_here = [n for n, p in PRESETS.items() if p.name == n and gpu_runs(gpu, p)]
        return [
            Problem(
                "precision",
                f"{cfg.precision} needs {needs.upper()} tensor cores, which "
                f"{cluster.gpu.upper()} does not have. {cluster.gpu.upper()} runs "
                f"{', '.join(runs_here)}; the closest is "
                f"precision={closest_runnable(preset, gpu)}. Or use a GPU in {', '.join(able)}",
            )
        ]
    return _bf16_ends(cfg, preset)


def _bf16_ends(cfg: TrainingConfig, preset: PrecisionPreset) -> list[Problem]:
    """FP8 with the first and last layer in BF16: TransformerConfig wants that one layer to fit in
    num_layers // PP, the layers of an even pipeline stage; with fewer layers than pipeline stages
    (a layout that leaves stages without a layer) it refuses to build."""
    pp, layers = cfg.parallel.pipeline_model_parallel_size, cfg.model.num_layers
    if not preset.first_last_layers_bf16 or preset.fp8_recipe in (None, "nvfp4") or pp < 1:
        return []
    if layers // pp >= 1:
        return []
    return [
        Problem(
            "precision",
            f"{cfg.precision} keeps the first and last layer in BF16, which Megatron-Core allows "
            f"only with at least one layer per pipeline stage: model.num_layers={layers} // "
            f"PP={pp} = 0; use PP <= {layers} or a preset without BF16 ends (e.g. "
            f"precision={preset.params_dtype}_with_fp8_subchannel_scaling_mixed)",
        )
    ]


def cpu(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    """What the CPU smoke mode cannot run (Megatron-Core needs CUDA or Transformer Engine for
    these); `recipes run --shrink` replaces each with what the CPU runs (recipes/shrink.py)."""
    if run_device(cfg, cluster) != "cpu":
        return []
    par, out = cfg.parallel, []
    why = (
        "needs a GPU; the CPU smoke mode runs TP (with or without SP), PP (with virtual stages), "
        "DP and EP over gloo"
    )
    if par.context_parallel_size > 1:
        out.append(
            Problem(
                "parallel.context_parallel_size",
                f"context parallel (Transformer Engine's attention) {why}; use 1",
            )
        )
    if cfg.model.arch == "llava" and par.sequence_parallel:
        out.append(
            Problem(
                "parallel.sequence_parallel",
                "sequence parallel in arch 'llava' needs Transformer Engine's attention (Megatron-"
                "Core's LLaVA model asserts it), so a GPU; use false",
            )
        )
    if cfg.model.num_moe_experts and cfg.model.moe_token_dispatcher_type != "allgather":
        out.append(
            Problem(
                "model.moe_token_dispatcher_type",
                f"'{cfg.model.moe_token_dispatcher_type}' {why}; use allgather",
            )
        )
    if d.preset is not None and d.preset.fp8_recipe is not None:
        out.append(
            Problem(
                "precision",
                f"{cfg.precision} (Transformer Engine's FP8/FP4 GEMMs) {why}; "
                f"use {d.preset.params_dtype}_mixed",
            )
        )
    return out
