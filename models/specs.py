"""Layer specs for GPT models: Transformer Engine when it imports, else torch's SDPA attention.

Megatron-Core's local spec computes attention with an unfused softmax (and cannot build MLA: its
DotProductAttention does not take MLA's separate key/value head sizes). Without Transformer Engine
we keep the local spec's linears and norms but swap its core attention for `SdpaAttention`, which
calls torch.nn.functional.scaled_dot_product_attention: flash / memory-efficient / cuDNN kernels
on GPUs, a fused kernel on the CPU.

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

import contextlib
import copy
import dataclasses
import functools
import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
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
from megatron.core.transformer.enums import AttnMaskType, LayerType
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import (
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
from megatron.core.transformer.utils import (
    is_layer_window_attention,
    make_sharded_tensors_for_checkpoint,
)
from megatron.core.utils import divide

from config.backend import local_layers
from models.gemma_layers import GemmaMLP, GemmaSelfAttention
from models.norms import SequenceParallelTorchNorm


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


class SdpaAttention(MegatronModule):
    """Core attention through scaled_dot_product_attention, a drop-in for DotProductAttention.

    Takes Megatron's layout ([seq, batch, heads, head_dim] for q, k, v; key/value with
    num_query_groups heads for GQA) and returns [seq, batch, heads * v_head_dim].

    GPT-OSS's attention runs here too, with or without packed rows' mask: a sliding window on the
    layers Megatron-Core windows (window_size, window_attn_skip_freq: the (left, right) window
    ANDed with the causal or packed mask), and learnable sinks (softmax_type "learnable": a logit
    per head in each softmax's denominator, `softmax_offset` as Megatron-Core names and shards
    it). SDPA's kernels have no sinks, so attention with sinks is computed in torch, the softmax in
    FP32; without sinks the window is one more mask for SDPA.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
        k_channels: int | None = None,
        v_channels: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise ValueError(
                "SdpaAttention has no context parallelism; it needs Transformer Engine"
            )
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        tp_size = (
            pg_collection.tp.size()
            if pg_collection is not None
            else config.tensor_model_parallel_size
        )
        self.num_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_groups_per_partition = divide(config.num_query_groups, tp_size)
        k_dim = k_channels or config.kv_channels
        # MLA reads and may change this attribute for packed sequences.
        self.hidden_size_per_attention_head_v = v_channels or config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(k_dim)
        self.dropout_p = (
            config.attention_dropout if attention_dropout is None else attention_dropout
        )
        windowed = is_layer_window_attention(
            config.window_size, config.window_attn_skip_freq, self.layer_number
        )
        self.window = config.window_size if windowed else None
        self.softmax_offset: torch.nn.Parameter | None = None
        if config.softmax_type == "learnable":
            # The sinks are sharded over TP by head (sharded_state_dict); nothing else here
            # needs the group, so an attention built without model parallelism has none.
            self.tp_group = (
                pg_collection.tp
                if pg_collection is not None
                else parallel_state.get_tensor_model_parallel_group()
            )
            self.softmax_offset = torch.nn.Parameter(
                torch.empty(self.num_heads_per_partition, dtype=config.params_dtype)
            )
            if config.perform_initialization:
                config.init_method(self.softmax_offset)

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> Any:
        """The sinks, sharded over TP by head as Megatron-Core's attentions shard them."""
        if self.softmax_offset is None:
            return super().sharded_state_dict(prefix, sharded_offsets, metadata)
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True),
            prefix,
            {"softmax_offset": 0},
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )

    def _kept(
        self, mask: torch.Tensor | None, causal: bool, sq: int, sk: int, device: torch.device
    ) -> torch.Tensor:
        """The attended positions (True) of an explicit mask, or the causal ones, within the
        window: key j is seen by query i when i - left <= j <= i + right."""
        rows = torch.arange(sq, device=device).unsqueeze(1) + (sk - sq)
        cols = torch.arange(sk, device=device).unsqueeze(0)
        kept = mask if mask is not None else (cols <= rows if causal else torch.ones_like(cols > 0))
        if self.window is not None:
            left, right = self.window
            inside = torch.ones_like(cols >= rows)
            if left >= 0:
                inside = inside & (cols >= rows - left)
            if right >= 0:
                inside = inside & (cols <= rows + right)
            kept = kept & inside
        return kept

    def _with_sinks(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kept: torch.Tensor,
        p: float,
        offset: torch.Tensor,
    ) -> torch.Tensor:
        """softmax([scores, sink]) without the sink's column, times the values ([b, h, s, d])."""
        if k.size(1) != q.size(1):  # GQA: each group's key and value for its heads
            k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
            v = v.repeat_interleave(q.size(1) // v.size(1), dim=1)
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * self.softmax_scale
        scores = scores.masked_fill(~kept, float("-inf"))
        sink = offset.float().reshape(1, -1, 1, 1)
        sink = sink.expand(scores.size(0), -1, scores.size(2), 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        probs = F.dropout(probs, p=p, training=p > 0).to(v.dtype)
        return torch.matmul(probs, v)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("packed sequences and attention bias need Transformer Engine")
        mask_type = attn_mask_type or self.attn_mask_type
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        mask = None
        if attention_mask is not None:
            mask = ~attention_mask  # Megatron marks the masked-out positions, SDPA the kept ones
        causal = mask is None and mask_type in (AttnMaskType.causal, AttnMaskType.padding_causal)
        dropout = self.dropout_p if self.training else 0.0
        rng = (
            tensor_parallel.get_cuda_rng_tracker().fork()
            if dropout > 0 and not self.config.sequence_parallel
            else contextlib.nullcontext()
        )
        if self.window is not None or self.softmax_offset is not None:
            kept = self._kept(mask, causal, q.size(2), k.size(2), q.device)
            mask, causal = kept, False
        with rng:
            if self.softmax_offset is not None:
                out = self._with_sinks(q, k, v, kept, dropout, self.softmax_offset)
            else:
                out = F.scaled_dot_product_attention(
                    q,
                    k,
                    v,
                    attn_mask=mask,
                    dropout_p=dropout,
                    is_causal=causal,
                    scale=self.softmax_scale,
                    enable_gqa=q.size(1) != k.size(1),
                )
        # [b, h, s, d] -> [s, b, h * d]
        return out.permute(2, 0, 1, 3).reshape(out.size(2), out.size(0), -1)


def _sdpa_can_run(config: TransformerConfig) -> bool:
    """SdpaAttention covers vanilla softmax and learnable sinks, with or without sliding windows;
    the off-by-one softmax keeps the local spec's attention."""
    return config.softmax_type in ("vanilla", "learnable")


def _swap_core_attention(
    config: TransformerConfig, layer_specs: list[Any], backend: str, masked: bool
) -> None:
    """SDPA as the core attention without TE, and in every layer when rows carry their own mask.

    Packed SFT rows (data/sft.py) hold several samples under a block-diagonal attention mask.
    TE's causal attention would ignore that mask, so with `masked` the TE layers take the SDPA
    core attention too (their linear layers, FP8 included, stay TE's).
    """
    if not _sdpa_can_run(config):
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
