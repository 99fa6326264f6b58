"""The step-time model against published NVIDIA runs: predicted tokens/s/GPU of each published
layout, its error, and where `recipes plan` ranks that layout.

    .venv/bin/python bench/plan_calibration.py                        # with config/cost/steptime.py's table
    .venv/bin/python bench/plan_calibration.py --set expert_half_dim=3000   # try other constants
    .venv/bin/python bench/plan_calibration.py --search               # coordinate descent
    .venv/bin/python bench/plan_calibration.py --table                # bench/data/published_perf.csv:
                                                     # calibration and held-out parts, ranked
    .venv/bin/python bench/plan_calibration.py --table --search --only gemm_fp8_blackwell,gemm_fp4
                                                     # fit the named constants on calibration only
    .venv/bin/python bench/plan_calibration.py --noise                # the table's own spread across
                                                     # releases of one configuration

--table also gives each part's dense and MoE runs apart (`show_kinds`), how often NVIDIA's TP,
PP, CP and EP are among the planner's five groups whatever the VPP and micro batch (`summary`'s
top5_group), which way the planner's first layout differs where the published one is not in its
five best (`missed`), how much faster the model prices its first and fifth there (`margins`), and
the predicted gain of FP8 over BF16 against NVIDIA's where one layout ran in both in one release
(`precisions`).

CONSTANTS in config/cost/constants.py: rates and bandwidths from the sources named there, the
calibrated ones by hand, by small grids with --set and by --search (one constant at a time by 10%,
inside BOUNDS, while the loss falls: median absolute error, plus the mean, plus a penalty per
published layout ranked below 5th); Blackwell's (`_blackwell`, gemm_fp4, blackwell_ultra) with
--table --search --only on the calibration part; stage_overhead_s, which moves the ranks more than
the errors, with --table --compare stage_overhead_s=8.1e-5,2e-4,4e-4. On a lent GPU, `make
gpu-check`'s calibrate step (bench/perf_one_gpu.py) fits gemm_bf16 and attention to the one-GPU
proxy: try such a fit here with --set before it moves into the table. The held-out part
(bench/published_table.py's split) is only ever printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.published_table import (  # noqa: E402
    TableRun,
    current,
    fitted_before,
    is_current,
    newest,
    priced,
    split,
)
from bench.published_table import load as load_table  # noqa: E402
from config.cost import steptime as perf  # noqa: E402
from config.cost.constants import BOUNDS  # noqa: E402
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


def _shape(p) -> tuple:
    s = p.shape
    return (s.tp, s.pp, s.vpp, s.cp, s.ep)


def evaluate(
    run: PublishedRun | TableRun, constants: dict[str, float], ranked: bool = True
) -> dict:
    """The run's predicted tokens/s/GPU and error; with `ranked`, where the planner puts its
    layout among its TOP best (None: not among them) and the planner's best."""
    if isinstance(run, TableRun):
        cfg, cluster = priced(run)
    else:  # tests/support/published_runs.py's: DGX H100s
        recipe, cfg = resolve(run.recipe, run.overrides)
        size = JobSize(nodes=max(1, run.gpus // 8), gpus_per_node=min(run.gpus, 8), gpu="h100")
        cluster = job_cluster(recipe.cluster, None, size)
    step = perf.predict(cfg, cluster, derive(cfg, cluster), constants)
    plans: list = []
    if ranked:
        saved = dict(perf.VALUES)
        perf.VALUES.update(constants)  # the planner prices with the module's table
        try:
            plans, _ = plan(cfg, cluster, top=TOP * (3 if isinstance(run, TableRun) else 1))
        finally:
            perf.VALUES.update(saved)
    if isinstance(run, TableRun):  # the table's layouts: TP, PP, VPP, CP, EP, whatever the MBS
        listed: dict[tuple, set] = {}  # each distinct layout listed, with its ties' layouts
        for p in plans:
            listed.setdefault(_shape(p), set()).update(_shape(t) for t in (p, *p.ties))
        shapes = list(listed)[:TOP]
        rank = next((i for i, s in enumerate(shapes, 1) if s == run.layout[:5]), None)
        tied = next((i for i, s in enumerate(shapes, 1) if run.layout[:5] in listed[s]), None)
        parallel = (*run.layout[:2], *run.layout[3:5])  # TP, PP, CP, EP: a group of the planner's
        group = next((i for i, s in enumerate(shapes, 1) if (*s[:2], *s[3:]) == parallel), None)
        fifth = next((p for p in plans if _shape(p) == shapes[4]), None) if shapes[4:] else None
    else:
        rank = next((i for i, p in enumerate(plans, 1) if matches(run, p)), None)
        tied = next(
            (i for i, p in enumerate(plans, 1) if any(matches(run, t) for t in (p, *p.ties))), None
        )
        fifth, group = (plans[4] if plans[4:] else None), None
    return {
        "run": run,
        "predicted": step.tokens_per_s_per_gpu,
        "error": step.tokens_per_s_per_gpu / run.tokens_per_s_per_gpu - 1,
        "rank": rank,
        "tied": tied,  # the rank where the layout is listed or one of a listed layout's ties
        "group": group,  # where its TP, PP, CP and EP are listed, whatever the VPP and MBS
        "best": plans[0].shape.describe() if plans else "-",
        "first": _shape(plans[0]) if plans else None,  # (TP, PP, VPP, CP, EP)
        "first_speed": plans[0].step.tokens_per_s_per_gpu if plans else None,
        "fifth_speed": fifth.step.tokens_per_s_per_gpu if fifth else None,
        "moe": bool(cfg.model.num_moe_experts),
        "ranked": ranked,
        "bottleneck": step.bottleneck,
    }


def table(constants: dict[str, float], runs: list | None = None, ranked: bool = True) -> list[dict]:
    """The rows of `runs` (default: tests/support/published_runs.py's RUNS)."""
    return [evaluate(run, constants, ranked) for run in (RUNS if runs is None else runs)]


def table_parts() -> tuple[list[TableRun], list[TableRun]]:
    """The table's priced runs, newest per configuration: (calibration, held out)."""
    runs, _ = load_table()
    return split(newest(runs))


def superseded() -> list[TableRun]:
    """The priced runs `newest` leaves out, older releases' figures of the table's configurations,
    but those `fitted_before`: in neither part, never fitted on; a second check, of older software."""
    runs = current(load_table()[0])
    kept = {id(r) for r in newest(runs)}
    return [r for r in runs if id(r) not in kept and not fitted_before(r)]


def megatron_lm_a100() -> list[TableRun]:
    """Megatron-LM's A100 runs (NVIDIA's of 2021, JSC's of 2023 on 4-GPU nodes), priced with what
    each release ran (MEGATRON_LM_2021, _2023): a third check, never fitted on."""
    return [r for r in load_table()[0] if not is_current(r)]


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=v.__getitem__)
        return [float(order.index(i)) for i in range(len(v))]

    rx, ry, n = ranks(xs), ranks(ys), len(xs)
    return 1 - 6 * sum((a - b) ** 2 for a, b in zip(rx, ry, strict=True)) / (n * (n * n - 1))


def layout_orders(rows: list[dict]) -> list[tuple[str, int, float]]:
    """Where NVIDIA published several layouts of one model on one GPU count, kind and precision:
    (the group, its layouts, Spearman's rank correlation of predicted with published)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        run = r["run"]
        groups.setdefault((run.model, run.system, run.gpus, run.precision), []).append(r)
    out = []
    for (model, system, gpus, precision), members in sorted(groups.items()):
        if len({m["run"].layout for m in members}) >= 2:
            rho = spearman(
                [m["run"].tokens_per_s_per_gpu for m in members], [m["predicted"] for m in members]
            )
            out.append((f"{model}, {gpus} {system}, {precision}", len(members), rho))
    return out


def scaling(rows: list[dict]) -> list[tuple[str, float, float]]:
    """Where NVIDIA ran one layout of one model on one GPU kind, precision and release at 4x the
    GPUs or more: (the series, measured, predicted) tokens/s/GPU of its largest run over its
    smallest. What the straggler term (gpu_speed_sigma) and the data-parallel latencies price."""
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        run = r["run"]
        key = (run.model, run.system, run.precision, run.layout[:5], run.software)
        series.setdefault(key, []).append(r)
    out = []
    for (model, system, precision, _, software), members in series.items():
        small, large = min(members, key=_gpus), max(members, key=_gpus)
        if _gpus(large) >= 4 * _gpus(small):
            measured = large["run"].tokens_per_s_per_gpu / small["run"].tokens_per_s_per_gpu
            name = f"{model}, {system} {precision}, {_gpus(small)} -> {_gpus(large)} ({software})"
            out.append((name, measured, large["predicted"] / small["predicted"]))
    return out


def precisions(rows: list[dict]) -> list[tuple[str, bool, float, float]]:
    """Where NVIDIA ran one layout of one model on one GPU count and kind, in one release, in BF16
    and in a lower precision: (the pair, whether the model has experts, measured, predicted)
    tokens/s/GPU of the lower precision over BF16: what choosing the precision gains, apart from
    the error the two runs share."""
    pairs: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        run = r["run"]
        key = (run.model, run.system, run.gpus, run.layout, run.software)
        pairs.setdefault(key, {})[run.precision] = r
    out = []
    for (model, system, gpus, _, software), members in pairs.items():
        if "bf16" not in members:
            continue
        base = members.pop("bf16")
        for precision, r in sorted(members.items()):
            measured = r["run"].tokens_per_s_per_gpu / base["run"].tokens_per_s_per_gpu
            name = f"{model}, {gpus} {system}, {precision} over bf16 ({software})"
            out.append((name, base["moe"], measured, r["predicted"] / base["predicted"]))
    return out


def gain_errors(pairs: list[tuple[str, bool, float, float]], moe: bool) -> list[float]:
    """The predicted gain's error, predicted over measured less one, of `precisions`' dense
    (moe False) or MoE pairs."""
    return [p / m - 1 for _, is_moe, m, p in pairs if is_moe == moe]


def misses(r: dict) -> bool:
    """Whether a ranked run's published layout is not in the planner's five best, even tied."""
    return r["ranked"] and (r["tied"] or TOP + 1) > 5


def missed(rows: list[dict]) -> dict[str, int]:
    """The `misses`, by how the planner's first layout differs: fewer or more pipeline stages,
    else the same stages split otherwise (VPP), else another TP, CP or EP."""
    out = {"fewer pipeline stages": 0, "more pipeline stages": 0, "another VPP": 0, "other": 0}
    for r in rows:
        if not misses(r) or r["first"] is None:
            continue
        _, pp, vpp = r["run"].layout[:3]
        first = r["first"]
        if first[1] != pp:
            out["fewer pipeline stages" if first[1] < pp else "more pipeline stages"] += 1
        else:
            out["another VPP" if (first[2] or 1) != (vpp or 1) else "other"] += 1
    return out


def margins(rows: list[dict]) -> list[tuple[float, float]]:
    """Each of the `misses`: how much faster the planner's first and fifth layouts are priced."""
    return [(r["first_speed"] / r["predicted"] - 1, r["fifth_speed"] / r["predicted"] - 1)
            for r in rows if misses(r) and r["fifth_speed"]]  # fmt: skip


def release_noise(runs: list[TableRun]) -> list[tuple[float, str, str]]:
    """How far NVIDIA's own figure for one configuration moved from one release to the next where
    nothing the model prices changed (the same configuration and the same release settings:
    dispatcher, overlap, fused MLP, offloading, loss): (|later / earlier - 1|, earlier id, later
    id), smallest first. The model prices both alike, so no step-time model of the hardware and
    the settings alone gets under this spread."""
    series: dict[tuple, list[TableRun]] = {}
    for run in runs:
        series.setdefault((run.config_key, run.settings), []).append(run)
    out = []
    for members in series.values():
        members.sort(key=lambda r: r.release)
        for before, after in zip(members, members[1:], strict=False):
            if after.release > before.release:
                change = abs(after.tokens_per_s_per_gpu / before.tokens_per_s_per_gpu - 1)
                out.append((change, before.id, after.id))
    return sorted(out)


def _gpus(row: dict) -> int:
    return int(row["run"].gpus)


def fit_loss(rows: list[dict]) -> float:
    """What --table --search lowers on the calibration part: the median absolute error plus the
    mean (which the far-off runs move: the issue bounds the maximum too)."""
    errors = [abs(r["error"]) for r in rows]
    return statistics.median(errors) + statistics.mean(errors)


def spread(values: list[float]) -> dict[str, float]:
    """The median, 90th percentile and maximum of `values` (the table's error figures)."""
    ordered = sorted(values)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[int(0.9 * (len(ordered) - 1))],
        "max": ordered[-1],
    }


def summary(rows: list[dict]) -> dict[str, float]:
    ranked = [r for r in rows if r["ranked"]]
    top5 = sum(1 for r in ranked if r["rank"] is not None and r["rank"] <= 5)
    tied = sum(1 for r in ranked if not misses(r))
    group = sum(1 for r in ranked if (r.get("group") or TOP + 1) <= 5)
    return {
        "runs": len(rows),
        **spread([abs(r["error"]) for r in rows]),
        "top5": top5 / len(ranked) if ranked else float("nan"),
        "top5_tied": tied / len(ranked) if ranked else float("nan"),
        "top5_group": group / len(ranked) if ranked else float("nan"),
    }


def loss(rows: list[dict]) -> float:
    median = statistics.median(abs(r["error"]) for r in rows)
    published = [r for r in rows if r["run"].in_published_layouts]
    missed = sum(1 for r in published if r["rank"] is None or r["rank"] > 5)
    return median + 0.1 * missed + 0.2 * statistics.mean(abs(r["error"]) for r in rows)


def _print_rows(rows: list[dict], width: int, gpus: bool) -> None:
    """The header and a line per row: name, (GPUs,) published, predicted, error, rank, the rank
    counting ties, bottleneck."""
    count = f" {'GPUs':>5}" if gpus else ""
    print(
        f"{'run':<{width}}{count} {'published':>9} {'predicted':>9} {'error':>7} {'rank':>4} "
        f"{'tied':>4}  bottleneck"
    )
    for r in rows:
        name, share = r["bottleneck"]
        rank, tied = (r[key] or f">{TOP}" if r["ranked"] else "-" for key in ("rank", "tied"))
        count = f" {r['run'].gpus:>5}" if gpus else ""
        print(
            f"{r['run'].name:<{width}}{count} {r['run'].tokens_per_s_per_gpu:>9,.0f} "
            f"{r['predicted']:>9,.0f} {r['error']:>+7.1%} {rank!s:>4} {tied!s:>4}  {name} {share:.0%}"
        )


def show_precisions(pairs: list[tuple[str, bool, float, float]]) -> None:
    """`precisions`' pairs, dense and MoE apart: how many, and the predicted gain's mean error."""
    print("\na lower precision over BF16, one layout and release (predicted over measured gain):")
    for moe, kind in ((False, "dense"), (True, "MoE")):
        errors = gain_errors(pairs, moe)
        if errors:
            print(f"  {kind}: {len(errors)} pairs, mean error {statistics.mean(errors):+.1%}, "
                  f"mean |error| {statistics.mean(map(abs, errors)):.1%}, max {max(map(abs, errors)):.1%}")  # fmt: skip


def show(rows: list[dict]) -> None:
    _print_rows(rows, 42, gpus=False)
    errors = [abs(r["error"]) for r in rows]
    published = [abs(r["error"]) for r in rows if r["run"].in_published_layouts]
    print(
        f"median |error|: {statistics.median(published):.1%} on the published layouts, "
        f"{statistics.median(errors):.1%} on all {len(rows)} runs"
    )


def kinds(rows: list[dict]) -> dict[str, dict[str, float]]:
    """`summary` of the dense and the MoE runs of `rows` apart, keyed as HELD_OUT_ERROR (the
    figures `recipes plan` prints for its model's kind); a kind without runs is left out."""
    parts = {kind: [r for r in rows if r["moe"] == moe] for kind, moe in (("dense", False), ("moe", True))}  # fmt: skip
    return {kind: summary(part) for kind, part in parts.items() if part}


def show_kinds(rows: list[dict]) -> None:
    """`kinds` of `rows`, a line each."""
    for kind, s in kinds(rows).items():
        ranks = f", top 5 {s['top5']:.0%} (tied {s['top5_tied']:.0%})" if s["top5"] == s["top5"] else ""  # fmt: skip
        print(f"  {'MoE' if kind == 'moe' else kind}: {s['runs']} runs, median |error| "
              f"{s['median']:.1%}, 90th percentile {s['p90']:.1%}, max {s['max']:.1%}{ranks}")  # fmt: skip


def show_table(rows: list[dict]) -> None:
    _print_rows(sorted(rows, key=lambda r: r["run"].name), 40, gpus=True)
    s = summary(rows)
    ranks = "not ranked" if s["top5"] != s["top5"] else (
        f"{s['top5']:.0%} (listed or tied: {s['top5_tied']:.0%}; its TP, PP, CP and EP: {s['top5_group']:.0%})")  # fmt: skip
    print(f"{s['runs']} runs: median |error| {s['median']:.1%}, 90th percentile {s['p90']:.1%}, "
          f"max {s['max']:.1%}; published layout in the top 5: {ranks}")  # fmt: skip
    show_kinds(rows)


def search(
    constants: dict[str, float],
    rounds: int,
    runs: list | None = None,
    only: list[str] | None = None,
) -> dict[str, float]:
    """Coordinate descent, one constant at a time by 10%, inside config/cost/constants.py's
    BOUNDS: on RUNS (the loss above, ranks included), or on `runs` (fit_loss, errors only)."""

    def cost(k: dict[str, float]) -> float:
        return loss(table(k)) if runs is None else fit_loss(table(k, runs, ranked=False))

    best, best_loss = dict(constants), cost(constants)
    for _ in range(rounds):
        improved = False
        for name in only or perf.VALUES:
            for factor in (0.9, 1.1):
                low, high = BOUNDS.get(name, (0.0, float("inf")))
                trial = {**best, name: min(high, max(low, best[name] * factor))}
                if trial[name] == best[name]:
                    continue
                trial_loss = cost(trial)
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
    parser.add_argument("--only", help="name,name: the constants --search may move (default: all)")
    parser.add_argument("--set", nargs="*", default=[], help="name=value: try other constants")
    parser.add_argument(
        "--compare",
        help="name=v1,v2,...: with --table, the calibration part's errors and ranks at each value",
    )
    parser.add_argument("--noise", action="store_true", help="one configuration across releases")
    parser.add_argument("--table", action="store_true", help="published_perf.csv's two parts")
    args = parser.parse_args()
    constants = dict(perf.VALUES)
    constants.update({k: float(v) for k, v in (item.split("=") for item in args.set)})
    if args.noise:
        pairs = release_noise(load_table()[0])
        changes = [c for c, _, _ in pairs]
        s = spread(changes)
        print(
            f"{len(pairs)} release pairs of one configuration priced alike: median "
            f"{s['median']:.1%}, 90th percentile {s['p90']:.1%}, max {s['max']:.1%}; "
            f"over 15%: {sum(c > 0.15 for c in changes)}"
        )
        for change, before, after in pairs[-5:]:
            print(f"  {change:6.1%}  {before} -> {after}")
        return
    if args.table:
        calibration, held_out = table_parts()
        if args.compare:  # how stage_overhead_s was chosen: errors and ranks, calibration only
            name, values = args.compare.split("=", 1)
            for value in map(float, values.split(",")):
                s = summary(table({**constants, name: value}, calibration))
                print(f"{name}={value:g}: median {s['median']:.1%}, 90th percentile "
                      f"{s['p90']:.1%}, max {s['max']:.1%}, top 5 {s['top5']:.0%} (tied {s['top5_tied']:.0%})", flush=True)  # fmt: skip
            return
        if args.search:  # fitted on the calibration part only
            only = args.only.split(",") if args.only else None
            constants = search(constants, args.rounds, calibration, only)
            print({k: round(v, 6) for k, v in constants.items()})
        for title, part in (("calibration", calibration), ("held out", held_out)):
            rows = table(constants, part)
            print(f"\n{title}:")
            show_table(rows)
            print(f"  not in the top 5 even tied, the planner's first layout has: {missed(rows)}")
            if gaps := margins(rows):
                first, fifth = (spread(list(m)) for m in zip(*gaps, strict=True))
                print(f"  there the planner prices its first layout a median {first['median']:+.1%} faster than the "
                      f"published one (at most {first['max']:+.1%}), its fifth {fifth['median']:+.1%} ({fifth['max']:+.1%})")  # fmt: skip
        s = summary(older := table(constants, superseded(), ranked=False))
        print(f"\nolder releases of these configurations ({s['runs']} runs, never fitted on): "
              f"median |error| {s['median']:.1%}, 90th percentile {s['p90']:.1%}, max {s['max']:.1%}")  # fmt: skip
        show_kinds(older)
        show_precisions(precisions(table(constants, load_table()[0], ranked=False)))
        rows = table(constants, megatron_lm_a100(), ranked=False)
        print(f"\nMegatron-LM's A100 runs of 2021 and 2023 ({len(rows)}, never fitted on):")
        for r in rows:
            print(f"  {r['run'].id:34s} {r['run'].tokens_per_s_per_gpu:8.1f} {r['predicted']:8.1f} {r['error']:+6.1%}")  # fmt: skip
        return
    if args.search:
        constants = search(constants, args.rounds)
        print({k: round(v, 4) for k, v in constants.items()})
    show(table(constants))


if __name__ == "__main__":
    main()
