"""Megatron-FSDP (parallel.use_megatron_fsdp) trains what Megatron DDP trains: the oracle is
Megatron-Core's own DDP with the distributed optimizer, on the same tiny model, data and seed.

2 CPU processes (training/cpu_mode.py item 6 runs Megatron-FSDP over gloo), 6 steps each:

- dense, DP=2: losses and gradient norms agree to 1e-4 (measured: 2e-5; the two reduce gradients
  in another order);
- MoE with EP=2 (the allgather dispatcher): to 5e-3 (measured: the gradient norm 0.17% apart at
  step 1, the losses 6e-5 at step 3; Megatron-FSDP reduces the expert gradients over its own
  expert mesh).

Exact resume of Megatron-FSDP's fsdp_dtensor checkpoints is tests/smoke/test_checkpoint.py's.
"""

from __future__ import annotations

import pytest

from tests.smoke.conftest import MOE, Planned, Runs, assert_same_training

pytestmark = pytest.mark.smoke

STEPS = ("train.max_steps=6",)
FSDP = "parallel.use_megatron_fsdp=true"
MOE_EP2 = (*MOE, "parallel.expert_model_parallel_size=2")
PLANNED = {
    "ddp_dense": Planned(2, STEPS),
    "fsdp_dense": Planned(2, (*STEPS, FSDP)),
    "ddp_moe": Planned(2, (*STEPS, *MOE_EP2)),
    "fsdp_moe": Planned(2, (*STEPS, *MOE_EP2, FSDP)),
}


@pytest.fixture(scope="module")
def planned(runs: Runs) -> Runs:
    runs.plan(PLANNED)
    return runs


def test_dense_matches_megatron_ddp(planned: Runs) -> None:
    fsdp, ddp = planned.metrics("fsdp_dense"), planned.metrics("ddp_dense")
    assert_same_training(fsdp, ddp, steps=6, rel=1e-4)


def test_moe_with_expert_parallel_matches_megatron_ddp(planned: Runs) -> None:
    fsdp, ddp = planned.metrics("fsdp_moe"), planned.metrics("ddp_moe")
    assert_same_training(fsdp, ddp, steps=6, rel=5e-3)
