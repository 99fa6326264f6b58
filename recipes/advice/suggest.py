"""What `recipes check` suggests, found by the planner (plan.py), so that `check` and `plan` never
give two answers to one question.

- `fixes`: when a config does not fit, the planner's fastest layouts that do, with the same
  pinned fields as `recipes plan` (what the command line set): on the cluster asked for, else on
  the fewest nodes (twice as many, four times, ... 64 times) where one does, with `--nodes N`.
- `keep_inside`: a topology warning (config/rules/topology.py: a TP, TP x CP or ETP x EP group
  that leaves its NVLink domain) completed with the planner's fastest layout that keeps the group
  inside a domain, freeing the group's own fields if the command line pinned them; or, where the
  step-time model prices the group's traffic as hidden (Llama 3.1 405B's TP 8 x CP 2 ring
  exchange, behind attention), with that: keeping the group inside cannot gain more than it
  costs, and the search is not run.
"""

from __future__ import annotations

import dataclasses

from config.cost.memory import MEMORY_MARGIN
from config.cost.steptime import predict
from config.hardware import Cluster
from config.problems import Problem
from config.rules import derive
from config.rules.topology import CP, EP, GROUPS, TERMS, TP
from config.schema import TrainingConfig
from recipes.advice.plan import Plan, plan
from recipes.advice.space import PAR

GROWTH = (1, 2, 4, 8, 16, 32, 64)  # node counts tried, as multiples of the cluster's
# A warned group's exposed traffic under this share of the step: keeping the group inside a
# domain gains at most that, less than the model's error (config/cost/constants.py HELD_OUT_ERROR).
HIDDEN = 0.01
# The fields a layout that keeps a warned group inside may change, pinned or not.
FREED = {TP: (TP,), CP: (CP,), EP: (EP, PAR + "expert_tensor_parallel_size")}


def fixes(
    cfg: TrainingConfig,
    cluster: Cluster,
    pinned: dict | None = None,
    limit: int = 3,
    margin: float = MEMORY_MARGIN,
) -> list[str]:
    """Up to `limit` changes predicted to fit, fastest first: each the overrides of one of
    `recipes plan`'s layouts (plus `--nodes N` where the job must grow), with its memory and
    speed. `recipes plan` with the same overrides (and `--nodes N`) lists the same layouts first."""
    for factor in GROWTH:
        sized = dataclasses.replace(cluster, num_nodes=cluster.num_nodes * factor)
        plans, _ = plan(cfg, sized, top=limit, pinned=pinned, margin=margin)
        if plans:
            grow = [f"--nodes {sized.num_nodes}"] if factor > 1 else []
            return [_fix(cfg, grow, p) for p in plans]
    return []


def _fix(cfg: TrainingConfig, grow: list[str], p: Plan) -> str:
    speed = f"{p.step.tokens_per_s_per_gpu:,.0f} tokens/s/GPU"
    return f"{' '.join(grow + p.changes(cfg))}  (predicted {p.memory.total_gib:.1f} GiB, {speed})"


def keep_inside(
    cfg: TrainingConfig,
    cluster: Cluster,
    warning: Problem,
    pinned: dict | None = None,
    margin: float = MEMORY_MARGIN,
) -> Problem:
    """`warning` with the fastest layout that keeps its group inside an NVLink domain, sized and
    priced against the config's own step time; or that none fits."""
    group, domain = GROUPS[warning.field], cluster.domain
    now = predict(cfg, cluster, derive(cfg, cluster))
    exposed = now.terms[TERMS[warning.field]] if now else None
    if now and exposed is not None and exposed < HIDDEN * now.seconds:
        advice = (
            f"Keeping {group} within a domain would save at most its {exposed:.2f} s exposed, "
            f"under {HIDDEN:.0%} of the step: no layout suggested (`recipes plan` ranks every "
            "layout by its whole step)."
        )
        return Problem(warning.field, f"{warning.message} {advice}")
    free = {k: v for k, v in (pinned or {}).items() if k not in FREED[warning.field]}
    plans, _ = plan(cfg, cluster, top=1, pinned=free, inside=warning.field, margin=margin)
    if not plans:
        advice = f"no layout that keeps {group} within {domain} GPUs fits (`recipes plan`)"
        return Problem(warning.field, f"{warning.message} {advice[0].upper()}{advice[1:]}.")
    best = plans[0]
    speed = (
        f", predicted {best.step.seconds:.2f} s per step against {now.seconds:.2f} s "
        f"({best.step.seconds / now.seconds - 1:+.0%})"
        if now
        else ""
    )
    advice = (
        f"Keep {group} within a domain: {' '.join(best.changes(cfg))} fits "
        f"({best.memory.total_gib:.1f} GiB){speed}, the fastest such layout of `recipes plan`."
    )
    return Problem(warning.field, f"{warning.message} {advice}")
