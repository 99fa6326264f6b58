"""The Qwen2.5, Mistral and Phi-3 presets against the config.json their makers published.

Each literal below is the published config.json of the model named above it (the fields that
shape the model, copied from the Hugging Face repository's file; the comment says which). The
family's map (models/hf/) reads it into a model section, which must equal the preset field by
field (the checker's own comparison, config/hf.py), and the preset's parameter count must be
the model card's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from config.cost.memory import count_parameters
from config.hf import ARCH_FIELDS, _effective
from config.schema import ModelConfig, TrainConfig, TrainingConfig
from models.hf import module_of
from models.presets import mistral, phi, qwen


def qwen25(**fields: Any) -> dict[str, Any]:
    """The fields every Qwen2.5 config.json shares (the 7B's values where they differ)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_position_embeddings": 131072,
        "model_type": "qwen2",
        "rope_theta": 1000000.0,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "vocab_size": 152064,
    } | fields


PUBLISHED: dict[str, tuple[Callable[..., ModelConfig], dict[str, Any], float]] = {
    # huggingface.co/Qwen/Qwen2.5-0.5B/blob/main/config.json; "0.49B" on its model card
    "qwen2.5-0.5b": (
        qwen.qwen25_0p5b,
        qwen25(
            hidden_size=896,
            intermediate_size=4864,
            num_attention_heads=14,
            num_hidden_layers=24,
            num_key_value_heads=2,
            rms_norm_eps=1e-06,
            max_position_embeddings=32768,
            sliding_window=32768,
            max_window_layers=24,
            tie_word_embeddings=True,
            vocab_size=151936,
        ),
        0.49e9,
    ),
    # huggingface.co/Qwen/Qwen2.5-1.5B/blob/main/config.json; "1.54B"
    "qwen2.5-1.5b": (
        qwen.qwen25_1p5b,
        qwen25(
            hidden_size=1536,
            intermediate_size=8960,
            num_attention_heads=12,
            num_hidden_layers=28,
            num_key_value_heads=2,
            rms_norm_eps=1e-06,
            max_window_layers=28,
            tie_word_embeddings=True,
            vocab_size=151936,
        ),
        1.54e9,
    ),
    # huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json; "7.61B"
    "qwen2.5-7b": (
        qwen.qwen25_7b,
        qwen25(
            hidden_size=3584,
            intermediate_size=18944,
            num_attention_heads=28,
            num_hidden_layers=28,
            num_key_value_heads=4,
            rms_norm_eps=1e-06,
            max_window_layers=28,
        ),
        7.61e9,
    ),
    # huggingface.co/Qwen/Qwen2.5-14B/blob/main/config.json; "14.7B"
    "qwen2.5-14b": (
        qwen.qwen25_14b,
        qwen25(
            hidden_size=5120,
            intermediate_size=13824,
            num_attention_heads=40,
            num_hidden_layers=48,
            num_key_value_heads=8,
            rms_norm_eps=1e-05,
            max_window_layers=48,
        ),
        14.7e9,
    ),
    # huggingface.co/Qwen/Qwen2.5-32B/blob/main/config.json; "32.5B"
    "qwen2.5-32b": (
        qwen.qwen25_32b,
        qwen25(
            hidden_size=5120,
            intermediate_size=27648,
            num_attention_heads=40,
            num_hidden_layers=64,
            num_key_value_heads=8,
            rms_norm_eps=1e-05,
            max_window_layers=64,
        ),
        32.5e9,
    ),
    # huggingface.co/Qwen/Qwen2.5-72B/blob/main/config.json; "72.7B"
    "qwen2.5-72b": (
        qwen.qwen25_72b,
        qwen25(
            hidden_size=8192,
            intermediate_size=29568,
            num_attention_heads=64,
            num_hidden_layers=80,
            num_key_value_heads=8,
            rms_norm_eps=1e-05,
            max_window_layers=80,
        ),
        72.7e9,
    ),
    # huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json; "7.25B"
    "mistral-7b-v0.3": (
        mistral.mistral_7b_v03,
        {
            "architectures": ["MistralForCausalLM"],
            "hidden_act": "silu",
            "hidden_size": 4096,
            "initializer_range": 0.02,
            "intermediate_size": 14336,
            "max_position_embeddings": 32768,
            "model_type": "mistral",
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "vocab_size": 32768,
        },
        7.25e9,
    ),
    # huggingface.co/microsoft/Phi-3-mini-4k-instruct/blob/main/config.json; "3.8B" (3.82B)
    "phi-3-mini-4k": (
        phi.phi3_mini_4k,
        {
            "architectures": ["Phi3ForCausalLM"],
            "attention_bias": False,
            "hidden_act": "silu",
            "hidden_size": 3072,
            "initializer_range": 0.02,
            "intermediate_size": 8192,
            "max_position_embeddings": 4096,
            "model_type": "phi3",
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 32,
            "original_max_position_embeddings": 4096,
            "rms_norm_eps": 1e-05,
            "rope_scaling": None,
            "rope_theta": 10000.0,
            "sliding_window": 2047,
            "tie_word_embeddings": False,
            "vocab_size": 32064,
        },
        3.82e9,
    ),
    # huggingface.co/microsoft/Phi-3-medium-4k-instruct/blob/main/config.json; "14B" (13.96B)
    "phi-3-medium-4k": (
        phi.phi3_medium_4k,
        {
            "architectures": ["Phi3ForCausalLM"],
            "attention_bias": False,
            "hidden_act": "silu",
            "hidden_size": 5120,
            "initializer_range": 0.02,
            "intermediate_size": 17920,
            "max_position_embeddings": 4096,
            "model_type": "phi3",
            "num_attention_heads": 40,
            "num_hidden_layers": 40,
            "num_key_value_heads": 10,
            "original_max_position_embeddings": 4096,
            "rms_norm_eps": 1e-05,
            "rope_scaling": None,
            "rope_theta": 10000.0,
            "sliding_window": 2047,
            "tie_word_embeddings": False,
            "vocab_size": 32064,
        },
        13.96e9,
    ),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_is_the_published_config(name: str) -> None:
    preset, config, parameters = PUBLISHED[name]
    ours = preset()
    theirs = module_of(config["architectures"][0]).to_model(config, set())
    differing = {
        f: (_effective(ours, f), _effective(theirs, f))
        for f in ARCH_FIELDS
        if _effective(ours, f) != _effective(theirs, f)
    }
    assert differing == {}
    train = TrainConfig(global_batch_size=1, micro_batch_size=1, max_steps=1)
    count = count_parameters(TrainingConfig(name=name, model=ours, train=train)).total
    assert count == pytest.approx(parameters, rel=0.01)
