"""Context parallel's batches: the ranks of a CP group read one replica's samples and each takes
its part of every sequence, Megatron-Core's zigzag split (models/gpt.py on_this_cp_rank). Until
2026-11-28 each CP rank read other samples (the data-parallel rank counted CP) and fed the whole
sequence to a model whose attention expects its part: nothing failed, the model trained on garbled
attention. Every rank of a 16-rank world (TP 2, CP 2, PP 2, DP 2) on torch's fake process group,
with Megatron-Core's parallel state set up as the engine sets it up (tests/support/megatron_build.py);
CP itself runs only where Transformer Engine does (tests/gpu/test_gpu.py compares it with one GPU)."""

from __future__ import annotations

from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from megatron.core import parallel_state  # noqa: E402

from config.hardware import Cluster  # noqa: E402
from config.tree import apply_overrides  # noqa: E402
from models.gpt import on_this_cp_rank  # noqa: E402
from recipes.registry import resolve  # noqa: E402
from tests.support.megatron_build import fake_world  # noqa: E402
from training.distributed import replica_rank  # noqa: E402

SEQ, ROWS = 16, 2
LAYOUT = [
    "parallel.tensor_model_parallel_size=2",
    "parallel.sequence_parallel=true",
    "parallel.context_parallel_size=2",
    "parallel.pipeline_model_parallel_size=2",
    f"model.seq_length={SEQ}",
    "train.global_batch_size=4",
    "train.micro_batch_size=1",
]


def _batch() -> dict:
    tokens = torch.arange(ROWS * SEQ).view(ROWS, SEQ)
    return {
        "tokens": tokens,
        "labels": tokens + 1000,
        "loss_mask": torch.ones(ROWS, SEQ),
        "position_ids": torch.arange(SEQ).expand(ROWS, SEQ),
    }


def test_a_cp_group_reads_one_replica_and_splits_each_sequence_zigzag() -> None:
    _, cfg = resolve("tiny_gpt_pretrain", [])
    cfg = apply_overrides(cfg, LAYOUT)
    cluster = Cluster(num_nodes=2, gpus_per_node=8, gpu="h100")
    full = _batch()
    parts: dict[tuple[int, int, int], list[list[int]]] = defaultdict(list)  # (replica, tp, pp)
    for rank in range(16):
        with fake_world(cfg, cluster, rank):
            key = (
                replica_rank(),
                parallel_state.get_tensor_model_parallel_rank(),
                parallel_state.get_pipeline_model_parallel_rank(),
            )
            cp = parallel_state.get_context_parallel_world_size()
            cp_rank = parallel_state.get_context_parallel_rank()
            mine = on_this_cp_rank(full)
        assert cp == 2 and key[0] in (0, 1)
        chunk = SEQ // (2 * cp)  # rank r: chunks r and 2 x CP - 1 - r
        expected = [*range(cp_rank * chunk, (cp_rank + 1) * chunk)]
        expected += [*range((2 * cp - 1 - cp_rank) * chunk, (2 * cp - cp_rank) * chunk)]
        for row in range(ROWS):
            assert mine["position_ids"][row].tolist() == expected
            assert mine["tokens"][row].tolist() == [row * SEQ + p for p in expected]
            assert mine["labels"][row].tolist() == [row * SEQ + p + 1000 for p in expected]
        assert mine["loss_mask"].shape == (ROWS, SEQ // cp)
        parts[key].append(expected)
    # The batch the ranks were handed is whole: every model chunk of a rank reads it again.
    assert full["tokens"].shape == (ROWS, SEQ) and torch.equal(
        full["position_ids"][0], torch.arange(SEQ)
    )
    # Each replica's (TP, PP) position has its two CP ranks, which cover the sequence once.
    assert len(parts) == 2 * 2 * 2
    for halves in parts.values():
        assert sorted(p for half in halves for p in half) == list(range(SEQ))


def test_without_cp_the_batch_is_the_whole_batch() -> None:
    _, cfg = resolve("tiny_gpt_pretrain", [])
    cfg = apply_overrides(cfg, [f"model.seq_length={SEQ}", "parallel.tensor_model_parallel_size=2"])
    full = _batch()
    with fake_world(cfg, Cluster(num_nodes=1, gpus_per_node=2, gpu="h100"), 1):
        assert replica_rank() == 0
        assert on_this_cp_rank(full) is full
