"""The language model of a Gemma 3 vision-language folder (Gemma3ForConditionalGeneration: the
published 4B, 12B and 27B) <-> Megatron-Core's GPTModel: text only.

The folder's `text_config` is a Gemma 3 text model (models/hf/gemma3.py; the published ones leave
out the fields at transformers' Gemma3TextConfig defaults, which that map fills in). **The SigLIP
vision tower and the multi-modal projector are not loaded**: `skipped` names them, so a run trains
the language model on text, `recipes import` keeps them aside and `recipes export` writes them back
unchanged (from the imported checkpoint, or from the folder the run started from), giving a
Gemma3ForConditionalGeneration folder whose language model is the trained one. A model that did
not start from such a folder exports as Gemma3ForCausalLM (`matches` is False here; `to_hf`
refuses, having no vision tower to write).

Tensor names: the hub's checkpoints (saved by transformers 4) hold `language_model.model.*`,
`vision_tower.vision_model.*` and `multi_modal_projector.*`; transformers 5 saves
`model.language_model.*`, `model.vision_tower.*` and `model.multi_modal_projector.*`. `weights`
takes the folder's names to pick the spelling; without them it declares the hub's. The embedding
is tied to the output layer in every published size, and a folder that unties it is refused.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gemma3
from models.hf.mapping import Node

ARCHITECTURE = "Gemma3ForConditionalGeneration"
HUB, TRANSFORMERS_5 = "language_model.model", "model.language_model"
VISION = (
    "vision_tower.",
    "multi_modal_projector.",
    "model.vision_tower.",
    "model.multi_modal_projector.",
)


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    text = dict(hf.get("text_config") or {})
    tied = text.get("tie_word_embeddings", hf.get("tie_word_embeddings", True))
    if not tied:
        raise ValueError(
            "config.json tie_word_embeddings=false: the language model of a Gemma 3 "
            "vision-language folder is mapped with its embedding tied to the output layer, as "
            "Google publishes every size"
        )
    return gemma3.to_model(text | {"tie_word_embeddings": True}, names)


def to_hf(model: ModelConfig) -> dict[str, Any]:
    raise ValueError(
        f"a {ARCHITECTURE} folder needs its vision tower, which a model that did not start from "
        f"such a folder lacks; export it with --family {gemma3.ARCHITECTURE} (text only)"
    )


def matches(model: ModelConfig) -> bool:
    return False  # see `to_hf`: Gemma3ForCausalLM takes a Gemma 3 model without an origin


def skipped(model: ModelConfig, name: str) -> bool:
    """The vision tower and the projector: not loaded, kept aside by an import."""
    return name.startswith(VISION)


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str | None = None,
) -> dict[str, Node]:
    if hf is None:
        new = names is not None and any(n.startswith(TRANSFORMERS_5 + ".") for n in names)
        hf = TRANSFORMERS_5 if new else HUB
    return gemma3.weights(model, padded_vocab, names, meg, hf)
