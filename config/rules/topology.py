"""Warnings, not errors: a communication group that spans NVLink domains.

The first failure mode of distributed training in the course material: tensor parallelism laid
across nodes, its all-reduces and all-gathers (every layer, forward and backward) over the
inter-node network instead of NVLink, and MFU collapses. Such a run is valid (Megatron-Core runs
it), so `recipes check` keeps its exit code and lists these under `warnings`.

Megatron-Core orders ranks tp-cp-ep-dp-pp (its default `order`): a TP group is TP consecutive
ranks, TP x CP consecutive ranks hold a TP group's context-parallel peers, and for the experts
ETP x EP consecutive ranks hold an alltoall group. With Slurm's block placement, consecutive ranks
fill a node (or an NVL72 rack) before the next, so a group stays inside an NVLink domain exactly
when its block of consecutive ranks divides the domain. What crossing costs is given per byte, as
the ratio of the two links' bandwidths (config/hardware.py); the step-time model that would turn
it into seconds is not built yet.
"""

from __future__ import annotations

import copy

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig


def _spans(block: int, domain: int, world: int) -> bool:
    """Whether blocks of `block` consecutive ranks cross domains of `domain` ranks."""
    return block > 1 and world > domain and (block > domain or domain % block != 0)


def topology(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    """One warning per group (TP, CP, the expert alltoall) that leaves its NVLink domain."""
    par, domain, world = cfg.parallel, cluster.domain, cluster.world_size
    tp, cp = par.tensor_model_parallel_size, par.context_parallel_size
    etp = d.expert_tensor_parallel_size or tp
    ep = par.expert_model_parallel_size
    spec = cluster.spec
    slower = (
        f"; the network carries {spec.network_gb_s:g} GB/s per GPU against NVLink's "
        f"{spec.nvlink_gb_s:g}, {spec.nvlink_gb_s / spec.network_gb_s:.0f}x less"
        if spec.network_gb_s
        else ""
    )
    where = f"NVLink domains of {domain} GPUs ({cluster.gpu}, {world} GPUs)"
    out = []
    if _spans(tp, domain, world):
        out.append(
            Problem(
                "parallel.tensor_model_parallel_size",
                f"TP={tp} spans {where}: every layer's TP all-reduce/all-gather, forward and "
                f"backward, crosses the inter-node network{slower}. {_fix(cfg, cluster, d)}",
            )
        )
    elif cp > 1 and _spans(tp * cp, domain, world):
        out.append(
            Problem(
                "parallel.context_parallel_size",
                f"TP x CP = {tp} x {cp} spans {where}: the context-parallel exchange of keys and "
                f"values, every layer, crosses the inter-node network{slower}. Published runs "
                "do this at long context (Llama 3.1 405B: TP 8 x CP 2 over two nodes), where the "
                f"ring exchange hides behind attention's compute; else keep TP x CP within {domain} "
                "GPUs",
            )
        )
    if cfg.model.num_moe_experts and ep > 1 and _spans(etp * ep, domain, world):
        out.append(
            Problem(
                "parallel.expert_model_parallel_size",
                f"ETP x EP = {etp} x {ep} spans {where}: the MoE token alltoall, twice per MoE "
                f"layer forward and backward, crosses the inter-node network{slower}. Published "
                "runs accept this for very wide models (DeepSeek-V3: EP 64 over InfiniBand) with "
                "the flex dispatcher (DeepEP) and communication overlap; otherwise keep ETP x EP "
                f"within {domain} GPUs",
            )
        )
    return out


def _fix(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> str:
    """The same model-parallel size with TP inside the domain and the rest in PP, if the checker
    accepts it; else the bound."""
    from config.rules import validate

    par, domain = cfg.parallel, cluster.domain
    tp = par.tensor_model_parallel_size
    for inside in range(min(tp, domain), 0, -1):
        if tp % inside or domain % inside:
            continue
        trial = copy.deepcopy(cfg)
        trial.parallel.tensor_model_parallel_size = inside
        trial.parallel.pipeline_model_parallel_size = par.pipeline_model_parallel_size * (
            tp // inside
        )
        trial.parallel.sequence_parallel = par.sequence_parallel and inside > 1
        if not validate(trial, cluster):
            sp = (
                ""
                if trial.parallel.sequence_parallel == par.sequence_parallel
                else (" parallel.sequence_parallel=false")
            )
            return (
                f"Keep TP within a domain: parallel.tensor_model_parallel_size={inside} "
                f"parallel.pipeline_model_parallel_size="
                f"{trial.parallel.pipeline_model_parallel_size}{sp} is valid"
            )
    return f"Keep TP within a domain (at most {domain}, dividing it)"
