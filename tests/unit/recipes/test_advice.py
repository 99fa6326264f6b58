"""One engine for the CLI's layout advice: what `recipes check` suggests is what `recipes plan`
ranks.

`check` suggests layouts in two places: the changes that make a config fit ("predicted to fit
with") and, in a topology warning, a layout that keeps a group inside its NVLink domain. Both come
from the planner (recipes/advice/suggest.py), so for the same command line they are `plan`'s
answers. A short list of changes of its own would miss what the planner finds: Llama 3 8B on four
A100-40G fits on those four with TP 4 and full recompute, no second node needed.
"""

from __future__ import annotations

import json

import pytest

from config.cost.memory import MEMORY_MARGIN
from config.hardware import Cluster
from config.rules import derive
from config.rules.topology import group_block, topology
from recipes.advice.check import check
from recipes.advice.plan import overrides, pinned, plan
from recipes.advice.space import shapes
from recipes.cli import main
from recipes.registry import resolve

A100_40G = ["--gpu", "a100-40g"]


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, object]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def changes(recipe: str, user: list[str], plan_overrides: list[str]) -> list[str]:
    """A plan's overrides that differ from the recipe with the user's overrides."""
    _, cfg = resolve(recipe, user)
    current = overrides(cfg)
    return [o for o in plan_overrides if o not in current]


@pytest.mark.parametrize(
    ("recipe", "user", "size"),
    [
        ("llama3_8b_pretrain", [], ["--gpu", "a100-64g", "--nodes", "1", "--gpus-per-node", "4"]),
        ("llama3_8b_pretrain", [], [*A100_40G, "--nodes", "2", "--gpus-per-node", "8"]),
        # A pinned field stays pinned in both.
        (
            "llama3_8b_pretrain",
            ["parallel.tensor_model_parallel_size=2"],
            [*A100_40G, "--nodes", "1", "--gpus-per-node", "8"],
        ),
        ("mixtral_8x7b_pretrain", [], A100_40G),
    ],
)
def test_checks_suggestions_are_plans_first_layouts(
    recipe: str, user: list[str], size: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, report = cli_json(capsys, "check", recipe, *user, *size)
    assert code == 3 and report["fixes"], report
    suggested = [fix.split("  (predicted", 1)[0].split() for fix in report["fixes"]]
    code, plans = cli_json(capsys, "plan", recipe, *user, *size, "--top", str(len(suggested)))
    assert code == 0
    assert suggested == [changes(recipe, user, p["overrides"]) for p in plans]


def test_where_nothing_fits_check_grows_the_job_as_plan_on_more_nodes_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Llama 3 70B without TP and PP on one node: nothing fits on 8 GPUs; the suggestion names
    the nodes, and `plan` there ranks the same layout first."""
    user = [
        "parallel.tensor_model_parallel_size=1",
        "parallel.pipeline_model_parallel_size=1",
        "parallel.virtual_pipeline_model_parallel_size=None",
        "parallel.sequence_parallel=false",
    ]
    code, report = cli_json(capsys, "check", "llama3_70b_pretrain", *user, "--nodes", "1")
    first = report["fixes"][0].split("  (predicted", 1)[0].split()
    assert code == 3 and first[0] == "--nodes", report["fixes"]
    nodes = first[1]
    code, plans = cli_json(capsys, "plan", "llama3_70b_pretrain", *user, "--nodes", nodes)
    assert code == 0 and first[2:] == changes("llama3_70b_pretrain", user, plans[0]["overrides"])
    # On the cluster asked for, `plan` agrees that no layout fits.
    code, plans = cli_json(capsys, "plan", "llama3_70b_pretrain", *user, "--nodes", "1")
    assert code == 3 and plans == []


@pytest.mark.parametrize(
    ("recipe", "user", "cluster", "field"),
    [
        (
            "llama3_8b_pretrain",
            ["parallel.tensor_model_parallel_size=8", "parallel.context_parallel_size=1"],
            Cluster(2, 4, "h100"),
            "parallel.tensor_model_parallel_size",
        ),
        (
            "qwen3_30b_a3b_pretrain",
            [],
            Cluster(2, 8, "h100"),
            "parallel.expert_model_parallel_size",
        ),
        (  # the all-gather of K and V, which no compute hides (the ring would: test below)
            "llama3_8b_pretrain",
            ["parallel.tensor_model_parallel_size=4", "parallel.cp_comm_type=all_gather"],
            Cluster(2, 8, "h100", nvlink_domain=4),
            "parallel.context_parallel_size",
        ),
    ],
)
def test_the_topology_warnings_layout_is_one_plan_offers(
    recipe: str, user: list[str], cluster: Cluster, field: str
) -> None:
    """The layout a warning suggests is the first of `plan`'s layouts (without the pinned field
    the warning is about) that keeps the group inside an NVLink domain."""
    _, cfg = resolve(recipe, user)
    report = check(cfg, cluster, pinned=pinned(cfg, user))
    (warning,) = [w for w in report.warnings if w.field == field]
    suggested = warning.message.split(" within a domain: ", 1)[1].split(" fits (", 1)[0].split()
    others = [o for o in user if not o.startswith(field + "=")]
    plans, _ = plan(cfg, cluster, top=20, pinned=pinned(cfg, others))
    inside = [
        p
        for p in plans
        if not cluster.crosses(
            group_block(field, p.shape.tp, p.shape.cp, p.shape.ep, p.shape.etp or p.shape.tp)
        )
    ]
    assert inside and suggested == inside[0].changes(cfg)


def test_a_warned_group_whose_traffic_the_model_hides_gets_no_layout_nor_a_search(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Llama 3 8B at TP 4 x CP 2 across 4-GPU NVLink domains: the ring exchange of keys and
    values hides behind attention (under 1% of the step exposed), so keeping TP x CP inside a
    domain cannot gain more and `check` says so without the planner's search (as for Llama 3.1
    405B's TP 8 x CP 2). With the all-gather exchange, which nothing hides, it gets its layout."""
    import recipes.advice.suggest as suggest

    cluster = Cluster(2, 8, "h100", nvlink_domain=4)

    def searched(*args: object, **kwargs: object) -> None:
        raise AssertionError("the planner searched")

    _, cfg = resolve("llama3_8b_pretrain", ["parallel.tensor_model_parallel_size=4"])
    with monkeypatch.context() as m:
        m.setattr(suggest, "plan", searched)
        (warning,) = check(cfg, cluster).warnings
    assert warning.field == "parallel.context_parallel_size"
    assert "exposed, under 1% of the step: no layout suggested" in warning.message
    assert " within a domain: " not in warning.message
    exchange = ["parallel.tensor_model_parallel_size=4", "parallel.cp_comm_type=all_gather"]
    _, cfg = resolve("llama3_8b_pretrain", exchange)
    (warning,) = check(cfg, cluster).warnings
    assert " within a domain: " in warning.message


def test_the_planner_never_offers_a_tp_group_that_check_warns_about() -> None:
    """An NVL72 domain of 72 GPUs holds TP 8 groups whole but not TP 16 (72 = 4 x 16 + 8): the
    planner searches only the TP sizes the topology rule accepts."""
    _, cfg = resolve("llama31_405b_pretrain_128gpu_gb200_bf16", [])
    cluster = Cluster(32, 4, "gb200")
    tps = {shape.tp for shape in shapes(cfg, cluster, {})}
    assert tps == {1, 2, 4, 8}
    # CP 1 keeps TP x PP x CP = 16 x 8 x 1 the world of 128: a valid run, warned about.
    wide_tp = ["parallel.tensor_model_parallel_size=16", "parallel.context_parallel_size=1"]
    _, wide = resolve("llama31_405b_pretrain_128gpu_gb200_bf16", wide_tp)
    warned = [w.field for w in topology(wide, cluster, derive(wide, cluster))]
    assert warned == ["parallel.tensor_model_parallel_size"]


# Llama 3 8B on 2 x 4 A100-40G at TP 2, CP 2, MBS 1, no recompute, the first 6 layers'
# activations offloaded, Megatron DDP: 38.8 GiB predicted of the GPU's 39.4, above the 36.2 that
# keeping 8% free leaves.
BORDER = [
    "parallel.tensor_model_parallel_size=2",
    "parallel.context_parallel_size=2",
    "parallel.pipeline_model_parallel_size=1",
    "parallel.sequence_parallel=true",
    "train.micro_batch_size=1",
    "model.recompute_granularity=None",
    "model.cpu_offloading_num_layers=6",
    "parallel.use_megatron_fsdp=false",
]
A100_40G_2x4 = [*A100_40G, "--nodes", "2", "--gpus-per-node", "4"]


@pytest.mark.parametrize("margin, fits", [(None, False), ("0.005", True)])
def test_check_and_plan_keep_the_same_memory_free(
    margin: str | None, fits: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """A layout between the margin and the GPU's memory: `check` and `plan` (every layout field
    pinned) both refuse it with the default margin, both take it with a smaller one, and both
    print the limit they judged by."""
    size = [*A100_40G_2x4, *(["--memory-margin", margin] if margin else [])]
    code, report = cli_json(capsys, "check", "llama3_8b_pretrain", *BORDER, *size)
    assert report["valid"] and 36 < report["memory_gib_per_gpu"] < report["gpu_memory_gib"]
    assert report["memory_limit_gib"] == pytest.approx(
        report["gpu_memory_gib"] * (1 - float(margin or MEMORY_MARGIN))
    )
    assert (code == 0) == fits == report["fits"]
    code, plans = cli_json(capsys, "plan", "llama3_8b_pretrain", *BORDER, *size, "--top", "1")
    assert (code == 0) == fits == bool(plans)
    if fits:
        assert plans[0]["memory_gib_per_gpu"] == report["memory_gib_per_gpu"]
    percent = f"keeping {float(margin or MEMORY_MARGIN) * 100:g}% free"
    assert main(["check", "llama3_8b_pretrain", *BORDER, *size]) == (0 if fits else 3)
    assert percent in capsys.readouterr().out
    if fits:
        assert main(["plan", "llama3_8b_pretrain", *BORDER, *size]) == 0
        assert percent in capsys.readouterr().out
