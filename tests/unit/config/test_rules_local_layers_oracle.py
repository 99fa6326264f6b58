"""The sliding-window and Gemma 3 rules (config/rules/model.py `_local_layers`) against
Megatron-Core's own constructors (tests/support/megatron_build.py: every pipeline stage built on
torch's fake process group and the meta device, as the engine builds it).

Where Megatron-Core builds what the checker refuses, STRICTER says why: a setting it would ignore
without a word. Sliding windows under context parallelism: tests/unit/config/test_cp_comm_type.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from config.rules import validate  # noqa: E402
from config.schema import TrainingConfig  # noqa: E402
from config.tree import apply_overrides  # noqa: E402
from tests.support import megatron_build  # noqa: E402
from tests.unit.config.test_rules_build_oracle import MLA, SMALL  # noqa: E402
from tests.unit.config.test_validation import H100x8, llama_like  # noqa: E402

# SMALL's llama_like (TP 2 with SP on 8 H100s) with Gemma 3's layers: six of them, a global one
# every third, the local ones with their own RoPE base.
GEMMA = (
    *SMALL,
    "model.num_layers=6",
    "model.activation=geglu",
    "model.qk_layernorm=true",
    "model.sandwich_norm=true",
    "model.layernorm_zero_centered_gamma=true",
    "model.scale_embeddings=true",
    "model.share_embeddings_and_output_weights=true",
    "model.window_size=127",
    "model.window_attn_skip_freq=3",
    "model.rotary_base=1000000",
    "model.rotary_base_local=10000",
    "model.rope_scaling=linear",
)
MOE = ("model.num_moe_experts=4", "model.moe_router_topk=2")

STRICTER = {
    "skip_freq_alone": "window_attn_skip_freq without window_size: Megatron-Core makes no layer "
    "local and ignores it",
    "local_base_alone": "rotary_base_local without window_size: no local layer takes it",
}


def gemma(*overrides: str) -> TrainingConfig:
    return apply_overrides(llama_like(), [*GEMMA, *overrides])


def problems(cfg: TrainingConfig) -> list[str]:
    return [f"{p.field}: {p.message}" for p in validate(cfg, H100x8)]


@pytest.mark.parametrize(
    "overrides, stricter, field",
    [
        ((), None, None),
        (("peft.scheme=lora",), None, None),
        (("parallel.pipeline_model_parallel_size=2",), None, None),
        (("parallel.sequence_parallel=false", "parallel.tensor_model_parallel_size=1"), None, None),
        (("model.sandwich_norm=false",), None, None),
        (("model.rotary_base_local=None",), None, None),
        ((*MOE, "model.sandwich_norm=false"), None, None),
        (MOE, None, "model.sandwich_norm"),
        ((*MLA, "model.kv_channels=None"), None, "model.sandwich_norm"),
        (
            (*MLA, "model.kv_channels=None", "model.sandwich_norm=false"),
            None,
            "model.rotary_base_local",
        ),
        (
            ("model.window_size=None", "model.rotary_base_local=None"),
            "skip_freq_alone",
            "model.window_attn_skip_freq",
        ),
        (
            ("model.window_size=None", "model.window_attn_skip_freq=None"),
            "local_base_alone",
            "model.rotary_base_local",
        ),
    ],
)
def test_the_checker_gives_megatron_cores_verdict(
    overrides: tuple[str, ...], stricter: str | None, field: str | None
) -> None:
    cfg = gemma(*overrides)
    ours, theirs = problems(cfg), megatron_build.refuses(cfg, H100x8)
    assert [p.split(":")[0] for p in ours] == ([field] if field else []), ours
    if stricter is None:
        assert (theirs is None) == (field is None), (ours, theirs)
    else:
        assert stricter in STRICTER and theirs is None


@pytest.mark.parametrize("pp", [1, 2])
def test_each_layer_is_local_or_global_by_its_global_number(pp: int) -> None:
    """On every pipeline stage, layers 3 and 6 (counting from 1) attend over the whole sequence
    with the model's RoPE, the others through the window with their own base, as
    Megatron-Core's is_layer_window_attention numbers them; every layer has its post norms."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    cfg = gemma(f"parallel.pipeline_model_parallel_size={pp}")
    assert problems(cfg) == []
    seen = {}
    for chunks in megatron_build.build(cfg, H100x8).values():
        for layer in (m for c in chunks for m in c.modules() if isinstance(m, TransformerLayer)):
            attention = layer.self_attention
            local_rope = attention.local_rope
            seen[layer.layer_number] = (
                attention.core_attention.window,
                # inv_freq[1] = base ** (-2 / head_dim); heads of 256 / 8 = 32 here
                None if local_rope is None else round(float(local_rope.inv_freq[1]) ** -16),
            )
            assert attention.post_layernorm is not None and layer.mlp.post_layernorm is not None
    local = ((127, 0), 10000)  # SdpaAttention.window: Megatron-Core's (left, right)
    assert seen == {1: local, 2: local, 3: (None, None), 4: local, 5: local, 6: (None, None)}
