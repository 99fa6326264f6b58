"""The data-parallel reduction's last bucket: what no backward is left to hide.

Megatron DDP reduces the gradients of the first pipeline stage's first chunk bucket by bucket
behind the backward, but the last bucket's reduce-scatter starts when the backward has ended, and
the first bucket's all-gather must end before the forward starts. Its buckets grow with the
data-parallel size (1M parameters per rank, at least 40M), so this exposed time does too, and
NCCL's ring adds a latency per step. Held against Megatron-Core's own bucket rule, and against
NVIDIA's Nemotron-4 15B runs, whose tokens per GPU fall as the same layout scales from 16 to 2,048
H100s.
"""

from __future__ import annotations

from functools import cache

import pytest

from bench.plan_calibration import evaluate
from bench.published_table import TableRun, load
from config.cost.collectives import ring_latency
from config.cost.constants import VALUES
from config.hardware import Cluster
from config.layout import ddp_bucket_size
from recipes.registry import resolve


@pytest.mark.parametrize("nodes", [1, 16, 128])
def test_buckets_are_megatron_cores_own(nodes: int) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig

    from tests.support.megatron_build import fake_world

    _, cfg = resolve(
        "llama3_8b_pretrain",
        [
            f"parallel.{name}_parallel_size=1"
            for name in ("tensor_model", "pipeline_model", "context")
        ],
    )
    cluster = Cluster(nodes, 8, "h100")
    ddp = DistributedDataParallelConfig(overlap_grad_reduce=True, use_distributed_optimizer=True)
    with fake_world(cfg, cluster):
        model = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)
        try:  # Megatron-Core sizes the buckets first; without a GPU it stops at the buffers
            DistributedDataParallel(model, ddp, torch.nn.Linear(8, 8))
        except RuntimeError:
            pass
    assert ddp.bucket_size == ddp_bucket_size(cluster.world_size)


def test_ring_latency_is_nccls_step_count() -> None:
    k = VALUES
    one_node = Cluster(1, 8, "h100")
    assert ring_latency(one_node, 8, 1, k) == pytest.approx(
        k["ring_base_s"] + 7 * k["ring_step_nvlink_s"]
    )
    # 64 ranks two apart (TP 2) on 16 nodes: 4 on each node, 3 NVLink steps there, 15 network.
    many = Cluster(16, 8, "h100")
    assert ring_latency(many, 64, 2, k) == pytest.approx(
        k["ring_base_s"] + 48 * k["ring_step_nvlink_s"] + 15 * k["ring_step_network_s"]
    )


# NVIDIA's DGX Cloud benchmarks, v25.04.02 (bench/data/published_perf.csv): Nemotron-4 15B FP8,
# TP 2, MBS 2, 4 microbatches per rank at every size (the global batch grows with the GPUs).
SMALL, LARGE = "dgxc250402-nemotron415b-h100-fp8-16", "dgxc250402-nemotron415b-h100-fp8-2048"


@cache
def table_run(run_id: str) -> TableRun:
    runs, _ = load()
    return next(r for r in runs if r.id == run_id)


def tokens(run_id: str, **constants: float) -> tuple[float, float]:
    """(published, predicted) tokens/s per GPU of a row of the table, as the calibration prices it."""
    run = table_run(run_id)
    row = evaluate(run, {**VALUES, **constants}, ranked=False)
    return run.tokens_per_s_per_gpu, row["predicted"]


def test_the_exposed_bucket_grows_with_the_data_parallel_size_as_nvidia_measured() -> None:
    (small, small_predicted), (large, large_predicted) = tokens(SMALL), tokens(LARGE)
    published, predicted = large / small - 1, large_predicted / small_predicted - 1  # -5.3%
    _, bandwidth_only = tokens(LARGE, **dict.fromkeys(LATENCIES, 0.0))
    assert large_predicted < bandwidth_only  # NCCL's latency adds to the bucket's bytes
    # Priced by bandwidth alone, all of it hidden behind the backward, the model gained 0.3%
    # between these sizes (before config/layout.py's buckets reached it); it now loses 2.0% of
    # the 5.3% measured: the larger part of what is left grows with the size too, unpriced.
    assert published < predicted < published / 3


LATENCIES = ("ring_base_s", "ring_step_nvlink_s", "ring_step_network_s")
