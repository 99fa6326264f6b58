"""What the decoder-only families share: config.json fields and the weight map of a GPTModel.

Megatron-Core's keys are its `sharded_state_dict()` keys: global layer numbers, Transformer
Engine's names for the norms fused into the next linear layer (the local spec maps its own names
onto those), experts stacked on a leading axis. Hugging Face's are the published checkpoints' (the
names `save_pretrained` writes). Torch-free: the CLI reads config.json with it on a login node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config.schema import ModelConfig
from models.hf.mapping import Node, Pad, Part, Rows, Stack, tensor

# Megatron-Core names some tensors differently with and without Transformer Engine (a norm fused
# into the linear layer after it, or not); a key missing from a map is looked up by its other
# names. The input norm of a Gated DeltaNet layer is fused into its in_proj under TE.
ALIASES: dict[str, tuple[str, ...]] = {
    "self_attention.linear_q_up_proj.layer_norm_weight": ("self_attention.q_layernorm.weight",),
    "self_attention.linear_kv_up_proj.layer_norm_weight": ("self_attention.kv_layernorm.weight",),
    "self_attention.q_layernorm.weight": ("self_attention.linear_q_up_proj.layer_norm_weight",),
    "self_attention.kv_layernorm.weight": ("self_attention.linear_kv_up_proj.layer_norm_weight",),
    "mlp.linear_fc1.layer_norm_weight": ("pre_mlp_layernorm.weight",),
    "pre_mlp_layernorm.weight": ("mlp.linear_fc1.layer_norm_weight",),
    "self_attention.linear_qkv.layer_norm_weight": ("input_layernorm.weight",),
    "self_attention.in_proj.layer_norm_weight": ("input_layernorm.weight",),
    "input_layernorm.weight": (
        "self_attention.linear_qkv.layer_norm_weight",
        "self_attention.in_proj.layer_norm_weight",
    ),
}


def aliases(key: str) -> list[str]:
    """The other names of a Megatron key (with or without Transformer Engine), if it has any."""
    for ours, others in ALIASES.items():
        if key.endswith("." + ours):
            return [key[: -len(ours)] + other for other in others]
    return []


# --- config.json ---------------------------------------------------------------------------------
def rope(hf: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and scaling as ModelConfig fields, from transformers 4's `rope_theta` /
    `rope_scaling` or transformers 5's `rope_parameters`."""
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    out: dict[str, Any] = {"rotary_base": int(theta)}
    if kind == "default":
        return out
    if kind == "llama3":
        fixed = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
        fixed["original_max_position_embeddings"] = 8192
        for name, value in fixed.items():
            if float(params.get(name, value)) != float(value):
                raise ValueError(
                    f"config.json rope_scaling.{name}={params.get(name)}: Megatron-Core's llama3 "
                    f"RoPE scaling has it fixed at {value} (as Llama 3.1 and 3.2 publish it)"
                )
        return out | {"rope_scaling": "llama3", "rope_scaling_factor": float(params["factor"])}
    if kind == "yarn":
        return out | {
            "rope_scaling": "yarn",
            "rope_scaling_factor": float(params["factor"]),
            "rope_original_max_position_embeddings": int(
                params.get("original_max_position_embeddings", 4096)
            ),
            "rope_beta_fast": float(params.get("beta_fast", 32.0)),
            "rope_beta_slow": float(params.get("beta_slow", 1.0)),
            "rope_mscale": float(params.get("mscale", 1.0)),
            "rope_mscale_all_dim": float(params.get("mscale_all_dim", 0.0)),
        }
    raise ValueError(
        f"config.json rope type {kind!r} is not modelled here (default, llama3 and yarn are)"
    )


def yarn(hf: dict[str, Any], fields: dict[str, Any], family: str) -> None:
    """Check that Megatron-Core's YaRN computes what transformers' does, adjusting `fields`
    (`family` names the model in messages: "GPT-OSS", "multi-latent attention").

    transformers scales cos/sin by mscale(factor, mscale) / mscale(factor, mscale_all_dim) when
    both are set and non-zero, else by mscale(factor, 1); Megatron-Core always by the ratio, where
    mscale(factor, 0) is 1. With mscale_all_dim 0 they agree once mscale is taken as 1
    (transformers ignores it then); a non-zero mscale_all_dim without mscale has no Megatron-Core
    equivalent, nor has an explicit attention_factor. `truncate` (true unless set) becomes
    rope_correction_range_round_to_int, which multi-latent attention's YaRN cannot turn off (the
    checker refuses it there).
    """
    if fields.get("rope_scaling") is None:
        return
    if fields["rope_scaling"] != "yarn":
        raise ValueError(
            f"config.json rope scaling {fields['rope_scaling']!r}: {family} is modelled with "
            "plain RoPE or YaRN"
        )
    params = dict(hf.get("rope_scaling") or {})
    params.update(hf.get("rope_parameters") or {})
    if params.get("attention_factor") is not None:
        raise ValueError(
            f"config.json rope_scaling.attention_factor={params['attention_factor']}: Megatron-Core's "
            "YaRN derives it from factor, mscale and mscale_all_dim"
        )
    if not params.get("mscale_all_dim"):
        fields["rope_mscale"] = 1.0  # transformers uses mscale 1 whatever the config says
        fields["rope_mscale_all_dim"] = 0.0
    elif not params.get("mscale"):
        raise ValueError(
            f"config.json rope_scaling.mscale={params.get('mscale')!r} with mscale_all_dim="
            f"{params['mscale_all_dim']}: transformers then scales cos/sin by YaRN's default "
            "mscale, which Megatron-Core's YaRN does not model (set mscale)"
        )
    fields["rope_correction_range_round_to_int"] = bool(params.get("truncate", True))


def rope_to_hf(model: ModelConfig) -> dict[str, Any]:
    """config.json's `rope_theta` and `rope_scaling` (the published transformers 4 form)."""
    out: dict[str, Any] = {"rope_theta": float(model.rotary_base)}
    if model.rope_scaling == "llama3":
        out["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": model.rope_scaling_factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    elif model.rope_scaling == "yarn":
        out["rope_scaling"] = {
            "type": "yarn",
            "factor": model.rope_scaling_factor,
            "original_max_position_embeddings": model.rope_original_max_position_embeddings,
            "beta_fast": model.rope_beta_fast,
            "beta_slow": model.rope_beta_slow,
            "mscale": model.rope_mscale,
            "mscale_all_dim": model.rope_mscale_all_dim,
        }
    return out


def silu(hf: dict[str, Any]) -> None:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            f"config.json hidden_act={act!r}: this family is mapped with SiLU (SwiGLU)"
        )


def decoder_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The fields every decoder-only family reads the same way."""
    silu(hf)
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    fields: dict[str, Any] = dict(
        num_layers=hf["num_hidden_layers"],
        hidden_size=hf["hidden_size"],
        ffn_hidden_size=hf["intermediate_size"],
        num_attention_heads=heads,
        num_query_groups=hf.get("num_key_value_heads") or heads,
        seq_length=min(int(hf.get("max_position_embeddings", 4096)), 4096),
        vocab_size=hf["vocab_size"],
        normalization="RMSNorm",
        layernorm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
        activation="swiglu",
        share_embeddings_and_output_weights=bool(hf.get("tie_word_embeddings", False)),
        init_method_std=float(hf.get("initializer_range", 0.02)),
        **rope(hf),
    )
    if head_dim * heads != hf["hidden_size"]:
        fields["kv_channels"] = head_dim
    return fields


def decoder_to_hf(model: ModelConfig, architecture: str, model_type: str) -> dict[str, Any]:
    heads = model.num_attention_heads
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": model.num_query_groups or heads,
        "head_dim": model.kv_channels or model.hidden_size // heads,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.seq_length,
        "rms_norm_eps": model.layernorm_epsilon,
        "hidden_act": "silu",
        "tie_word_embeddings": model.share_embeddings_and_output_weights,
        "initializer_range": model.init_method_std,
        **rope_to_hf(model),
    }


# --- weights -------------------------------------------------------------------------------------
def padded_rows(name: str, rows: int, padded: int) -> Rows:
    """An embedding or output layer, padded with zero rows to Megatron's vocabulary size."""
    if padded < rows:
        raise ValueError(f"{name}: padded vocabulary {padded} < {rows}")
    return Rows((Part(name), Pad(padded - rows))) if padded > rows else tensor(name)


def qkv(q: str, k: str, v: str, heads: int, groups: int, head_dim: int) -> Rows:
    """Megatron's fused QKV: per query group, its query heads' rows, then its key's, its value's."""
    per_group = heads // groups * head_dim
    parts: list[Part] = []
    for g in range(groups):
        parts += [
            Part(q, g * per_group, (g + 1) * per_group),
            Part(k, g * head_dim, (g + 1) * head_dim),
            Part(v, g * head_dim, (g + 1) * head_dim),
        ]
    return Rows(tuple(parts))


def fused_qkv(name: str, heads: int, groups: int, head_dim: int) -> Rows:
    """Megatron's fused QKV from one Hugging Face tensor that holds [all q; all k; all v] (Phi-3's
    qkv_proj): the same per-group interleaving as `qkv`, each block a row range of `name`."""
    per_group = heads // groups * head_dim
    k0, v0 = heads * head_dim, (heads + groups) * head_dim
    parts: list[Part] = []
    for g in range(groups):
        parts += [
            Part(name, g * per_group, (g + 1) * per_group),
            Part(name, k0 + g * head_dim, k0 + (g + 1) * head_dim),
            Part(name, v0 + g * head_dim, v0 + (g + 1) * head_dim),
        ]
    return Rows(tuple(parts))


def gated(gate: str, up: str) -> Rows:
    """Megatron's fc1 of a gated MLP: [gate; up]."""
    return Rows((Part(gate), Part(up)))


def attention(model: ModelConfig, meg: str, hf: str) -> dict[str, Node]:
    """Self-attention with fused QKV (GQA), optional biases and per-head q/k norms."""
    heads = model.num_attention_heads
    groups = model.num_query_groups or heads
    head_dim = model.kv_channels or model.hidden_size // heads
    a = f"{hf}.self_attn"
    out: dict[str, Node] = {
        f"{meg}.self_attention.linear_qkv.layer_norm_weight": tensor(
            f"{hf}.input_layernorm.weight"
        ),
        f"{meg}.self_attention.linear_qkv.weight": qkv(
            f"{a}.q_proj.weight",
            f"{a}.k_proj.weight",
            f"{a}.v_proj.weight",
            heads,
            groups,
            head_dim,
        ),
        f"{meg}.self_attention.linear_proj.weight": tensor(f"{a}.o_proj.weight"),
    }
    if model.add_qkv_bias or model.add_bias_linear:  # Megatron-Core: either gives QKV a bias
        out[f"{meg}.self_attention.linear_qkv.bias"] = qkv(
            f"{a}.q_proj.bias", f"{a}.k_proj.bias", f"{a}.v_proj.bias", heads, groups, head_dim
        )
    if model.add_bias_linear:
        out[f"{meg}.self_attention.linear_proj.bias"] = tensor(f"{a}.o_proj.bias")
    if model.qk_layernorm:
        out[f"{meg}.self_attention.q_layernorm.weight"] = tensor(f"{a}.q_norm.weight")
        out[f"{meg}.self_attention.k_layernorm.weight"] = tensor(f"{a}.k_norm.weight")
    return out


def dense_mlp(meg: str, hf_mlp: str, hf_norm: str) -> dict[str, Node]:
    """A SwiGLU MLP with its pre-MLP norm fused into fc1 (Megatron's key)."""
    return {
        f"{meg}.mlp.linear_fc1.layer_norm_weight": tensor(hf_norm),
        f"{meg}.mlp.linear_fc1.weight": gated(
            f"{hf_mlp}.gate_proj.weight", f"{hf_mlp}.up_proj.weight"
        ),
        f"{meg}.mlp.linear_fc2.weight": tensor(f"{hf_mlp}.down_proj.weight"),
    }


def moe_mlp(
    model: ModelConfig,
    meg: str,
    hf_norm: str,
    router: str,
    expert: str,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> dict[str, Node]:
    """A MoE layer: the router, the experts stacked (expert `expert.format(e)`), with the gate,
    up and down projections named `names` in each expert."""
    gate, up, down = names
    experts = range(model.num_moe_experts or 0)
    return {
        f"{meg}.pre_mlp_layernorm.weight": tensor(hf_norm),
        f"{meg}.mlp.router.weight": tensor(router),
        f"{meg}.mlp.experts.experts.linear_fc1.weight": Stack(
            tuple(
                gated(f"{expert.format(e)}.{gate}.weight", f"{expert.format(e)}.{up}.weight")
                for e in experts
            )
        ),
        f"{meg}.mlp.experts.experts.linear_fc2.weight": Stack(
            tuple(tensor(f"{expert.format(e)}.{down}.weight") for e in experts)
        ),
    }


def shared_experts(meg: str, hf: str) -> dict[str, Node]:
    return {
        f"{meg}.mlp.shared_experts.linear_fc1.weight": gated(
            f"{hf}.gate_proj.weight", f"{hf}.up_proj.weight"
        ),
        f"{meg}.mlp.shared_experts.linear_fc2.weight": tensor(f"{hf}.down_proj.weight"),
    }


def ends(
    model: ModelConfig, padded_vocab: int, meg: str = "", hf: str = "model"
) -> dict[str, Node]:
    """Embedding, final norm and (untied) output layer."""
    vocab = model.vocab_size
    out: dict[str, Node] = {
        f"{meg}embedding.word_embeddings.weight": padded_rows(
            f"{hf}.embed_tokens.weight", vocab, padded_vocab
        ),
        f"{meg}decoder.final_layernorm.weight": tensor(f"{hf}.norm.weight"),
    }
    if not model.share_embeddings_and_output_weights:
        out[f"{meg}output_layer.weight"] = padded_rows("lm_head.weight", vocab, padded_vocab)
    return out


def plain_layers(model: ModelConfig) -> bool:
    """Layers as Llama's: SwiGLU, one norm before each sublayer scaling by its weight, every layer
    attending over the whole sequence with one RoPE, the usual softmax scale and embedding. The
    families whose `matches` says so would export a Gemma-like model as something else."""
    return (
        model.activation == "swiglu"
        and not model.sandwich_norm
        and not model.layernorm_zero_centered_gamma
        and not model.scale_embeddings
        and model.window_size is None
        and model.rotary_base_local is None
        and model.softmax_scale is None
        and model.rope_scaling != "linear"
    )


def softmax_moe(model: ModelConfig) -> bool:
    """A GPT whose MoE routes by softmax with none of DeepSeek-V3's extras (shared experts,
    expert bias, group-limited routing, scaled weights) and no MLA or biases: what Mixtral and
    Qwen3-MoE share, each `matches` adding its own fields."""
    return (
        model.arch == "gpt"
        and bool(model.num_moe_experts)
        and plain_layers(model)
        and not model.multi_latent_attention
        and not model.add_qkv_bias
        and not model.add_bias_linear
        and model.moe_router_score_function == "softmax"
        and not model.moe_shared_expert_intermediate_size
        and not model.moe_router_enable_expert_bias
        and not model.moe_router_num_groups
        and not model.moe_router_topk_scaling_factor
    )


Layer = Callable[[int, str, str], dict[str, Node]]


def decoder(
    model: ModelConfig, padded_vocab: int, meg: str, hf: str, layer: Layer
) -> dict[str, Node]:
    """A decoder-only family's map: the ends, and `layer(i, Megatron prefix, Hugging Face prefix)`
    for each decoder layer i (what differs between families)."""
    out = ends(model, padded_vocab, meg, hf)
    for i in range(model.num_layers):
        out |= layer(i, f"{meg}decoder.layers.{i}", f"{hf}.layers.{i}")
    return out
