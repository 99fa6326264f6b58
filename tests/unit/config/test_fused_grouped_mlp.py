"""Transformer Engine's fused grouped MLP of the experts (model.moe_fused_grouped_mlp): what the
checker asks of it, where Megatron-Core would ignore it without a word, and what the step-time
model and the published table make of it."""

from __future__ import annotations

import pytest

from bench.published_table import load
from config.cost.constants import KERNELS_PER_LAYER, VALUES
from config.cost.steptime import predict
from config.hardware import Cluster
from config.rules import derive, validate
from config.schema import TrainingConfig
from config.tree import apply_overrides
from recipes.shrink import cpu_substitutes
from tests.unit.config.test_validation import H100x8, llama_like, moe_like

FIELD = "model.moe_fused_grouped_mlp"
GB200x8 = Cluster(num_nodes=2, gpus_per_node=4, gpu="gb200")
FUSED = [f"{FIELD}=true", "model.moe_grouped_gemm=true", "parallel.expert_tensor_parallel_size=1"]


def _cfg(*overrides: str) -> TrainingConfig:
    return apply_overrides(moe_like(), [*FUSED, *overrides])


def _messages(cfg: TrainingConfig, cluster: Cluster = GB200x8) -> list[str]:
    return [p.message for p in validate(cfg, cluster) if p.field == FIELD]


def test_a_blackwell_moe_run_with_grouped_gemms_may_fuse_its_experts() -> None:
    assert not validate(_cfg(), GB200x8)
    assert not validate(_cfg("model.activation=quick_geglu"), GB200x8)


@pytest.mark.parametrize(
    ("overrides", "cluster", "says"),
    [
        (["model.moe_grouped_gemm=false"], GB200x8, "model.moe_grouped_gemm=true"),
        (["parallel.expert_tensor_parallel_size=2"], GB200x8, "expert_tensor_parallel_size=1"),
        (["model.activation=geglu"], GB200x8, "swiglu or quick_geglu"),
        (["peft.scheme=lora"], GB200x8, "LoRA"),
        ([], H100x8, "Blackwell"),
    ],
)
def test_the_checker_names_what_the_fused_op_needs(
    overrides: list[str], cluster: Cluster, says: str
) -> None:
    """Each refusal names the field, what the op needs, the fix, and the way out (set it false)."""
    messages = _messages(_cfg(*overrides), cluster)
    assert len(messages) == 1 and says in messages[0], messages
    assert "set it false" in messages[0]


def test_a_model_without_experts_has_nothing_to_fuse() -> None:
    cfg = apply_overrides(llama_like(), [f"{FIELD}=true"])
    messages = _messages(cfg)
    assert len(messages) == 1 and "no experts" in messages[0]


def test_the_cpu_runs_without_it() -> None:
    """The CPU mode builds Megatron-Core's local layers: the checker refuses the field there, and
    --shrink turns it off with a line that says so."""
    cpu = Cluster(num_nodes=1, gpus_per_node=2, gpu="cpu")
    cfg = _cfg("parallel.tensor_model_parallel_size=1", "parallel.expert_model_parallel_size=2")
    assert any("CPU" in m for m in _messages(cfg, cpu))
    changes = cpu_substitutes(cfg)
    assert not cfg.model.moe_fused_grouped_mlp
    assert any(c.startswith(f"{FIELD}: True -> False (") for c in changes)


def test_megatron_core_would_ignore_it_on_its_local_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the checker refuses it without Transformer Engine: on the fake process group and the
    meta device (tests/support/megatron_build.py), Megatron-Core builds LoRA's local layers with
    the field on and no word, and its experts are the unfused SequentialMLP."""
    pytest.importorskip("torch")
    from tests.support import megatron_build

    # The build sets it for the fused kernel; put back whatever the process had.
    monkeypatch.setenv("NVTE_CUTEDSL_FUSED_GROUPED_MLP", "0")

    cfg = _cfg("peft.scheme=lora", "model.num_layers=2")
    assert megatron_build.refuses(cfg, H100x8) is None
    built = megatron_build.build(cfg, H100x8)
    kinds = {type(m).__name__ for chunk in built[0] for m in chunk.modules()}
    assert "SequentialMLP" in kinds and "TEGroupedMLP" not in kinds


def test_the_fused_experts_are_priced_faster_and_only_the_experts() -> None:
    """The fused op runs narrow experts nearer the dense rate (expert_half_dim_fused) in one
    kernel for all of them: the step's GEMM time falls, and its launches by one cuBLAS GEMM per
    local expert and GEMM (six a layer); nothing else moves."""
    plain, fused = _cfg(f"{FIELD}=false"), _cfg()
    slow = predict(plain, GB200x8, derive(plain, GB200x8))
    fast = predict(fused, GB200x8, derive(fused, GB200x8))
    assert slow is not None and fast is not None
    assert fast.terms["gemm"] < slow.terms["gemm"]
    m, e = plain.model, plain.parallel.expert_model_parallel_size
    launches = 6 * m.num_moe_experts // e * VALUES["layer_overhead_s"] / KERNELS_PER_LAYER
    per_layer = (slow.terms["overhead"] - fast.terms["overhead"]) / launches
    layer_microbatches = m.num_layers * derive(plain, GB200x8).num_microbatches  # all MoE, PP 1
    assert per_layer == pytest.approx(layer_microbatches)
    for term, seconds in slow.terms.items():
        if term not in ("gemm", "overhead", "straggler"):  # the straggler: a share of compute
            assert fast.terms[term] == pytest.approx(seconds), term


def test_the_published_runs_that_fused_their_experts_are_priced_with_it() -> None:
    """Megatron-Bridge's MXFP8 MoE runs on Blackwell from 26.06 fuse the experts (bench/
    published_table.py FUSED_SETTINGS): their rows carry the override as a setting, outside the
    split's key; no H100 row and no earlier release does."""
    runs, _ = load()
    fused = {r.id: r for r in runs if f"{FIELD}=true" in r.settings}
    assert "mb2608-qwen330ba3b-gb200-fp8mx-8" in fused
    assert "mb260401-qwen330ba3b-gb200-fp8mx-8" not in fused
    assert all(FIELD not in str(r.config_key) for r in fused.values())
    assert all(r.system != "H100" and r.precision == "fp8_mx" for r in fused.values())
    assert all(r.release >= 26.06 for r in fused.values())
