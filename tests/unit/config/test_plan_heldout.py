"""The step-time model and the planner against NVIDIA's published runs they were not fitted on.

bench/data/published_perf.csv holds every public NVIDIA pretraining figure a session found, with
its source; bench/published_table.py prices the rows whose model has a preset here, or its
architecture written out over one (ARCHITECTURES; newest release per configuration) and splits them once, by a fixed seed, into a calibration part (what
config/cost/constants.py's fitted constants were fitted on: bench/plan_calibration.py --table
--search) and a held-out part never fitted on. The tables are printed (pytest -s, or
`bench/plan_calibration.py --table`); the bounds below are today's, so that nothing gets worse
unseen, and the issue's own bounds are held in an expected failure until they are met. A rank is
the published layout's (TP, PP, VPP, CP, EP) place among the distinct layouts `recipes plan`
lists, whatever micro batch size, recompute or Megatron-FSDP it pairs them with; the issue's
bound counts only the layouts listed, today's also the ties listed under them (the virtual-stage
splits the model cannot order against a listed layout, recipes/advice/plan.py `ties`).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import re
import statistics

import pytest

from bench.plan_calibration import (
    gain_errors,
    kinds,
    layout_orders,
    margins,
    missed,
    precisions,
    scaling,
    show_kinds,
    show_precisions,
    show_table,
    summary,
    table,
    table_parts,
)
from bench.published_table import TABLE, load, newest, priced, split
from config.cost import layers
from config.cost import steptime as perf
from config.cost.constants import A100_ERROR, HELD_OUT_ERROR


@pytest.fixture(scope="module")
def parts() -> tuple[list, list]:
    return table_parts()


@pytest.fixture(scope="module")
def held_rows(parts: tuple[list, list]) -> list[dict]:
    return table(dict(perf.VALUES), parts[1])  # with the planner's ranks


@pytest.fixture(scope="module")
def calibration_rows(parts: tuple[list, list]) -> list[dict]:
    return table(dict(perf.VALUES), parts[0], ranked=False)


def test_the_table_names_a_source_for_every_figure() -> None:
    with TABLE.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 500 and len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        # a repository path at a commit, or a documentation page's address
        assert re.search(r"@ [0-9a-f]{10}", r["source"]) or "https://" in r["source"], r["id"]
        assert float(r["tokens_per_s_per_gpu"] or r["tflops_per_gpu"]) > 0, r["id"]
        assert int(r["gpus"]) > 0 and int(r["seq"]) > 0 and int(r["gbs"]) > 0, r["id"]
    runs, skipped = load()
    assert len(runs) + len(skipped) == len(rows)
    assert len(newest(runs)) >= 100  # configurations priced


def test_a_figure_its_source_calls_a_regression_is_kept_but_not_priced() -> None:
    """Megatron-Bridge 26.06.01's GPT-OSS 120B rows carry the summary's footnote: a known
    regression of a cuDNN kernel, fixed in the next container. Priced, they were the older
    releases' largest errors (+119% and +123%)."""
    runs, skipped = load()
    marked = {row["id"]: why for row, why in skipped if "REGRESSION" in row["notes"]}
    assert set(marked) == {f"mb260601-gptoss120b-{gpu}-fp8mx-64" for gpu in ("gb200", "gb300")}
    assert all("known regression" in why for why in marked.values())
    assert not {r.id for r in runs} & set(marked)


# Parameters as each model's publishers give them: Qwen3-235B-A22B's model card (235B), Llama 2's
# paper (Touvron et al. 2023: 7B, 13B, 70B; the HF checkpoints hold 6.74, 13.0 and 69.0 billion),
# Nemotron-4 15B (arXiv 2402.16819: 3.2B embedding + 12.5B other) and 340B (arXiv 2406.11704),
# GPT-3 (Brown et al. 2020: 175.0B), Grok-1 (xai-org/grok-1: 314B), Megatron-LM's GPT models of
# 2021 (its README's table, images/cases_april2021.png @ 50a4b5fa02: "Number of parameters"), JSC's
# benchmark models (FZJ-JSC/jubench-megatron-lm DESCRIPTION.md: "13B", "175B", whole billions).
PUBLISHED_PARAMETERS = {
    "Qwen3 235B-A22B": 235e9, "Llama 2 7B": 6.74e9, "Llama 2 13B": 13.0e9,
    "Llama 2 70B": 69.0e9, "Nemotron-4 15B": 15.7e9, "Nemotron-4 340B": 340e9,
    "GPT-3 175B": 175e9, "Grok-1 314B": 314e9,
    "GPT 1.7B": 1.7e9, "GPT 3.6B": 3.6e9, "GPT 7.5B": 7.5e9, "GPT 18B": 18.4e9,
    "GPT 39B": 39.1e9, "GPT 76B": 76.1e9, "GPT 145B": 145.6e9, "GPT 310B": 310.1e9,
    "GPT 530B": 529.6e9, "GPT 1T": 1008.0e9, "GPT 13B": 13e9, "GPT 175B": 175e9,
}  # fmt: skip


def test_each_written_out_architecture_has_its_published_parameter_count() -> None:
    """ARCHITECTURES' overrides (what prices a model without a preset) are the model: their
    parameter count (config/cost/memory.py) within 1% of the publisher's."""
    from bench.published_models import GPT_JUBE
    from bench.published_table import ARCHITECTURES, RECIPES
    from config.cost.memory import count_parameters
    from recipes.registry import resolve

    assert set(ARCHITECTURES) == set(PUBLISHED_PARAMETERS)
    for model, overrides in ARCHITECTURES.items():
        _, cfg = resolve(RECIPES[model], overrides)
        published = PUBLISHED_PARAMETERS[model]
        # Megatron-LM's table gives tenths of a billion (1.7 for 1.65), JSC's whole billions
        rounding = (0.5e9 if model in GPT_JUBE else 0.05e9) / published
        total = count_parameters(cfg).total
        assert total == pytest.approx(published, rel=max(0.01, rounding)), model


def test_the_split_is_fixed_and_keeps_configurations_whole(parts: tuple[list, list]) -> None:
    calibration, held = parts
    assert (calibration, held) == split(newest(load()[0]))  # the seed's, every time
    assert not {r.config_key for r in calibration} & {r.config_key for r in held}
    assert 0.28 <= len(held) / (len(held) + len(calibration)) <= 0.38


def test_report_and_todays_bounds(
    calibration_rows: list[dict], held_rows: list[dict], capsys: pytest.CaptureFixture[str]
) -> None:
    with capsys.disabled():
        for title, rows in (("calibration", calibration_rows), ("held out", held_rows)):
            print(f"\n{title}:")
            show_table(rows)
        print(f"held-out misses, the planner's first layout has: {missed(held_rows)}")
        first, fifth = (statistics.median(m) for m in zip(*margins(held_rows), strict=True))
        print(f"  priced faster than the published layout: the first {first:+.1%}, the fifth "
              f"{fifth:+.1%} (medians)")  # fmt: skip
        print("\nlayouts of one model, GPU count, kind and precision (Spearman):")
        for group, n, rho in layout_orders(calibration_rows + held_rows):
            print(f"  {group}: {n} layouts, {rho:+.2f}")
    cal, held = summary(calibration_rows), summary(held_rows)
    assert cal["median"] <= 0.05
    # max 64.8% before the interleaved chunks' wait on the dropless alltoall (chunk_wait_s), 78%
    # and 90th percentile 15.3% before its host waits (alltoall_sync_s, 2026-11-29). 90th
    # percentile 15.0% before the output layer took gemm_bf16 on Blackwell (2026-11-29, eleventh
    # session): DeepSeek-V3 on 256 B200s and B300s from -22% and -19% to -9% and -5%.
    assert held["median"] <= 0.05 and held["max"] <= 0.50 and held["p90"] <= 0.12
    # 56% (62% with ties) before the experts' launches were priced and the constants refitted
    # (2026-11-29): three held-out layouts went from 5th to 6th, one from 8th to 2nd; 52% (59%)
    # before the host waits, which moved Grok-1 FP8 on 2,048 H100s from 6th to 5th; 54% (60%)
    # before the output layer's rate, which moved Llama 3.1 405B FP8 and MXFP8 on 128 B200s from
    # 7th to 5th; 57% (63%) before the planner offered config/layout.py's loss_heavy layouts,
    # which moved DeepSeek-V3 MXFP8 on 256 B200s and B300s (PP 16) from below 10th to 1st and 4th;
    # 60% (67%) before the planner offloaded where offloading all but one layer overflows the
    # host, which moved Llama 3.1 405B FP8 on 128 GB200s (FSDP, offloading) from below 10th to 2nd.
    assert held["top5"] >= 0.62 and held["top5_tied"] >= 0.68  # 40 and 44 of 64: listed; tied
    # NVIDIA's TP, PP, CP and EP among the planner's five groups, its own VPP and MBS or not: 51.
    assert held["top5_group"] >= 0.79 and held["top5_group"] >= held["top5_tied"]
    # Where it is not, it misses by less than the model's median error: the planner prices its
    # fifth layout a median 2.9% faster than the published one, its first 4.7% (2026-11-30); 2.0%
    # and 4.2% before the interleaved chunks' wait on the dropless alltoall (chunk_wait_s), which
    # prices NVIDIA's virtual stages there slower (Qwen3 30B-A3B on 16 H100s: +64.8% to +7.4%).
    assert fifth <= min(0.03, held["median"]) and first <= 0.05
    # What `recipes plan` prints as its accuracy is today's, dense and MoE apart
    # (config/cost/constants.py).
    by_kind = kinds(held_rows)
    assert set(by_kind) == set(HELD_OUT_ERROR)
    for kind, part in by_kind.items():
        assert HELD_OUT_ERROR[kind]["runs"] == part["runs"], kind
        assert HELD_OUT_ERROR[kind]["median"] == round(part["median"], 3), kind
        assert HELD_OUT_ERROR[kind]["p90"] == round(part["p90"], 3), kind
    assert sum(e["runs"] for e in HELD_OUT_ERROR.values()) == held["runs"]
    # The dense models' held-out runs stay within a 5% median and a 15% maximum error, the
    # bounds the planner is held to (41 runs, 2026-11-30: median 3.2%, max 14.8%, DGX Cloud
    # 25.01's GPT-3 175B FP8 on 1,024 H100s); the MoE runs hold the maximum above (median 6.1%,
    # max 46.2%).
    assert by_kind["dense"]["median"] <= 0.05 and by_kind["dense"]["max"] <= 0.15


def test_show_kinds_prints_the_dense_and_moe_runs_apart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--table's line per kind under each part: its runs' count and errors (ranks where ranked)."""
    errors = ((False, 0.01), (False, -0.03), (True, 0.2))
    show_kinds([{"moe": moe, "error": e, "ranked": False} for moe, e in errors])
    assert capsys.readouterr().out.splitlines() == [
        "  dense: 2 runs, median |error| 2.0%, 90th percentile 1.0%, max 3.0%",
        "  MoE: 1 runs, median |error| 20.0%, 90th percentile 20.0%, max 20.0%",
    ]
    show_kinds([{"moe": False, "error": 0.05, "ranked": True, "rank": 3, "tied": 3}])
    assert capsys.readouterr().out.endswith(", top 5 100% (tied 100%)\n")


def test_margins_count_the_misses_alone() -> None:
    """`margins` takes the ranked runs whose layout is not in the five best even tied (or not
    listed at all), each as how much faster the planner's first and fifth are priced."""
    miss = {
        "ranked": True,
        "tied": 7,
        "predicted": 100.0,
        "first_speed": 110.0,
        "fifth_speed": 102.0,
    }
    unlisted = {**miss, "tied": None, "fifth_speed": 95.0}
    rows = [miss, unlisted, {**miss, "tied": 5}, {**miss, "ranked": False}]
    assert margins(rows) == [pytest.approx((0.10, 0.02)), pytest.approx((0.10, -0.05))]


def test_older_releases_of_the_configurations_never_fitted_on(parts: tuple[list, list]) -> None:
    """The figures `newest` leaves out (older releases of the table's configurations, in neither
    part), but those fitted on before the table: today's bounds. Pricing the dropless alltoall's
    host waits (alltoall_sync_s) took their median from 5.1% to 4.9% and the 90th percentile
    from 20.2% to 17.2%; B300's network and the output layer's rate to 4.0% and 14.7%; the
    layouts NVIDIA ran DeepSeek-V3 with (DEEPSEEK_LAYOUTS) to 3.9% and 15.1%."""
    from bench.plan_calibration import superseded
    from bench.published_table import fitted_before

    runs = superseded()
    assert not {r.id for r in runs} & {r.id for r in parts[0] + parts[1]}
    assert not any(fitted_before(r) for r in runs)
    s = summary(table(dict(perf.VALUES), runs, ranked=False))
    assert s["runs"] == len(runs) >= 200
    assert s["median"] <= 0.045 and s["p90"] <= 0.155


def test_megatron_lms_a100_runs_with_what_each_ran(parts: tuple[list, list]) -> None:
    """Another GPU and generation of software, never fitted on: Megatron-LM's GPT 1.7B to 1T on
    32 to 3,072 A100s (April 2021), priced with what it ran (FP16, full recompute of every layer,
    no sequence parallelism nor distributed optimizer, its unfused attention, dropout 0.1), and
    JSC's GPT 13B and 175B on JUWELS Booster's 4-GPU A100 40 GB nodes (2023): each within 8%
    (-7.7% to +7.3%, median |error| 2.6%). Megatron-LM 2021's attention wrote every score to
    memory: priced as flash attention, GPT 1.7B to 18B come out 17-31% too fast."""
    from bench.plan_calibration import megatron_lm_a100

    runs = megatron_lm_a100()
    assert len(runs) == 12 and {r.gpu for r in runs} == {"a100", "a100-40g"}
    assert not {r.id for r in runs} & {r.id for r in parts[0] + parts[1]}  # outside the split
    rows = table(dict(perf.VALUES), runs, ranked=False)
    errors = [r["error"] for r in rows]
    assert max(map(abs, errors)) <= 0.08 and statistics.median(map(abs, errors)) <= 0.03
    assert A100_ERROR == {  # what `recipes plan` prints on A100s
        "runs": len(rows),
        "median": round(statistics.median(map(abs, errors)), 3),
        "max": round(max(map(abs, errors)), 3),
    }
    small = min(runs, key=lambda r: r.gpus)  # GPT 1.7B: attention is a third of its step
    flash = dataclasses.replace(small, overrides=[*small.overrides, "model.attention_backend=auto"])
    assert table(dict(perf.VALUES), [flash], ranked=False)[0]["error"] > 0.25


def test_tp_across_4_gpu_nodes_leaves_through_every_members_nic() -> None:
    """JSC's GPT 175B at TP 8 on JUWELS Booster spans two 4-GPU nodes per TP group; NCCL lays a
    ring channel per NIC, so each node's four members move TP's rings at four NICs' rate. Priced
    through one NIC (25 GB/s) the run comes out 17% slower than JSC measured (93.9 tokens/s/GPU
    over 430 iterations); through four, within 4%."""
    from bench.plan_calibration import megatron_lm_a100
    from config.cost.collectives import ring

    (run,) = [r for r in megatron_lm_a100() if r.id == "jube2310-gpt175b-juwels-bf16-384"]
    cfg, cluster = priced(run)
    assert cluster.gpus_per_node == 4 and cfg.parallel.tensor_model_parallel_size == 8
    nic = cluster.network * 1e9 * perf.VALUES["network"]
    assert ring(cluster, 8, 1, perf.VALUES) == pytest.approx(4 * nic)
    (row,) = table(dict(perf.VALUES), [run], ranked=False)
    assert abs(row["error"]) <= 0.05
    one_nic = dict(perf.VALUES, tp_exposed=perf.VALUES["tp_exposed"] * 4)  # TP's bytes at 1 NIC
    assert table(one_nic, [run], ranked=False)[0]["error"] < -0.12


@pytest.mark.xfail(strict=True, reason="issue 29's bounds on the held-out part are not met yet")
def test_the_issues_bounds_on_the_held_out_part(held_rows: list[dict]) -> None:
    held = summary(held_rows)
    assert held["median"] <= 0.05 and held["max"] <= 0.15 and held["top5"] >= 0.90


def test_layouts_of_one_run_are_ordered_as_measured(
    calibration_rows: list[dict], held_rows: list[dict]
) -> None:
    """Where NVIDIA published several layouts of one model on one cluster and precision, the
    predicted order against the measured one: today's mean Spearman, not to fall."""
    orders = layout_orders(calibration_rows + held_rows)
    assert len(orders) >= 45
    assert statistics.mean(rho for _, _, rho in orders) >= 0.5


def test_scaling_a_layout_to_more_gpus_loses_what_nvidia_measured(
    calibration_rows: list[dict], held_rows: list[dict], capsys: pytest.CaptureFixture[str]
) -> None:
    """One layout on 4x the GPUs or more (same model, GPU kind, precision and release): the
    predicted tokens/s/GPU of the largest run over the smallest against NVIDIA's, in log terms.
    Today's bounds, with the wait for the slowest GPU priced (gpu_speed_sigma): without it the
    calibration series were 1.2% off on average and the held-out ones 3.6%."""
    with capsys.disabled():
        print("\nscaling one layout (measured, predicted: largest over smallest run):")
        for rows in (calibration_rows, held_rows):
            for name, measured, predicted in scaling(rows):
                print(f"  {name}: {measured:.3f}, {predicted:.3f}")
    for rows, bound in ((calibration_rows, 0.010), (held_rows, 0.030)):
        errors = [abs(math.log(p / m)) for _, m, p in scaling(rows)]
        assert len(errors) >= 5 and statistics.mean(errors) <= bound


def test_a_lower_precision_gains_over_bf16_what_nvidia_measured(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Where NVIDIA ran one layout of one model on one cluster in one release in BF16 and in FP8
    (every priced row, either part or an older release: a ratio, out of which the error the two
    share cancels), the predicted gain against the measured one. Today's bounds: the dense
    models' gains are priced without a bias (81 pairs, mean -0.3%, mean |error| 3.0%); the MoE
    ones are overstated in every pair (9, +19.3% on average: Grok-1 on H100s 1.43x predicted,
    1.19x to 1.26x measured in four releases; DeepSeek-V3 MXFP8 on 256 GB300s 1.69x, 1.13x).
    Transformer Engine's FP8 grouped GEMM gains less over BF16 than the dense GEMMs the FP8
    fractions were fitted on. A fraction of its own, 0.85 of the dense one, was tried
    (2026-11-30) and not taken: refitted with the MoE constants alone it raised the calibration
    fit loss from 0.092 to 0.100, with every rate refitted it lowered it only to 0.090."""
    pairs = precisions(table(dict(perf.VALUES), load()[0], ranked=False))
    with capsys.disabled():
        show_precisions(pairs)
    dense, moe = gain_errors(pairs, moe=False), gain_errors(pairs, moe=True)
    assert len(dense) >= 80 and abs(statistics.mean(dense)) <= 0.01
    assert statistics.mean(map(abs, dense)) <= 0.032 and max(map(abs, dense)) <= 0.10
    assert len(moe) >= 9 and statistics.mean(moe) <= 0.20


def test_the_releases_moe_settings_are_priced_but_do_not_move_the_split() -> None:
    """Qwen3 235B-A22B on H100 ran the alltoall dispatcher overlapped from Megatron-Bridge 25.11,
    on GB200 HybridEP, and every Megatron-Bridge run Transformer Engine's fused loss: the runs
    carry MOE_SETTINGS' and `loss_settings`' overrides last (they win over the notes'), and the
    configuration the split hashes leaves them out. NeMo's runs before 25.07 (DGX Cloud's among
    them) carry no loss setting, Megatron-Core's fused loss, but DeepSeek-V3's from NeMo 25.04,
    whose performance script sets TE's."""
    from bench.published_table import moe_settings

    assert moe_settings("Qwen3 235B-A22B", "H100", "fp8_cs", 25.11) == [
        "model.moe_token_dispatcher_type=alltoall",
        "parallel.overlap_moe_expert_parallel_comm=true",
    ]
    assert moe_settings("Qwen3 235B-A22B", "H100", "fp8_cs", 25.09) == []
    assert moe_settings("Qwen3 235B-A22B", "GB200", "bf16", 26.02)[0].endswith("=flex")
    # 26.02's container had no DeepEP (the release's known issues): its H100 Qwen3 30B-A3B recipe's
    # DeepEP ran as the alltoall, as 25.11's; 26.02.01 on took HybridEP.
    qwen30 = [
        moe_settings("Qwen3 30B-A3B", "H100", "fp8_cs", r)[0] for r in (25.11, 26.02, 26.0201)
    ]
    assert [s.rsplit("=", 1)[1] for s in qwen30] == ["alltoall", "alltoall", "flex"]
    runs, _ = load()
    (h100,) = [r for r in runs if r.id == "mb2511-qwen3235ba22b-h100-fp8cs-256"]
    assert h100.overrides[-3:] == list(h100.settings) and len(h100.settings) == 3
    assert h100.settings[0] == "model.cross_entropy_fusion_impl=te"
    te = {r.id for r in runs if "model.cross_entropy_fusion_impl=te" in r.settings}
    assert {r.id for r in runs if r.software.startswith("Megatron-Bridge")} < te
    assert "dgxc250505-deepseekv3-h100-bf16-512" in te  # NeMo 25.04.01's DeepSeek-V3 script
    others = {r.id for r in runs if r.software.startswith("dgxc") and r.model != "DeepSeek-V3"}
    assert others and not others & te
    assert not set(h100.settings) & set(h100.config_key[-1])


def test_the_releases_recompute_is_priced_over_the_recipes_and_the_notes() -> None:
    """GPT-OSS 120B recomputes its norms and experts' activation in Megatron-Bridge's H100, B200
    and GB200 recipes only, and not in GB200's full-iteration MXFP8 from 26.06 (its workload base
    config's recompute_modules=[]: the row's note, read from the function's first assignment, says
    otherwise); DeepSeek-V3 on GB300 recomputes nothing from 26.06, on GB200 at 26.04 the dense
    layers' MLPs only. RECOMPUTE_SETTINGS win over the recipe here and the notes, outside the split."""
    from bench.published_table import priced, recompute_settings

    none = ["model.recompute_granularity=None", "model.recompute_modules=None"]
    assert recompute_settings("GPT-OSS 120B", "GB300", "bf16", 26.04) == none
    assert recompute_settings("GPT-OSS 120B", "GB200", "fp8_mx", 26.08) == none
    assert recompute_settings("GPT-OSS 120B", "GB200", "bf16", 26.0401)[1].endswith(
        "=layernorm,moe_act"
    )
    assert recompute_settings("Qwen3 235B-A22B", "GB200", "bf16", 26.04) == []
    runs = {r.id: r for r in load()[0]}
    expected = {
        "mb2608-gptoss120b-gb200-fp8mx-64": (None, None),
        "mb260401-gptoss120b-gb300-bf16-64": (None, None),
        "mb260401-gptoss120b-h100-bf16-64": ("selective", "layernorm,moe_act"),
        "mb2608-deepseekv3-gb300-fp8mx-256": (None, None),
        "mb2604-deepseekv3-gb200-fp8mx-256": ("selective", "mlp"),
        "mb2511-deepseekv3-gb300-bf16-256": ("selective", "moe_act"),
    }
    for run_id, recompute in expected.items():
        run = runs[run_id]
        m = priced(run)[0].model
        assert (m.recompute_granularity, m.recompute_modules) == recompute, run_id
        assert any(o.startswith("model.recompute_granularity=") for o in run.settings)
        assert run.overrides[-len(run.settings) :] == list(run.settings)


def test_nvidias_b300_runs_cross_nodes_at_a_400_gbit_nics_rate() -> None:
    """GPT-OSS 120B in BF16 at EP 64 over 8 nodes (Megatron-Bridge 26.02) ran 8,047 tokens/s/GPU
    on B200s and 8,359 on B300s. Priced on the network SYSTEMS gives NVIDIA's B300s (50 GB/s), the
    B300s gain what NVIDIA measured within 5%; on the data sheet's 800 Gb/s NICs, 30% more."""
    import dataclasses

    from bench.plan_calibration import evaluate
    from bench.published_table import TableRun, priced

    runs = {r.id: r for r in load()[0]}
    b200, b300 = runs["mb2602-gptoss120b-b200-bf16-64"], runs["mb2602-gptoss120b-b300-bf16-64"]
    assert priced(b300)[1].network == 50 and priced(b200)[1].network == 50
    sheet = dataclasses.replace(b300, network_gb_s=None)
    assert priced(sheet)[1].network == 100  # config/hardware.py's b300
    measured = b300.tokens_per_s_per_gpu / b200.tokens_per_s_per_gpu

    def gain(run: TableRun) -> float:
        k = dict(perf.VALUES)
        return evaluate(run, k, False)["predicted"] / evaluate(b200, k, False)["predicted"]

    assert abs(gain(b300) / measured - 1) <= 0.05
    assert gain(sheet) / measured > 1.3


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_grok_1s_experts_whole_on_each_gpu_gain_what_nvidia_measured(precision: str) -> None:
    """DGX Cloud's Grok-1 on 512 H100s kept TP 4, PP 8, CP 2, VPP 8 and EP 8 from v25.04.02 to
    v25.05.01 and set ETP 1 where Megatron-Core's default had split each expert over the TP 4
    ranks: 779.7 to 967.7 tokens/s/GPU in BF16 (+24.1%), 969.5 to 1,217.8 in FP8 (+25.6%). The
    model prices the step within 3 points (the v25.05.01 runs are held out)."""
    from bench.plan_calibration import evaluate
    from bench.published_table import priced

    runs = {r.id: r for r in load()[0]}
    before = runs[f"dgxc250402-grok1314b-h100-{precision}-512"]
    after = runs[f"dgxc250501-grok1314b-h100-{precision}-512"]
    assert before.layout == after.layout
    assert "parallel.expert_tensor_parallel_size=1" in after.overrides
    assert not any(o.startswith("parallel.expert_tensor_parallel_size") for o in before.overrides)
    assert priced(before)[0].parallel.expert_tensor_parallel_size in (None, 4)  # TP's
    k = dict(perf.VALUES)
    predicted = evaluate(after, k, False)["predicted"] / evaluate(before, k, False)["predicted"]
    measured = after.tokens_per_s_per_gpu / before.tokens_per_s_per_gpu
    assert abs(predicted - measured) <= 0.03


def test_interleaved_chunks_wait_on_the_dropless_alltoalls_host_syncs() -> None:
    """NVIDIA ran Qwen3 235B-A22B MXFP8 on 256 GPUs in Megatron-Bridge 26.02 on the dropless
    alltoall with 16 local experts: at PP 8 with 4 virtual stages on B300s, 2,691 tokens/s/GPU;
    at PP 8 without on B200s, 3,805. The B300 is the faster GPU: only the chunks' wait on the
    dispatcher's host sync (chunk_wait_s) orders them as measured (+13.4% and -2.9%, where the
    B300's was +68%); without virtual stages nothing waits."""
    runs = {r.id: r for r in load()[0]}
    chunks, plain = (
        runs["mb2602-qwen3235ba22b-b300-fp8mx-256"],
        runs["mb2602-qwen3235ba22b-b200-fp8mx-256"],
    )
    for run in (chunks, plain):  # 128 experts over EP 8: the wait's count, as its launches'
        cfg = priced(run)[0]
        assert layers.local_experts(cfg.model, cfg.parallel) == 16
    rows = {r["run"].id: r for r in table(dict(perf.VALUES), [chunks, plain], ranked=False)}
    assert rows[chunks.id]["predicted"] < rows[plain.id]["predicted"]
    assert all(abs(r["error"]) <= 0.15 for r in rows.values())
    no_wait = dict(perf.VALUES, chunk_wait_s=0.0)
    before = {r["run"].id: r for r in table(no_wait, [chunks, plain], ranked=False)}
    assert before[chunks.id]["predicted"] > 1.2 * before[plain.id]["predicted"]
    assert before[plain.id]["predicted"] == rows[plain.id]["predicted"]
