"""The architecture itself: layers, head dimension, query groups, recompute."""

from __future__ import annotations

from config.backend import local_reason
from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import RECOMPUTE_MODULES, ModelConfig, TrainingConfig, selective_modules
from config.tree import not_one_of


def model(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    model = cfg.model
    out: list[Problem] = []
    if model.num_attention_heads < 1:
        return out  # config/rules/ranges.py names it
    if (
        model.kv_channels is None
        and not model.multi_latent_attention
        and model.hidden_size % model.num_attention_heads
    ):
        out.append(
            Problem(
                "model.num_attention_heads",
                f"hidden_size={model.hidden_size} is not divisible by num_attention_heads={model.num_attention_heads}; "
                "set model.kv_channels to the head dimension",
            )
        )
    out += _rotary(model) + _rope_scaling(model) + _attention(cfg)
    groups = model.num_query_groups
    if groups is not None and (groups < 1 or model.num_attention_heads % groups):
        out.append(
            Problem(
                "model.num_query_groups",
                f"{groups} must divide num_attention_heads={model.num_attention_heads}",
            )
        )
    out += _recompute(model) + _mla_query_norm(cfg, cluster) + _local_layers(cfg)
    out += _cp_exchange(cfg)
    out += _offloading(cfg, cluster) + _loss_fusion(cfg, cluster)
    delayed = d.preset is not None and d.preset.fp8_recipe == "delayed"
    discarded = {"moe_act", "layernorm"} & set(selective_modules(model))
    if delayed and discarded:
        out.append(
            Problem(
                "model.recompute_modules",
                f"{' and '.join(sorted(discarded))} recompute cannot run under FP8 delayed "
                f"scaling (precision {cfg.precision}); drop them or use a current-scaling FP8 "
                "preset",
            )
        )
    return out


CP_EXCHANGES = ("p2p", "a2a", "all_gather")  # parallel.cp_comm_type, the planner's preference


def cp_exchange_obstacles(m: ModelConfig, tp: int, cp: int, kind: str) -> list[str]:
    """Why Transformer Engine's context parallelism cannot run the model with the exchange `kind`
    (parallel.cp_comm_type) at TP `tp` and CP `cp`, as it asserts in the first forward step (TE's
    attention/dot_product_attention/context_parallel.py, `attn_forward_func_with_cp` and
    `AttnFuncWithCPAndQKVOA2A`, at NVIDIA/TransformerEngine d0067d0da):

    - a sliding window only with a2a or all_gather ("Context parallelism does not support sliding
      window attention with cp_comm_type='p2p'");
    - sinks (model.softmax_type other than vanilla: GPT-OSS) only with a2a;
    - a2a trades each rank's share of the sequence for a share of the heads: a TP rank's query
      heads and key-value heads both divide by CP ("requires num_heads % cp_size == 0")."""
    if cp == 1:
        return []
    out = []
    if m.window_size is not None and kind == "p2p":
        out.append(
            f"sliding-window layers (model.window_size={m.window_size}) run on a2a or all_gather "
            "only: the ring of keys and values cannot run a window"
        )
    if m.softmax_type != "vanilla" and kind != "a2a":
        out.append(f"model.softmax_type='{m.softmax_type}' (attention sinks) runs on a2a only")
    heads = m.num_attention_heads
    groups = heads if m.multi_latent_attention else m.num_query_groups or heads
    if kind == "a2a" and (heads // tp % cp or groups // tp % cp):
        out.append(
            f"a2a needs CP {cp} to divide each tensor-parallel rank's query heads ({heads} / TP "
            f"{tp}) and key-value heads ({groups} / TP {tp})"
        )
    return out


def cp_exchanges(m: ModelConfig, tp: int, cp: int) -> list[str]:
    """The exchanges Transformer Engine runs the model with at this TP and CP, preferred first."""
    return [kind for kind in CP_EXCHANGES if not cp_exchange_obstacles(m, tp, cp, kind)]


def _cp_exchange(cfg: TrainingConfig) -> list[Problem]:
    par = cfg.parallel
    tp, cp, kind = par.tensor_model_parallel_size, par.context_parallel_size, par.cp_comm_type
    why = cp_exchange_obstacles(cfg.model, tp, cp, kind)
    if not why:
        return []
    others = [k for k in cp_exchanges(cfg.model, tp, cp) if k != kind]
    fix = (
        f"use parallel.cp_comm_type={others[0]}"
        if others
        else "use a CP that divides the heads, or parallel.context_parallel_size=1"
    )
    return [
        Problem(
            "parallel.cp_comm_type",
            f"is '{kind}' at parallel.context_parallel_size={cp}: {'; '.join(why)}; {fix}",
        )
    ]


def _local_layers(cfg: TrainingConfig) -> list[Problem]:
    """Sliding-window (local) layers and what models/gemma_layers.py adds to Megatron-Core's
    layers (Gemma 3): the settings Megatron-Core would ignore, and what the layers cannot run.

    - Megatron-Core makes a layer local only when window_size is set (is_layer_window_attention);
      the local layers' RoPE base would be ignored without it (window_attn_skip_freq too:
      `_attention` names that).
    - Context parallelism with windows: `_cp_exchange`.
    - The post norms sit on a dense MLP (models/specs.py `gemma_layers`), and both they and the
      local RoPE subclass SelfAttention, not multi-latent attention.
    """
    m = cfg.model
    out: list[Problem] = []
    # (window_attn_skip_freq without a window: `_attention`)
    if m.window_size is None and m.rotary_base_local is not None:
        out.append(
            Problem(
                "model.rotary_base_local",
                f"is {m.rotary_base_local} but model.window_size is unset: without a window "
                "no layer is local, and Megatron-Core would ignore it; set "
                "model.window_size (Gemma 3: 1023) or model.rotary_base_local=None",
            )
        )
    if m.rotary_base_local is not None and m.position_embedding_type != "rope":
        out.append(
            Problem(
                "model.rotary_base_local",
                f"is {m.rotary_base_local} but model.position_embedding_type="
                f"'{m.position_embedding_type}' has no RoPE; unset it",
            )
        )
    gemma = [
        f"model.{name}"
        for name in ("sandwich_norm", "rotary_base_local")
        if getattr(m, name) not in (None, False)
    ]
    if gemma and m.multi_latent_attention:
        out.append(
            Problem(
                gemma[0],
                f"{' and '.join(gemma)} extend Megatron-Core's SelfAttention, not multi-latent "
                "attention; set model.multi_latent_attention=false or unset them",
            )
        )
    if m.sandwich_norm and m.num_moe_experts:
        out.append(
            Problem(
                "model.sandwich_norm",
                "is true in a mixture of experts (model.num_moe_experts="
                f"{m.num_moe_experts}): the norm on the MLP's output is built on a dense MLP "
                "only; set model.sandwich_norm=false or unset model.num_moe_experts",
            )
        )
    return out


def _mla_query_norm(cfg: TrainingConfig, cluster: Cluster) -> list[Problem]:
    """Multi-latent attention's query norm (model.qk_layernorm) sits after the query's down
    projection, which only model.q_lora_rank gives it. Without one, Transformer Engine's layers
    fuse the norm into the query projection; Megatron-Core's local layers have no such fused layer
    and refuse the model when they build it."""
    m = cfg.model
    if not (m.multi_latent_attention and m.qk_layernorm and m.q_lora_rank is None):
        return []
    why = local_reason(cfg, cluster)
    if why is None:
        return []
    return [
        Problem(
            "model.q_lora_rank",
            f"is unset with model.qk_layernorm=true in multi-latent attention, and {why}: "
            "Megatron-Core's local layers normalise the query only after its down projection, "
            "so they refuse to build it. Set model.q_lora_rank (e.g. 1536, DeepSeek-V3's), or "
            "model.qk_layernorm=false"
            + (", or train every weight (peft.scheme=none)" if cfg.peft.scheme != "none" else ""),
        )
    ]


def _recompute(model: ModelConfig) -> list[Problem]:
    """TransformerConfig.__post_init__'s recompute rules: full recompute needs a method and a
    layer count; selective recompute takes no layer count (a method it accepts and ignores). An
    unknown granularity or method is named by the choices rule (the schema's Literal)."""
    granularity, method, layers = (
        model.recompute_granularity,
        model.recompute_method,
        model.recompute_num_layers,
    )
    out: list[Problem] = []
    if granularity == "full":
        if method is None:
            out.append(
                Problem(
                    "model.recompute_method",
                    "model.recompute_granularity=full needs model.recompute_method 'uniform' "
                    "(checkpoint every recompute_num_layers layers) or 'block' (the first "
                    "recompute_num_layers layers of each pipeline stage); e.g. "
                    "model.recompute_method=uniform",
                )
            )
        if layers is None:
            out.append(
                Problem(
                    "model.recompute_num_layers",
                    "model.recompute_granularity=full needs model.recompute_num_layers (1 to "
                    "the layers per pipeline stage), e.g. model.recompute_num_layers=1",
                )
            )
    elif granularity == "selective" and layers is not None:
        out.append(
            Problem(
                "model.recompute_num_layers",
                f"is {layers}, but model.recompute_granularity=selective recomputes parts of "
                "every layer and takes no layer count; unset model.recompute_num_layers "
                "(model.recompute_num_layers=None) or use model.recompute_granularity=full",
            )
        )
    return out + _recompute_modules(model)


def _offloading(cfg: TrainingConfig, cluster: Cluster) -> list[Problem]:
    """TransformerConfig.__post_init__'s CPU offloading rules (fewer layers than the model's, no
    pipeline parallelism, no recompute) and TransformerBlock's: the offload hooks are Transformer
    Engine's, so Megatron-Core's local layers assert."""
    m, field = cfg.model, "model.cpu_offloading_num_layers"
    n = m.cpu_offloading_num_layers
    if n <= 0:
        return []
    out: list[Problem] = []
    if n >= m.num_layers:
        out.append(
            Problem(
                field,
                f"is {n}, but Megatron-Core offloads fewer layers than the model's "
                f"model.num_layers={m.num_layers}; use at most {m.num_layers - 1}",
            )
        )
    pp = cfg.parallel.pipeline_model_parallel_size
    if pp > 1:
        out.append(
            Problem(
                field,
                f"is {n}, but Megatron-Core offloads activations only without pipeline "
                f"parallelism (parallel.pipeline_model_parallel_size={pp}); use "
                "parallel.pipeline_model_parallel_size=1 or model.cpu_offloading_num_layers=0",
            )
        )
    if m.recompute_granularity is not None:
        out.append(
            Problem(
                field,
                f"is {n}, but Megatron-Core offloads no activations of a run that recomputes "
                f"them (model.recompute_granularity={m.recompute_granularity}); use one: "
                "model.recompute_granularity=null or model.cpu_offloading_num_layers=0",
            )
        )
    why = local_reason(cfg, cluster)
    if why:
        out.append(
            Problem(
                field,
                f"is {n}, but the offload hooks are Transformer Engine's and {why}; use "
                "model.cpu_offloading_num_layers=0",
            )
        )
    return out


def _loss_fusion(cfg: TrainingConfig, cluster: Cluster) -> list[Problem]:
    """The engine fuses the loss only where it builds Transformer Engine's layers (models/gpt.py),
    so TE's cross entropy there alone; elsewhere the field would be dropped without a word."""
    why = local_reason(cfg, cluster)
    if cfg.model.cross_entropy_fusion_impl != "te" or why is None:
        return []
    return [
        Problem(
            "model.cross_entropy_fusion_impl",
            f"is 'te', Transformer Engine's cross entropy, which the engine fuses into runs of "
            f"Transformer Engine's layers only, and {why}; use native",
        )
    ]


def _recompute_modules(model: ModelConfig) -> list[Problem]:
    """TransformerConfig.__post_init__'s rules for recompute_modules (the names, moe_act with
    grouped GEMMs, mla_up_proj with MLA), and one of ours: the field without selective
    recompute, which Megatron-Core ignores without a word."""
    text, field = model.recompute_modules, "model.recompute_modules"
    if text is None:
        return []
    if model.recompute_granularity != "selective":
        return [
            Problem(
                field,
                f"is '{text}', but only model.recompute_granularity=selective recomputes "
                f"modules (it is {model.recompute_granularity}); set "
                "model.recompute_granularity=selective or unset model.recompute_modules",
            )
        ]
    names = selective_modules(model)
    if not names:
        return [
            Problem(
                field,
                "names no module, so selective recompute would rebuild nothing; name some of "
                f"{', '.join(RECOMPUTE_MODULES)} (comma-separated), or unset "
                "model.recompute_granularity",
            )
        ]
    out = [
        Problem(field, not_one_of(n, list(RECOMPUTE_MODULES)))
        for n in names
        if n not in RECOMPUTE_MODULES
    ]
    if "moe_act" in names and not (model.num_moe_experts and model.moe_grouped_gemm):
        why = (
            "model.moe_grouped_gemm is false; set model.moe_grouped_gemm=true or drop moe_act"
            if model.num_moe_experts
            else "this model has no experts (model.num_moe_experts is unset); drop moe_act"
        )
        out.append(
            Problem(
                field,
                f"moe_act recomputes the activation inside the experts' grouped GEMMs, and {why}",
            )
        )
    if "mla_up_proj" in names and not model.multi_latent_attention:
        out.append(
            Problem(
                field,
                "mla_up_proj recomputes multi-latent attention's up projections, and this model "
                "has none (model.multi_latent_attention is false); drop mla_up_proj",
            )
        )
    return out


def _attention(cfg: TrainingConfig) -> list[Problem]:
    """Sliding windows and sinks (GPT-OSS) as Megatron-Core builds them; unfused attention.

    Megatron-Core windows layer i (from 1) unless i % window_attn_skip_freq == 0, and reads the
    frequency only with a window (transformer/utils.py is_layer_window_attention): a frequency
    alone, or of 1 (no layer windowed), would be ignored without a word. (Packed SFT rows take
    windows and sinks too: models/sdpa.py SdpaAttention applies them with the rows' mask.)
    """
    m = cfg.model
    out = []
    freq = m.window_attn_skip_freq
    if freq is not None and m.window_size is None:
        out.append(
            Problem(
                "model.window_attn_skip_freq",
                f"is {freq} without model.window_size, and Megatron-Core reads it only with a "
                "window; set model.window_size or unset it",
            )
        )
    elif freq == 1:
        out.append(
            Problem(
                "model.window_attn_skip_freq",
                "is 1: every layer would attend in full and model.window_size go unused; use 2 "
                "or more (2: windowed and full layers alternate), or unset model.window_size",
            )
        )
    cp = cfg.parallel.context_parallel_size
    if m.attention_backend == "unfused" and cp > 1:  # Transformer Engine's dot_product_attention/
        # utils.py disables its unfused attention with context parallelism; SDPA has none either
        out.append(
            Problem(
                "model.attention_backend",
                f"is unfused with parallel.context_parallel_size={cp}, and unfused attention "
                "has no context parallelism; use auto, or context_parallel_size=1",
            )
        )
    return out


def _rotary(model: ModelConfig) -> list[Problem]:
    """RoPE rotates the channels of a head in pairs: an odd rotary dimension fails in the first
    forward step (found by tests/unit/config/test_checker_fuzz.py)."""
    if model.position_embedding_type != "rope":
        return []
    if model.multi_latent_attention:
        field, dim = "model.qk_pos_emb_head_dim", model.qk_pos_emb_head_dim
    elif model.kv_channels is not None:
        field, dim = "model.kv_channels", model.kv_channels
    elif model.hidden_size % model.num_attention_heads == 0:
        field, dim = "model.hidden_size", model.hidden_size // model.num_attention_heads
    else:
        return []  # no whole head dimension: named above
    if dim % 2 == 0:
        return []
    return [
        Problem(
            field,
            f"gives the rotary head dimension {dim}, which is odd; RoPE rotates channels in pairs, "
            f"so use an even one (e.g. {dim + 1}) or model.position_embedding_type=learned_absolute",
        )
    ]


def _rope_scaling(model: ModelConfig) -> list[Problem]:
    """Megatron-Core applies llama3 scaling in GPTModel's rotary embedding, YaRN in multi-latent
    attention or GPTModel's YaRN embedding (models/gpt.py); each elsewhere would be ignored
    without a word, as would an unrounded YaRN correction range in multi-latent attention."""
    if model.rope_scaling is None:
        return []
    if model.position_embedding_type != "rope":
        return [
            Problem(
                "model.rope_scaling",
                f"'{model.rope_scaling}' scales RoPE, but model.position_embedding_type="
                f"'{model.position_embedding_type}'; unset model.rope_scaling",
            )
        ]
    if (
        model.rope_scaling == "yarn"
        and model.multi_latent_attention
        and not model.rope_correction_range_round_to_int
    ):
        return [
            Problem(
                "model.rope_correction_range_round_to_int",
                "is false, but multi-latent attention's YaRN always rounds its correction range "
                "to whole dimensions; set it to true",
            )
        ]
    if model.rope_scaling == "llama3" and model.multi_latent_attention:
        return [
            Problem(
                "model.rope_scaling",
                "'llama3' is not applied by multi-latent attention, which scales RoPE with "
                "'yarn'; use model.rope_scaling=yarn",
            )
        ]
    return []
