"""LLaVA (llava-hf layout, CLIP ViT + Llama) from a Hugging Face folder made on the spot, with
transformers as the oracle.

A tiny random LlavaForConditionalGeneration is saved with `save_pretrained`; the engine loads it
through `checkpoint.pretrained_dir` on one CPU rank (FP32) and must give transformers' logits at
every position for one image inside some text. transformers' input_ids hold one `image_token_id`
per image embedding; ours hold one placeholder (-200) that LLaVAModel expands into the same
embeddings, so the two sequences line up once expanded.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from config.hf import model_from_hf
from models.hf import llava
from models.hf.mapping import hf_names
from tests.support.hf_oracle import engine_from_hf, hf_config
from tests.unit.training.test_engine import one_rank  # noqa: F401  (the module's one-rank process group)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_rank")

IMAGE_TOKEN_ID = 199  # transformers' placeholder: a token of the vocabulary
PLACEHOLDER = -200  # Megatron-Core's LLaVAModel's
VOCAB = 200
CLIP_LAYERS = 3


def tiny_llava(
    folder: Path, *, strategy: str = "default", feature_layer: int = -2, tied: bool = False
) -> torch.nn.Module:
    vision = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=CLIP_LAYERS,
        num_attention_heads=4,
        image_size=32,
        patch_size=8,
        projection_dim=16,
    )
    text = transformers.LlamaConfig(
        vocab_size=VOCAB,  # not a multiple of 128: Megatron pads the embedding
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=131_072,
        tie_word_embeddings=tied,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    config = transformers.LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=IMAGE_TOKEN_ID,
        vision_feature_select_strategy=strategy,
        vision_feature_layer=feature_layer,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    model = transformers.LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    return model


def as_on_the_hub(folder: Path) -> None:
    """Rename the vision tower's tensors as the published llava-hf checkpoints name them
    (`vision_tower.vision_model.*`); transformers 5 writes `vision_tower.*`."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    renamed = {
        name.replace("vision_tower.", "vision_tower.vision_model.", 1)
        if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model.")
        else name: value
        for name, value in tensors.items()
    }
    save_file(renamed, path, metadata={"format": "pt"})


def inputs(image_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(our tokens with one placeholder, transformers' tokens with the image's run of
    image_token_id, one image): 5 text tokens, the image, 9 text tokens."""
    text = torch.randint(0, IMAGE_TOKEN_ID, (14,), generator=torch.Generator().manual_seed(1))
    before, after = text[:5], text[5:]
    ours = torch.cat([before, torch.tensor([PLACEHOLDER]), after]).unsqueeze(0)
    run = torch.full((image_tokens,), IMAGE_TOKEN_ID)
    theirs = torch.cat([before, run, after]).unsqueeze(0)
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    return ours, theirs, image


@torch.no_grad()
def llava_logits(trainer, tokens: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """[b, expanded s, vocab] logits of the one-rank LLaVAModel (vocabulary padding cut off)."""
    from training.checkpoint.state import model_chunks

    chunk = model_chunks(trainer.model)["model"].eval()
    positions = torch.arange(tokens.size(1)).unsqueeze(0).expand_as(tokens)
    logits, _ = chunk(images, tokens, positions, None, sound_clips=tokens.new_zeros(0))
    chunk.train()
    return logits[..., :VOCAB]


@pytest.mark.parametrize(
    ("strategy", "feature_layer", "tied"),
    [("default", -2, False), ("full", -1, True)],
    ids=["llava-1.5", "full-last-layer-tied"],
)
def test_llava_logits_match_transformers(
    tmp_path: Path, strategy: str, feature_layer: int, tied: bool
) -> None:
    folder = tmp_path / "hf"
    reference = tiny_llava(folder, strategy=strategy, feature_layer=feature_layer, tied=tied)
    as_on_the_hub(folder)
    cfg = hf_config(folder, tmp_path / "run", seq_length=64)
    v = cfg.model.vision
    assert v.num_layers == CLIP_LAYERS + 1 + feature_layer
    assert v.class_token == (strategy == "full") and cfg.model.rope_scaling == "llama3"
    image_tokens = 16 + int(v.class_token)
    trainer = engine_from_hf(cfg, tmp_path / "run")
    try:
        ours_tokens, their_tokens, image = inputs(image_tokens)
        ours = llava_logits(trainer, ours_tokens, image)
        with torch.no_grad():
            theirs = reference(input_ids=their_tokens, pixel_values=image).logits
        assert ours.shape == theirs.shape == (1, 14 + image_tokens, VOCAB)
        # Measured: bit for bit the same on the CPU (max |difference| 0.0, logits up to ~1.3).
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    finally:
        trainer.close()


def test_every_spelling_of_the_tensor_names_is_read(tmp_path: Path) -> None:
    """The hub's names, transformers 5's (its vision tower without `vision_model.`) and its
    in-memory ones (`model.` in front, `lm_head.weight`): the map reads tensors the folder has,
    and leaves only CLIP's last layer and post-layernorm, which LLaVA does not use."""
    tiny_llava(tmp_path / "hf")
    model = model_from_hf(tmp_path / "hf")
    saved = set(load_file(tmp_path / "hf" / "model.safetensors"))
    hub = {n.replace("vision_tower.", "vision_tower.vision_model.", 1) for n in saved}
    in_memory = {
        "lm_head.weight"
        if n == "language_model.lm_head.weight"
        else "model." + n.replace("language_model.model.", "language_model.", 1)
        for n in saved
    }
    for names in (saved, hub, in_memory):
        used = {n for node in llava.weights(model, 256, names).values() for n in hf_names(node)}
        assert used == names - unused(names)
    declared = {n for node in llava.weights(model, 256).values() for n in hf_names(node)}
    assert declared == hub - unused(hub)  # without names: the hub's


def unused(names: set[str]) -> set[str]:
    """CLIP's tensors after the feature layer (-2: its last layer and its post-layernorm)."""
    last = f".encoder.layers.{CLIP_LAYERS - 1}."
    return {n for n in names if ".post_layernorm." in n or last in n}


def test_a_config_megatron_cannot_compute_is_refused_naming_the_field(tmp_path: Path) -> None:
    tiny_llava(tmp_path / "hf")
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    model = llava.to_model(hf, set())
    assert model.vision.num_layers == CLIP_LAYERS - 1 and llava.matches(model)
    # An export without a Hugging Face origin declares the ViT's layers and the last as features.
    exported = llava.to_hf(model)
    assert exported["vision_feature_layer"] == -1
    assert llava.to_model(exported, set()) == model
    assert transformers.LlavaConfig(**exported).vision_config.num_hidden_layers == CLIP_LAYERS - 1
    refused = {
        "vision_feature_layer": ([-2, -1], r"vision_feature_layer=\[-2, -1\]: .* one layer"),
        "projector_hidden_act": ("silu", r"projector_hidden_act='silu'"),
        "multimodal_projector_bias": (False, r"multimodal_projector_bias=False"),
    }
    for field, (value, message) in refused.items():
        with pytest.raises(ValueError, match=message):
            llava.to_model(hf | {field: value}, set())
    eps = hf | {"vision_config": hf["vision_config"] | {"layer_norm_eps": 1e-6}}
    with pytest.raises(ValueError, match=r"vision_config.layer_norm_eps=1e-06"):
        llava.to_model(eps, set())
