"""LLaVA (LlavaForConditionalGeneration, the llava-hf layout) <-> Megatron-Core's LLaVAModel.

A CLIP ViT (`vision_config`, model_type clip_vision_model), a two-layer MLP projector
(`multi_modal_projector`: Linear, GELU, Linear, with biases) and a Llama language model
(`text_config`, model_type llama; the Llama map of models/hf/llama.py under Megatron's
`language_model.` prefix). What transformers computes, and how our model computes the same:

- The image features are CLIP's hidden states at `vision_feature_layer` (-2 by default: after all
  layers but the last), before CLIP's post-layernorm. Megatron's CLIPViTModel returns the output
  of its last layer with no final norm, so our ViT is built with just the layers transformers runs
  (`num_hidden_layers + 1 + vision_feature_layer`); CLIP's unused last layer and post-layernorm are
  not mapped (an import keeps them aside for the export).
- `vision_feature_select_strategy` "default" drops the class token from the features, "full"
  keeps it: VisionConfig.class_token False / True (Megatron's CLIPViTModel always has the class
  token; LLaVAModel drops its output when told to).
- One image is `image_seq_length` copies of `image_token_id` in transformers' input_ids, and one
  placeholder (-200) in ours, which LLaVAModel expands into the same embeddings; the text around
  it is the same tokens at the same positions once expanded.

The ViT's keys are Transformer Engine's (the norms fused into the next linear layer:
`self_attention.linear_qkv.layer_norm_weight` / `_bias`, `mlp.linear_fc1.layer_norm_weight` /
`_bias`); models/llava.py keys the local spec's separate norms the same way.

Megatron-Core's vision tower has a fixed CLIP shape: LayerNorm with epsilon 1e-5, quick-GELU,
biases everywhere, no bias on the patch convolution; the projector's activation is exact GELU.
A config.json asking for anything else is refused, naming the field.

Tensor names: the llava-hf checkpoints on the hub (saved by transformers 4) hold
`language_model.model.*`, `language_model.lm_head.weight`, `vision_tower.vision_model.*` and
`multi_modal_projector.*`. transformers 5 writes the vision tower as `vision_tower.*` (CLIPVisionModel
lost its `vision_model.` level), and its in-memory names are `model.language_model.*`,
`model.vision_tower.*`, `model.multi_modal_projector.*`, `lm_head.weight`. `weights` takes the
folder's tensor names to pick the spelling they use; without them it declares the hub's (which is
also what an export writes).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from config.schema import ModelConfig, VisionConfig
from models.hf import gpt, llama
from models.hf.mapping import Node, Reshaped, tensor

ARCHITECTURE = "LlavaForConditionalGeneration"
CLIP_LAYERNORM_EPSILON = 1e-5  # models/llava.py builds the ViT's norms with it

# transformers' defaults for the fields a config.json may leave out: LlavaConfig's, the vision
# tower LlavaConfig makes when there is no vision_config (CLIP ViT-L/14-336), CLIPVisionConfig's
# and LlamaConfig's.
LLAVA_DEFAULTS: dict[str, Any] = {
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "projector_hidden_act": "gelu",
    "multimodal_projector_bias": True,
    "tie_word_embeddings": False,
}
LLAVA_VISION: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "image_size": 336,
    "patch_size": 14,
}
CLIP_VISION_DEFAULTS: dict[str, Any] = {
    "model_type": "clip_vision_model",
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "image_size": 224,
    "patch_size": 32,
    "num_channels": 3,
    "hidden_act": "quick_gelu",
    "layer_norm_eps": 1e-5,
}
LLAMA_DEFAULTS: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}


# --- config.json ---------------------------------------------------------------------------------
def _sections(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(LLaVA's own fields, vision_config, text_config), each with transformers' defaults filled."""
    top = LLAVA_DEFAULTS | hf
    vision = CLIP_VISION_DEFAULTS | (hf.get("vision_config") or LLAVA_VISION)
    text = LLAMA_DEFAULTS | (hf.get("text_config") or {})
    return top, vision, text


def _refuse(field: str, value: Any, why: str) -> None:
    raise ValueError(f"config.json {field}={value!r}: {why}")


def vision_layers(layers: int, feature_layer: Any) -> int:
    """How many CLIP layers the features go through: hidden_states[k] is the embeddings after k
    layers (hidden_states[0]: after the pre-layernorm only), a negative k counts from the end of
    the num_layers + 1 hidden states."""
    if isinstance(feature_layer, bool) or not isinstance(feature_layer, int):
        _refuse(
            "vision_feature_layer",
            feature_layer,
            "Megatron-Core's LLaVAModel takes the features of one layer (not several concatenated)",
        )
    used = feature_layer if feature_layer >= 0 else layers + 1 + feature_layer
    if not 1 <= used <= layers:
        _refuse(
            "vision_feature_layer",
            feature_layer,
            f"the features must come out of one of CLIP's {layers} layers",
        )
    return used


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    top, v, text = _sections(hf)
    if v.get("model_type") != "clip_vision_model":
        _refuse(
            "vision_config.model_type", v.get("model_type"), "the vision tower mapped is CLIP's"
        )
    if text.get("model_type") != "llama":
        _refuse(
            "text_config.model_type", text.get("model_type"), "the language model mapped is Llama"
        )
    checks = (
        ("vision_config.hidden_act", v["hidden_act"], "quick_gelu", "CLIP's ViT uses quick-GELU"),
        (
            "vision_config.layer_norm_eps",
            float(v["layer_norm_eps"]),
            CLIP_LAYERNORM_EPSILON,
            "the ViT's LayerNorms are built with CLIP's epsilon",
        ),
        ("vision_config.num_channels", v["num_channels"], 3, "the ViT takes RGB images"),
        ("projector_hidden_act", top["projector_hidden_act"], "gelu", "the projector uses GELU"),
        (
            "multimodal_projector_bias",
            top["multimodal_projector_bias"],
            True,
            "the projector has biases",
        ),
    )
    for field, value, expected, why in checks:
        if value != expected:
            _refuse(field, value, f"{why} ({expected!r}) in Megatron-Core's LLaVAModel")
    strategy = top["vision_feature_select_strategy"]
    if strategy not in ("default", "full"):
        _refuse("vision_feature_select_strategy", strategy, "transformers knows default and full")
    model = llama.to_model(text | {"tie_word_embeddings": _tied(top, text)}, set())
    if model.rope_scaling not in (None, "llama3"):
        _refuse(
            "text_config.rope_scaling",
            model.rope_scaling,
            "LLaVAModel's language model takes Llama 3's RoPE scaling only",
        )
    model.arch = "llava"
    model.vision = VisionConfig(
        num_layers=vision_layers(v["num_hidden_layers"], top["vision_feature_layer"]),
        hidden_size=v["hidden_size"],
        ffn_hidden_size=v["intermediate_size"],
        num_attention_heads=v["num_attention_heads"],
        image_size=v["image_size"],
        patch_size=v["patch_size"],
        class_token=strategy == "full",
        projector_hidden_size=None,  # linear_1 goes to the language model's width
    )
    return model


def _tied(top: dict[str, Any], text: dict[str, Any]) -> bool:
    """LlavaConfig ties the output layer to the embedding when either config.json level says so."""
    return bool(top.get("tie_word_embeddings") or text.get("tie_word_embeddings"))


def to_hf(model: ModelConfig) -> dict[str, Any]:
    """config.json of a LLaVA exported from a run without a Hugging Face origin.

    Our ViT's last layer is the feature layer, so the export declares exactly those layers and
    `vision_feature_layer` -1 (CLIP's post-layernorm, which LLaVA never uses, is not written).
    """
    v = model.vision
    assert v is not None, "a LLaVA has model.vision (`matches`, config/rules/vision.py)"
    text = llama.to_hf(model)
    text.pop("architectures")
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llava",
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": v.hidden_size,
            "intermediate_size": v.ffn_hidden_size,
            "num_hidden_layers": v.num_layers,
            "num_attention_heads": v.num_attention_heads,
            "image_size": v.image_size,
            "patch_size": v.patch_size,
            "num_channels": 3,
            "hidden_act": "quick_gelu",
            "layer_norm_eps": CLIP_LAYERNORM_EPSILON,
        },
        "text_config": text,
        "vision_feature_layer": -1,
        "vision_feature_select_strategy": "full" if v.class_token else "default",
        "projector_hidden_act": "gelu",
        "multimodal_projector_bias": True,
        "image_seq_length": (v.image_size // v.patch_size) ** 2 + int(v.class_token),
        "tie_word_embeddings": model.share_embeddings_and_output_weights,
    }


def matches(model: ModelConfig) -> bool:
    v = model.vision
    return (
        model.arch == "llava"
        and v is not None
        and (v.projector_hidden_size or model.hidden_size) == model.hidden_size
        and llama.matches(dataclasses.replace(model, arch="gpt", vision=None))
    )


# --- weights -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Spelling:
    """Where a folder keeps each part: the prefixes of its tensor names."""

    language: str  # before `.layers.<i>`, `.embed_tokens.weight`, `.norm.weight`
    lm_head: str
    vision: str  # before `.embeddings`, `.pre_layrnorm`, `.encoder.layers.<i>`
    projector: str


HUB = Spelling(
    "language_model.model",
    "language_model.lm_head.weight",
    "vision_tower.vision_model",
    "multi_modal_projector",
)


def spelling(names: Collection[str] | None) -> Spelling:
    """The spelling the names use (each part looked up by one tensor it must have); the hub's
    when there are no names."""
    if not names:
        return HUB

    def first(candidates: tuple[str, ...], suffix: str) -> str:
        for prefix in candidates:
            if f"{prefix}{suffix}" in names:
                return prefix
        return candidates[0]

    language = first(("language_model.model", "model.language_model"), ".embed_tokens.weight")
    lm_head = first(("language_model.lm_head", "lm_head"), ".weight") + ".weight"
    vision = first(
        (
            "vision_tower.vision_model",
            "vision_tower",
            "model.vision_tower.vision_model",
            "model.vision_tower",
        ),
        ".embeddings.class_embedding",
    )
    projector = first(("multi_modal_projector", "model.multi_modal_projector"), ".linear_1.weight")
    return Spelling(language, lm_head, vision, projector)


def vision_weights(v: VisionConfig, meg: str, hf: str) -> dict[str, Node]:
    """CLIP's embeddings and its first `v.num_layers` layers as CLIPViTModel keys them."""
    h = v.hidden_size
    out: dict[str, Node] = {
        f"{meg}class_token": Reshaped(tensor(f"{hf}.embeddings.class_embedding"), (1, 1, h), (h,)),
        f"{meg}conv1.weight": tensor(f"{hf}.embeddings.patch_embedding.weight"),
        f"{meg}position_embeddings.weight": tensor(f"{hf}.embeddings.position_embedding.weight"),
        f"{meg}ln_pre.weight": tensor(f"{hf}.pre_layrnorm.weight"),
        f"{meg}ln_pre.bias": tensor(f"{hf}.pre_layrnorm.bias"),
    }
    heads = v.num_attention_heads
    head_dim = h // heads
    for i in range(v.num_layers):
        m, layer = f"{meg}decoder.layers.{i}", f"{hf}.encoder.layers.{i}"
        a = f"{layer}.self_attn"
        for kind in ("weight", "bias"):
            out[f"{m}.self_attention.linear_qkv.layer_norm_{kind}"] = tensor(
                f"{layer}.layer_norm1.{kind}"
            )
            out[f"{m}.self_attention.linear_qkv.{kind}"] = gpt.qkv(
                f"{a}.q_proj.{kind}",
                f"{a}.k_proj.{kind}",
                f"{a}.v_proj.{kind}",
                heads,
                heads,
                head_dim,
            )
            out[f"{m}.self_attention.linear_proj.{kind}"] = tensor(f"{a}.out_proj.{kind}")
            out[f"{m}.mlp.linear_fc1.layer_norm_{kind}"] = tensor(f"{layer}.layer_norm2.{kind}")
            out[f"{m}.mlp.linear_fc1.{kind}"] = tensor(f"{layer}.mlp.fc1.{kind}")
            out[f"{m}.mlp.linear_fc2.{kind}"] = tensor(f"{layer}.mlp.fc2.{kind}")
    return out


def weights(
    model: ModelConfig, padded_vocab: int, names: Collection[str] | None = None
) -> dict[str, Node]:
    """Megatron key -> Hugging Face tensors, in the spelling of `names` (a folder's tensor names;
    None: the hub's)."""
    s = spelling(names)
    out = llama.weights(model, padded_vocab, meg="language_model.", hf=s.language)
    if "language_model.output_layer.weight" in out:  # the LM head is not under the LM's prefix
        out["language_model.output_layer.weight"] = gpt.padded_rows(
            s.lm_head, model.vocab_size, padded_vocab
        )
    assert model.vision is not None, "a LLaVA has model.vision (`matches`, config/rules/vision.py)"
    out |= vision_weights(model.vision, "vision_model.", s.vision)
    for i, hf_linear in ((1, "linear_1"), (2, "linear_2")):
        for kind in ("weight", "bias"):
            out[f"vision_projection.encoder.linear_fc{i}.{kind}"] = tensor(
                f"{s.projector}.{hf_linear}.{kind}"
            )
    return out


# A tensor of CLIP's that LLaVA never runs, in any spelling of `spelling`: its post-layernorm, or
# a layer (group 1: its number) that is one only past the feature layer.
CLIP_UNUSED = re.compile(
    r"(?:model\.)?vision_tower(?:\.vision_model)?\.(?:post_layernorm|encoder\.layers\.(\d+))\..*"
)


def skipped(model: ModelConfig, name: str) -> bool:
    """CLIP's layers after the feature layer and its post-layernorm (see the module docstring;
    an import keeps them aside for the export)."""
    match = CLIP_UNUSED.fullmatch(name)
    if match is None or model.vision is None:
        return False
    return match[1] is None or int(match[1]) >= model.vision.num_layers
