"""How fast `recipes plan` searches: CPU seconds of the layout search alone (one process, one core,
the best of the repeats; no imports, no printing), the layouts it ranks per second, and how many
whole step predictions it made for them (recipes/advice/plan.py passes the others over on their
floors: each layout's microbatches on its slowest pipeline rank's layers).

    .venv/bin/python bench/plan_speed.py                  # DeepSeek-V3 on 1,024 H100s (FP8)
    .venv/bin/python bench/plan_speed.py --recipe deepseek_v3_pretrain --repeat 3

The first is the case issue 29 bounds: under a second. bench/cli_latency.py times whole commands.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launchers.jobsize import job_cluster  # noqa: E402
from recipes.advice import plan as search  # noqa: E402
from recipes.registry import resolve  # noqa: E402

RECIPE = "deepseek_v3_pretrain_1024gpu_h100_fp8sc"


def speed(recipe: str = RECIPE, repeat: int = 5) -> dict:
    """The search's best CPU seconds over `repeat`, the layouts it ranks, and the step predictions
    (`config.cost.steptime.predict` calls) of one search."""
    recipe_obj, cfg = resolve(recipe, [])
    cluster = job_cluster(recipe_obj.cluster, None, None)
    best, ranked = float("inf"), 0
    for _ in range(repeat):
        start = time.process_time()
        _, ranked = search.plan(cfg, cluster, top=5)
        best = min(best, time.process_time() - start)
    calls, predict = [], search.predict
    search.predict = lambda *a, **kw: calls.append(1) or predict(*a, **kw)
    try:
        search.plan(cfg, cluster, top=5)
    finally:
        search.predict = predict
    return {"recipe": recipe, "gpus": cluster.world_size, "seconds": best, "ranked": ranked,
            "per_second": ranked / best, "predictions": len(calls)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=RECIPE)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    r = speed(args.recipe, args.repeat)
    print(
        f"{r['recipe']} on {r['gpus']} GPUs: {r['ranked']:,} layouts ranked in "
        f"{r['seconds']:.3f} CPU-s ({r['per_second']:,.0f} per second on one core), "
        f"{r['predictions']:,} whole step predictions"
    )


if __name__ == "__main__":
    main()
