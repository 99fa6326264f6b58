"""Llama 3 from a Hugging Face folder made on the spot, with transformers as the oracle.

A tiny random LlamaForCausalLM (GQA, llama3 RoPE scaling, tied and untied embeddings) is saved
with `save_pretrained`; the engine loads it through `checkpoint.pretrained_dir` on one CPU rank and
must give the same logits in FP32. The multi-rank layouts are tests/smoke/test_hf_layouts.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support.hf_oracle import engine_from_hf, gpt_logits, hf_config
from tests.unit.training.test_engine import one_rank  # noqa: F401  (the module's one-rank process group)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_rank")


def tiny_llama(folder: Path, *, tied: bool = False, scaled: bool = True) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=200,  # not a multiple of 128: Megatron pads the embedding
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500_000.0,
        tie_word_embeddings=tied,
        max_position_embeddings=131_072,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
        if scaled
        else None,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_llama_logits_match_transformers(tmp_path: Path, tied: bool) -> None:
    reference = tiny_llama(tmp_path / "hf", tied=tied)
    cfg = hf_config(tmp_path / "hf", tmp_path / "run")
    assert (
        cfg.model.rope_scaling == "llama3" and cfg.model.share_embeddings_and_output_weights == tied
    )
    trainer = engine_from_hf(cfg, tmp_path / "run")
    try:
        tokens = torch.randint(0, 200, (2, 32), generator=torch.Generator().manual_seed(1))
        ours = gpt_logits(trainer, tokens)
        with torch.no_grad():
            theirs = reference(tokens).logits
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    finally:
        trainer.close()


def test_a_folder_whose_architecture_differs_is_refused_naming_the_field(tmp_path: Path) -> None:
    tiny_llama(tmp_path / "hf")
    cfg = hf_config(tmp_path / "hf", tmp_path / "run")
    cfg.model.ffn_hidden_size = 128
    with pytest.raises(ValueError, match=r"model.ffn_hidden_size=128 but the folder has 96"):
        engine_from_hf(cfg, tmp_path / "run")
