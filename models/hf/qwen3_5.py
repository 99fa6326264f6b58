"""Qwen3.5 dense (Qwen3_5ForCausalLM, and the language model of Qwen3_5ForConditionalGeneration,
the class of the published folders) <-> Megatron-Core's GPTModel with Gated DeltaNet layers.

Layers: `layer_types` (or `full_attention_interval`) makes every fourth layer full attention and
the others linear attention; Megatron-Core's linear_attention_freq N places softmax attention in
the layers i with (i + 1) % N == 0, so any other pattern is refused, naming the key.

- Linear attention (Gated DeltaNet, `linear_attn`): in_proj_qkv [q of every key head; k; v],
  in_proj_z (the output gate), in_proj_b (beta), in_proj_a (alpha) are Megatron-Core's in_proj,
  which its sharded_state_dict splits into `in_proj.weight.{query,key,value,z,beta,alpha}`; the
  depthwise conv1d over [q; k; v] is `conv1d.weight.{query,key,value}`; A_log, dt_bias as they are;
  the gated output norm `norm` is `out_norm` (scaling by its weight as it is: models/specs.py
  `_plain_gamma`), out_proj is out_proj. The input norm is fused into in_proj under Transformer
  Engine (`in_proj.layer_norm_weight`, an alias of `input_layernorm.weight`).
- Full attention (`self_attn`): q_proj holds, per head, [query; gate] (Megatron-Core's
  attention_output_gate); Megatron-Core's fused QKV holds per query group [its heads' queries;
  their gates; key; value]. q_norm, k_norm per head.
- Every RMSNorm but the gated one scales by 1 + weight (Megatron-Core's
  layernorm_zero_centered_gamma): the weights map as they are.
- RoPE rotates the first partial_rotary_factor (0.25) of each head's channels (rotary_percent),
  halves rotated as in Llama. The published folders use multimodal RoPE (`mrope_section`); with
  text only, the three position streams are the same positions and it is plain RoPE.

The published folders hold a vision tower (`model.visual.*`) and one multi-token-prediction layer
(`mtp.*`, which transformers neither loads nor runs): both are left out by name (`skipped`), kept
aside by an import for the export. Qwen3-Next lays its in_proj out per key head group:
models/hf/qwen3_next.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from config.schema import ModelConfig
from models.hf import gpt
from models.hf.mapping import Node, Part, Rows, tensor

ARCHITECTURE = "Qwen3_5ForCausalLM"
LANGUAGE_MODEL = "model.language_model"  # Qwen3_5ForConditionalGeneration's prefix


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The language model's config.json section (nested under text_config in the VL folders)."""
    text = hf.get("text_config")
    if text is None:
        return hf
    return {"tie_word_embeddings": hf.get("tie_word_embeddings", False)} | text


def linear_attention_freq(text: dict[str, Any]) -> int:
    """Megatron-Core's linear_attention_freq from `layer_types` (or `full_attention_interval`)."""
    layers = int(text["num_hidden_layers"])
    kinds = text.get("layer_types")
    interval = int(text.get("full_attention_interval", 4))
    if kinds:
        full = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
        interval = full[0] + 1 if full else layers + 1
    expected = [
        "linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)
    ]
    if kinds and list(kinds) != expected:
        raise ValueError(
            f"config.json layer_types={list(kinds)}: Megatron-Core places full attention in every "
            "linear_attention_freq-th layer only (linear, linear, linear, full, ...)"
        )
    return interval


def rope_fields(text: dict[str, Any]) -> dict[str, Any]:
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    fields = gpt.rope({"rope_parameters": {k: v for k, v in params.items() if "mrope" not in k}})
    if "rope_theta" not in params and "rope_theta" in text:
        fields["rotary_base"] = int(text["rope_theta"])
    qwen_rope(fields)
    percent = float(params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))
    return fields | {"rotary_percent": percent}


def qwen_rope(fields: dict[str, Any]) -> None:
    if fields.get("rope_scaling") is not None:
        raise ValueError(
            f"config.json rope type {fields['rope_scaling']!r}: Qwen3.5 is mapped with plain RoPE"
        )


def hybrid_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """The fields dense and MoE Qwen3.5 share: attention, Gated DeltaNet, norms, RoPE."""
    text = text_config(hf)
    if text.get("attention_bias"):
        raise ValueError(
            "config.json attention_bias=true: biases on q, k, v and o but not on the MLP have no "
            "Megatron-Core equivalent"
        )
    gpt.silu(text)
    heads = text["num_attention_heads"]
    return dict(
        num_layers=text["num_hidden_layers"],
        hidden_size=text["hidden_size"],
        num_attention_heads=heads,
        num_query_groups=text.get("num_key_value_heads") or heads,
        kv_channels=text.get("head_dim") or text["hidden_size"] // heads,
        seq_length=min(int(text.get("max_position_embeddings", 4096)), 4096),
        vocab_size=text["vocab_size"],
        normalization="RMSNorm",
        layernorm_epsilon=float(text.get("rms_norm_eps", 1e-6)),
        activation="swiglu",
        share_embeddings_and_output_weights=bool(text.get("tie_word_embeddings", False)),
        init_method_std=float(text.get("initializer_range", 0.02)),
        **rope_fields(text),
        qk_layernorm=True,
        layernorm_zero_centered_gamma=True,
        attention_output_gate=True,
        experimental_attention_variant="gated_delta_net",
        linear_attention_freq=linear_attention_freq(text),
        linear_conv_kernel_dim=int(text.get("linear_conv_kernel_dim", 4)),
        linear_key_head_dim=int(text.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(text.get("linear_value_head_dim", 128)),
        linear_num_key_heads=int(text.get("linear_num_key_heads", 16)),
        linear_num_value_heads=int(text.get("linear_num_value_heads", 32)),
    )


def to_model(hf: dict[str, Any], names: set[str]) -> ModelConfig:
    text = text_config(hf)
    return ModelConfig(**hybrid_fields(hf), ffn_hidden_size=text["intermediate_size"])


def hybrid_to_hf(model: ModelConfig, architecture: str, model_type: str) -> dict[str, Any]:
    """config.json of the text-only class (what transformers' Qwen3_5ForCausalLM saves)."""
    out = gpt.decoder_to_hf(model, architecture, model_type)
    out.pop("rope_theta")
    freq = model.linear_attention_freq or model.num_layers + 1
    return out | {
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": float(model.rotary_base),
            "partial_rotary_factor": model.rotary_percent,
        },
        "attention_bias": False,
        "layer_types": [
            "linear_attention" if (i + 1) % freq else "full_attention"
            for i in range(model.num_layers)
        ],
        "linear_conv_kernel_dim": model.linear_conv_kernel_dim,
        "linear_key_head_dim": model.linear_key_head_dim,
        "linear_value_head_dim": model.linear_value_head_dim,
        "linear_num_key_heads": model.linear_num_key_heads,
        "linear_num_value_heads": model.linear_num_value_heads,
    }


def to_hf(model: ModelConfig) -> dict[str, Any]:
    return hybrid_to_hf(model, ARCHITECTURE, "qwen3_5_text")


def hybrid(model: ModelConfig) -> bool:
    """Qwen3.5's attention, norms and layer pattern (dense or MoE)."""
    return (
        model.arch == "gpt"
        and model.experimental_attention_variant == "gated_delta_net"
        and model.attention_output_gate
        and model.layernorm_zero_centered_gamma
        and model.qk_layernorm
        and not model.multi_latent_attention
        and not model.add_qkv_bias
        and not model.add_bias_linear
    )


def matches(model: ModelConfig) -> bool:
    return hybrid(model) and not model.num_moe_experts


# --- weights -------------------------------------------------------------------------------------
def prefix(names: set[str] | None) -> str:
    """`model.language_model` in the published (vision-language) folders, else `model`."""
    if names and any(n.startswith(LANGUAGE_MODEL + ".") for n in names):
        return LANGUAGE_MODEL
    return "model"


def linear_layer(model: ModelConfig, index: int) -> bool:
    """Whether layer `index` is Gated DeltaNet (Megatron-Core's get_linear_attention_pattern)."""
    return bool((index + 1) % (model.linear_attention_freq or model.num_layers + 1))


def gated_attention(model: ModelConfig, meg: str, hf: str) -> dict[str, Node]:
    """Full attention with the output gate: Megatron's QKV per query group is [its heads'
    queries; their gates; key; value]; Hugging Face's q_proj per head [query; gate]."""
    heads = model.num_attention_heads
    groups = model.num_query_groups or heads
    d = model.kv_channels or model.hidden_size // heads
    per_group = heads // groups
    a, s = f"{hf}.self_attn", f"{meg}.self_attention"
    q, k, v = f"{a}.q_proj.weight", f"{a}.k_proj.weight", f"{a}.v_proj.weight"
    parts: list[Part] = []
    for g in range(groups):
        group_heads = range(g * per_group, (g + 1) * per_group)
        parts += [Part(q, 2 * h * d, (2 * h + 1) * d) for h in group_heads]
        parts += [Part(q, (2 * h + 1) * d, (2 * h + 2) * d) for h in group_heads]
        parts += [Part(k, g * d, (g + 1) * d), Part(v, g * d, (g + 1) * d)]
    return {
        f"{s}.linear_qkv.layer_norm_weight": tensor(f"{hf}.input_layernorm.weight"),
        f"{s}.linear_qkv.weight": Rows(tuple(parts)),
        f"{s}.linear_proj.weight": tensor(f"{a}.o_proj.weight"),
        f"{s}.q_layernorm.weight": tensor(f"{a}.q_norm.weight"),
        f"{s}.k_layernorm.weight": tensor(f"{a}.k_norm.weight"),
    }


def gated_delta_net(model: ModelConfig, meg: str, hf: str) -> dict[str, Node]:
    """Gated DeltaNet: in_proj and conv1d as the parts Megatron-Core's sharded_state_dict splits
    them into (each TP-sharded on its own), the rest as it is."""
    a, s = f"{hf}.linear_attn", f"{meg}.self_attention"
    qk = model.linear_key_head_dim * model.linear_num_key_heads
    v = model.linear_value_head_dim * model.linear_num_value_heads
    qkv, conv = f"{a}.in_proj_qkv.weight", f"{a}.conv1d.weight"
    out: dict[str, Node] = {
        f"{meg}.input_layernorm.weight": tensor(f"{hf}.input_layernorm.weight"),
        f"{s}.in_proj.weight.z": tensor(f"{a}.in_proj_z.weight"),
        f"{s}.in_proj.weight.beta": tensor(f"{a}.in_proj_b.weight"),
        f"{s}.in_proj.weight.alpha": tensor(f"{a}.in_proj_a.weight"),
        f"{s}.A_log": tensor(f"{a}.A_log"),
        f"{s}.dt_bias": tensor(f"{a}.dt_bias"),
        f"{s}.out_norm.weight": tensor(f"{a}.norm.weight"),
        f"{s}.out_proj.weight": tensor(f"{a}.out_proj.weight"),
    }
    for name, start, stop in (("query", 0, qk), ("key", qk, 2 * qk), ("value", 2 * qk, 2 * qk + v)):
        out[f"{s}.in_proj.weight.{name}"] = Rows((Part(qkv, start, stop),))
        out[f"{s}.conv1d.weight.{name}"] = Rows((Part(conv, start, stop),))
    return out


MlpMap = Callable[[int, str, str], dict[str, Node]]
MixerMap = Callable[[ModelConfig, str, str], dict[str, Node]]


def hybrid_weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None,
    meg: str,
    mlp: MlpMap,
    linear: MixerMap = gated_delta_net,
) -> dict[str, Node]:
    """The whole map: `linear` (Gated DeltaNet) or gated attention per layer, then
    `mlp(i, meg, hf)`."""
    hf = prefix(names)

    def layer(i: int, m: str, h: str) -> dict[str, Node]:
        mixer = linear if linear_layer(model, i) else gated_attention
        return mixer(model, m, h) | mlp(i, m, h)

    # The embedding and final norm sit under the same prefix, lm_head at the top in both.
    return gpt.decoder(model, padded_vocab, meg, hf, layer)


def weights(
    model: ModelConfig,
    padded_vocab: int,
    names: set[str] | None = None,
    meg: str = "",
    hf: str = "model",
) -> dict[str, Node]:
    """`names`: the folder's tensor names, which say whether its language model sits under
    `model.language_model` (the published vision-language folders) or `model`."""

    def mlp(i: int, m: str, h: str) -> dict[str, Node]:
        return gpt.dense_mlp(m, f"{h}.mlp", f"{h}.post_attention_layernorm.weight")

    return hybrid_weights(model, padded_vocab, names, meg, mlp)


def skipped(model: ModelConfig, name: str) -> bool:
    """The vision tower and the multi-token-prediction layer of the published folders: the
    language model trains without them (an import keeps them aside for the export)."""
    return name.startswith(("model.visual.", "mtp."))
