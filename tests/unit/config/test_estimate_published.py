"""The memory estimate on the layouts NVIDIA published for H100 (tests/support/published_runs.py,
written out in tests/unit/config/test_estimate.py's PUBLISHED): each ran on 80 GB H100s, so each is
predicted to fit, and each gets Megatron-Bridge's pipeline layout."""

from __future__ import annotations

import copy

import pytest

from config.cost.memory import estimate_memory
from config.finalize import finalize
from config.hardware import Cluster
from config.rules import derive
from tests.unit.config.test_estimate import H100_GIB, PUBLISHED, estimate


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_runs_fit_on_h100(name: str) -> None:
    cfg, gpus = PUBLISHED[name]
    mem = estimate(cfg, gpus)
    assert mem is not None
    assert mem.total_gib < H100_GIB, mem
    assert mem.total_gib > 0.6 * H100_GIB, mem  # they were tuned to use the memory, not idle


def test_published_bf16_variants_fit_too() -> None:
    """The same layouts in plain BF16, as the catalog's base recipes run them."""
    for name in ("llama3_70b", "llama31_405b", "qwen3_30b_a3b"):
        cfg, gpus = copy.deepcopy(PUBLISHED[name])
        cfg.precision = "bf16_mixed"
        assert estimate(cfg, gpus).total_gib < H100_GIB, name


def test_405b_uses_the_uneven_layout() -> None:
    cfg, gpus = PUBLISHED["llama31_405b"]
    cluster = Cluster(num_nodes=128, gpus_per_node=8)
    derived = derive(cfg, cluster)
    assert derived.pipeline_layout == "Et|(tt|)*62tL"
    mem = estimate_memory(cfg, cluster, derived)
    # Rank 0's first chunk holds the embedding in place of a layer (15 layers); rank 1 holds 16
    # and keeps (PP - 2) x 2 + (VPP - 1) x PP + 1 = 69 chunk-microbatches = 8.625 microbatches.
    assert mem.pipeline_rank == 1 and mem.microbatches_in_flight == 69 / 8


def test_deepseek_v3_gets_the_published_layout() -> None:
    cfg, _ = PUBLISHED["deepseek_v3"]
    derived = finalize(cfg, Cluster(num_nodes=128, gpus_per_node=8))
    assert derived.pipeline_layout == "Et|(tt|)*30mL"  # Megatron-Bridge's DeepSeek-V3 H100 layout
