"""`--shrink`: the same recipe, topology and features, with a model small enough for a CPU.

A shrunk recipe keeps its parallel layout (TP, PP with virtual stages, CP, SP, EP), its precision,
its MoE / MLA / MTP features and its data settings, and replaces the sizes: 2 layers per pipeline
chunk, hidden 64, a short sequence and a small vocabulary, from random weights (full-size ones do
not fit: `checkpoint.pretrained_dir` is dropped). `fit_to_world` then scales the layout down to
the processes at hand (a 1024-GPU recipe on 4 CPU processes), halving the largest sizes first and
recording every change, so the run says what it is really exercising.

On the CPU, `cpu_substitutes` first replaces what only a GPU runs (context parallel, FP8/FP4, the
alltoall and flex MoE dispatchers, LLaVA's sequence parallel) with what the CPU mode runs
(training/cpu_mode.py), and says so; TP, SP, PP, DP and EP otherwise stay as the recipe has them."""

from __future__ import annotations

import copy
import math

from config.precision import PRESETS
from config.schema import ModelConfig, TrainingConfig

HIDDEN = 64
HEAD_DIM = 16


def shrunk_experts(model: ModelConfig, expert_parallel: int) -> int:
    """The experts of a shrunk MoE: two per expert-parallel rank, at least 4 (top-2 routing
    still chooses), rounded up to a multiple of the routing groups (DeepSeek-V3's 8). Not the
    recipe's count: 128 tiny experts on 4 CPU processes cost a shrunk DeepSeek-V3 run most of its
    time, and its checkpoint 20,000 metadata entries."""
    step = math.lcm(expert_parallel, model.moe_router_num_groups or 1)
    return -(-max(4, 2 * expert_parallel) // step) * step


def shrink(cfg: TrainingConfig) -> TrainingConfig:
    """A copy of `cfg` with a tiny model and a few steps; layout and features unchanged."""
    cfg = copy.deepcopy(cfg)
    model, par = cfg.model, cfg.parallel
    tp = par.tensor_model_parallel_size
    chunks = par.pipeline_model_parallel_size * (par.virtual_pipeline_model_parallel_size or 1)
    model.num_layers = 2 * chunks
    par.pipeline_model_parallel_layout = None  # 2 layers per chunk split evenly
    if model.cpu_offloading_num_layers:  # offloading runs at PP 1: one layer of the two
        model.cpu_offloading_num_layers = 1
    model.hidden_size = HIDDEN
    model.num_attention_heads = max(4, tp)
    model.kv_channels = HEAD_DIM
    if model.num_query_groups is not None:
        model.num_query_groups = max(
            tp, min(model.num_query_groups, model.num_attention_heads // 2)
        )
    model.ffn_hidden_size = 2 * HIDDEN * max(1, tp // 2)
    model.vocab_size = 512
    model.seq_length = 64 * max(1, par.context_parallel_size)
    if model.num_moe_experts:
        model.num_moe_experts = shrunk_experts(model, par.expert_model_parallel_size)
        model.moe_router_topk = min(model.moe_router_topk, 2)
        model.moe_ffn_hidden_size = 32
        model.moe_first_k_dense_layers = min(model.moe_first_k_dense_layers, 1)
        if model.moe_shared_expert_intermediate_size:
            model.moe_shared_expert_intermediate_size = 32
    if model.window_size is not None:
        # A window that cuts the short sequence, and local and global layers in every chunk.
        model.window_size = min(model.window_size, 15)
        if model.window_attn_skip_freq is not None:
            model.window_attn_skip_freq = 2
    if model.multi_latent_attention:
        model.q_lora_rank = 32 if model.q_lora_rank else None
        model.kv_lora_rank = 16
        model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim = HEAD_DIM, 8, HEAD_DIM
    if model.experimental_attention_variant is not None:
        # Every 2-layer chunk keeps one Gated DeltaNet and one attention layer; its heads still
        # split over TP x CP, with two value heads to a key head as in the published models.
        model.linear_attention_freq = 2
        model.linear_num_key_heads = max(2, tp * par.context_parallel_size)
        model.linear_num_value_heads = 2 * model.linear_num_key_heads
        model.linear_key_head_dim = model.linear_value_head_dim = HEAD_DIM
    if model.vision is not None:
        vision = model.vision
        vision.num_layers, vision.hidden_size, vision.ffn_hidden_size = 2, HIDDEN, 2 * HIDDEN
        vision.num_attention_heads, vision.image_size, vision.patch_size = 4, 32, 8
    cfg.train.micro_batch_size = 1
    cfg.train.max_steps = 3
    cfg.scheduler.warmup_steps = 1
    cfg.scheduler.decay_steps = None
    cfg.scheduler.wsd_decay_steps = (
        1 if cfg.scheduler.decay_style == "wsd" else cfg.scheduler.wsd_decay_steps
    )
    cfg.checkpoint.save_interval = max(1, cfg.checkpoint.save_interval)
    # Full-size weights do not fit the shrunk model: SFT, LoRA and stage-2 recipes start afresh.
    cfg.checkpoint.pretrained_dir = None
    return cfg


def fit_to_world(cfg: TrainingConfig, world: int) -> list[str]:
    """Scale the parallel layout down (in place) until it runs on `world` processes.

    Returns the changes made, as "field: old -> new". Pipeline stages are kept longest, since the
    pipeline schedules are what a CPU run can exercise best; context parallel goes first. The global
    batch becomes the smallest one the new layout accepts (one or PP microbatches per rank).
    """
    par, changes = cfg.parallel, []

    def set_(name: str, value: object) -> None:
        old = getattr(par, name)
        if old != value:
            changes.append(f"parallel.{name}: {old} -> {value}")
            setattr(par, name, value)

    while (
        par.tensor_model_parallel_size
        * par.pipeline_model_parallel_size
        * par.context_parallel_size
        > world
    ):
        if par.context_parallel_size > 1:
            set_("context_parallel_size", par.context_parallel_size // 2)
        elif par.tensor_model_parallel_size >= par.pipeline_model_parallel_size:
            set_("tensor_model_parallel_size", par.tensor_model_parallel_size // 2)
        else:
            set_("pipeline_model_parallel_size", par.pipeline_model_parallel_size // 2)
    if par.tensor_model_parallel_size == 1:
        set_("sequence_parallel", False)
    if par.pipeline_model_parallel_size == 1:
        set_("virtual_pipeline_model_parallel_size", None)
    if par.expert_tensor_parallel_size is not None:
        set_(
            "expert_tensor_parallel_size",
            min(par.expert_tensor_parallel_size, par.tensor_model_parallel_size),
        )
    ranks_per_stage = world // par.pipeline_model_parallel_size
    etp = par.expert_tensor_parallel_size or par.tensor_model_parallel_size
    ep = par.expert_model_parallel_size
    while ep > 1 and ranks_per_stage % (ep * etp):
        ep //= 2
    set_("expert_model_parallel_size", ep)
    # A world that the model-parallel product does not divide runs with fewer replicas.
    model_parallel = (
        par.tensor_model_parallel_size
        * par.pipeline_model_parallel_size
        * par.context_parallel_size
    )
    dp = max(1, world // model_parallel)
    microbatches = par.pipeline_model_parallel_size if par.pipeline_model_parallel_size > 1 else 1
    cfg.train.global_batch_size = cfg.train.micro_batch_size * dp * microbatches
    # Still 2 layers per pipeline chunk, as `shrink` made them (not 80 layers on 2 stages).
    cfg.model.num_layers = (
        2 * par.pipeline_model_parallel_size * (par.virtual_pipeline_model_parallel_size or 1)
    )
    if cfg.model.num_moe_experts:  # sized for the recipe's EP by `shrink`: now for the fitted one
        cfg.model.num_moe_experts = shrunk_experts(cfg.model, ep)
    return changes


def cpu_substitutes(cfg: TrainingConfig) -> list[str]:
    """Replace (in place) what the CPU mode cannot run with its nearest CPU counterpart; returns
    the changes, each as "field: old -> new (why)". Call before `fit_to_world`, which then fits
    the layout left (a context-parallel group becomes data-parallel replicas).

    What changes only how the same thing is computed, and what changes the computation:
    - the MoE token dispatcher: all-gathers move the same tokens to the same experts, and the
      alltoall overlap goes (the same computation, one microbatch after another);
    - context parallel: the whole sequence on each rank (same model and loss, more memory);
    - sequence parallel in LLaVA: off (LLaVAModel asserts TE's attention; plain GPTs keep SP);
    - FP8/FP4 precision: the plain mixed preset of the same dtype (the GEMMs run in BF16/FP16);
    - CPU activation offloading: off (Transformer Engine's hooks; the activations stay put);
    - the fused grouped MLP of the experts: off (Transformer Engine's op for Blackwell);
    - Transformer Engine's cross entropy: Megatron-Core's (the same loss).
    The checker's `cpu` rule (config/rules/precision.py) refuses the same features without
    --shrink, when the user asked for the CPU with a layout of their own.
    """
    model, par, changes = cfg.model, cfg.parallel, []
    if model.num_moe_experts and model.moe_token_dispatcher_type != "allgather":
        changes.append(
            f"model.moe_token_dispatcher_type: {model.moe_token_dispatcher_type} -> allgather "
            "(the CPU mode exchanges tokens with all-gathers; the same experts get the same tokens)"
        )
        model.moe_token_dispatcher_type = "allgather"
    if par.overlap_moe_expert_parallel_comm:
        changes.append(
            "parallel.overlap_moe_expert_parallel_comm: True -> False (its schedule overlaps the "
            "alltoall on CUDA streams; the same steps run one after the other)"
        )
        par.overlap_moe_expert_parallel_comm = False
    if model.moe_shared_expert_overlap:
        changes.append(
            "model.moe_shared_expert_overlap: True -> False (it overlaps the alltoall's exchange "
            "on a side CUDA stream; the allgather dispatcher has none to hide)"
        )
        model.moe_shared_expert_overlap = False
    if par.context_parallel_size > 1:
        changes.append(
            f"parallel.context_parallel_size: {par.context_parallel_size} -> 1 (context parallel "
            "needs Transformer Engine's attention on a GPU)"
        )
        par.context_parallel_size = 1
    if model.arch == "llava" and par.sequence_parallel:
        changes.append(
            "parallel.sequence_parallel: True -> False (Megatron-Core's LLaVA model runs sequence "
            "parallel only with Transformer Engine's attention)"
        )
        par.sequence_parallel = False
    if model.cpu_offloading_num_layers:
        changes.append(
            f"model.cpu_offloading_num_layers: {model.cpu_offloading_num_layers} -> 0 "
            "(Transformer Engine's offload hooks; the same activations stay in memory)"
        )
        model.cpu_offloading_num_layers = 0
    if model.moe_fused_grouped_mlp:
        changes.append(
            "model.moe_fused_grouped_mlp: True -> False (Transformer Engine's fused op on "
            "Blackwell; the experts compute the same)"
        )
        model.moe_fused_grouped_mlp = False
    if model.cross_entropy_fusion_impl == "te":
        changes.append(
            "model.cross_entropy_fusion_impl: te -> native (Transformer Engine's kernel; the "
            "same loss)"
        )
        model.cross_entropy_fusion_impl = "native"
    preset = PRESETS.get(cfg.precision)
    if preset is not None and preset.fp8_recipe is not None:
        fmt = "FP4" if preset.fp8_recipe == "nvfp4" else "FP8"
        plain = f"{preset.params_dtype}_mixed"
        changes.append(
            f"precision: {cfg.precision} -> {plain} ({fmt} needs a GPU with Transformer Engine)"
        )
        cfg.precision = plain
    return changes
