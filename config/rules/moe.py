"""Mixture of experts: experts over EP, the router's top-k, EP x ETP within a pipeline stage."""

from __future__ import annotations

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem, choices, divisors
from config.schema import TrainingConfig


def moe(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    par, model = cfg.parallel, cfg.model
    ep, etp = par.expert_model_parallel_size, d.expert_tensor_parallel_size
    experts = model.num_moe_experts
    if etp is None or ep < 1:
        return []  # config/rules/ranges.py names them
    # Megatron-Core lays out the expert groups at start-up whether or not the model has experts.
    out = _expert_grid(cfg, d, ep, etp)
    if experts is None:
        if ep > 1:
            out.append(
                Problem(
                    "parallel.expert_model_parallel_size",
                    f"is {ep} but the model has no experts (model.num_moe_experts is None); set it to 1",
                )
            )
        return out
    if experts % ep:
        out.append(
            Problem(
                "parallel.expert_model_parallel_size",
                f"model.num_moe_experts={experts} is not divisible by EP={ep}; use EP in {{{choices(divisors(experts))}}}",
            )
        )
    if not 1 <= model.moe_router_topk <= experts:
        out.append(
            Problem("model.moe_router_topk", f"must be between 1 and num_moe_experts={experts}")
        )
    return out


def _expert_grid(cfg: TrainingConfig, d: Derived, ep: int, etp: int) -> list[Problem]:
    """EP x ETP must divide the ranks of a pipeline stage."""
    pp = cfg.parallel.pipeline_model_parallel_size
    ranks_per_stage = d.world_size // pp if pp > 0 and d.world_size % pp == 0 else None
    if ranks_per_stage is None or ranks_per_stage % (ep * etp) == 0:
        return []
    field = "parallel.expert_model_parallel_size"
    if ep == 1:
        field = "parallel.expert_tensor_parallel_size"
    return [
        Problem(
            field,
            f"EP x ETP = {ep} x {etp} = {ep * etp} must divide the {ranks_per_stage} ranks of each "
            f"pipeline stage (world {d.world_size} / PP {pp})",
        )
    ]
