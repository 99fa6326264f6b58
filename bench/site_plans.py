"""`recipes plan` on the HPC sites' 4-GPU nodes beside a DGX H100 cluster of as many GPUs.

    .venv/bin/python bench/site_plans.py            # the table BENCHMARKS.md shows

For each recipe and GPU count: the fastest layout the planner finds on JUPITER (4 GH200 per node,
25 GB/s per GPU), Leonardo (4 A100 64 GB, 12.5 GB/s) and DGX H100 (8 H100 on NVSwitch, 50 GB/s),
each through the shipped profile as `recipes plan --profile NAME --nodes N` takes it. Printed: the
layout, the predicted step time and tokens per second per GPU, and the share of the step the
network-bound terms take (data-parallel gradient traffic, the MoE all-to-all, pipeline sends).
Torch-free: it runs on a login node in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launchers.jobsize import JobSize, job_cluster  # noqa: E402
from launchers.profile import load_profile  # noqa: E402
from recipes.advice.plan import plan  # noqa: E402
from recipes.registry import get  # noqa: E402

CASES = [("llama3_8b_pretrain", 16), ("llama3_70b_pretrain", 64), ("qwen3_30b_a3b_pretrain", 16)]
SITES = ("jupiter", "leonardo", "dgx-h100")
NETWORK_TERMS = ("dp", "ep", "p2p")


def main() -> int:
    print("| recipe | GPUs | site | best layout | step s | tokens/s/GPU | DP+EP+PP comm share |")
    print("|---|---|---|---|---|---|---|")
    for name, gpus in CASES:
        recipe = get(name)
        for site in SITES:
            profile = load_profile(site)
            nodes = gpus // (profile.gpus_per_node or 8)
            cluster = job_cluster(recipe.cluster, profile, JobSize(nodes=nodes))
            plans, _ = plan(recipe.config(), cluster, top=1)
            if not plans:
                print(f"| {name} | {gpus} | {site} | no layout fits | | | |")
                continue
            step = plans[0].step
            comm = sum(step.terms.get(t, 0.0) for t in NETWORK_TERMS) / step.seconds
            print(
                f"| {name} | {gpus} | {site} | {plans[0].describe()} | {step.seconds:.2f} "
                f"| {step.tokens_per_s_per_gpu:,.0f} | {comm:.0%} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
