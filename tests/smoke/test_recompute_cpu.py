"""Selective recompute of Megatron-Core's modules changes no number (its own oracle: the run that
keeps every activation).

The same tiny MLA + MoE model (a dense first layer, shared experts; TP=2 with SP, FP32) trains on 2
CPU processes three times: without recompute, recomputing the output-discarding modules and the
MLPs (`mla_up_proj,layernorm,mlp,shared_experts`), and recomputing whole MoE layers (`moe`). A
recomputed forward must rebuild exactly what the first forward computed, so the losses and gradient
norms agree to 1e-6. (moe_act needs grouped GEMMs, which need a GPU.) layernorm runs through
training/cpu_mode.py's no-FP8 answers for Transformer Engine (item 5 there).
"""

from __future__ import annotations

import pytest

from tests.smoke.conftest import MLA, MOE, Planned, Runs, assert_same_training

pytestmark = pytest.mark.smoke

BASE = (
    "parallel.tensor_model_parallel_size=2",
    "parallel.sequence_parallel=true",
    "precision=fp32",
    "train.max_steps=6",
    *MLA,
    *MOE,
    "model.moe_shared_expert_intermediate_size=64",
    "model.moe_first_k_dense_layers=1",
)
MODULES = {"light": "mla_up_proj,layernorm,mlp,shared_experts", "moe": "moe"}
PLANNED = {"recompute_none": Planned(2, BASE)} | {
    f"recompute_{name}": Planned(
        2, (*BASE, "model.recompute_granularity=selective", f"model.recompute_modules={modules}")
    )
    for name, modules in MODULES.items()
}


@pytest.fixture(scope="module")
def planned(runs: Runs) -> Runs:
    runs.plan(PLANNED)
    return runs


@pytest.mark.parametrize("name", sorted(MODULES))
def test_selective_recompute_matches_no_recompute(planned: Runs, name: str) -> None:
    off = planned.metrics("recompute_none")
    on = planned.metrics(f"recompute_{name}")
    assert_same_training(on, off, steps=6)
