"""`recipes plan` on the HPC sites' 4-GPU nodes beside a DGX H100 cluster of as many GPUs.

    .venv/bin/python bench/site_plans.py            # the table BENCHMARKS.md shows

For each recipe and GPU count: the fastest layout the planner finds on JUPITER (4 GH200 per node,
25 GB/s per GPU), Leonardo (4 A100 64 GB, 12.5 GB/s) and DGX H100 (8 H100 on NVSwitch, 50 GB/s),
each through the shipped profile as `recipes plan --profile NAME --nodes N` takes it. Printed: the
layout, its micro batch and recompute (or CPU activation offloading), the predicted step time and
tokens per second per GPU, the share of the step spent on traffic that leaves the NVLink domain
(data-parallel and pipeline traffic between nodes, an expert all-to-all whose group spans nodes),
and the DGX H100 cluster's best layout priced on this site: what a layout tuned for 8-GPU
NVSwitch nodes costs on 4-GPU nodes and a slower network.
Torch-free: it runs on a login node in seconds.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config.cost.steptime import predict  # noqa: E402
from config.hardware import Cluster  # noqa: E402
from config.rules import derive  # noqa: E402
from config.schema import TrainingConfig  # noqa: E402
from config.tree import ConfigError, apply_overrides  # noqa: E402
from launchers.jobsize import JobSize, job_cluster  # noqa: E402
from launchers.profile import load_profile  # noqa: E402
from recipes.advice.plan import Plan, plan  # noqa: E402
from recipes.advice.plan_text import memory_saver  # noqa: E402
from recipes.registry import get  # noqa: E402

CASES = [("llama3_8b_pretrain", 16), ("llama3_70b_pretrain", 64), ("qwen3_30b_a3b_pretrain", 16)]
SITES = ("jupiter", "leonardo", "dgx-h100")
NETWORK_TERMS = ("dp", "ep", "p2p")


def main() -> int:
    print(
        "| recipe | GPUs | site | best layout | MBS, recompute | step s | tokens/s/GPU "
        "| network share | DGX H100's best layout here |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, gpus in CASES:
        recipe = get(name)
        best = {}
        for site in SITES:
            profile = load_profile(site)
            nodes = gpus // (profile.gpus_per_node or 8)
            cluster = job_cluster(recipe.cluster, profile, JobSize(nodes=nodes))
            plans, _ = plan(recipe.config(), cluster, top=1)
            best[site] = (cluster, plans[0] if plans else None)
        dgx_plan = best["dgx-h100"][1]
        for site in SITES:
            cluster, top = best[site]
            if top is None:
                print(f"| {name} | {gpus} | {site} | no layout fits | | | | | |")
                continue
            step = top.step
            net = sum(step.terms.get(t, 0.0) for t in NETWORK_TERMS if crosses(cluster, top, t))
            there = dgx_layout_here(recipe.config(), cluster, dgx_plan)
            print(
                f"| {name} | {gpus} | {site} | {top.describe()} "
                f"| {top.field('train.micro_batch_size')}, {memory_saver(top)} | {step.seconds:.2f} "
                f"| {step.tokens_per_s_per_gpu:,.0f} | {net / step.seconds:.0%} | {there} |"
            )
    return 0


def crosses(cluster: Cluster, p: Plan, term: str) -> bool:
    """Whether a term's traffic leaves the NVLink domain: data-parallel and pipeline traffic when
    the job spans nodes, the expert all-to-all when its EP x ETP group does."""
    if term == "ep":
        return cluster.crosses(p.shape.ep * (p.shape.etp or p.shape.tp))
    return cluster.num_nodes > 1


def dgx_layout_here(cfg: TrainingConfig, cluster: Cluster, dgx: Plan | None) -> str:
    """The step time of DGX H100's best layout on this cluster, or why it cannot run here."""
    if dgx is None:
        return "-"
    here = apply_overrides(copy.deepcopy(cfg), dgx.overrides)
    try:
        step = predict(here, cluster, derive(here, cluster))
    except ConfigError as err:
        return f"invalid here ({err.problems[0][0]})"
    return f"{dgx.describe()}: {step.seconds:.2f} s" if step else "-"


if __name__ == "__main__":
    raise SystemExit(main())
