"""Sequence parallel on the CPU computes what TP without SP computes (Megatron-Core's own oracle).

The same tiny model, seed and samples train on 2 CPU processes with TP=2, once with
`parallel.sequence_parallel` off and once on, in FP32 so that only the order of the sums differs.
With SP, Megatron-Core's code path is the GPU one (training/cpu_mode.py): the norms (the local
spec's, models/norms.py `SequenceParallelTorchNorm`, as on GPUs without Transformer Engine and
for LoRA) and dropout run on sequence shards, the column-parallel linears all-gather the sequence and the row-parallel ones
reduce-scatter it over gloo, and the norms' partial weight gradients are summed over the TP group.
Measured: the losses and gradient norms agree to 1e-7 (dense and MLA: bit for bit). Norms whose
gradients were not summed over the TP group show at step 1 (LR 0 there, the weights are the same):
the gradient norm is 5e-5 off, and 1e-3 to 1e-2 by step 6.

The runs are planned with conftest's `Runs`: they train in the same launch as any other planned
2-process run of the session (test_engine_cpu.py's).
"""

from __future__ import annotations

import pytest

from tests.smoke.conftest import MLA, MOE, Planned, Runs, assert_same_training

pytestmark = pytest.mark.smoke

TP2 = ("parallel.tensor_model_parallel_size=2", "precision=fp32", "train.max_steps=6")
# LoRA: Megatron-Core's local layers on GPUs too (models/specs.py), adapters and frozen norms.
LORA = ("peft.scheme=lora", "peft.target_modules=linear_qkv,linear_proj,linear_fc1,linear_fc2")
VARIANTS = {"dense": (), "moe": MOE, "mla": MLA, "lora": LORA}
PLANNED = {
    f"sp_{variant}_{sp}": Planned(2, (*TP2, *extra, f"parallel.sequence_parallel={sp}"))
    for variant, extra in VARIANTS.items()
    for sp in ("false", "true")
}
# Megatron-Core's MoE layer refuses TP > 1 without SP: its oracle is the same batch split by DP.
PLANNED["sp_moe_false"] = Planned(2, (*TP2, *MOE, "parallel.tensor_model_parallel_size=1"))


@pytest.fixture(scope="module")
def planned(runs: Runs) -> Runs:
    runs.plan(PLANNED)
    return runs


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sequence_parallel_matches_tensor_parallel(planned: Runs, variant: str) -> None:
    off = planned.metrics(f"sp_{variant}_false")
    on = planned.metrics(f"sp_{variant}_true")
    assert_same_training(on, off, steps=6)
