"""model.recompute_modules: Megatron-Core's selective recompute, module by module, in the checker,
the memory estimate, the step-time model and the planner.

The checker's verdicts are held to Megatron-Core's TransformerConfig by the oracle tests
(test_rules_model_oracle.py, test_rules_moe_oracle.py) and the numbers of a recomputed run to a run
without recompute by tests/smoke/test_recompute_cpu.py. Here: the messages, what each module frees
and costs, NVIDIA's published choice of modules, and the planner's use of them.
"""

from __future__ import annotations

import copy

import pytest

from config.cost.memory import estimate_memory
from config.cost.steptime import predict
from config.hardware import Cluster
from config.rules import derive, validate
from config.schema import TrainingConfig
from config.tree import apply_overrides
from recipes.advice.check import check
from recipes.advice.plan import overrides, plan
from recipes.registry import resolve
from tests.unit.config.test_validation import H100x8, llama_like

H100x1024 = Cluster(num_nodes=128, gpus_per_node=8, gpu="h100")
SELECTIVE = "model.recompute_granularity=selective"


def _messages(cfg: TrainingConfig, extra: list[str]) -> list[str]:
    apply_overrides(cfg, extra)
    return [p.message for p in validate(cfg, H100x8) if p.field == "model.recompute_modules"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["model.recompute_modules=mlp"], "set model.recompute_granularity=selective"),
        ([SELECTIVE, "model.recompute_modules=mlpp"], "Did you mean 'mlp'?"),
        ([SELECTIVE, "model.recompute_modules=mla_up_proj"], "drop mla_up_proj"),
        ([SELECTIVE, "model.recompute_modules=moe_act"], "this model has no experts"),
        ([SELECTIVE, "model.recompute_modules=,"], "names no module"),
        (
            [
                SELECTIVE,
                "model.recompute_modules=layernorm",
                "precision=bf16_with_fp8_delayed_scaling_mixed",
            ],
            "FP8 delayed scaling",
        ),
    ],
)
def test_refusals_name_the_field_and_the_fix(extra: list[str], expected: str) -> None:
    messages = _messages(llama_like(), extra)
    assert any(expected in m for m in messages), messages


def test_moe_act_needs_grouped_gemms() -> None:
    _, cfg = resolve("qwen3_30b_a3b_pretrain", [])
    cfg.model.moe_grouped_gemm = False
    messages = _messages(cfg, [SELECTIVE, "model.recompute_modules=moe_act"])
    assert any("model.moe_grouped_gemm=true" in m for m in messages), messages
    cfg.model.moe_grouped_gemm = True
    assert _messages(cfg, []) == []


def _activations(recipe: str, extra: list[str], cluster: Cluster) -> float:
    _, cfg = resolve(recipe, extra)
    return estimate_memory(cfg, cluster, derive(cfg, cluster)).activations_gib


NONE = ["model.recompute_granularity=None", "model.recompute_modules=None"]


def test_what_each_module_frees() -> None:
    dense = "llama3_8b_pretrain"
    kept = _activations(dense, NONE, H100x8)
    # The fused attention kernel keeps no scores, and TE fuses a dense layer's norms into its
    # next GEMM: neither frees anything. The MLP does.
    for module in ("core_attn", "layernorm"):
        assert _activations(dense, [SELECTIVE, f"model.recompute_modules={module}"], H100x8) == kept
    assert _activations(dense, [SELECTIVE, "model.recompute_modules=mlp"], H100x8) < 0.6 * kept
    # DeepSeek-V3: MLA's up projections, the norms that stand alone, the experts' activation;
    # the whole MoE layer frees at least its activation and shared experts.
    moe = "deepseek_v3_pretrain_1024gpu_h100_fp8sc"
    kept = _activations(moe, NONE, H100x1024)
    freed = {
        modules: kept - _activations(moe, [f"model.recompute_modules={modules}"], H100x1024)
        for modules in ("mla_up_proj", "layernorm", "moe_act", "shared_experts", "moe")
    }
    assert all(v > 0 for v in freed.values()), freed
    assert freed["moe"] > freed["moe_act"] + freed["shared_experts"]


def test_the_published_deepseek_layout_needs_its_recompute() -> None:
    """NVIDIA's DeepSeek-V3 H100 run recomputes mla_up_proj and mlp on TP2 PP8 VP4 EP64: the
    recipe, as published, fits; in BF16 without recompute it does not."""
    name = "deepseek_v3_pretrain"
    _, cfg = resolve(name, [])
    assert (cfg.model.recompute_granularity, cfg.model.recompute_modules) == (
        "selective",
        "mla_up_proj,mlp",
    )
    assert check(cfg, H100x1024).fits
    _, bare = resolve(name, NONE)
    assert not check(bare, H100x1024).fits


def test_each_module_costs_its_forward_again() -> None:
    name = "deepseek_v3_pretrain_1024gpu_h100_fp8sc"

    def seconds(extra: list[str]) -> float:
        _, cfg = resolve(name, extra)
        return predict(cfg, H100x1024, derive(cfg, H100x1024)).seconds

    none = seconds(NONE)
    cost = {
        m: seconds([f"model.recompute_modules={m}"]) - none
        for m in ("core_attn", "mla_up_proj", "layernorm", "moe_act", "shared_experts", "moe")
    }
    assert all(v > 0 for v in cost.values()), cost
    # Output-discarding modules redo little; the whole MoE layer redoes its experts' GEMMs.
    assert cost["moe"] > 5 * max(cost["layernorm"], cost["moe_act"], cost["mla_up_proj"])
    both = seconds(["model.recompute_modules=moe_act,moe"]) - none
    assert both == pytest.approx(cost["moe"])  # the MoE layer's recompute covers its activation


def test_the_planner_recomputes_modules_where_they_fit_best() -> None:
    _, cfg = resolve("deepseek_v3_pretrain_1024gpu_h100_fp8sc", [])
    plans, _ = plan(cfg, H100x1024, top=5)
    chosen = {dict(o.split("=", 1) for o in p.overrides)["model.recompute_modules"] for p in plans}
    assert "mla_up_proj,layernorm,moe_act" in chosen, chosen
    for p in plans:  # every plan, as the dotlist it prints, passes `check` and fits
        _, trial = resolve("deepseek_v3_pretrain_1024gpu_h100_fp8sc", p.overrides)
        assert overrides(trial) == p.overrides
        report = check(trial, H100x1024)
        assert report.valid and report.fits, (p.overrides, report.problems)


def test_check_shows_the_recompute_and_suggests_recompute_that_applies_as_printed() -> None:
    """What `check` suggests changes the recompute modules with the granularity (full recompute
    or none refuses the selective ones): every suggestion, applied as printed, passes `check`."""
    from recipes.advice.check import render

    _, cfg = resolve("deepseek_v3_pretrain", [])
    assert "recompute selective: mla_up_proj,mlp" in render(check(cfg, H100x1024)).splitlines()
    small = Cluster(num_nodes=128, gpus_per_node=8, gpu="a100-40g")
    report = check(cfg, small)
    assert report.exit_code == 3 and report.fixes
    for fix in report.fixes:
        words = fix.split("  (predicted", 1)[0].split()
        assert words[0] != "--nodes", fix  # it fits on these nodes
        trial = apply_overrides(copy.deepcopy(cfg), words)
        if trial.model.recompute_granularity != "selective":
            assert "model.recompute_modules=None" in words, fix
        assert check(trial, small, suggest_fixes=False).exit_code == 0, fix
