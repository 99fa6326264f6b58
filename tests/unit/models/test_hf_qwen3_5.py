"""Qwen3.5 dense and MoE (Gated DeltaNet, gated attention, zero-centred norms, a gated shared
expert) from Hugging Face folders made on the spot, with transformers as the oracle.

As tests/unit/models/test_hf_families.py: a tiny random model with both layer kinds (three Gated
DeltaNet layers, then full attention, twice) is saved with `save_pretrained`, the engine loads it
through `checkpoint.pretrained_dir` on one CPU rank in FP32 (Gated DeltaNet through the CPU mode's
torch stand-ins of fla's kernels) and must give transformers' logits. Norm weights, A_log and
dt_bias are randomised, so a norm mapped to the wrong tensor or a zero-centred norm taken as plain
shows in the logits; the sequence (80 tokens) is longer than the delta rule's chunk of 64, so the
state carried between chunks is exercised.

Tolerance: 5e-4 on logits of standard deviation about 0.8 (measured largest differences: 6.3e-5
dense, 2.7e-4 for the published class's draw of weights, the same language model as transformers'
text class to the bit). The chunked delta rule is exact only up to its triangular solve in FP32:
Megatron-Core's torch_chunk_gated_delta_rule and transformers' each stand about 1e-6 from the
step-by-step recurrence on outputs of magnitude 1 and differ from each other as much
(tests/unit/training/test_gdn_cpu.py), which eight layers of random weights at std 0.1 grow. A
mapping mistake (a query taken for its gate, a norm taken as plain) moves the logits by 1e-2 and
more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.hf_oracle import engine_from_hf, gpt_logits, hf_config
from tests.unit.training.test_engine import one_rank  # noqa: F401  (the module's one-rank process group)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_rank")

VOCAB = 200  # not a multiple of 128: Megatron pads the embedding
SEQ = 80
TOKENS = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
INIT = 0.1

SIZES: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    initializer_range=INIT,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
)


def save(model_class: Any, config: Any, folder: Path) -> torch.nn.Module:
    """A random model of `config`, its norms, A_log and dt_bias randomised, saved in `folder`."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith(("norm.weight", "dt_bias", "A_log")):
                tensor.add_(0.2 * torch.randn_like(tensor))
    model.save_pretrained(folder)
    return model


def tiny_dense(folder: Path) -> torch.nn.Module:
    config = transformers.Qwen3_5TextConfig(intermediate_size=96, **SIZES)
    return save(transformers.Qwen3_5ForCausalLM, config, folder)


def tiny_moe(folder: Path) -> torch.nn.Module:
    config = transformers.Qwen3_5MoeTextConfig(
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=2,
        **SIZES,
    )
    return save(transformers.Qwen3_5MoeForCausalLM, config, folder)


def assert_logits_match(
    reference: torch.nn.Module, folder: Path, run_dir: Path, weights: Path | None = None
) -> float:
    cfg = hf_config(folder, run_dir, seq_length=SEQ)
    if weights is not None:
        cfg.checkpoint.pretrained_dir = str(weights)
    trainer = engine_from_hf(cfg, run_dir)
    try:
        ours = gpt_logits(trainer, TOKENS)
        with torch.no_grad():
            theirs = reference(TOKENS).logits
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=5e-4)
        return float((ours - theirs).abs().max())
    finally:
        trainer.close()


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_qwen3_5_logits_match_transformers(tmp_path: Path, kind: str) -> None:
    reference = (tiny_dense if kind == "dense" else tiny_moe)(tmp_path / "hf")
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def add_published_extras(folder: Path) -> None:
    """What the published folders hold beside the language model: a vision tower tensor and an
    MTP layer's tensors (transformers loads neither into the text model), added to the folder."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    tensors["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2)
    tensors["mtp.fc.weight"] = torch.randn(64, 128)
    tensors["mtp.layers.0.input_layernorm.weight"] = torch.randn(64)
    save_file(tensors, path, metadata={"format": "pt"})


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_import_then_export_gives_every_tensor_back_bit_for_bit(tmp_path: Path, kind: str) -> None:
    """`recipes import` (Transformer Engine's names: Gated DeltaNet's input norm fused into
    in_proj, its in_proj and conv1d split in parts) then a CPU run from it (the local names) with
    transformers' logits, then `export`: every tensor back bit for bit, the vision and MTP tensors
    the language model leaves out included."""
    from recipes.cli import main
    from training.hf.convert import iter_tensors

    reference = (tiny_dense if kind == "dense" else tiny_moe)(tmp_path / "hf")
    add_published_extras(tmp_path / "hf")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run", tmp_path / "imported")
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 0
    original, back = dict(iter_tensors(tmp_path / "hf")), dict(iter_tensors(tmp_path / "back"))
    assert sorted(back) == sorted(original)
    for name, value in original.items():
        assert torch.equal(back[name], value), name


def tiny_published(folder: Path) -> torch.nn.Module:
    """A tiny Qwen3_5ForConditionalGeneration: the class and layout of the published folders
    (text_config nested in config.json, the language model under `model.language_model`, a
    vision tower under `model.visual`)."""
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=4,
        temporal_patch_size=2,
        spatial_merge_size=2,
        num_position_embeddings=16,
    )
    text = dict(intermediate_size=96, **SIZES)
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision)
    return save(transformers.Qwen3_5ForConditionalGeneration, config, folder)


def test_the_published_vision_language_folder_trains_its_language_model(tmp_path: Path) -> None:
    """`checkpoint.pretrained_dir` (and `model=`) on a Qwen3_5ForConditionalGeneration folder:
    the language model loads (its prefix read from the folder's names, its config from
    text_config) with transformers' logits for text, the vision tower left out by name."""
    from config.hf import model_from_hf
    from models.hf import qwen3_5

    reference = tiny_published(tmp_path / "hf")
    from safetensors import safe_open

    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert any(n.startswith("model.visual.") for n in names)
    assert qwen3_5.prefix(names) == "model.language_model"
    model = model_from_hf(tmp_path / "hf", SEQ)
    assert (model.num_layers, model.linear_attention_freq) == (8, 4)
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")


def tiny_next(folder: Path) -> torch.nn.Module:
    """A tiny Qwen3-Next: Gated DeltaNet's projections fused per key head, a dense first layer.
    Every token goes to every expert (top 4 of 4): with top 2, rounding flips one token's choice
    in this draw (positions 52-55 of a row then differ by 1e-3), which says nothing of the map;
    the experts still weigh by the router's softmax."""
    config = transformers.Qwen3NextConfig(
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        num_experts=4,
        num_experts_per_tok=4,
        mlp_only_layers=[0],
        **SIZES,
    )
    return save(transformers.Qwen3NextForCausalLM, config, folder)


def test_qwen3_next_logits_match_and_export_is_bit_for_bit(tmp_path: Path) -> None:
    from recipes.cli import main
    from training.hf.convert import iter_tensors

    reference = tiny_next(tmp_path / "hf")
    assert_logits_match(reference, tmp_path / "hf", tmp_path / "run")
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    assert main(["export", str(tmp_path / "imported"), str(tmp_path / "back")]) == 0
    original, back = dict(iter_tensors(tmp_path / "hf")), dict(iter_tensors(tmp_path / "back"))
    assert sorted(back) == sorted(original)
    for name, value in original.items():
        assert torch.equal(back[name], value), name
