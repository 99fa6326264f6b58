"""Megatron-Core's GPTModel from our config tree: dense, MoE, MLA and multi-token prediction.

`transformer_config` maps ModelConfig + ParallelConfig + the precision preset onto Megatron-Core's
TransformerConfig (MLATransformerConfig for multi-latent attention); the field names are mostly
the same on both sides. `build_chunks` builds this rank's pipeline chunks: one GPTModel, or one
per virtual stage with `vp_stage` set, each holding the layers the pipeline layout gives it.

FP8 / FP4: the preset's recipe goes into TransformerConfig (fp8 / fp8_recipe / fp4); Megatron-Core
then builds Transformer Engine's recipe object (DelayedScaling, Float8CurrentScaling,
Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling) and enters TE's autocast around every
layer itself (megatron.core.fp8_utils.get_fp8_context), keeping the first and last layers in BF16
where the preset asks for it. The decoder's weights are built in FP8 alone (fp8_param, TE's
fp8_model_init around each layer) where config/backend.py `fp8_weights` says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.fusions.fused_bias_geglu import quick_gelu
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.enums import AttnBackend
from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
from megatron.core.utils import get_batch_on_this_cp_rank

from config.backend import fp8_weights
from config.finalize import Derived
from config.precision import PrecisionPreset
from config.schema import TrainingConfig, is_gated, masks_packed_rows, selective_modules
from models.gemma_layers import scale_embeddings
from models.specs import choose_backend, decoder_block_spec, have_transformer_engine, mtp_block_spec

# Our preset names for TE's FP8 scaling recipes -> TransformerConfig.fp8_recipe.
_FP8_RECIPES = {
    "delayed": "delayed",
    "tensorwise": "tensorwise",
    "blockwise": "blockwise",
    "mxfp8": "mxfp8",
}


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU with the tanh approximation: Gemma's gelu_pytorch_tanh, as transformers computes it."""
    return F.gelu(x, approximate="tanh")


# ModelConfig.activation -> Megatron-Core's activation_func (to the gate half when gated:
# `is_gated`).
_ACTIVATIONS: dict[str, Callable[..., Any]] = {
    "swiglu": F.silu,
    "geglu": gelu_tanh,
    "gelu": F.gelu,
    "quick_geglu": quick_gelu,  # x * sigmoid(1.702 x), Megatron-Core's own
}


@dataclass
class YarnTransformerConfig(TransformerConfig):
    """TransformerConfig with the YaRN fields GPTModel reads (`getattr(config, "yarn_...")`) for
    position_embedding_type="yarn": TransformerConfig does not declare them, and its attention
    takes YaRN's cos/sin scale from them too. Megatron-Bridge's GPT provider declares the same."""

    yarn_rotary_scaling_factor: float = 1.0
    yarn_original_max_position_embeddings: int = 4096
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_mscale: float = 1.0
    yarn_mscale_all_dim: float = 0.0
    yarn_correction_range_round_to_int: bool = True


def gpt_yarn(cfg: TrainingConfig) -> bool:
    """YaRN in GPTModel's rotary embedding (GPT-OSS); multi-latent attention has its own."""
    return cfg.model.rope_scaling == "yarn" and not cfg.model.multi_latent_attention


def chunks_per_rank(cfg: TrainingConfig, derived: Derived) -> int:
    """Model chunks on every pipeline rank: the virtual stages (from VPP or the layout), else 1."""
    pp = cfg.parallel.pipeline_model_parallel_size
    return len(derived.pipeline_chunks) // pp if pp > 1 else 1


def _precision_fields(
    preset: PrecisionPreset, dtype: torch.dtype, fp8_param: bool = False
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "bf16": dtype == torch.bfloat16,
        "fp16": dtype == torch.float16,
        "params_dtype": dtype,
        "pipeline_dtype": dtype,  # the dtype of activations sent between pipeline stages
    }
    if preset.fp8_recipe is None:
        return fields
    if not have_transformer_engine():
        raise RuntimeError(
            f"precision={preset.name} runs its GEMMs in FP8/FP4 through Transformer Engine, which "
            "does not import here; use an NGC PyTorch container or precision=bf16_mixed"
        )
    if preset.fp8_recipe == "nvfp4":
        fields.update(fp4="e2m1", fp4_recipe="nvfp4")
    else:
        fields.update(
            fp8=preset.fp8_format,
            fp8_recipe=_FP8_RECIPES[preset.fp8_recipe],
            fp8_amax_history_len=preset.fp8_amax_history_len,
            fp8_amax_compute_algo="max" if preset.fp8_recipe == "delayed" else "most_recent",
            fp8_param=fp8_param,
            first_last_layers_bf16=preset.first_last_layers_bf16,
        )
    return fields


def transformer_config(
    cfg: TrainingConfig, derived: Derived, device: str, dtype: torch.dtype
) -> TransformerConfig:
    """Megatron-Core's TransformerConfig (or MLATransformerConfig) for this run."""
    m, par = cfg.model, cfg.parallel
    vpp = chunks_per_rank(cfg, derived)
    lora = cfg.peft.scheme != "none"
    te = choose_backend(device, lora) == "te"
    fields: dict[str, Any] = dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups or m.num_attention_heads,
        normalization=m.normalization,
        layernorm_epsilon=m.layernorm_epsilon,
        gated_linear_unit=is_gated(m),
        activation_func=_ACTIVATIONS[m.activation],
        activation_func_clamp_value=m.activation_func_clamp_value,
        glu_linear_offset=m.glu_linear_offset,
        layernorm_zero_centered_gamma=m.layernorm_zero_centered_gamma,
        softmax_scale=m.softmax_scale,
        # GPT-OSS's attention: sinks (a learned logit per head) and windows on some layers;
        # Megatron-Core's (left, right) window, a causal decoder looking no further right than 0.
        softmax_type=m.softmax_type,
        window_size=None if m.window_size is None else (m.window_size, 0),
        window_attn_skip_freq=m.window_attn_skip_freq,
        add_bias_linear=m.add_bias_linear,
        add_qkv_bias=m.add_qkv_bias,
        qk_layernorm=m.qk_layernorm,
        attention_output_gate=m.attention_output_gate,
        init_method_std=m.init_method_std,
        hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout,
        recompute_granularity=m.recompute_granularity,
        recompute_method=m.recompute_method,
        recompute_num_layers=m.recompute_num_layers,
        recompute_modules=selective_modules(m) or None,
        # Transformer Engine's offload hooks move the first layers' saved activations to the
        # host and back; the weights stay on the GPU.
        cpu_offloading=m.cpu_offloading_num_layers > 0,
        cpu_offloading_num_layers=m.cpu_offloading_num_layers,
        cpu_offloading_activations=True,
        cpu_offloading_weights=False,
        mtp_num_layers=m.mtp_num_layers,
        tensor_model_parallel_size=par.tensor_model_parallel_size,
        pipeline_model_parallel_size=par.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        pipeline_model_parallel_layout=derived.pipeline_layout,
        context_parallel_size=par.context_parallel_size,
        cp_comm_type=par.cp_comm_type,
        sequence_parallel=par.sequence_parallel,
        expert_model_parallel_size=par.expert_model_parallel_size,
        expert_tensor_parallel_size=derived.expert_tensor_parallel_size,
        # Interleaved schedule: overlap the P2P transfers with compute, with unbatched P2P ops
        # (Megatron-LM's default). Batched, PP=2 would put two sends to the same peer into one
        # batch, which the receiver can match in the wrong order (measured: swapped activations
        # and gradients over gloo).
        overlap_p2p_comm=vpp > 1,
        batch_p2p_comm=vpp == 1,
        # Free each pipeline output's data once it has been sent (Megatron-LM's default).
        deallocate_pipeline_outputs=True,
        transformer_impl="transformer_engine" if te else "local",
        # Megatron-Core sets Transformer Engine's NVTE_*_ATTN switches from it at model build;
        # models/sdpa.py runs "unfused" in torch's math kernel.
        attention_backend=AttnBackend[m.attention_backend],
        # The loss in a fused cross entropy where Transformer Engine's layers are built:
        # Megatron-Core's, or TE's (model.cross_entropy_fusion_impl; config/cost/memory.py
        # `logit_bytes`). Megatron-LM refuses TE's for stability (NVIDIA/Megatron-LM#5115).
        cross_entropy_loss_fusion=te,
        cross_entropy_fusion_impl=m.cross_entropy_fusion_impl if te else "native",
        # On the CPU, build weights with the CPU generator and slice them per TP rank.
        use_cpu_initialization=device == "cpu",
        **_precision_fields(derived.preset, dtype, fp8_weights(cfg, derived.preset)),
    )
    if m.kv_channels is not None:
        fields["kv_channels"] = m.kv_channels
    if m.experimental_attention_variant == "gated_delta_net":
        fields.update(
            experimental_attention_variant="gated_delta_net",
            linear_attention_freq=m.linear_attention_freq,
            linear_conv_kernel_dim=m.linear_conv_kernel_dim,
            linear_key_head_dim=m.linear_key_head_dim,
            linear_value_head_dim=m.linear_value_head_dim,
            linear_num_key_heads=m.linear_num_key_heads,
            linear_num_value_heads=m.linear_num_value_heads,
        )
    if m.num_moe_experts:
        fields.update(
            num_moe_experts=m.num_moe_experts,
            moe_router_topk=m.moe_router_topk,
            moe_ffn_hidden_size=m.moe_ffn_hidden_size or m.ffn_hidden_size,
            moe_shared_expert_intermediate_size=m.moe_shared_expert_intermediate_size,
            moe_shared_expert_gate=m.moe_shared_expert_gate,
            # 0 = dense, 1 = MoE per layer: DeepSeek-V3 keeps its first layers dense.
            moe_layer_freq=[0] * m.moe_first_k_dense_layers
            + [1] * (m.num_layers - m.moe_first_k_dense_layers),
            moe_router_score_function=m.moe_router_score_function,
            moe_router_load_balancing_type=m.moe_router_load_balancing_type,
            moe_aux_loss_coeff=m.moe_aux_loss_coeff,
            moe_token_dispatcher_type=m.moe_token_dispatcher_type,
            moe_flex_dispatcher_backend=m.moe_flex_dispatcher_backend,
            moe_expert_capacity_factor=m.moe_expert_capacity_factor,
            moe_pad_expert_input_to_capacity=m.moe_pad_expert_input_to_capacity,
            moe_shared_expert_overlap=m.moe_shared_expert_overlap,
            moe_grouped_gemm=m.moe_grouped_gemm,
            # The experts' FC1, activation and FC2 as one Transformer Engine op (build_chunks).
            use_transformer_engine_op_fuser=m.moe_fused_grouped_mlp,
            # How the router turns scores into weights (models/hf/ names each family's choice):
            # softmax before or after the top k, DeepSeek-V3's expert bias, group-limited routing
            # and scaled weights.
            moe_router_pre_softmax=m.moe_router_pre_softmax,
            moe_router_enable_expert_bias=m.moe_router_enable_expert_bias,
            moe_router_num_groups=m.moe_router_num_groups,
            moe_router_group_topk=m.moe_router_group_topk,
            moe_router_topk_scaling_factor=m.moe_router_topk_scaling_factor,
            # The combined 1F1B schedule: one microbatch's alltoall behind another's compute.
            overlap_moe_expert_parallel_comm=par.overlap_moe_expert_parallel_comm,
        )
    if m.multi_latent_attention:
        return MLATransformerConfig(
            **fields,
            q_lora_rank=m.q_lora_rank,
            kv_lora_rank=m.kv_lora_rank,
            qk_head_dim=m.qk_head_dim,
            qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
            v_head_dim=m.v_head_dim,
            rotary_base=m.rotary_base,
            **_mla_rope(cfg),
        )
    if gpt_yarn(cfg):
        return YarnTransformerConfig(
            **fields,
            yarn_rotary_scaling_factor=m.rope_scaling_factor,
            yarn_original_max_position_embeddings=m.rope_original_max_position_embeddings,
            yarn_beta_fast=m.rope_beta_fast,
            yarn_beta_slow=m.rope_beta_slow,
            yarn_mscale=m.rope_mscale,
            yarn_mscale_all_dim=m.rope_mscale_all_dim,
            yarn_correction_range_round_to_int=m.rope_correction_range_round_to_int,
        )
    return TransformerConfig(**fields)


def _mla_rope(cfg: TrainingConfig) -> dict[str, Any]:
    """MLATransformerConfig's RoPE fields: YaRN with the model's parameters, or plain RoPE.

    MLATransformerConfig defaults to DeepSeek-V3's YaRN (factor 40), which a model without RoPE
    scaling must not get. Its softmax scale is mscale(rotary_scaling_factor, mscale_all_dim)^2 /
    sqrt(head dim) whatever the rope type, so plain RoPE sets the factor to 1 (mscale 1). (llama3
    scaling with MLA is refused by the checker, config/rules/model.py.)
    """
    m = cfg.model
    if m.rope_scaling != "yarn":
        return {"rope_type": "rope", "rotary_scaling_factor": 1.0, "mscale_all_dim": 0.0}
    return {
        "rope_type": "yarn",
        "rotary_scaling_factor": m.rope_scaling_factor,
        "original_max_position_embeddings": m.rope_original_max_position_embeddings,
        "beta_fast": m.rope_beta_fast,
        "beta_slow": m.rope_beta_slow,
        "mscale": m.rope_mscale,
        "mscale_all_dim": m.rope_mscale_all_dim,
    }


def build_chunks(
    cfg: TrainingConfig, derived: Derived, config: TransformerConfig, device: str
) -> list[GPTModel]:
    """This rank's model chunks (one per virtual pipeline stage), not yet wrapped or moved."""
    m = cfg.model
    backend = choose_backend(device, cfg.peft.scheme != "none")
    # Packed rows attend within their segments only: an explicit block-diagonal mask.
    masked = masks_packed_rows(cfg)
    num_chunks = chunks_per_rank(cfg, derived)
    if m.moe_fused_grouped_mlp:
        # Megatron-Core's experts (at build) and Transformer Engine's op fuser (at each forward)
        # fuse a gated activation's grouped MLP into the CuTe DSL kernel only where this is set.
        os.environ["NVTE_CUTEDSL_FUSED_GROUPED_MLP"] = "1"
    chunks = []
    for vp_stage in range(num_chunks):
        stage = vp_stage if num_chunks > 1 else None
        pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage)
        post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage)
        model = GPTModel(
            config=config,
            transformer_layer_spec=decoder_block_spec(
                config,
                backend,
                m.normalization,
                stage,
                masked,
                rotary_base_local=m.rotary_base_local,
                sandwich_norm=m.sandwich_norm,
            ),
            vocab_size=derived.padded_vocab_size,
            max_sequence_length=m.seq_length,
            pre_process=pre,
            post_process=post,
            share_embeddings_and_output_weights=m.share_embeddings_and_output_weights,
            position_embedding_type="yarn" if gpt_yarn(cfg) else m.position_embedding_type,
            rotary_base=m.rotary_base,
            rotary_percent=m.rotary_percent,
            # Llama 3.1 / 3.2's frequency scaling (MLA's RoPE and YaRN live in MLATransformerConfig).
            rope_scaling=m.rope_scaling == "llama3",
            rope_scaling_factor=m.rope_scaling_factor,
            # Linear RoPE scaling: positions divided by the factor (Gemma 3's global layers).
            seq_len_interpolation_factor=(
                m.rope_scaling_factor if m.rope_scaling == "linear" else None
            ),
            mtp_block_spec=mtp_block_spec(config, backend, m.normalization, stage, masked),
            vp_stage=stage,
        )
        if m.scale_embeddings and pre:
            scale_embeddings(model.embedding, m.hidden_size)
        chunks.append(model)
    return chunks


def attention_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """[b, s] segment ids -> [b, 1, s, s] bool, True where attention is masked (Megatron's
    convention): causal within each segment, nothing across segments.

    Built where the batch is used (on the GPU, in the forward step) rather than in the loader:
    s x s per row is 16 MiB at seq 4096, the ids 32 KiB.
    """
    s = segment_ids.size(-1)
    causal = torch.ones(s, s, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return ~(causal & same).unsqueeze(1)


def on_this_cp_rank(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """This context-parallel rank's part of a microbatch's sequences: Megatron-Core's zigzag split
    (get_batch_on_this_cp_rank: of 2 x CP chunks, rank r takes r and 2 x CP - 1 - r, so each rank
    has as much causal attention to compute), positions kept; the batch itself untouched (a
    microbatch passes through every model chunk of a rank). The whole batch without CP."""
    if parallel_state.get_context_parallel_world_size() <= 1:
        return batch
    group = parallel_state.get_context_parallel_group()
    return get_batch_on_this_cp_rank(dict(batch), is_hybrid_cp=False, cp_group=group)


def forward(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], schedule_plan: bool = False
) -> tuple[Any, torch.Tensor]:
    """One microbatch through one GPTModel chunk: (per-token loss [b, s], loss mask).

    With labels, GPTModel returns the per-token cross-entropy (vocab-parallel over TP). Packed rows
    carry segment ids and attend within their segment only; other rows are causal. With
    `schedule_plan` (the MoE alltoall overlap's combined 1F1B schedule asks for it), the same
    inputs build GPTModel's schedule plan, which that schedule runs in place of the forward.
    """
    batch = on_this_cp_rank(batch)
    mask = attention_mask(batch["segment_ids"]) if "segment_ids" in batch else None
    # build_schedule_plan is GPTModel's own: typed as an nn.Module, `model` does not declare it.
    run: Callable[..., Any] = (
        cast(Callable[..., Any], model.build_schedule_plan) if schedule_plan else model
    )
    output = run(batch["tokens"], batch["position_ids"], mask, labels=batch["labels"])
    return output, batch["loss_mask"]
