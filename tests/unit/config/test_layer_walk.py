"""config/cost/layers.py `walk`: the one walk over a pipeline layout that the memory estimate and the
step-time model both price, so that a layer one counts is a layer the other times."""

from __future__ import annotations

from config import layout
from config.cost.layers import rank_loads, walk


def test_walk_gives_each_slot_its_rank_stage_kind_and_recompute() -> None:
    """PP 2 x VPP 2, two dense layers then MoE, an MTP layer, block recompute of each chunk's
    first layer: chunk i is virtual stage i // PP of rank i % PP, as Megatron-Core numbers them."""
    chunks = layout.parse("Et|tt|tm|tL")
    slots = list(walk(chunks, 2, 2, 5, ("full", "block", 1)))
    assert slots == [
        (0, 0, "E", False, False),
        (0, 0, "t", False, True),  # layer 0, dense, first of its chunk
        (1, 0, "t", False, True),  # layer 1
        (1, 0, "t", True, False),  # layer 2: the first MoE layer, second of its chunk
        (0, 1, "t", True, True),  # layer 3
        (0, 1, "m", True, False),  # the MTP layer is of the decoder's last kind
        (1, 1, "t", True, True),  # layer 4
        (1, 1, "L", False, False),
    ]
    uniform = [s[4] for s in walk(chunks, 2, 2, 5, ("full", "uniform", 1)) if s[2] in "tm"]
    assert uniform == [True] * 6
    assert not any(s[4] for s in walk(chunks, 2, 2, 5, ("selective", None, 1)))


def test_the_step_time_models_rank_loads_count_the_walk() -> None:
    chunks = tuple(map(tuple, layout.parse("Et|tt|tm|tL")))
    loads = rank_loads(chunks, 2, 2, 5, ("full", "block", 1))
    # (dense, moe, dense recomputed, moe recomputed, mtp, embedding, output, selective x 2)
    assert loads == ((0, 1, 1, 1, 1, 1, 0, 0, 0), (0, 1, 1, 1, 0, 0, 1, 0, 0))
