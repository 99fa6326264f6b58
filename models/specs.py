"""Layer specs for GPT models: Transformer Engine when it imports, else torch's SDPA attention.

Megatron-Core's local spec computes attention with an unfused softmax (and cannot build MLA: its
DotProductAttention does not take MLA's separate key/value head sizes). Without Transformer Engine
we keep the local spec's linears and norms but swap its core attention for `SdpaAttention`
(models/sdpa.py), which calls torch.nn.functional.scaled_dot_product_attention: flash /
memory-efficient / cuDNN kernels on GPUs, a fused kernel on the CPU.

The local spec's RMSNorm (and its LayerNorm without apex) is Megatron-Core's torch norm, which
refuses sequence parallelism; LoRA builds that spec on GPUs too. models/norms.py
`SequenceParallelTorchNorm` takes its place (and scales by 1 + weight for Gemma 3 and Qwen3.5):
see there. Experts with biases (GPT-OSS) take `SoloExpertRowParallelLinear` as their fc2 in the
local spec, where Megatron-Core's own cannot train them without expert parallelism.

Linear attention (Gated DeltaNet in most layers, `experimental_attention_variant`): Megatron-Core's
own hybrid builder with Transformer Engine, else the local GPT layers with its GatedDeltaNet in
the linear layers (`_hybrid_layer_specs`), sliced per pipeline chunk as Megatron-Core slices them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, cast

import torch
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
    get_linear_attention_pattern,
    get_transformer_layer_with_experimental_attention_variant_spec,
)
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_mtp_block_spec,
)
from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
from megatron.core.tensor_parallel.layers import RowParallelLinear
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import LayerType
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from config.backend import local_layers
from models.gemma_layers import GemmaMLP, GemmaSelfAttention
from models.norms import SequenceParallelTorchNorm
from models.sdpa import SdpaAttention, sdpa_can_run


def have_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except (ImportError, OSError):  # OSError: the wheel is there but its CUDA libraries are not
        return False
    return True


def choose_backend(device: str, lora: bool = False) -> str:
    """ "te" on GPUs with Transformer Engine, otherwise "sdpa": Megatron-Core's local layers
    wherever config/backend.py `local_layers` says so (the CPU, LoRA) and where Transformer Engine
    does not import."""
    return "sdpa" if local_layers(lora, device) or not have_transformer_engine() else "te"


def _sequence_parallel_norms(spec: Any, seen: set[int] | None = None) -> None:
    """Put `SequenceParallelTorchNorm` in place of every `WrappedTorchNorm` of a spec tree
    (ModuleSpecs, submodule dataclasses, lists of layer specs), in place."""
    seen = set() if seen is None else seen
    if id(spec) in seen:
        return
    seen.add(id(spec))
    if isinstance(spec, list | tuple):
        for item in spec:
            _sequence_parallel_norms(item, seen)
        return
    if not dataclasses.is_dataclass(spec) or isinstance(spec, type):
        return
    for field in dataclasses.fields(spec):
        value = getattr(spec, field.name)
        if value is WrappedTorchNorm:
            setattr(spec, field.name, SequenceParallelTorchNorm)
        else:
            _sequence_parallel_norms(value, seen)


class SoloExpertRowParallelLinear(RowParallelLinear):
    """Megatron-Core's RowParallelLinear as an expert's fc2, for experts with biases (GPT-OSS).

    An expert's fc2 alone in its expert-TP group with EP 1 (EP x ETP = 1) "all-reduces" its
    output over that group of one, which returns the output itself through an autograd Function;
    SequentialMLP then adds the routed bias to it in place, which autograd forbids ("Output 0 of
    _ReduceFromModelParallelRegion is a view and is being modified inplace"): Megatron-Core 0.19.2
    cannot train biased experts in its local layers without expert parallelism. Over a group of
    one there is nothing to reduce, so this takes the path Megatron-Core takes for experts with
    EP or ETP > 1 (explicit_expert_comm: the output as the GEMM gave it); the same numbers.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.is_expert and self.tp_group.size() == 1:
            self.explicit_expert_comm = True


def _solo_expert_fc2(spec: Any, seen: set[int] | None = None) -> None:
    """Put `SoloExpertRowParallelLinear` in place of the fc2 of every SequentialMLP of a spec
    tree (ModuleSpecs, partials, submodule dataclasses, lists of layer specs), in place."""
    seen = set() if seen is None else seen
    if id(spec) in seen:
        return
    seen.add(id(spec))
    if isinstance(spec, functools.partial):
        submodules = spec.keywords.get("submodules")
        if spec.func is SequentialMLP and submodules is not None:
            if submodules.linear_fc2 is RowParallelLinear:
                submodules.linear_fc2 = SoloExpertRowParallelLinear
            return
        for value in (*spec.args, *spec.keywords.values()):
            _solo_expert_fc2(value, seen)
        return
    if isinstance(spec, list | tuple):
        for item in spec:
            _solo_expert_fc2(item, seen)
        return
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        for field in dataclasses.fields(spec):
            _solo_expert_fc2(getattr(spec, field.name), seen)


def _plain_gamma(norm: Any) -> Any:
    """A norm builder that builds `norm` scaling by its weight as it is, whatever
    layernorm_zero_centered_gamma says: Gated DeltaNet's output norm. Qwen3.5 and Qwen3-Next
    scale that one norm by its weight (initialised to ones) while their other norms scale by
    1 + weight, so its weight maps to the Hugging Face tensor unchanged."""

    class PlainGammaNorm:
        def __new__(  # type: ignore[misc]
            cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **kwargs: Any
        ) -> torch.nn.Module:
            plain = copy.copy(config)
            plain.layernorm_zero_centered_gamma = False
            return cast(torch.nn.Module, norm(config=plain, hidden_size=hidden_size, eps=eps))

    return PlainGammaNorm


def _swap_core_attention(
    config: TransformerConfig, layer_specs: list[Any], backend: str, masked: bool
) -> None:
    """SDPA as the core attention without TE, and in every layer when rows carry their own mask.

    Packed SFT rows (data/sft.py) hold several samples under a block-diagonal attention mask.
    TE's causal attention would ignore that mask, so with `masked` the TE layers take the SDPA
    core attention too (their linear layers, FP8 included, stay TE's).
    """
    if not sdpa_can_run(config):
        if masked:
            raise ValueError(
                "packed SFT rows need the SDPA core attention, which has no off-by-one softmax; "
                "set data.sequence_packing=false"
            )
        return  # the spec's own attention
    if backend == "te" and not masked:
        return
    for spec in layer_specs:
        if spec.submodules.self_attention.module is GatedDeltaNet:
            continue  # linear attention: no core attention to swap
        attention = spec.submodules.self_attention.submodules
        if masked or attention.core_attention is DotProductAttention:
            attention.core_attention = SdpaAttention


def gemma_layers(
    layer_specs: list[Any], rotary_base_local: int | None, sandwich_norm: bool
) -> None:
    """Gemma 3's attention and MLP (models/gemma_layers.py) in the layers, in place, where the
    model has a RoPE base of its own for the local layers or norms on the sublayers' outputs."""
    if rotary_base_local is None and not sandwich_norm:
        return
    for spec in layer_specs:
        attention = spec.submodules.self_attention
        if attention.module not in (SelfAttention, GemmaSelfAttention):
            raise ValueError(
                f"model.rotary_base_local / model.sandwich_norm extend SelfAttention, not "
                f"{attention.module.__name__}"
            )
        attention.module = GemmaSelfAttention
        attention.params = dict(
            attention.params, rotary_base_local=rotary_base_local, sandwich_norm=sandwich_norm
        )
        mlp = spec.submodules.mlp  # layers share one spec: it may be swapped already
        if not sandwich_norm or mlp.func == GemmaMLP.as_mlp_submodule:
            continue
        if not (isinstance(mlp, functools.partial) and mlp.func == MLP.as_mlp_submodule):
            raise ValueError(f"model.sandwich_norm: the layers' MLP is {mlp}, not a dense MLP")
        spec.submodules.mlp = functools.partial(GemmaMLP.as_mlp_submodule, **mlp.keywords)


def decoder_block_spec(
    config: TransformerConfig,
    backend: str,
    normalization: str,
    vp_stage: int | None,
    masked: bool = False,
    rotary_base_local: int | None = None,
    sandwich_norm: bool = False,
) -> TransformerBlockSubmodules:
    """The layers of one pipeline chunk (dense or MoE per config.moe_layer_freq).

    `masked`: batches carry an explicit attention mask (packed SFT), see `_swap_core_attention`.
    `rotary_base_local`, `sandwich_norm`: ModelConfig's, see `gemma_layers`.
    """
    if config.experimental_attention_variant is not None:
        spec = _hybrid_block_spec(config, backend, normalization, vp_stage)
    else:
        spec = get_gpt_decoder_block_spec(
            config,
            use_transformer_engine=backend == "te",
            normalization=normalization,
            vp_stage=vp_stage,
        )
    _swap_core_attention(config, spec.layer_specs, backend, masked)
    gemma_layers(spec.layer_specs, rotary_base_local, sandwich_norm)
    _norms(config, spec, backend)
    if config.num_moe_experts and config.add_bias_linear:
        _solo_expert_fc2(spec)
    return spec


def _norms(config: TransformerConfig, spec: Any, backend: str) -> None:
    """The local layers' norms zero-centred where the config asks (Transformer Engine's are by
    themselves) and marked for sequence parallelism; Gated DeltaNet's output norm keeps its plain
    weight with either backend (`_plain_gamma`)."""
    _sequence_parallel_norms(spec)  # zero-centred where the config asks: SequenceParallelTorchNorm
    layers = spec.layer_specs if isinstance(spec, TransformerBlockSubmodules) else [spec]
    for layer in layers:
        attention = layer.submodules.self_attention
        if attention.module is GatedDeltaNet:
            inner = attention.submodules.out_norm
            if backend != "te":
                inner = SequenceParallelTorchNorm
            attention.submodules.out_norm = _plain_gamma(inner)


def _gated_delta_net_local(config: TransformerConfig) -> ModuleSpec:
    """Megatron-Core's GatedDeltaNet on its local layers: Megatron-Core's own spec
    (experimental_attention_variant_module_specs) builds it from Transformer Engine's only, with
    the input norm fused into in_proj; here the layer keeps its own input norm before it."""
    local = LocalSpecProvider()
    return ModuleSpec(
        module=GatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(
            in_proj=local.column_parallel_linear(),
            out_norm=local.layer_norm(rms_norm=config.normalization == "RMSNorm", for_qk=False),
            out_proj=local.row_parallel_linear(),
        ),
        metainfo={"fuse_input_layernorm": False},
    )


def _hybrid_layer_specs(config: TransformerConfig, backend: str, normalization: str) -> list[Any]:
    """Every layer's spec of a model with linear attention (Gated DeltaNet) in some layers.

    With Transformer Engine: Megatron-Core's own builder. Without it, the local GPT layers (dense
    or MoE as moe_layer_freq says) with Gated DeltaNet in place of self-attention in the linear
    layers (`get_linear_attention_pattern`: 1 marks one), as Megatron-Core's builder places it.
    """
    if backend == "te":
        return list(get_transformer_layer_with_experimental_attention_variant_spec(config))
    softmax_only = copy.copy(config)
    softmax_only.experimental_attention_variant = None  # what get_gpt_decoder_layer_specs asks
    layers = get_gpt_decoder_layer_specs(
        softmax_only, use_transformer_engine=False, normalization=normalization
    )
    linear = get_linear_attention_pattern(config)
    out = []
    for layer, is_linear in zip(layers, linear, strict=True):
        layer = copy.deepcopy(layer)  # the layers share their spec objects
        if is_linear:
            layer.submodules.self_attention = _gated_delta_net_local(config)
        out.append(layer)
    return out


def _hybrid_block_spec(
    config: TransformerConfig, backend: str, normalization: str, vp_stage: int | None
) -> TransformerBlockSubmodules:
    """The layers of one pipeline chunk of a linear-attention model, sliced as Megatron-Core's
    get_transformer_block_with_experimental_attention_variant_spec slices them."""
    layers = _hybrid_layer_specs(config, backend, normalization)
    if config.pipeline_model_parallel_layout is not None:
        ids = config.pipeline_model_parallel_layout.get_layer_id_list(
            layer_type=LayerType.decoder, vp_stage=vp_stage
        )
    else:
        offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
        ids = range(offset, offset + get_num_layers_to_build(config, vp_stage=vp_stage))
    if backend == "te":
        from megatron.core.extensions.transformer_engine import TENorm

        final_norm: Any = TENorm
    else:
        final_norm = LocalSpecProvider().layer_norm(
            rms_norm=config.normalization == "RMSNorm", for_qk=False
        )
    return TransformerBlockSubmodules(layer_specs=[layers[i] for i in ids], layer_norm=final_norm)


def mtp_block_spec(
    config: TransformerConfig,
    backend: str,
    normalization: str,
    vp_stage: int | None,
    masked: bool = False,
) -> Any:
    """Multi-token-prediction layers of the chunk that holds them (None elsewhere).

    Each MTP layer wraps a copy of the model's last decoder layer (MoE in DeepSeek-V3), taken from
    the whole model's layer list since the chunk holding the MTP layers may hold no decoder layer.
    """
    if not config.mtp_num_layers:
        return None
    if config.experimental_attention_variant is not None:
        last_layer = _hybrid_layer_specs(config, backend, normalization)[-1]
    else:
        last_layer = get_gpt_decoder_layer_specs(
            config, use_transformer_engine=backend == "te", normalization=normalization
        )[-1]
    _swap_core_attention(config, [last_layer], backend, masked)
    spec = get_gpt_mtp_block_spec(
        config, last_layer, use_transformer_engine=backend == "te", vp_stage=vp_stage
    )
    _sequence_parallel_norms(spec)  # zero-centred where the config asks: SequenceParallelTorchNorm
    if config.num_moe_experts and config.add_bias_linear:
        _solo_expert_fc2(spec)
    return spec
