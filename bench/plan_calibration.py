"""The step-time model against published NVIDIA runs: predicted tokens/s/GPU of each published
layout, its error, and where `recipes plan` ranks that layout.

    .venv/bin/python bench/plan_calibration.py                        # with config/cost/steptime.py's table
    .venv/bin/python bench/plan_calibration.py --set expert_half_dim=3000   # try other constants
    .venv/bin/python bench/plan_calibration.py --search               # coordinate descent

How CONSTANTS in config/cost/constants.py were set: the rates and bandwidths from the sources named there,
then the calibrated ones by hand and by small grids with --set against this table (the MoE one:
expert_half_dim). --search moves one constant at a time by 10% while the loss (median
absolute error, plus the mean, plus a penalty per published layout ranked below 5th) falls; from the
table's values no such move lowers it by more than 0.002. On a lent GPU, `make gpu-check`'s
calibrate step (bench/perf_one_gpu.py) fits gemm_bf16 and attention to the one-GPU proxy: try
such a fit here with --set before it moves into the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from config.cost import steptime as perf  # noqa: E402
from config.rules import derive  # noqa: E402
from launchers.jobsize import JobSize, job_cluster  # noqa: E402
from recipes.advice.plan import plan  # noqa: E402
from recipes.registry import resolve  # noqa: E402
from tests.support.published_runs import RUNS, PublishedRun  # noqa: E402

TOP = 10  # how deep to look for the published layout


def matches(run: PublishedRun, p) -> bool:
    s = p.shape
    fields = dict(o.split("=", 1) for o in p.overrides)
    mbs = int(fields["train.micro_batch_size"])
    return (s.tp, s.pp, s.vpp, s.cp, s.ep, mbs) == run.layout


def evaluate(run: PublishedRun, constants: dict[str, float]) -> dict:
    recipe, cfg = resolve(run.recipe, run.overrides)
    size = JobSize(nodes=max(1, run.gpus // 8), gpus_per_node=min(run.gpus, 8), gpu="h100")
    cluster = job_cluster(recipe.cluster, None, size)
    step = perf.predict(cfg, cluster, derive(cfg, cluster), constants)
    saved = dict(perf.VALUES)
    perf.VALUES.update(constants)  # the planner prices with the module's table
    try:
        plans, _ = plan(cfg, cluster, top=TOP)
    finally:
        perf.VALUES.update(saved)
    rank = next((i for i, p in enumerate(plans, 1) if matches(run, p)), None)
    return {
        "run": run,
        "predicted": step.tokens_per_s_per_gpu,
        "error": step.tokens_per_s_per_gpu / run.tokens_per_s_per_gpu - 1,
        "rank": rank,
        "best": plans[0].shape.describe() if plans else "-",
        "bottleneck": step.bottleneck,
    }


def table(constants: dict[str, float]) -> list[dict]:
    return [evaluate(run, constants) for run in RUNS]


def loss(rows: list[dict]) -> float:
    median = statistics.median(abs(r["error"]) for r in rows)
    published = [r for r in rows if r["run"].in_published_layouts]
    missed = sum(1 for r in published if r["rank"] is None or r["rank"] > 5)
    return median + 0.1 * missed + 0.2 * statistics.mean(abs(r["error"]) for r in rows)


def show(rows: list[dict]) -> None:
    print(f"{'run':<42} {'published':>9} {'predicted':>9} {'error':>7} {'rank':>4}  bottleneck")
    for r in rows:
        name, share = r["bottleneck"]
        rank = r["rank"] or f">{TOP}"
        print(
            f"{r['run'].name:<42} {r['run'].tokens_per_s_per_gpu:>9,.0f} {r['predicted']:>9,.0f} "
            f"{r['error']:>+7.1%} {rank!s:>4}  {name} {share:.0%}"
        )
    errors = [abs(r["error"]) for r in rows]
    published = [abs(r["error"]) for r in rows if r["run"].in_published_layouts]
    print(
        f"median |error|: {statistics.median(published):.1%} on the published layouts, "
        f"{statistics.median(errors):.1%} on all {len(rows)} runs"
    )


def search(constants: dict[str, float], rounds: int) -> dict[str, float]:
    best, best_loss = dict(constants), loss(table(constants))
    for _ in range(rounds):
        improved = False
        for name in perf.VALUES:
            for factor in (0.9, 1.1):
                trial = {**best, name: best[name] * factor}
                trial_loss = loss(table(trial))
                if trial_loss < best_loss - 1e-4:
                    best, best_loss, improved = trial, trial_loss, True
                    print(f"{name} -> {trial[name]:.4g}  loss {best_loss:.4f}", flush=True)
        if not improved:
            break
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--search", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], help="name=value: try other constants")
    args = parser.parse_args()
    constants = dict(perf.VALUES)
    constants.update({k: float(v) for k, v in (item.split("=") for item in args.set)})
    if args.search:
        constants = search(constants, args.rounds)
        print({k: round(v, 4) for k, v in constants.items()})
    show(table(constants))


if __name__ == "__main__":
    main()
