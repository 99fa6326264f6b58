"""Qwen3-Next (Qwen3NextForCausalLM: Qwen3-Next-80B-A3B) <-> Megatron-Core's GPTModel with Gated
DeltaNet layers.

Qwen3.5's predecessor (models/hf/qwen3_5.py for attention, norms, RoPE and the layer pattern;
models/hf/qwen3_5_moe.py for the MoE MLP with its gated shared expert), text only, with two
differences:

- Gated DeltaNet's input projections are fused per key head: `in_proj_qkvz` holds, for each of
  the linear_num_key_heads heads, [its query; its key; its group's values; their gates z], and
  `in_proj_ba` [its group's beta; their alpha]. Megatron-Core's in_proj parts
  (`in_proj.weight.{query,key,value,z,beta,alpha}`) gather each kind over the heads, so each part
  reads one slice of every head's block. The convolution runs over [q; k; v] as in Qwen3.5.
- The first layers may be dense (`mlp_only_layers` = [0, ..., k-1], decoder_sparse_step 1; other
  patterns are refused as for Qwen3-MoE), and `norm_topk_prob` picks renormalised top-k weights
  (true, transformers' default and the published model's) or the softmax over all experts.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt, qwen3_5, qwen3_5_moe, qwen3_moe
from models.hf.mapping import Node, Part, Rows

ARCHITECTURE = "Qwen3NextForCausalLM"


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    normalised = bool(hf.get("norm_topk_prob", True))  # transformers' Qwen3-Next default
    topk = int(hf.get("num_experts_per_tok", 10))
    if topk == 1 and normalised:
        raise ValueError(
            "config.json num_experts_per_tok=1 with norm_topk_prob=true: Megatron-Core's softmax "
            "router refuses top-1 renormalised weights (they are all 1)"
        )
    moe_ffn = int(hf["moe_intermediate_size"])
    return ModelConfig(
        **qwen3_5.hybrid_fields(hf),
        ffn_hidden_size=int(hf["intermediate_size"]),
        num_moe_experts=int(hf["num_experts"]),
        moe_router_topk=topk,
        moe_ffn_hidden_size=moe_ffn,
        moe_shared_expert_intermediate_size=int(hf["shared_expert_intermediate_size"]),
        moe_shared_expert_gate=True,
        moe_first_k_dense_layers=qwen3_moe.first_dense_layers(hf),
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not normalised,
        moe_aux_loss_coeff=float(hf.get("router_aux_loss_coef", 1e-3)),
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    out = qwen3_5.hybrid_to_hf(model, ARCHITECTURE, "qwen3_next")
    return out | {
        "num_experts": model.num_moe_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "moe_intermediate_size": model.moe_ffn_hidden_size or model.ffn_hidden_size,
        "shared_expert_intermediate_size": model.moe_shared_expert_intermediate_size,
        "norm_topk_prob": not model.moe_router_pre_softmax,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(range(model.moe_first_k_dense_layers)),
        "router_aux_loss_coef": model.moe_aux_loss_coeff,
    }


def matches(model: ModelConfig) -> bool:
    return (
        qwen3_5.hybrid(model)
        and bool(model.num_moe_experts)
        and model.moe_router_score_function == "softmax"
        and bool(model.moe_shared_expert_intermediate_size)
        and model.moe_shared_expert_gate
        and not model.moe_router_enable_expert_bias
    )


def gated_delta_net(model: ModelConfig, meg: str, hf: str) -> dict[str, Node]:
    """Qwen3.5's Gated DeltaNet map with in_proj read from the per-key-head fused tensors."""
    a, s = f"{hf}.linear_attn", f"{meg}.self_attention"
    out = {k: v for k, v in qwen3_5.gated_delta_net(model, meg, hf).items() if ".in_proj." not in k}
    dk, dv = model.linear_key_head_dim, model.linear_value_head_dim
    heads, group = (
        model.linear_num_key_heads,
        model.linear_num_value_heads // model.linear_num_key_heads,
    )
    block, qkvz, ba = 2 * dk + 2 * group * dv, f"{a}.in_proj_qkvz.weight", f"{a}.in_proj_ba.weight"
    sections = {  # (tensor, offset in a head's block, length, block length)
        "query": (qkvz, 0, dk, block),
        "key": (qkvz, dk, dk, block),
        "value": (qkvz, 2 * dk, group * dv, block),
        "z": (qkvz, 2 * dk + group * dv, group * dv, block),
        "beta": (ba, 0, group, 2 * group),
        "alpha": (ba, group, group, 2 * group),
    }
    for name, (source, offset, length, size) in sections.items():
        parts = tuple(
            Part(source, g * size + offset, g * size + offset + length) for g in range(heads)
        )
        out[f"{s}.in_proj.weight.{name}"] = Rows(parts)
    return out


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    def mlp(i: int, m: str, h: str) -> dict[str, Node]:
        if i < model.moe_first_k_dense_layers:
            return gpt.dense_mlp(m, f"{h}.mlp", f"{h}.post_attention_layernorm.weight")
        return qwen3_5_moe.moe_layer(model, names, m, h)

    return qwen3_5.hybrid_weights(model, padded_vocab, names, meg, mlp, gated_delta_net)


def skipped(model: ModelConfig, name: str) -> bool:
    """The published folder's multi-token-prediction layer (`mtp.*`), not trained here."""
    return name.startswith("mtp.")
