"""The Qwen3.5 / 3.6 presets against the published config.json numbers, and the parameter count
against transformers' own model of the same config (built on the meta device: no weights).

The config.json sections below are copied, as literal numbers, from the published folders'
`text_config` (Qwen/Qwen3.5-27B and Qwen/Qwen3.5-35B-A3B on the Hugging Face hub, February 2026;
Qwen3.6-27B and -35B-A3B publish the same text_config numbers), as reproduced in public
repositories' test fixtures and loaders (e.g. the Qwen3_5Config of Qwen3.5-27B with its vision
config; the Qwen3.5-35B-A3B text config beside the 122B-A10B's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.hf import ARCH_FIELDS, _effective
from models.hf import qwen3_5, qwen3_5_moe
from models.presets.qwen3_5 import qwen3_5_27b, qwen3_5_35b_a3b

ROPE = {
    "mrope_interleaved": True,
    "mrope_section": [11, 11, 10],
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000000,
    "rope_type": "default",
}
QWEN3_5_27B: dict[str, Any] = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "text_config": {
        "attention_bias": False,
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 5120,
        "initializer_range": 0.02,
        "intermediate_size": 17408,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_value_head_dim": 128,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_5_text",
        "mtp_num_hidden_layers": 1,
        "num_attention_heads": 24,
        "num_hidden_layers": 64,
        "num_key_value_heads": 4,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "rope_parameters": ROPE,
        "tie_word_embeddings": False,
        "vocab_size": 248320,
    },
}
QWEN3_5_35B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "tie_word_embeddings": False,
    "text_config": {
        "attention_bias": False,
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
        "max_position_embeddings": 262144,
        "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": 512,
        "mtp_num_hidden_layers": 1,
        "num_attention_heads": 16,
        "num_experts": 256,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-6,
        "rope_parameters": ROPE,
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": 512,
        "tie_word_embeddings": False,
        "vocab_size": 248320,
    },
}
CASES = [
    (qwen3_5_27b, qwen3_5, QWEN3_5_27B, "Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    (
        qwen3_5_35b_a3b,
        qwen3_5_moe,
        QWEN3_5_35B_A3B,
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
    ),
]


@pytest.mark.parametrize(("preset", "family", "published", "_c", "_m"), CASES)
def test_preset_is_what_the_published_config_json_maps_to(
    preset: Any, family: Any, published: dict[str, Any], _c: str, _m: str
) -> None:
    ours, theirs = preset(), family.to_model(published, set())
    differ = {
        name: (_effective(ours, name), _effective(theirs, name))
        for name in ARCH_FIELDS
        if _effective(ours, name) != _effective(theirs, name)
    }
    assert differ == {}
    text = published["text_config"]
    assert (ours.num_layers, ours.hidden_size) == (text["num_hidden_layers"], text["hidden_size"])
    assert ours.linear_num_value_heads == text["linear_num_value_heads"]
    assert family.matches(ours)


@pytest.mark.parametrize(("preset", "_f", "published", "config_class", "model_class"), CASES)
def test_parameter_count_is_transformers(
    preset: Any, _f: Any, published: dict[str, Any], config_class: str, model_class: str
) -> None:
    """Our count (config/cost) against transformers' text model of the published config, its
    parameters counted on the meta device; Megatron pads the vocabulary, so the rows it adds to
    the embedding and output layer are taken off first."""
    transformers = pytest.importorskip("transformers")
    import torch

    from config.cost.memory import count_parameters
    from config.finalize import padded_vocab_size
    from config.schema import DataConfig, TrainConfig, TrainingConfig

    config = getattr(transformers, config_class)(**published["text_config"])
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    theirs = sum(p.numel() for p in model.parameters())
    m = preset()
    cfg = TrainingConfig(
        name="count", model=m, train=TrainConfig(global_batch_size=1), data=DataConfig(kind="mock")
    )
    padding = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, 1) - m.vocab_size
    ours = count_parameters(cfg).total - 2 * padding * m.hidden_size
    assert ours == pytest.approx(theirs, abs=m.num_layers)  # the per-layer average rounds down


@pytest.mark.parametrize(
    ("recipe", "published", "other"),
    [
        ("qwen3_5_27b_sft", QWEN3_5_27B, QWEN3_5_35B_A3B),
        ("qwen3_5_35b_a3b_sft", QWEN3_5_35B_A3B, QWEN3_5_27B),
    ],
)
def test_sft_recipes_take_the_published_folder(
    tmp_path: Path, recipe: str, published: dict[str, Any], other: dict[str, Any]
) -> None:
    """`checkpoint.pretrained_dir=<published folder>`: the recipe's model section is the
    folder's (no field differs); the other size's folder is refused field by field."""
    from config.rules import validate
    from config.tree import apply_overrides
    from recipes.registry import get
    from tests.unit.config.test_hf_check import hf_folder

    def problems(cfg: Any) -> set[str]:  # on the recipe's own cluster
        return {p.field for p in validate(cfg, get(recipe).cluster)}

    folder = hf_folder(tmp_path / "ours", published)
    cfg = apply_overrides(get(recipe).config(), [f"checkpoint.pretrained_dir={folder}"])
    assert problems(cfg) == set()
    wrong = hf_folder(tmp_path / "other", other)
    cfg = apply_overrides(get(recipe).config(), [f"checkpoint.pretrained_dir={wrong}"])
    assert {"model.num_layers", "model.hidden_size", "model.linear_num_value_heads"} <= problems(
        cfg
    )


@pytest.mark.parametrize(("preset", "family", "_p", "config_class", "_m"), CASES)
def test_config_json_of_an_export_without_origin_is_the_model(
    preset: Any, family: Any, _p: Any, config_class: str, _m: str
) -> None:
    """`to_hf` (an export of a run that started from no folder): transformers' config class
    takes it, and it maps back to the same architecture."""
    transformers = pytest.importorskip("transformers")
    model = preset()
    hf = family.to_hf(model)
    config = getattr(transformers, config_class)(**hf)
    assert config.layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]
    assert config.rope_parameters["partial_rotary_factor"] == 0.25
    back = family.to_model(hf, set())
    assert {n: _effective(back, n) for n in ARCH_FIELDS} == {
        n: _effective(model, n) for n in ARCH_FIELDS
    }
