"""The output layer in the step-time model: Megatron-Core's one BF16 GEMM of tokens x hidden x
vocabulary / TP (a plain ColumnParallelLinear, not a Transformer Engine layer, so BF16 whatever
the recipe) is priced at gemm_bf16's fraction of the BF16 peak on every GPU, Blackwell too, where
a layer's BF16 GEMMs take gemm_bf16_blackwell. How that was chosen against NVIDIA's published runs
is in config/cost/constants.py (gemm_bf16) and BENCHMARKS.md; the held-out bounds that hold it are
tests/unit/config/test_plan_heldout.py's."""

from __future__ import annotations

import pytest

from config.cost import steptime as perf
from config.hardware import Cluster
from config.rules import derive
from recipes.registry import resolve

VALUES = dict(perf.VALUES)


def _costs(gpu: str, k: dict[str, float], *overrides: str) -> perf.LayerCosts:
    recipe, cfg = resolve("deepseek_v3_pretrain", ["parallel.pipeline_model_parallel_size=16",
                                                   "parallel.expert_model_parallel_size=8",
                                                   *overrides])  # fmt: skip
    cluster = Cluster(num_nodes=32, gpus_per_node=8, gpu=gpu)
    return perf.layer_costs(cfg, cluster, derive(cfg, cluster), k)


@pytest.mark.parametrize("gpu", ["b200", "gb200", "b300", "h100"])
def test_the_output_gemm_runs_at_gemm_bf16_on_every_gpu(gpu: str) -> None:
    base = _costs(gpu, VALUES)
    # Blackwell's whole-layer BF16 fraction moves the layers' BF16 GEMMs (the router), not it
    other = _costs(gpu, {**VALUES, "gemm_bf16_blackwell": VALUES["gemm_bf16_blackwell"] / 2})
    assert other.output["gemm"] == pytest.approx(base.output["gemm"])
    # gemm_bf16 sets it: half the fraction, twice the seconds
    half = _costs(gpu, {**VALUES, "gemm_bf16": VALUES["gemm_bf16"] / 2})
    assert half.output["gemm"] == pytest.approx(2 * base.output["gemm"])


def test_the_output_gemm_is_bf16_whatever_the_recipe() -> None:
    bf16 = _costs("gb200", VALUES, "precision=bf16_mixed")
    mxfp8 = _costs("gb200", VALUES, "precision=bf16_with_mxfp8_mixed")
    assert mxfp8.output["gemm"] == pytest.approx(bf16.output["gemm"])
    assert mxfp8.moe["gemm"] < bf16.moe["gemm"]  # while the layers' GEMMs run in MXFP8
