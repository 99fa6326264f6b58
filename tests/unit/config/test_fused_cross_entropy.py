"""The loss as the engine builds it and as the estimates price it. Where Transformer Engine's layers
are built the engine fuses the loss: Megatron-Core's fused cross entropy by default (two FP32
tensors beside the BF16 logits at its peak, 10 bytes a logit, as Megatron-LM measured:
test_memory_measured.py), Transformer Engine's with model.cross_entropy_fusion_impl=te (in place on
the BF16 logits, 2), which Megatron-LM refuses for stability issues (NVIDIA/Megatron-LM#5115) and
Megatron-Core 0.19.2 warns about. Elsewhere (LoRA, the CPU) the loss is Megatron-Core's unfused one
(6: one FP32 copy). One answer, config/backend.py `te_layers` with the field, for the engine
(models/gpt.py `transformer_config`), the memory estimate and the step time (config/cost/memory.py
`logit_bytes`; a pass of the loss moves the logits' BF16 and FP32 copies, 6 bytes, or 2 in TE's)."""

from __future__ import annotations

import warnings
from unittest import mock

import pytest

from config.backend import te_layers
from config.cost.memory import estimate_memory, logit_bytes
from config.cost.steptime import layer_costs
from config.hardware import Cluster
from config.rules import derive, validate
from config.schema import TrainingConfig
from config.tree import apply_overrides
from recipes.shrink import cpu_substitutes
from tests.unit.config.test_validation import H100x8, llama_like

CPU = Cluster(num_nodes=1, gpus_per_node=2, gpu="cpu")
TE_LOSS = "model.cross_entropy_fusion_impl=te"


def _cpu(cfg: TrainingConfig) -> TrainingConfig:
    return apply_overrides(
        cfg, ["parallel.tensor_model_parallel_size=1", "parallel.sequence_parallel=false"]
    )


def _te() -> TrainingConfig:
    return apply_overrides(llama_like(), [TE_LOSS])


CASES = [
    ("h100", llama_like, H100x8, "native", 10.0),
    ("h100-te", _te, H100x8, "te", 2.0),
    ("lora", lambda: apply_overrides(llama_like(), ["peft.scheme=lora"]), H100x8, None, 6.0),
    ("cpu", lambda: _cpu(llama_like()), CPU, None, 6.0),
]


def _transformer_config(cfg: TrainingConfig, cluster: Cluster):
    """Megatron-Core's TransformerConfig as the engine builds it, Transformer Engine taken to
    import (as in a GPU container); the warnings Megatron-Core gave while building it."""
    torch = pytest.importorskip("torch")
    from models import gpt, specs

    device = "cuda" if cluster.gpu != "cpu" else "cpu"
    with (
        mock.patch.object(specs, "have_transformer_engine", lambda: True),
        mock.patch.object(gpt, "have_transformer_engine", lambda: True),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        config = gpt.transformer_config(cfg, derive(cfg, cluster), device, torch.bfloat16)
    return config, [str(w.message) for w in caught]


@pytest.mark.parametrize(
    ("name", "make", "cluster", "impl", "bytes_"), CASES, ids=[c[0] for c in CASES]
)
def test_the_engine_fuses_the_loss_as_the_estimates_price_it(
    name: str, make, cluster: Cluster, impl: str | None, bytes_: float
) -> None:
    """The engine's TransformerConfig fuses the loss where TE's layers are built, with the field's
    implementation (None: not fused), and `logit_bytes` prices its peak: 10 bytes a logit for
    Megatron-Core's fused loss, 6 unfused, 2 for TE's; a pass moves 2 in TE's, else 6."""
    cfg = make()
    assert logit_bytes(cfg, cluster) == bytes_
    assert logit_bytes(cfg, cluster, peak=False) == (2.0 if impl == "te" else 6.0)
    config, _ = _transformer_config(cfg, cluster)
    assert config.cross_entropy_loss_fusion == te_layers(cfg, cluster) == (impl is not None)
    if impl is not None:
        assert config.cross_entropy_fusion_impl == impl


def test_megatron_core_warns_about_the_te_loss_and_not_about_its_own() -> None:
    """The oracle: Megatron-Core 0.19.2's ModelParallelConfig warns that Megatron-LM refuses TE's
    fused cross entropy (stability issues) when the engine asks for it, and is silent about the
    default; `recipes check` says the same in its "loss" line."""
    from recipes.advice.check import check, render

    _, default = _transformer_config(llama_like(), H100x8)
    _, te = _transformer_config(_te(), H100x8)
    assert not [m for m in default if "stability" in m]
    assert [m for m in te if "cross entropy loss fusion has known stability issues" in m]
    assert "Megatron-LM refuses it for stability" in render(check(_te(), H100x8))
    assert "loss " not in render(check(llama_like(), H100x8))


@pytest.mark.parametrize(
    ("overrides", "cluster", "why"),
    [
        (["peft.scheme=lora"], H100x8, "LoRA"),
        (["parallel.tensor_model_parallel_size=1", "parallel.sequence_parallel=false"], CPU, "CPU"),
    ],
    ids=["lora", "cpu"],
)
def test_the_te_loss_without_te_layers_is_refused(
    overrides: list[str], cluster: Cluster, why: str
) -> None:
    """Where the engine builds Megatron-Core's local layers it fuses no loss: the field would be
    dropped without a word, so the checker refuses it, naming the reason and the fix."""
    cfg = apply_overrides(llama_like(), [*overrides, TE_LOSS])
    problems = [p for p in validate(cfg, cluster) if p.field == "model.cross_entropy_fusion_impl"]
    assert len(problems) == 1
    assert why in problems[0].message and "use native" in problems[0].message
    assert not [p for p in validate(_te(), H100x8) if p.field == "model.cross_entropy_fusion_impl"]


def test_shrinking_to_the_cpu_takes_megatron_cores_loss() -> None:
    cfg = _cpu(_te())
    changes = cpu_substitutes(cfg)
    assert cfg.model.cross_entropy_fusion_impl == "native"
    assert any(c.startswith("model.cross_entropy_fusion_impl: te -> native") for c in changes)
    assert not [p for p in validate(cfg, CPU) if p.field == "model.cross_entropy_fusion_impl"]


def test_the_te_loss_keeps_a_fifth_of_the_logits_bytes() -> None:
    """On the last pipeline stage the logits of one microbatch: tokens x padded vocabulary x 2
    bytes with TE's loss, x 10 with Megatron-Core's fused one; its memory-bound passes in the step
    time over 2 and 6 bytes."""
    native, te = llama_like(), _te()
    fused = estimate_memory(te, H100x8, derive(te, H100x8))
    copied = estimate_memory(native, H100x8, derive(native, H100x8))
    assert copied.logits_gib == pytest.approx(5 * fused.logits_gib)
    fast = layer_costs(te, H100x8, derive(te, H100x8)).output["memory"]
    slow = layer_costs(native, H100x8, derive(native, H100x8)).output["memory"]
    assert slow == pytest.approx(3 * fast)
