"""Warnings, not errors: a communication group that spans NVLink domains.

The first failure mode of distributed training in the course material: tensor parallelism laid
across nodes, its all-reduces and all-gathers (every layer, forward and backward) over the
inter-node network instead of NVLink, and MFU collapses. Such a run is valid (Megatron-Core runs
it), so `recipes check` keeps its exit code and lists these under `warnings`.

Megatron-Core orders ranks tp-cp-ep-dp-pp (its default `order`): a TP group is TP consecutive
ranks, TP x CP consecutive ranks hold a TP group's context-parallel peers, and for the experts
ETP x EP consecutive ranks hold an alltoall group. With Slurm's block placement, consecutive ranks
fill a node (or an NVL72 rack) before the next, so a group stays inside an NVLink domain exactly
when its block of consecutive ranks divides the domain (Cluster.crosses). Each warning gives what
the step-time model (config/cost/steptime.py) predicts the group's traffic costs per step, and a layout that
keeps the group inside a domain with its own predicted step time and memory.
"""

from __future__ import annotations

import copy

from config.cost.memory import estimate_memory
from config.cost.steptime import StepTime, predict
from config.finalize import Derived, finalize
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig


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
    step = predict(cfg, cluster, d)
    out = []
    if cluster.crosses(tp):
        out.append(
            Problem(
                "parallel.tensor_model_parallel_size",
                f"TP={tp} spans {where}: every layer's TP all-reduce/all-gather, forward and "
                f"backward, crosses the inter-node network{slower}{_cost(step, 'tp')}. "
                f"{_tp_inside(cfg, cluster, step)}",
            )
        )
    elif cp > 1 and cluster.crosses(tp * cp):
        inside = max(1, min(cp, domain // tp))
        out.append(
            Problem(
                "parallel.context_parallel_size",
                f"TP x CP = {tp} x {cp} spans {where}: the context-parallel exchange of keys and "
                f"values, every layer, crosses the inter-node network{slower}"
                f"{_cost(step, 'cp')}. Published runs do this at long context (Llama 3.1 405B: "
                "TP 8 x CP 2 over two nodes), where the ring exchange hides behind attention's "
                f"compute; to keep TP x CP within {domain} GPUs: "
                + _priced(cfg, cluster, step, {"context_parallel_size": inside}),
            )
        )
    if cfg.model.num_moe_experts and ep > 1 and cluster.crosses(etp * ep):
        inside = max(1, domain // etp)
        while cfg.model.num_moe_experts % inside:
            inside //= 2
        out.append(
            Problem(
                "parallel.expert_model_parallel_size",
                f"ETP x EP = {etp} x {ep} spans {where}: the MoE token alltoall, twice per MoE "
                f"layer forward and backward, crosses the inter-node network{slower}"
                f"{_cost(step, 'ep')}. Published runs accept this for very wide models "
                "(DeepSeek-V3: EP 64 over InfiniBand) with the flex dispatcher, which sends a "
                "token once per node (model.moe_token_dispatcher_type=flex, DeepEP or HybridEP "
                "installed), and the alltoall overlapped "
                "(parallel.overlap_moe_expert_parallel_comm=true); "
                f"to keep ETP x EP within {domain} GPUs: "
                + _priced(cfg, cluster, step, {"expert_model_parallel_size": inside}),
            )
        )
    return out


def _cost(step: StepTime | None, term: str) -> str:
    if step is None:
        return ""
    seconds = step.terms[term]
    return (
        f" (predicted: {seconds:.2f} s of a {step.seconds:.2f} s step exposed, "
        f"{seconds / step.seconds:.0%}; config/cost/steptime.py)"
    )


def _priced(
    cfg: TrainingConfig, cluster: Cluster, step: StepTime | None, changes: dict[str, object]
) -> str:
    """The overrides in `changes` (parallel fields), whether the checker accepts them and the
    estimate fits them, and their predicted step time against the current one."""
    from config.rules import validate

    trial = copy.deepcopy(cfg)
    for name, value in changes.items():
        setattr(trial.parallel, name, value)
    trial.parallel.sequence_parallel = (
        cfg.parallel.sequence_parallel and trial.parallel.tensor_model_parallel_size > 1
    )
    text = " ".join(f"parallel.{name}={value}" for name, value in changes.items())
    if trial.parallel.sequence_parallel != cfg.parallel.sequence_parallel:
        text += " parallel.sequence_parallel=false"
    derived = finalize(trial, cluster)
    problems = validate(trial, cluster, derived)
    if problems:
        return f"{text} is not valid here ({problems[0].field}: {problems[0].message})"
    memory = estimate_memory(trial, cluster, derived)
    fits = memory is not None and memory.total_gib <= cluster.spec.memory_gib
    size = f"{memory.total_gib:.1f} GiB" if memory else "?"
    after = predict(trial, cluster, derived)
    speed = (
        f", predicted {after.seconds:.2f} s per step against {step.seconds:.2f} s "
        f"({after.seconds / step.seconds - 1:+.0%})"
        if after and step
        else ""
    )
    verdict = f"is valid and fits ({size})" if fits else f"is valid but does not fit ({size})"
    return f"{text} {verdict}{speed}; `recipes plan` ranks every layout"


def _tp_inside(cfg: TrainingConfig, cluster: Cluster, step: StepTime | None) -> str:
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
            changes = {
                "tensor_model_parallel_size": inside,
                "pipeline_model_parallel_size": trial.parallel.pipeline_model_parallel_size,
            }
            return "Keep TP within a domain: " + _priced(cfg, cluster, step, changes)
    return f"Keep TP within a domain (at most {domain}, dividing it)"
