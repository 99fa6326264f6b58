"""Gemma 3 text from Hugging Face folders made on the spot, with transformers as the oracle.

A tiny random Gemma3ForCausalLM (transformers' eager attention) with both kinds of layer: local
layers with a 4-token window over 32 tokens (so the window cuts) and their own RoPE base, global
layers every third layer with linear RoPE scaling, a softmax scale of its own
(query_pre_attn_scalar differs from the head dimension), all four norms and the q/k norms
randomised around transformers' zeros. Our engine loads it through checkpoint.pretrained_dir on one
CPU rank in FP32 (the SDPA core attention with its window mask, models/specs.py) and must give the
same logits; `recipes import` then `export` gives every tensor back bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.hf_oracle import hf_config
from tests.unit.models.test_hf_families import INIT, VOCAB, assert_logits_match, save
from tests.unit.training.test_engine import one_rank  # noqa: F401  (the module's one-rank process group)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_rank")

LOCAL, GLOBAL = "sliding_attention", "full_attention"
LAYER_TYPES = [LOCAL, LOCAL, GLOBAL, LOCAL, LOCAL, GLOBAL]


def tiny_gemma3(folder: Path, **change: Any) -> torch.nn.Module:
    fields: dict[str, Any] = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,  # not the head dimension: softmax_scale
        sliding_window=4,
        layer_types=LAYER_TYPES,
        rope_parameters={
            GLOBAL: {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            LOCAL: {"rope_type": "default", "rope_theta": 10_000.0},
        },
        max_position_embeddings=64,
        initializer_range=INIT,
        attn_implementation="eager",
    )
    config = transformers.Gemma3TextConfig(**(fields | change))
    return save(transformers.Gemma3ForCausalLM, config, folder)


def test_gemma3_logits_match_transformers(tmp_path: Path) -> None:
    reference = tiny_gemma3(tmp_path / "hf")
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert (model.window_size, model.window_attn_skip_freq) == (3, 3)
    assert (model.rotary_base, model.rotary_base_local) == (1_000_000, 10_000)
    assert (model.rope_scaling, model.rope_scaling_factor) == ("linear", 8.0)
    assert model.softmax_scale == 24**-0.5 and model.share_embeddings_and_output_weights
    assert model.sandwich_norm and model.layernorm_zero_centered_gamma and model.scale_embeddings
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


@pytest.mark.parametrize(
    "change",
    [
        # a window wider than the sequence: every layer sees it all, RoPE bases alone differ
        {"sliding_window": 64},
        # no linear scaling, and local and global RoPE swapped over (a mix-up would show)
        {
            "rope_parameters": {
                GLOBAL: {"rope_type": "default", "rope_theta": 10_000.0},
                LOCAL: {"rope_type": "default", "rope_theta": 1_000_000.0},
            }
        },
    ],
    ids=["wide_window", "bases_swapped"],
)
def test_gemma3_variants_match_transformers(tmp_path: Path, change: dict[str, Any]) -> None:
    reference = tiny_gemma3(tmp_path / "hf", **change)
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def tiny_gemma3_vlm(folder: Path) -> torch.nn.Module:
    """A Gemma3ForConditionalGeneration (the published 4B-27B folders' class) around the text model
    of `tiny_gemma3`, with a one-layer SigLIP tower and its projector."""
    text = tiny_gemma3(folder / "text").config.to_dict()
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config={
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 28,
            "patch_size": 14,
        },
        mm_tokens_per_image=4,
        attn_implementation="eager",
    )
    return save(transformers.Gemma3ForConditionalGeneration, config, folder / "vlm")


def test_gemma3_vlm_language_model_matches_transformers(tmp_path: Path) -> None:
    """The language model of a vision-language folder (the hub's tensor names, which transformers
    5 writes back), its vision tower not loaded: the same logits on text as transformers'."""
    from config.hf import safetensors_tensors

    reference = tiny_gemma3_vlm(tmp_path)
    names = set(safetensors_tensors(tmp_path / "vlm"))
    assert "language_model.model.embed_tokens.weight" in names
    assert any(n.startswith("vision_tower.") for n in names)
    model = hf_config(tmp_path / "vlm", tmp_path / "run").model
    assert model.window_attn_skip_freq == 3 and model.rotary_base_local == 10_000
    assert_logits_match(reference, tmp_path / "vlm", tmp_path / "run")


@pytest.mark.parametrize("vlm", [False, True], ids=["causal_lm", "vlm"])
def test_import_then_export_gives_every_tensor_back_bit_for_bit(tmp_path: Path, vlm: bool) -> None:
    """The vision tower of a vision-language folder too: kept aside by the import."""
    from recipes.cli import main
    from training.hf.convert import iter_tensors

    reference = tiny_gemma3_vlm(tmp_path) if vlm else tiny_gemma3(tmp_path / "hf")
    if vlm:
        (tmp_path / "vlm").rename(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run", tmp_path / "imported")
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 0
    original, back = dict(iter_tensors(tmp_path / "hf")), dict(iter_tensors(tmp_path / "back"))
    assert sorted(back) == sorted(original)
    for name, value in original.items():
        assert torch.equal(back[name], value), name


def test_export_without_origin_writes_a_config_transformers_reads_back(tmp_path: Path) -> None:
    """`to_hf` (an export of a model that did not start from a folder): transformers' config of it
    gives the same ModelConfig back."""
    from models.hf import gemma3

    tiny_gemma3(tmp_path / "hf")
    model = hf_config(tmp_path / "hf", tmp_path / "run").model
    assert gemma3.matches(model)
    written = gemma3.to_hf(model)
    config = transformers.Gemma3TextConfig(
        **{k: v for k, v in written.items() if k != "architectures"}
    )
    again = gemma3.to_model(config.to_dict() | {"architectures": written["architectures"]}, set())
    again.seq_length = model.seq_length
    assert again == model


GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 1152,
    "intermediate_size": 6912,
    "num_hidden_layers": 26,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "vocab_size": 262144,
}


@pytest.mark.parametrize(
    "change, key",
    [
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"hidden_activation": "gelu"}, "hidden_activation"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type"),
        ({"layer_types": [LOCAL, GLOBAL] * 12 + [GLOBAL, LOCAL]}, "layer_types"),
    ],
)
def test_gemma3_refuses_what_it_would_compute_differently(change: dict, key: str) -> None:
    from models.hf import gemma3

    assert gemma3.to_model(GEMMA3_1B, set()).window_attn_skip_freq == 6
    with pytest.raises(ValueError, match=key):
        gemma3.to_model(GEMMA3_1B | change, set())


def test_other_families_do_not_claim_a_gemma3_model() -> None:
    """An export without an origin picks the first family whose `matches` takes the model: Qwen3
    (q/k norms, no biases) must not take Gemma 3."""
    from config.registry import HF_FAMILIES
    from models.hf import gemma3, module_of

    model = gemma3.to_model(GEMMA3_1B, set())
    assert [name for name in HF_FAMILIES if module_of(name).matches(model)] == ["Gemma3ForCausalLM"]
