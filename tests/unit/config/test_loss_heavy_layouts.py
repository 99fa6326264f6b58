"""The pipeline layout that gives the embedding's place to the loss (config/layout.py
loss_heavy), which the planner offers beside the even split and the balanced layout: held against
the layouts Megatron-Bridge runs DeepSeek-V3 with, and against Megatron-Core's own layout parser
and validation."""

from __future__ import annotations

import pytest

from config import layout as layouts
from recipes.advice.space import _pipelines
from recipes.registry import resolve

# Megatron-Bridge's DeepSeek-V3 layouts (61 layers, one MTP layer): recipes/deepseek/deepseek_v3.py
# at r0.1.0 684a686165 (its map by PP and VPP, as lists) and the performance configs' pp_layout
# from v0.3.0 21b02e0cfb (configs/deepseek/deepseek_workload_base_configs.py).
MEGATRON_BRIDGE = {
    4: "Et*16|t*16|t*16|t*13mL",
    8: "Et*8|(t*8|)*6t*5mL",
    16: "Et*4|(t*4|)*14tmL",
    32: "Et|(tt|)*30mL",
}


@pytest.mark.parametrize("chunks", sorted(MEGATRON_BRIDGE))
def test_deepseek_v3s_layouts_are_among_the_planners(chunks: int) -> None:
    heavy, balanced = layouts.loss_heavy(61, 1, chunks), layouts.balanced(61, 1, chunks)
    assert layouts.parse(MEGATRON_BRIDGE[chunks]) in (heavy, balanced)
    assert heavy != balanced  # each layout offered once (32 chunks: balanced, no heavy one)


@pytest.mark.parametrize(
    ("layers", "mtp", "chunks"), [(61, 1, 16), (61, 1, 8), (94, 0, 24), (126, 0, 64), (28, 2, 8)]
)
def test_megatron_core_accepts_each_layout(layers: int, mtp: int, chunks: int) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    heavy = layouts.loss_heavy(layers, mtp, chunks)
    assert heavy is not None
    for pp in (p for p in (2, 4, 8) if chunks % p == 0):
        assert layouts.check(heavy, layers, mtp, pp, chunks // pp) == []
        parsed = PipelineParallelLayerLayout(layouts.render(heavy), pp)
        parsed.validate_layer_layout(num_layers=layers, mtp_num_layers=mtp)
    # the first chunk holds a full chunk's layers, the loss's one fewer than balanced's
    balanced = layouts.balanced(layers, mtp, chunks)
    assert balanced is not None
    assert heavy[0].count("t") == heavy[1].count("t") == balanced[0].count("t") + 1
    assert heavy[-1].count("t") == balanced[-1].count("t") - 1


def test_the_planner_offers_them_beside_the_balanced_layout() -> None:
    _, cfg = resolve("deepseek_v3_pretrain", [])
    offered = [layout for vpp, layout in _pipelines(cfg, 16) if vpp is None]
    assert layouts.render(layouts.parse(MEGATRON_BRIDGE[16])) in offered
    assert layouts.render(layouts.balanced(61, 1, 16)) in offered
    assert _pipelines(cfg, 1) == [(None, None)]  # one stage: Megatron-Core's, no layout


def test_the_planner_offers_more_chunks_than_layers() -> None:
    """Megatron-Bridge runs Llama 3.1 405B (126 layers) at PP 16 VP 8 on GB200s (26.06, FP8 and
    NVFP4): 128 chunks, the embedding and the loss one each. The planner offered no more chunks
    than layers; Megatron-Core's parser and validation accept the layout."""
    _, cfg = resolve("llama31_405b_pretrain", [])
    offered = dict(_pipelines(cfg, 16))
    assert offered[8] == "E|(t|)*126L" == layouts.render(layouts.balanced(126, 0, 128))
    assert layouts.check(layouts.parse(offered[8]), 126, 0, 16, 8) == []
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    PipelineParallelLayerLayout(offered[8], 16).validate_layer_layout(
        num_layers=126, mtp_num_layers=0
    )
