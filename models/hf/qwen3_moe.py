"""Qwen3 mixture of experts (Qwen3MoeForCausalLM) <-> Megatron-Core's GPTModel.

Qwen3's attention (per-head q/k RMSNorm, head_dim) with MoE MLPs: a linear router (`mlp.gate`) and
experts `mlp.experts.{e}.{gate,up,down}_proj` of `moe_intermediate_size`. The router takes the
softmax over all experts and keeps the top k; with `norm_topk_prob` true (Qwen3-30B-A3B,
Qwen3-235B-A22B) it renormalises them, which is a softmax over the top k logits (Megatron-Core's
moe_router_pre_softmax false); with it false (transformers' default) the weights stay the softmax
over all experts (moe_router_pre_softmax true).

Which layers are MoE: transformers makes layer i dense when it is in `mlp_only_layers` or when
(i + 1) is not a multiple of `decoder_sparse_step`. Megatron-Core's layer pattern here is "the
first k layers dense", so `mlp_only_layers` = [0, ..., k-1] with step 1 is taken and anything else
is refused, naming the key.
"""

from __future__ import annotations

from typing import Any

from config.schema import ModelConfig
from models.hf import gpt, qwen3
from models.hf.mapping import Node

ARCHITECTURE = "Qwen3MoeForCausalLM"


def num_experts(hf: dict[str, Any]) -> int:
    """`num_experts` (transformers 4's config.json, Qwen's published ones) or `num_local_experts`
    (what transformers 5 writes)."""
    value = hf.get("num_experts", hf.get("num_local_experts"))
    if not value:
        raise ValueError("config.json has no num_experts (or num_local_experts)")
    return int(value)


def first_dense_layers(hf: dict[str, Any]) -> int:
    """The number of leading dense layers, from `decoder_sparse_step` and `mlp_only_layers`."""
    step = int(hf.get("decoder_sparse_step", 1))
    if step != 1:
        raise ValueError(
            f"config.json decoder_sparse_step={step}: only every layer MoE (1) is modelled here "
            "(Megatron-Core's dense layers are the first k)"
        )
    dense = sorted(int(i) for i in hf.get("mlp_only_layers") or ())
    if dense != list(range(len(dense))):
        raise ValueError(
            f"config.json mlp_only_layers={dense}: only the first k layers can be dense here "
            "([0, 1, ..., k-1])"
        )
    if len(dense) >= hf["num_hidden_layers"]:
        raise ValueError(
            f"config.json mlp_only_layers={dense} leaves no MoE layer; use Qwen3ForCausalLM"
        )
    return len(dense)


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    qwen3.full_attention_only(hf)
    qwen3.no_attention_bias(hf)
    fields = gpt.decoder_fields(hf)
    qwen3.plain_rope(fields)
    normalised = bool(hf.get("norm_topk_prob", False))  # transformers' default
    topk = int(hf.get("num_experts_per_tok", 8))
    if topk == 1 and normalised:
        raise ValueError(
            "config.json num_experts_per_tok=1 with norm_topk_prob=true: Megatron-Core's softmax "
            "router refuses top-1 renormalised weights (they are all 1)"
        )
    return ModelConfig(
        **fields,
        qk_layernorm=True,
        num_moe_experts=num_experts(hf),
        moe_router_topk=topk,
        moe_ffn_hidden_size=hf["moe_intermediate_size"],
        moe_first_k_dense_layers=first_dense_layers(hf),
        moe_router_score_function="softmax",
        moe_router_pre_softmax=not normalised,
        moe_aux_loss_coeff=float(hf.get("router_aux_loss_coef", 1e-3)),
    )


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return gpt.decoder_to_hf(model, ARCHITECTURE, "qwen3_moe") | {
        "num_experts": model.num_moe_experts,
        "num_experts_per_tok": model.moe_router_topk,
        "moe_intermediate_size": model.moe_ffn_hidden_size or model.ffn_hidden_size,
        "norm_topk_prob": not model.moe_router_pre_softmax,
        "decoder_sparse_step": 1,
        "mlp_only_layers": list(range(model.moe_first_k_dense_layers)),
        "router_aux_loss_coef": model.moe_aux_loss_coeff,
        "attention_bias": False,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": model.num_layers,
    }


def matches(model: ModelConfig) -> bool:
    return gpt.softmax_moe(model) and model.qk_layernorm


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """`names`: the folder's tensor names (unused: the family has one spelling)."""

    def layer(i: int, m: str, h: str) -> dict[str, Node]:
        norm = f"{h}.post_attention_layernorm.weight"
        if i < model.moe_first_k_dense_layers:
            mlp = gpt.dense_mlp(m, f"{h}.mlp", norm)
        else:
            mlp = gpt.moe_mlp(model, m, norm, f"{h}.mlp.gate.weight", f"{h}.mlp.experts.{{}}")
        return gpt.attention(model, m, h) | mlp

    return gpt.decoder(model, padded_vocab, meg, hf, layer)
