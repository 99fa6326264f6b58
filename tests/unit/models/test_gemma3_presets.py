"""The Gemma 3 presets against Google's published config.json, written out here as literals.

Sources: huggingface.co/google/gemma-3-1b-pt/blob/main/config.json (Gemma3ForCausalLM, every
field) and the `text_config` of google/gemma-3-{4b,12b,27b}-pt/config.json
(Gemma3ForConditionalGeneration), which leaves out the fields at transformers' Gemma3TextConfig
defaults (8 heads, 4 KV heads, head_dim 256, query_pre_attn_scalar 256, rope_theta 1e6,
rope_local_base_freq 1e4, sliding_window_pattern 6, vocab 262,208). Parameter counts: the Gemma 3
technical report (arXiv 2503.19786), Table 1, embedding plus non-embedding parameters of the
language model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from config.cost.memory import count_parameters
from config.schema import ModelConfig, TrainConfig, TrainingConfig
from models.hf import gemma3
from models.presets.gemma import gemma3_1b, gemma3_4b, gemma3_12b, gemma3_27b

LINEAR_8 = {"factor": 8.0, "rope_type": "linear"}
PUBLISHED: dict[str, dict[str, Any]] = {
    "1b": {
        "architectures": ["Gemma3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "attn_logit_softcapping": None,
        "bos_token_id": 2,
        "eos_token_id": 1,
        "final_logit_softcapping": None,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 1152,
        "initializer_range": 0.02,
        "intermediate_size": 6912,
        "max_position_embeddings": 32768,
        "model_type": "gemma3_text",
        "num_attention_heads": 4,
        "num_hidden_layers": 26,
        "num_key_value_heads": 1,
        "pad_token_id": 0,
        "query_pre_attn_scalar": 256,
        "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": 512,
        "sliding_window_pattern": 6,
        "torch_dtype": "bfloat16",
        "vocab_size": 262144,
    },
    "4b": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": LINEAR_8,
        "sliding_window": 1024,
    },
    "12b": {
        "hidden_size": 3840,
        "intermediate_size": 15360,
        "model_type": "gemma3_text",
        "num_attention_heads": 16,
        "num_hidden_layers": 48,
        "num_key_value_heads": 8,
        "rope_scaling": LINEAR_8,
        "sliding_window": 1024,
    },
    "27b": {
        "head_dim": 128,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "model_type": "gemma3_text",
        "num_attention_heads": 32,
        "num_hidden_layers": 62,
        "num_key_value_heads": 16,
        "query_pre_attn_scalar": 168,
        "rope_scaling": LINEAR_8,
        "sliding_window": 1024,
    },
}
PRESETS = {"1b": gemma3_1b, "4b": gemma3_4b, "12b": gemma3_12b, "27b": gemma3_27b}
# Technical report, Table 1: (embedding, non-embedding) parameters in millions.
REPORTED = {"1b": (302, 698), "4b": (675, 3209), "12b": (1012, 10759), "27b": (1416, 25600)}


@pytest.mark.parametrize("size", list(PRESETS))
def test_preset_is_the_published_config(size: str) -> None:
    preset: ModelConfig = PRESETS[size]()
    assert gemma3.to_model(PUBLISHED[size], set()) == preset


def test_presets_spell_out_the_published_numbers() -> None:
    """The numbers themselves, so that a wrong default in the map cannot hide a wrong preset."""
    rows = {
        size: (
            m.num_layers,
            m.hidden_size,
            m.ffn_hidden_size,
            m.num_attention_heads,
            m.num_query_groups,
            m.kv_channels,
            m.vocab_size,
            m.window_size,
            m.rope_scaling,
        )
        for size, m in ((size, make()) for size, make in PRESETS.items())
    }
    assert rows == {
        "1b": (26, 1152, 6912, 4, 1, 256, 262144, 511, None),
        "4b": (34, 2560, 10240, 8, 4, 256, 262208, 1023, "linear"),
        "12b": (48, 3840, 15360, 16, 8, 256, 262208, 1023, "linear"),
        "27b": (62, 5376, 21504, 32, 16, 128, 262208, 1023, "linear"),
    }
    assert gemma3_27b().softmax_scale == 168**-0.5 and gemma3_12b().softmax_scale == 256**-0.5
    for make in PRESETS.values():
        m = make()
        assert (m.window_attn_skip_freq, m.rotary_base, m.rotary_base_local) == (6, 10**6, 10**4)
        assert m.share_embeddings_and_output_weights and m.layernorm_epsilon == 1e-6


@pytest.mark.parametrize("size", list(PRESETS))
def test_parameter_count_is_the_reported_one(size: str) -> None:
    model = PRESETS[size]()
    model.make_vocab_size_divisible_by = 1  # the report counts the published vocabulary
    train = TrainConfig(global_batch_size=1, micro_batch_size=1, max_steps=1)
    count = count_parameters(TrainingConfig(name="gemma3", model=model, train=train))
    embedding, rest = REPORTED[size]
    assert count.embedding / 1e6 == pytest.approx(embedding, rel=0.01)
    assert (count.total - count.embedding) / 1e6 == pytest.approx(rest, rel=0.01)


def test_the_12b_recipes_take_the_published_folder(tmp_path: Path) -> None:
    """`checkpoint.pretrained_dir=<google/gemma-3-12b-pt>` (its config.json as published: the
    vision-language wrapper around the text_config above) passes the check; the 1B folder is
    refused naming each field that differs; `model=<1B folder>` takes the 1B's architecture."""
    from config.hf import model_override
    from config.rules import validate
    from config.tree import apply_overrides
    from recipes.registry import get
    from tests.unit.config.test_hf_check import hf_folder

    def vlm_folder(folder: Path, config: dict[str, Any]) -> Path:
        """hf_folder with its one tensor under the hub's language-model prefix."""
        import numpy as np
        from safetensors.numpy import save_file

        hf_folder(folder, config)
        norm = {"language_model.model.norm.weight": np.zeros(4, dtype=np.float32)}
        save_file(norm, str(folder / "model.safetensors"))
        return folder

    vlm = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": PUBLISHED["12b"],
        "vision_config": {"model_type": "siglip_vision_model", "num_hidden_layers": 27},
        "mm_tokens_per_image": 256,
    }
    folder_12b = vlm_folder(tmp_path / "gemma-3-12b-pt", vlm)
    folder_1b = hf_folder(tmp_path / "gemma-3-1b-pt", PUBLISHED["1b"])
    for name in ("gemma3_12b_sft", "gemma3_12b_lora"):
        recipe = get(name)
        cfg = apply_overrides(recipe.config(), [f"checkpoint.pretrained_dir={folder_12b}"])
        assert validate(cfg, recipe.cluster) == [], name
        cfg.checkpoint.pretrained_dir = str(folder_1b)
        fields = {p.field for p in validate(cfg, recipe.cluster)}
        assert {"model.num_layers", "model.window_size", "model.rope_scaling"} <= fields, fields
    ours = get("gemma3_12b_sft").config().model
    assert model_override(folder_1b, ours) == gemma3_1b(seq_length=ours.seq_length)
