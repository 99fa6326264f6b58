"""`recipes plan`'s table and the `recipes run` command of its first plan (plan.py finds the
plans)."""

from __future__ import annotations

import shlex

from config.cost.constants import A100_ERROR, HELD_OUT_ERROR
from config.cost.memory import MEMORY_MARGIN, limit_text
from config.hardware import Cluster
from config.schema import TrainingConfig
from recipes.advice.plan import Plan


def memory_saver(p: Plan) -> str:
    """What a plan trades time for memory with, as the recompute column prints it: "-", "full
    block 4", the selective modules, or "offload N" (CPU activation offloading)."""
    recompute = p.field("model.recompute_granularity")
    if recompute == "full":
        return f"full {p.field('model.recompute_method')} {p.field('model.recompute_num_layers')}"
    if recompute == "selective" and p.field("model.recompute_modules") != "None":
        return p.field("model.recompute_modules")
    if p.field("model.cpu_offloading_num_layers") != "0":
        return f"offload {p.field('model.cpu_offloading_num_layers')}"
    return "-" if recompute == "None" else recompute


def command(
    name: str,
    cfg: TrainingConfig,
    cluster: Cluster,
    user: list[str],
    p: Plan,
    profile: str | None = None,
    executor: str | None = None,
) -> str:
    """`recipes run` with the user's overrides, the plan's fields that differ from `cfg`, the
    cluster it was planned for and the profile it came from (`executor`: the profile's)."""
    changed = p.changes(cfg)
    size = [
        *("--nodes", str(cluster.num_nodes), "--gpus-per-node", str(cluster.gpus_per_node)),
        *("--gpu", cluster.gpu),
        *(("--nvlink-domain", str(cluster.nvlink_domain)) if cluster.nvlink_domain else ()),
    ]
    where = ["--profile", profile] if profile else []
    # The local executor runs one node: several need Slurm (slurm-bare needs no cluster profile).
    if cluster.num_nodes > 1 and (executor or "local") == "local":
        where += ["--executor", "slurm-bare"]
    return " ".join(["recipes run", *map(shlex.quote, [name, *user, *changed, *size, *where])])


def accuracy(plans: list[Plan], moe: bool, a100: bool = False) -> list[str]:
    """What the ranking is worth: the model's error on NVIDIA runs of the same kind (dense or
    `moe`) that it was not fitted on (on A100s, `a100`, also on Megatron-LM's A100 runs), and the
    plans that lie within its median of the first (the model cannot order those)."""
    error = HELD_OUT_ERROR["moe" if moe else "dense"]
    first = plans[0].step.tokens_per_s_per_gpu
    close = sum(1 for p in plans if p.step.tokens_per_s_per_gpu >= first * (1 - error["median"]))
    lines = [
        f"accuracy on {error['runs']:.0f} NVIDIA {'MoE' if moe else 'dense-model'} runs not "
        f"fitted on: median error {error['median']:.1%}, 9 in 10 within {error['p90']:.1%}"
    ]
    if a100:
        lines.append(
            f"  on A100s, {A100_ERROR['runs']:.0f} Megatron-LM runs (NVIDIA's of 2021, JSC's of 2023 "
            "on 4-GPU nodes) with their software: "
            f"median error {A100_ERROR['median']:.1%}, all within {A100_ERROR['max']:.1%}"
        )
    if close > 1:
        lines.append(
            f"  plans 1-{close} are within {error['median']:.1%} of the first: time a few "
            "steps of each before a long run"
        )
    return lines + [""]


def render(
    cfg: TrainingConfig,
    cluster: Cluster,
    plans: list[Plan],
    searched: int,
    recipe_name: str,
    user: list[str],
    profile: str | None = None,
    executor: str | None = None,
    margin: float = MEMORY_MARGIN,
) -> str:
    """The table of `plans`, and the `recipes run` command of the first (with `profile`, the
    cluster profile the plan was sized by, and its executor; `margin`, the share of memory the
    plans keep free)."""
    lines = [
        f"recipe   {cfg.name}",
        f"cluster  {cluster.num_nodes} node(s) x {cluster.gpus_per_node} {cluster.gpu.upper()} = "
        f"{cluster.world_size} GPUs, NVLink domain {cluster.domain}",
        f"batch    global {cfg.train.global_batch_size}, seq {cfg.model.seq_length}, "
        f"precision {cfg.precision}",
        f"memory   {limit_text(cluster.spec.memory_gib, margin)} per GPU",
        f"searched {searched} layouts x micro batch sizes; the {len(plans)} fastest that fit:",
        "",
    ]
    rows = [(p, p.field("train.micro_batch_size"), memory_saver(p)) for p in plans]
    wide = max([38] + [len(p.describe()) for p in plans])
    wide_rc = max([14] + [len(r) for _, _, r in rows])
    lines.append(
        f"{'#':>2}  {'layout':<{wide}} {'MBS':>3}  {'recompute':<{wide_rc}} {'tok/s/GPU':>10} "
        f"{'MFU':>6} {'GiB':>6}  bottleneck"
    )
    for i, (p, mbs, recompute) in enumerate(rows, 1):
        name, share = p.step.bottleneck
        lines.append(
            f"{i:>2}  {p.describe():<{wide}} {mbs:>3}  {recompute:<{wide_rc}} "
            f"{p.step.tokens_per_s_per_gpu:>10,.0f} {p.step.mfu:>6.1%} {p.memory.total_gib:>6.1f}  "
            f"{name} {share:.0%}"
        )
        if p.ties:  # the other pipeline splits the model cannot order against this one
            split = (
                f"VPP {t.shape.vpp or '-'}" + (" uneven" if t.shape.layout else "") for t in p.ties
            )
            lines.append(f"    as fast within the per-stage cost's uncertainty: {', '.join(split)}")
    if plans:
        moe = bool(cfg.model.num_moe_experts)
        lines += ["", *accuracy(plans, moe, cluster.spec.name.startswith("a100"))]
        lines += [
            "run the first with:",
            "  " + command(recipe_name, cfg, cluster, user, plans[0], profile, executor),
        ]
        if cluster.num_nodes > 1 and not profile:
            lines.insert(
                -2,
                "(slurm-bare runs this environment on the nodes; for a container use --executor "
                "slurm --profile CLUSTER.toml, see launchers/profiles/)",
            )
    else:
        lines += ["", "no layout fits; use more GPUs or GPUs with more memory"]
    return "\n".join(lines)
