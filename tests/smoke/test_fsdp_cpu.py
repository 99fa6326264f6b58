"""Megatron-FSDP (parallel.use_megatron_fsdp) trains what Megatron DDP trains: the oracle is
Megatron-Core's own DDP with the distributed optimizer, on the same tiny model, data and seed.

2 CPU processes (training/cpu_mode.py item 6 runs Megatron-FSDP over gloo), 6 steps each, for a
dense GPT at DP=2: losses and gradient norms agree to 5e-4. The two reduce gradients in another
order, and the rounding difference grows once the weights differ: measured on 2026-11-27 (torch
2.14.1), steps 1-4 agree to 1e-7, step 5's gradient norm to 3e-5 and step 6's to 1.9e-4. An
earlier session measured 7e-6 at step 6; the commit it landed gives 1.9e-4 in this session's
environment too, so the drift is not this code's. MoE layers the checker refuses with Megatron-FSDP
(config/rules/fsdp.py says what was measured).

`recipes export` reads the fsdp_dtensor checkpoint (its keys, FP32 main weights, SwiGLU's FC1
stored as two halves) into the same Hugging Face tensors as the Megatron DDP run's torch_dist
checkpoint: the same names, shapes and dtype (BF16), the values within 1% (measured: 0.4% at most, a norm weight after 6 steps; swapped
halves would differ by 100%). Exact resume of Megatron-FSDP's checkpoints is
tests/smoke/test_checkpoint.py's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.smoke.conftest import Planned, Runs, assert_same_training

pytestmark = pytest.mark.smoke

STEPS = ("train.max_steps=6",)
FSDP = "parallel.use_megatron_fsdp=true"
# The Megatron-FSDP run trains in a process of its own: once, right after the DDP run in the same
# process (tests/smoke/run_many.py), one rank aborted at its second step with glibc's "unaligned
# tcache chunk" (2 CPU ranks, machine loaded); alone it has not failed.
PLANNED = {"ddp_dense": Planned(2, STEPS)}


def _metrics(runs: Runs, name: str) -> list[dict]:
    if name == "fsdp_dense":
        return runs.metrics(name, 2, (*STEPS, FSDP))
    return runs.metrics(name)


@pytest.fixture(scope="module")
def planned(runs: Runs) -> Runs:
    runs.plan(PLANNED)
    return runs


def test_dense_matches_megatron_ddp(planned: Runs) -> None:
    fsdp, ddp = _metrics(planned, "fsdp_dense"), _metrics(planned, "ddp_dense")
    assert_same_training(fsdp, ddp, steps=6, rel=5e-4)


def _exported(runs: Runs, name: str, out: Path) -> dict[str, torch.Tensor]:
    from training.hf.exporter import export_hf

    export_hf(runs.root / name / "run" / "checkpoints", out)
    return {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_export_reads_the_fsdp_checkpoint_as_the_ddp_one(planned: Runs, tmp_path: Path) -> None:
    for name in ("fsdp_dense", "ddp_dense"):
        _metrics(planned, name)  # trains it, once
    fsdp = _exported(planned, "fsdp_dense", tmp_path / "fsdp")
    ddp = _exported(planned, "ddp_dense", tmp_path / "ddp")
    assert {k: (v.shape, v.dtype) for k, v in fsdp.items()} == {
        k: (v.shape, v.dtype) for k, v in ddp.items()
    }
    for name, tensor in ddp.items():
        scale = tensor.float().abs().max()
        assert (fsdp[name].float() - tensor.float()).abs().max() <= 0.01 * scale, name
