"""Core attention through torch's scaled_dot_product_attention, where Transformer Engine is absent
or rows carry their own (block-diagonal) mask: models/specs.py swaps it into the local spec's
layers. Flash, memory-efficient or cuDNN kernels on GPUs, a fused kernel on the CPU; learnable
sinks and sliding windows included.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.transformer.enums import AttnBackend, AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.utils import (
    is_layer_window_attention,
    make_sharded_tensors_for_checkpoint,
)
from megatron.core.utils import divide
from torch.nn.attention import SDPBackend, sdpa_kernel


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

    def _kernels(self) -> contextlib.AbstractContextManager:
        """model.attention_backend "unfused": torch's math kernel, which writes the scores and the
        probabilities to memory as Transformer Engine's unfused attention does; else SDPA's pick."""
        if self.config.attention_backend == AttnBackend.unfused:
            return sdpa_kernel([SDPBackend.MATH])
        return contextlib.nullcontext()

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
        with rng, self._kernels():
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


def sdpa_can_run(config: TransformerConfig) -> bool:
    """SdpaAttention covers vanilla softmax and learnable sinks, with or without sliding windows;
    the off-by-one softmax keeps the local spec's attention."""
    return config.softmax_type in ("vanilla", "learnable")
