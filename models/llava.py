"""Megatron-Core's LLaVAModel from our config tree: CLIP ViT + MLP projector + GPT language model.

Built the way Megatron-LM's examples/multimodal/model.py builds it, with three configs derived
from the language model's TransformerConfig (the same TP size, dtype and CPU initialisation):

- vision: CLIP-style ViT (LayerNorm, quick-GELU, biases on every linear and on QKV), no
  sequence or context parallel (Megatron runs the encoder without them), no FP8 (577 tokens are
  not a multiple of 16, which FP8 GEMMs need);
- projector: Linear(vision hidden -> projector hidden), GELU, Linear(-> LM hidden), with biases;
- language: the GPT of models/gpt.py `transformer_config`.

Layer specs: Transformer Engine's when it imports on a GPU; otherwise Megatron-Core's local specs
with core attention through torch's SDPA (models/sdpa.py `SdpaAttention`), the CPU smoke mode
included. Two CUDA/TE assumptions of CLIPViTModel are bridged while the model is built without TE
(see `_without_te`). The encoder and the LM live on one pipeline stage: the checker rejects PP > 1
for arch "llava" (config/rules/).

Freezing (model.vision.freeze_vision / freeze_language) sets requires_grad=False before the model
is wrapped in DDP, so frozen weights get no gradient buffer and no optimizer state.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_layer_local_spec,
    get_gpt_layer_with_transformer_engine_spec,
)
from megatron.core.models.multimodal import llava_model as mc_llava
from megatron.core.models.vision.vit_layer_specs import (
    get_vit_layer_with_local_spec,
    get_vit_layer_with_transformer_engine_spec,
)
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_config import TransformerConfig

from config.finalize import Derived
from config.schema import TrainingConfig
from models.sdpa import SdpaAttention
from models.specs import choose_backend

# What the vision and projector configs take over from the language model's config.
_SHARED_FIELDS = (
    "tensor_model_parallel_size",
    "bf16",
    "fp16",
    "params_dtype",
    "pipeline_dtype",
    "use_cpu_initialization",
    "transformer_impl",
    "init_method_std",
)


# The checker refuses arch "llava" without model.vision (config/rules/vision.py): what is built
# here always has one.
_NEEDS_VISION = "arch 'llava' needs a model.vision section"


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's activation: x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


def _shared(language: TransformerConfig) -> dict[str, Any]:
    return {name: getattr(language, name) for name in _SHARED_FIELDS}


def vision_config(cfg: TrainingConfig, language: TransformerConfig) -> TransformerConfig:
    v = cfg.model.vision
    assert v is not None, _NEEDS_VISION
    config = TransformerConfig(
        num_layers=v.num_layers,
        hidden_size=v.hidden_size,
        ffn_hidden_size=v.ffn_hidden_size,
        num_attention_heads=v.num_attention_heads,
        num_query_groups=v.num_attention_heads,
        kv_channels=v.hidden_size // v.num_attention_heads,
        normalization="LayerNorm",
        layernorm_epsilon=1e-5,
        activation_func=_quick_gelu,
        gated_linear_unit=False,
        add_bias_linear=True,
        add_qkv_bias=True,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        apply_rope_fusion=False,
        **_shared(language),
    )
    config.vision_model_type = "clip"  # read by LLaVAModel to build a CLIPViTModel
    return config


def projector_config(cfg: TrainingConfig, language: TransformerConfig) -> TransformerConfig:
    m = cfg.model
    assert m.vision is not None, _NEEDS_VISION
    return TransformerConfig(
        num_layers=1,  # unused by the MLP; TransformerConfig insists on a value
        hidden_size=m.hidden_size,  # the projector's output: the LM's input width
        ffn_hidden_size=m.vision.projector_hidden_size or m.hidden_size,
        num_attention_heads=language.num_attention_heads,  # unused; must divide over TP
        activation_func=F.gelu,
        gated_linear_unit=False,
        add_bias_linear=True,
        bias_activation_fusion=False,
        **_shared(language),
    )


def _sdpa(spec: ModuleSpec) -> ModuleSpec:
    attention = spec.submodules.self_attention.submodules
    if attention.core_attention is DotProductAttention:
        attention.core_attention = SdpaAttention
    return spec


def layer_specs(cfg: TrainingConfig, backend: str) -> tuple[ModuleSpec, ModuleSpec, MLPSubmodules]:
    """(language layer, vision layer, projector MLP) for "te" or "sdpa"."""
    m = cfg.model
    if backend == "te":
        from megatron.core.extensions.transformer_engine import (
            TEColumnParallelLinear,
            TERowParallelLinear,
        )

        language = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=m.qk_layernorm)
        projector = MLPSubmodules(linear_fc1=TEColumnParallelLinear, linear_fc2=TERowParallelLinear)
        return language, get_vit_layer_with_transformer_engine_spec(), projector
    language = _sdpa(
        get_gpt_layer_local_spec(normalization=m.normalization, qk_layernorm=m.qk_layernorm)
    )
    projector = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    vision = _sdpa(get_vit_layer_with_local_spec())
    # Checkpoint keys as Transformer Engine's ViT layer names them (its norms are fused into the
    # next linear layer), as the local GPT layer spec already does: a checkpoint then loads with
    # either spec, and one weight map (models/hf/llava.py) serves both.
    vision.submodules.sharded_state_dict_keys_map = {
        "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
        "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
    }
    return language, vision, projector


class _CpuIds(torch.Tensor):
    """Position ids whose `.cuda()` keeps them where they are (see `_without_te`)."""

    def cuda(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)


class _ClipTorch(types.ModuleType):
    """torch as clip_vit_model sees it while building on a machine without CUDA."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def arange(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.arange(*args, **kwargs).as_subclass(_CpuIds)


@contextlib.contextmanager
def _without_te() -> Iterator[None]:
    """While building without Transformer Engine: CLIPViTModel's default pre-norm is a bare
    torch.nn.LayerNorm, which cannot take Megatron's (config, hidden_size, eps) arguments, so it
    gets Megatron's WrappedTorchNorm; and without CUDA its position ids (`arange(...).cuda()`)
    stay on the CPU."""
    from megatron.core.models.vision import clip_vit_model
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    original_vit, original_torch = mc_llava.CLIPViTModel, clip_vit_model.torch
    mc_llava.CLIPViTModel = partial(
        original_vit, ln_pre_impl=WrappedTorchNorm, ln_post_impl=WrappedTorchNorm
    )
    if not torch.cuda.is_available():
        clip_vit_model.torch = _ClipTorch("torch")
    try:
        yield
    finally:
        mc_llava.CLIPViTModel, clip_vit_model.torch = original_vit, original_torch


def build_llava_chunks(
    cfg: TrainingConfig, derived: Derived, language: TransformerConfig, device: str
) -> list[mc_llava.LLaVAModel]:
    """This rank's LLaVAModel (one chunk: encoder, projector and the whole LM stage), frozen parts
    marked, not yet wrapped or moved."""
    m, v = cfg.model, cfg.model.vision
    assert v is not None, _NEEDS_VISION
    backend = choose_backend(device)
    language_spec, vision_spec, projector_spec = layer_specs(cfg, backend)
    build = contextlib.nullcontext() if backend == "te" else _without_te()
    with build:
        model = mc_llava.LLaVAModel(
            language_transformer_config=language,
            language_transformer_layer_spec=language_spec,
            language_vocab_size=derived.padded_vocab_size,
            language_max_sequence_length=m.seq_length,
            vision_transformer_config=vision_config(cfg, language),
            vision_transformer_layer_spec=vision_spec,
            # Megatron's CLIP ViT always has the class token; LLaVA-1.5 drops its output
            # (transformers' vision_feature_select_strategy "default"), "full" keeps it.
            drop_vision_class_token=not v.class_token,
            vision_projection_config=projector_config(cfg, language),
            vision_projection_layer_spec=projector_spec,
            vision_projection_type="mlp",
            share_embeddings_and_output_weights=m.share_embeddings_and_output_weights,
            language_position_embedding_type=m.position_embedding_type,
            language_rotary_base=m.rotary_base,
            language_rope_scaling=m.rope_scaling == "llama3",  # Llama 3.1 / 3.2 RoPE scaling
            language_rope_scaling_factor=m.rope_scaling_factor,
            img_h=v.image_size,
            img_w=v.image_size,
            patch_dim=v.patch_size,
        )
    model.model_type = ModelType.encoder_or_decoder  # what the pipeline schedules ask for
    model.freeze(
        freeze_language_model=v.freeze_language,
        freeze_vision_model=v.freeze_vision,
        freeze_vision_projection=False,  # the projector always trains: it is what aligns the two
    )
    return [model]


def forward(
    model: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One microbatch through LLaVAModel: images + tokens with placeholders -> per-token loss.

    LLaVAModel expands every placeholder into the image's embeddings and returns the loss mask
    expanded the same way (image positions masked), which is the mask the loss must use.
    """
    tokens = batch["tokens"]
    position_ids = torch.arange(tokens.size(1), device=tokens.device).unsqueeze(0).expand_as(tokens)
    output, loss_mask = model(
        batch["images"],
        tokens,
        position_ids,
        None,
        labels=batch["labels"],
        loss_mask=batch["loss_mask"],
        # No audio. An empty tensor (not None) tells LLaVAModel which device the empty sound
        # embeddings go on; with None it asks torch.cuda.current_device(), which the CPU lacks.
        sound_clips=tokens.new_zeros(0),
    )
    return output, loss_mask
