"""The checker's rules for vision-language models (arch "llava", config/registry.py). Whether the
data has images at all is the data rules' business (config/rules/data.py); the sizes and the Energon
loader's numbers each have their range (config/rules/ranges.py).

The ViT's head dimension is model.vision.hidden_size // num_attention_heads, as Megatron-Core
derives kv_channels (models/llava.py passes the same): a width that the heads do not divide builds
and trains, its attention narrower than the hidden size."""

from __future__ import annotations

from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem, choices, divisors
from config.schema import TrainingConfig


def multimodal(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    """arch "llava": a ViT and its projector in front of the GPT, fed by Energon (images + text).

    Runs for the architectures whose registry entry names it."""
    model, v = cfg.model, cfg.model.vision
    if v is None:
        return [Problem("model.vision", f"arch '{model.arch}' needs a vision section")]
    out: list[Problem] = []
    tp = cfg.parallel.tensor_model_parallel_size
    if min(v.num_attention_heads, v.patch_size, v.image_size, tp) < 1:
        return out  # config/rules/ranges.py names them
    if v.image_size % v.patch_size:
        out.append(
            Problem(
                "model.vision.image_size",
                f"{v.image_size} is not a multiple of model.vision.patch_size={v.patch_size}; the "
                "ViT cuts the image into whole patches",
            )
        )
    patches = (v.image_size // v.patch_size) ** 2
    tokens = patches + int(v.class_token)
    if tokens >= model.seq_length:
        need = tokens + 1
        out.append(
            Problem(
                "model.seq_length",
                f"one image takes ({v.image_size}/{v.patch_size})^2 = {patches} patches"
                f"{' + 1 class token' if v.class_token else ''} = {tokens} positions, which leaves no "
                f"room for text in seq_length={model.seq_length}; raise model.seq_length above "
                f"{tokens} (e.g. {max(need, 2 * tokens)}) or use larger patches / smaller images",
            )
        )
    projector = v.projector_hidden_size or model.hidden_size
    for field, value in (
        ("model.vision.num_attention_heads", v.num_attention_heads),
        ("model.vision.ffn_hidden_size", v.ffn_hidden_size),
        ("model.vision.projector_hidden_size", projector),
    ):
        if value % tp:
            out.append(
                Problem(
                    "parallel.tensor_model_parallel_size",
                    f"{field}={value} is not divisible by TP={tp}: the vision encoder and its "
                    f"projector are split over the same TP group as the language model; use TP "
                    f"in {{{choices([t for t in divisors(value) if model.num_attention_heads % t == 0])}}}",
                )
            )
    if cfg.parallel.pipeline_model_parallel_size > 1:
        out.append(
            Problem(
                "parallel.pipeline_model_parallel_size",
                f"is {cfg.parallel.pipeline_model_parallel_size}, but arch 'llava' builds the "
                "vision encoder, projector and language model in one pipeline stage here; set it "
                "to 1 and scale with TP and DP",
            )
        )
    unsupported = {
        "model.num_moe_experts": model.num_moe_experts,
        "model.multi_latent_attention": model.multi_latent_attention or None,
        "model.mtp_num_layers": model.mtp_num_layers,
    }
    for field, setting in unsupported.items():
        if setting:
            out.append(
                Problem(field, f"arch 'llava' builds a dense GPT language model; unset {field}")
            )
    return out
