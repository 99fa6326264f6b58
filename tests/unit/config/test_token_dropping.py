"""Token dropping (model.moe_expert_capacity_factor, model.moe_pad_expert_input_to_capacity): what
the checker refuses of it (held against Megatron-Core in test_rules_moe_oracle.py), and how the
step time and the memory estimate price an expert's capacity. The engine's padded path trains as
the dropless one where nothing is dropped (tests/smoke/test_engine_cpu.py)."""

from __future__ import annotations

import pytest

from config.cost import layers
from config.cost import steptime as perf
from config.cost.memory import estimate_memory
from config.hardware import Cluster
from config.rules import derive, validate
from recipes.registry import resolve

QWEN3 = "qwen3_30b_a3b_pretrain"
H100x16 = Cluster(num_nodes=2, gpus_per_node=8, gpu="h100")
FACTOR, PAD = "model.moe_expert_capacity_factor", "model.moe_pad_expert_input_to_capacity"


def _fields(overrides: list[str]) -> set[str]:
    _, cfg = resolve(QWEN3, overrides)
    return {p.field for p in validate(cfg, H100x16)}


def test_padding_needs_a_capacity_and_a_backend_that_pads() -> None:
    assert PAD in _fields([f"{PAD}=true"])
    assert PAD not in _fields([f"{FACTOR}=1.0", f"{PAD}=true"])
    deepep = ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep"]
    assert PAD in _fields([f"{FACTOR}=1.0", f"{PAD}=true", *deepep])
    assert FACTOR in _fields(
        [
            f"{FACTOR}=1.0",
            "model.moe_router_load_balancing_type=sinkhorn",
            "model.moe_aux_loss_coeff=0",
        ]
    )
    _, cfg = resolve(QWEN3, [f"{PAD}=true"])
    (problem,) = [p for p in validate(cfg, H100x16) if p.field == PAD]
    assert "moe_expert_capacity_factor" in problem.message and "1.0" in problem.message


def _moe(overrides: list[str]) -> tuple[dict[str, float], float]:
    """(an MoE layer's seconds by term, the activations' GiB) of Qwen3 30B-A3B on 16 H100s."""
    _, cfg = resolve(QWEN3, overrides)
    d = derive(cfg, H100x16)
    return perf.layer_costs(cfg, H100x16, d).moe, estimate_memory(cfg, H100x16, d).activations_gib


@pytest.mark.parametrize(
    ("factor", "pad", "share"),
    [(None, False, 1.0), (1.0, True, 1.0), (1.5, True, 1.5), (1.5, False, 1.0), (0.5, False, 0.5)],
)
def test_the_experts_compute_and_send_what_their_capacity_holds(
    factor: float | None, pad: bool, share: float
) -> None:
    """Padded, each expert computes and receives its capacity (factor x its even share of the
    tokens); unpadded, what exceeds the capacity is dropped, which even routing reaches only
    below a factor of 1."""
    overrides = [f"{FACTOR}={factor}" if factor else f"{FACTOR}=null", f"{PAD}={str(pad).lower()}"]
    _, cfg = resolve(QWEN3, overrides)
    assert layers.expert_share(cfg.model) == share
    dropless, dropless_gib = _moe([])
    moe, gib = _moe(overrides)
    assert dropless["ep"] > 0 and moe["ep"] == pytest.approx(
        share * dropless["ep"]
    )  # the exchange moves what is kept
    assert (moe["gemm"] > dropless["gemm"]) == (share > 1)
    assert (moe["gemm"] < dropless["gemm"]) == (share < 1)
    assert (gib > dropless_gib) == (share > 1) and (gib < dropless_gib) == (share < 1)
