"""CPU activation offloading (model.cpu_offloading_num_layers): the checker's rules beyond
TransformerConfig's (tests/unit/config/test_rules_model_oracle.py holds those to Megatron-Core),
what the memory estimate keeps on the GPU, and what the step-time model charges for the copies."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.published_table import load
from config.cost import offload
from config.cost.constants import VALUES
from config.cost.memory import GIB, estimate_memory, layer_saved_bytes
from config.cost.steptime import layer_costs, predict
from config.hardware import GPUS, Cluster
from config.rules import derive, validate
from config.schema import TrainingConfig
from config.tree import apply_overrides
from tests.unit.config.test_validation import H100x8, llama_like

FIELD = "model.cpu_offloading_num_layers"
GH200x4 = Cluster(num_nodes=2, gpus_per_node=4, gpu="gh200")


def _cfg(*overrides: str) -> TrainingConfig:
    return apply_overrides(llama_like(), list(overrides))


def test_the_checker_refuses_offloading_without_transformer_engine() -> None:
    """Transformer Engine's hooks do the copies: LoRA's local layers and the CPU mode have none
    (Megatron-Core's TransformerBlock asserts), and the message names the field and the fix."""
    assert not validate(_cfg(f"{FIELD}=8"), H100x8)
    lora = validate(_cfg(f"{FIELD}=8", "peft.scheme=lora"), H100x8)
    assert [p.field for p in lora] == [FIELD]
    assert "Transformer Engine" in lora[0].message and f"{FIELD}=0" in lora[0].message
    cpu = Cluster(num_nodes=1, gpus_per_node=2, gpu="cpu")
    on_cpu = _cfg(f"{FIELD}=8", "parallel.tensor_model_parallel_size=1")
    assert FIELD in {p.field for p in validate(on_cpu, cpu)}


def test_megatron_core_refuses_what_the_checker_refuses_without_transformer_engine() -> None:
    """On the fake process group and the meta device (tests/support/megatron_build.py), LoRA's
    local layers with offloading: Megatron-Core refuses to build them as the checker does."""
    pytest.importorskip("torch")
    from tests.support import megatron_build

    cfg = _cfg(f"{FIELD}=8", "peft.scheme=lora")
    assert validate(cfg, H100x8)
    refused = megatron_build.refuses(cfg, H100x8)
    assert refused is not None and "Offloading" in refused, refused


@pytest.mark.parametrize("n", [1, 2, 8, 31])
def test_offloaded_layers_leave_the_gpu_but_one_in_transit(n: int) -> None:
    """n offloaded layers of 32 leave the activations of 32 - n layers and one more (the layer on
    its way to the host or back): what a 33 - n layer model holds without offloading."""
    cfg = _cfg(f"{FIELD}={n}")
    shorter = _cfg(f"model.num_layers={32 - n + 1}")
    ours = estimate_memory(cfg, H100x8, derive(cfg, H100x8))
    theirs = estimate_memory(shorter, H100x8, derive(shorter, H100x8))
    assert ours.activations_gib == pytest.approx(theirs.activations_gib)
    full = estimate_memory(llama_like(), H100x8, derive(llama_like(), H100x8))
    layer = layer_saved_bytes(cfg, derive(cfg, H100x8), False) / GIB
    assert full.activations_gib - ours.activations_gib == pytest.approx((n - 1) * layer)


def _offload_s(cfg: TrainingConfig, cluster: Cluster) -> float:
    step = predict(cfg, cluster, derive(cfg, cluster))
    assert step is not None
    return step.terms.get("offload", 0.0)


def test_copies_show_where_the_host_link_is_slower_than_the_next_layers_compute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Over PCIe (H100) an 8B layer's activations take longer to copy than the next layer's forward
    and backward: each offloaded layer costs the difference, so the cost grows with the layers.
    Over NVLink-C2C (GH200, 450 GB/s) the same copies hide behind the compute."""
    assert _offload_s(llama_like(), H100x8) == 0.0
    h100 = {n: _offload_s(_cfg(f"{FIELD}={n}"), H100x8) for n in (4, 8)}
    assert h100[4] > 0 and h100[8] == pytest.approx(2 * h100[4])
    cfg = _cfg(f"{FIELD}=8")
    d = derive(cfg, H100x8)
    costs = layer_costs(cfg, H100x8, d)
    copy = layer_saved_bytes(cfg, d, False) / (GPUS["h100"].host_gb_s * 1e9 * VALUES["host_link"])
    layer = costs.per_slot[0]  # one dense layer's forward and backward
    assert copy > 2 * layer / 3, "the example must be copy-bound both ways"
    assert h100[8] == pytest.approx(d.num_microbatches * 8 * (2 * copy - layer))
    gh200 = _cfg(f"{FIELD}=8", "parallel.tensor_model_parallel_size=4")
    assert _offload_s(gh200, GH200x4) == 0.0
    # The same GPU behind a PCIe Gen4 link: the copies show again.
    monkeypatch.setitem(GPUS, "gh200-pcie", replace(GPUS["gh200"], host_gb_s=31.5))
    assert _offload_s(gh200, replace(GH200x4, gpu="gh200-pcie")) > 0


def test_the_published_runs_that_offloaded_are_priced_with_it() -> None:
    """Megatron-Bridge's FSDP recipes on GB200/GB300 offload (bench/published_table.py
    OFFLOAD_SETTINGS): their rows carry the override, as a setting (outside the split's key)."""
    runs, _ = load()
    offloaded = {r.id: r for r in runs if any(FIELD in s for s in r.settings)}
    run = offloaded["mb260401-llama370b-gb200-fp8cs-64"]
    assert f"{FIELD}=40" in run.overrides
    assert all(FIELD not in str(r.config_key) for r in offloaded.values())
    assert all("use_megatron_fsdp=true" in " ".join(r.overrides) for r in offloaded.values())
    assert not any(FIELD in " ".join(r.overrides) for r in runs if r.system == "H100")


def test_offloaded_layers_split_dense_and_moe() -> None:
    """DeepSeek-V3's first three layers are dense: offloading five takes three dense, two MoE."""
    cfg = apply_overrides(
        llama_like(),
        ["model.num_moe_experts=8", "model.moe_first_k_dense_layers=3", f"{FIELD}=5"],
    )
    assert offload.offloaded_layers(cfg.model) == (3, 2)
    assert offload.offloaded_layers(llama_like().model) == (0, 0)
