"""Gated DeltaNet (linear attention in most layers: Qwen3.5, Qwen3-Next), the attention output
gate and zero-centred norms, as Megatron-Core 0.19.2 applies them.

From TransformerConfig.__post_init__: linear_attention_freq must be set with the variant; the
value heads a multiple of the key heads; both head counts a multiple of TP x CP (GatedDeltaNet
splits its heads over TP and, by an all-to-all, over CP; sequence parallelism is supported, the
in_proj gathering the sequence as any column-parallel layer does). From MLATransformerConfig:
no output gate with multi-latent attention. From Megatron-Core's torch norm (the local layers):
no zero-centred norm at all; models/specs.py adds a zero-centred RMSNorm there, LayerNorm stays
Transformer Engine's. tests/unit/config/test_rules_gdn_oracle.py holds these to Megatron-Core's
constructors.

Stricter on purpose: TP without sequence parallelism (GatedDeltaNet's gated output norm is one
weight shared by the heads each TP rank holds; finalize_model_grads sums its gradient over TP only
when it is marked sequence parallel, so without SP each rank applies its own partial gradient);
packed rows (several samples in a row, kept apart by an attention mask)
with Gated DeltaNet: its recurrence runs over the whole row and sees no mask, so one sample
would read the ones before it (Megatron-Core separates them only with THD cu_seqlens, which the
engine does not pass); and the variant's sizes set without the variant (they would be ignored).
"""

from __future__ import annotations

from config.backend import local_reason
from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig, masks_packed_rows


def linear_attention(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    m, par = cfg.model, cfg.parallel
    out: list[Problem] = []
    if m.attention_output_gate and m.multi_latent_attention:
        out.append(
            Problem(
                "model.attention_output_gate",
                "Megatron-Core has no output gate for multi-latent attention "
                "(MLATransformerConfig raises NotImplementedError); set it false",
            )
        )
    if m.layernorm_zero_centered_gamma and m.normalization != "RMSNorm":
        why = local_reason(cfg, cluster)
        if why:
            out.append(
                Problem(
                    "model.layernorm_zero_centered_gamma",
                    f"zero-centred {m.normalization} on Megatron-Core's local layers ({why}): "
                    "they have a zero-centred RMSNorm only; use normalization=RMSNorm",
                )
            )
    if m.experimental_attention_variant is None:
        if m.linear_attention_freq is not None:
            out.append(
                Problem(
                    "model.linear_attention_freq",
                    f"{m.linear_attention_freq} without model.experimental_attention_variant: "
                    "no layer would be linear; set experimental_attention_variant=gated_delta_net "
                    "or linear_attention_freq=None",
                )
            )
        return out
    if m.linear_attention_freq is None:
        out.append(
            Problem(
                "model.linear_attention_freq",
                "must be set with experimental_attention_variant=gated_delta_net (every N-th layer "
                "keeps softmax attention: Qwen3.5 uses 4)",
            )
        )
    keys, values = m.linear_num_key_heads, m.linear_num_value_heads
    if values % keys:
        out.append(
            Problem(
                "model.linear_num_value_heads",
                f"{values} is not a multiple of linear_num_key_heads={keys} (each query/key head "
                "serves a whole group of value heads)",
            )
        )
    tp, cp = par.tensor_model_parallel_size, par.context_parallel_size
    for field, heads in (("linear_num_key_heads", keys), ("linear_num_value_heads", values)):
        if heads % (tp * cp):
            out.append(
                Problem(
                    f"model.{field}",
                    f"{heads} Gated DeltaNet heads do not split over tensor_model_parallel_size="
                    f"{tp} x context_parallel_size={cp} = {tp * cp}; pick TP x CP dividing "
                    f"{heads}",
                )
            )
    if tp > 1 and not par.sequence_parallel:
        out.append(
            Problem(
                "parallel.sequence_parallel",
                f"false with Gated DeltaNet at tensor_model_parallel_size={tp}: each TP rank "
                "normalises its own heads with the one gated output norm, and Megatron-Core sums "
                "that norm's gradient over TP only for sequence-parallel parameters, so without "
                "it the replicas drift apart; set parallel.sequence_parallel=true",
            )
        )
    if masks_packed_rows(cfg):
        out.append(
            Problem(
                "data.sequence_packing",
                "packed rows with Gated DeltaNet: its recurrence runs over the whole row and "
                "ignores the attention mask that keeps packed samples apart; set "
                "data.sequence_packing=false",
            )
        )
    return out
