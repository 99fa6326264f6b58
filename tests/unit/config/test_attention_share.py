"""The attention work the step-time model prices per layer (config/cost/layers.py `attention_share`):
windowed layers (GPT-OSS, Gemma 3) see only their window, Gated DeltaNet layers (Qwen3.5) none that
grows with the sequence. Held against Megatron-Core: which layers are windowed
(`is_layer_window_attention`) or linear (`get_linear_attention_pattern`), and the keys each query
sees (`get_sliding_window_causal_mask`, the mask its unfused attention applies for a window)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from config.cost import layers
from config.cost.steptime import predict
from config.rules import derive
from config.tree import apply_overrides
from launchers.jobsize import job_cluster
from recipes.registry import resolve
from tests.unit.config.test_validation import llama_like

torch = pytest.importorskip("torch")


def megatron_share(m) -> float:
    """Keys seen by every query of every layer, over causal attention in every layer, as
    Megatron-Core builds the layers and masks them (its mask function allocates on CUDA: here on
    the CPU)."""
    from megatron.core.models.gpt import experimental_attention_variant_module_specs as specs
    from megatron.core.transformer import utils

    s = m.seq_length
    cpu_ones = torch.ones
    with mock.patch.object(
        utils.torch, "ones", lambda *a, **kw: cpu_ones(*a, **{**kw, "device": "cpu"})
    ):
        window = (
            int((~utils.get_sliding_window_causal_mask(s, s, (m.window_size, 0))).sum())
            if m.window_size is not None
            else None
        )
    linear = [0] * m.num_layers
    if m.experimental_attention_variant is not None:
        linear = specs.get_linear_attention_pattern(
            SimpleNamespace(
                linear_attention_freq=m.linear_attention_freq,
                num_layers=m.num_layers,
                experimental_attention_variant=m.experimental_attention_variant,
            )
        )
    causal = s * (s + 1) // 2
    seen = 0
    for number in range(1, m.num_layers + 1):
        if linear[number - 1]:
            continue
        local = utils.is_layer_window_attention(
            (m.window_size, 0) if m.window_size is not None else None,
            m.window_attn_skip_freq,
            number,
        )
        seen += window if local else causal
    return seen / (m.num_layers * causal)


CASES = {
    # GPT-OSS's pattern: sliding, full, sliding, ...
    "every other layer": ["model.window_size=31", "model.window_attn_skip_freq=2"],
    # Gemma 3's: five local layers, then a global one
    "five of six": ["model.window_size=15", "model.window_attn_skip_freq=6"],
    "every layer": ["model.window_size=47"],
    "window past the sequence": ["model.window_size=300", "model.window_attn_skip_freq=3"],
    "none": [],
    # Qwen3.5's: three Gated DeltaNet layers, then softmax attention
    "gated deltanet": [
        "model.experimental_attention_variant=gated_delta_net",
        "model.linear_attention_freq=4",
    ],  # fmt: skip
    "gated deltanet and windows": [
        "model.experimental_attention_variant=gated_delta_net",
        "model.linear_attention_freq=3",
        "model.window_size=7",
        "model.window_attn_skip_freq=2",
    ],  # fmt: skip
}


@pytest.mark.parametrize("case", CASES)
def test_share_matches_megatron_core(case: str) -> None:
    m = apply_overrides(
        llama_like(), ["model.num_layers=12", "model.seq_length=256", *CASES[case]]
    ).model
    assert layers.attention_share(m) == pytest.approx(megatron_share(m), rel=1e-12)


def test_models_with_windows_and_linear_layers_are_priced_below_full_attention() -> None:
    """The shares of the presets: GPT-OSS (128 tokens on half its layers), Gemma 3 (1,024 on five
    of six), Qwen3.5 (softmax attention on one layer of four); Llama attends in full."""
    shares = {}
    for name in ("gpt_oss_20b_sft", "gemma3_12b_sft", "qwen3_5_27b_lora", "llama3_8b_pretrain"):
        _, cfg = resolve(name, [])
        shares[name] = layers.attention_share(cfg.model)
    assert shares["llama3_8b_pretrain"] == 1.0
    assert shares["qwen3_5_27b_lora"] == 0.25
    assert 0.5 < shares["gpt_oss_20b_sft"] < 0.6  # half the layers at 128 of ~1,024 keys
    assert 1 / 6 < shares["gemma3_12b_sft"] < 0.6


def test_step_time_prices_the_window() -> None:
    """GPT-OSS 20B's attention term with its windows is the share of the same model's without."""
    recipe, cfg = resolve("gpt_oss_20b_sft", [])
    _, full = resolve(
        "gpt_oss_20b_sft", ["model.window_size=null", "model.window_attn_skip_freq=null"]
    )
    cluster = job_cluster(recipe.cluster, None, None)
    windowed = predict(cfg, cluster, derive(cfg, cluster))
    whole = predict(full, cluster, derive(full, cluster))
    assert windowed is not None and whole is not None
    ratio = windowed.terms["attention"] / whole.terms["attention"]
    assert ratio == pytest.approx(layers.attention_share(cfg.model), rel=1e-9)
    assert windowed.seconds < whole.seconds
