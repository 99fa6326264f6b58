"""The loss as the engine builds it and as the estimates price it: Transformer Engine's fused cross
entropy wherever TE's layers are built (it keeps the BF16 logits alone, 2 bytes each), Megatron-
Core's unfused one elsewhere (an FP32 softmax beside them, 6). One answer, config/backend.py
`te_layers`, for the engine (models/gpt.py `transformer_config`), the memory estimate and the step
time (config/cost/memory.py `logit_bytes`)."""

from __future__ import annotations

from unittest import mock

import pytest

from config.backend import te_layers
from config.cost.memory import estimate_memory, logit_bytes
from config.cost.steptime import layer_costs
from config.hardware import Cluster
from config.rules import derive
from config.schema import TrainingConfig
from config.tree import apply_overrides
from tests.unit.config.test_validation import H100x8, llama_like

CPU = Cluster(num_nodes=1, gpus_per_node=2, gpu="cpu")


def _cpu(cfg: TrainingConfig) -> TrainingConfig:
    return apply_overrides(
        cfg, ["parallel.tensor_model_parallel_size=1", "parallel.sequence_parallel=false"]
    )


CASES = [
    ("h100", llama_like, H100x8, 2.0),
    ("lora", lambda: apply_overrides(llama_like(), ["peft.scheme=lora"]), H100x8, 6.0),
    ("cpu", lambda: _cpu(llama_like()), CPU, 6.0),
]


@pytest.mark.parametrize(("name", "make", "cluster", "bytes_"), CASES, ids=[c[0] for c in CASES])
def test_the_engine_fuses_the_loss_where_the_estimates_price_it_fused(
    name: str, make, cluster: Cluster, bytes_: float
) -> None:
    """Megatron-Core's TransformerConfig as the engine builds it (Transformer Engine taken to
    import, as in a GPU container) asks for TE's fused loss exactly where `logit_bytes` prices 2
    bytes per logit."""
    torch = pytest.importorskip("torch")
    from models import gpt, specs

    cfg = make()
    assert logit_bytes(cfg, cluster) == bytes_
    device = "cuda" if cluster.gpu != "cpu" else "cpu"
    with (
        mock.patch.object(specs, "have_transformer_engine", lambda: True),
        mock.patch.object(gpt, "have_transformer_engine", lambda: True),
    ):
        config = gpt.transformer_config(cfg, derive(cfg, cluster), device, torch.bfloat16)
    assert config.cross_entropy_loss_fusion == te_layers(cfg, cluster) == (bytes_ == 2.0)
    if config.cross_entropy_loss_fusion:
        assert config.cross_entropy_fusion_impl == "te"


def test_the_fused_loss_keeps_a_third_of_the_logits_bytes() -> None:
    """On the last pipeline stage the logits of one microbatch: tokens x padded vocabulary x 2
    bytes with the fused loss, x 6 without; its memory-bound passes in the step time likewise."""
    cfg = llama_like()
    lora = apply_overrides(llama_like(), ["peft.scheme=lora"])
    fused = estimate_memory(cfg, H100x8, derive(cfg, H100x8))
    unfused = estimate_memory(lora, H100x8, derive(lora, H100x8))
    assert unfused.logits_gib == pytest.approx(3 * fused.logits_gib)
    fast = layer_costs(cfg, H100x8, derive(cfg, H100x8)).output["memory"]
    slow = layer_costs(lora, H100x8, derive(lora, H100x8)).output["memory"]
    assert slow == pytest.approx(3 * fast)
