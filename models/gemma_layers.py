"""What Gemma 3's layers compute that Megatron-Core 0.19.2's do not, as small subclasses of its own.

Megatron-Core already has the rest: sliding-window attention every layer but each
`window_attn_skip_freq`-th (TransformerConfig.window_size, in Transformer Engine's attention; the
SDPA core attention of models/specs.py does it without TE), per-head q/k norms (qk_layernorm),
norms scaling by (1 + weight) (layernorm_zero_centered_gamma, TE's norms; models/norms.py
`ZeroCenteredNorm` for the local layers), a softmax scale of one's own (softmax_scale) and linear RoPE
scaling (GPTModel's seq_len_interpolation_factor). It lacks:

- a second RoPE base for the local layers (ModelConfig.rotary_base_local): GPTModel computes one
  rotary embedding for every layer. `GemmaSelfAttention` of a local layer computes its own, the
  same way GPTModel does (the sequence length from its input, CP slicing and packed rows as
  there), and uses it in place of the one it is handed.
- norms on the attention's and the MLP's outputs (ModelConfig.sandwich_norm):
  TransformerLayer adds each output to the residual as it comes. `GemmaSelfAttention` and
  `GemmaMLP` normalise their output first, after the output projection's TP reduction (and
  LoRA's, training/lora.py, which adds its adapter to the projection's output before that
  reduction), as Hugging Face's Gemma3DecoderLayer does after o_proj and down_proj. Their
  `post_layernorm` is TE's norm on the TE layers, else `ZeroCenteredNorm` /
  Megatron-Core's torch norm, marked for sequence parallelism as the others
  (models/norms.py `SequenceParallelTorchNorm`).
- the embedding scaled by sqrt(hidden_size) (ModelConfig.scale_embeddings): `scale_embeddings`
  hooks it onto the embedding's output, rounded to its dtype as transformers rounds it.

Megatron-Bridge builds Gemma 3 from its own copies of the attention, rotary embedding, embedding
and TE linear-plus-norm modules; here they stay Megatron-Core's, subclassed where a layer needs
more, so the spec, LoRA, checkpoints and the checker see the usual modules.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import is_layer_window_attention, sharded_state_dict_default

from models.norms import SequenceParallelTorchNorm


def post_norm(config: TransformerConfig) -> torch.nn.Module:
    """The norm on a sublayer's output: TE's on TE layers, else the torch norm of the local spec."""
    if config.transformer_impl == "transformer_engine":
        from megatron.core.extensions.transformer_engine import TENorm

        return TENorm(config, config.hidden_size, config.layernorm_epsilon)
    return SequenceParallelTorchNorm(config, config.hidden_size, config.layernorm_epsilon)


def _normed(norm: torch.nn.Module, out: torch.Tensor, bias: torch.Tensor | None) -> Any:
    # The bias (skip_bias_add) belongs before the norm; the layer's bias-dropout-add gets none.
    return norm(out if bias is None else out + bias), None


class GemmaSelfAttention(SelfAttention):
    """SelfAttention with its own RoPE base on local (sliding-window) layers and a norm on its
    output (see the module docstring); each only where the config asks for it."""

    def __init__(
        self,
        config: TransformerConfig,
        *args: Any,
        rotary_base_local: int | None = None,
        sandwich_norm: bool = False,
        **kwargs: Any,
    ) -> None:
        """`rotary_base_local` and `sandwich_norm`: ModelConfig's, through the spec's params
        (models/specs.py `gemma_layers`)."""
        super().__init__(config, *args, **kwargs)
        local = is_layer_window_attention(
            config.window_size, config.window_attn_skip_freq, self.layer_number
        )
        self.local_rope = (
            RotaryEmbedding(
                kv_channels=config.kv_channels,
                rotary_percent=1.0,
                rotary_interleaved=config.rotary_interleaved,
                rotary_base=rotary_base_local,
                use_cpu_initialization=config.use_cpu_initialization,
                cp_group=self.pg_collection.cp,
            )
            if local and rotary_base_local is not None
            else None
        )
        self.post_layernorm = post_norm(config) if sandwich_norm else None

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if self.local_rope is not None and kwargs.get("rotary_pos_emb") is not None:
            packed = kwargs.get("packed_seq_params")
            length = self.local_rope.get_rotary_seq_len(
                None, None, hidden_states, self.config, packed
            )
            kwargs["rotary_pos_emb"] = self.local_rope(
                length,
                packed_seq=packed is not None and packed.qkv_format == "thd",
                cp_group=packed.cp_group if packed is not None else None,
            )
        out, bias = super().forward(hidden_states, *args, **kwargs)
        return (
            (out, bias) if self.post_layernorm is None else _normed(self.post_layernorm, out, bias)
        )


class GemmaMLP(MLP):
    """MLP with a norm on its output (ModelConfig.sandwich_norm)."""

    def __init__(self, config: TransformerConfig, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, *args, **kwargs)
        self.post_layernorm = post_norm(config)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out, bias = super().forward(hidden_states, *args, **kwargs)
        return _normed(self.post_layernorm, out, bias)

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        """MLP's, with the post norm replicated over TP: MLP hands its children no TP group, and
        a torch module's tensors then get replica id 0 on every TP rank (a checkpoint refuses
        that)."""
        out = super().sharded_state_dict(prefix, sharded_offsets, metadata)
        norm = f"{prefix}post_layernorm."
        out = {k: v for k, v in out.items() if not k.startswith(norm)}
        return out | sharded_state_dict_default(
            self.post_layernorm, norm, sharded_offsets, metadata, tp_group=self.tp_group
        )


def scale_embeddings(embedding: torch.nn.Module, hidden_size: int) -> None:
    """Multiply the embedding's output by sqrt(hidden_size) rounded to the output's dtype (as
    transformers' Gemma3TextScaledWordEmbedding: 55.4256 becomes 55.5 in BF16 for hidden 3072)."""
    scale = math.sqrt(hidden_size)

    def hook(module: torch.nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
        return out * torch.tensor(scale, dtype=out.dtype, device=out.device)

    embedding.register_forward_hook(hook)
