"""The config tree of a training run: strict dataclasses, one section per concern.

Field names follow Megatron-Core's own (ModelParallelConfig, TransformerConfig, OptimizerConfig) so
that users recognise them. Nothing here imports torch, Megatron-Core or NeMo-Run: the CLI checks a
config in well under a second, and the engine re-checks the same tree with the same code on every
rank. Values that follow from others (data-parallel size, microbatches, pipeline grouping) are not
stored here; `config.finalize.finalize` derives them after overrides.

`Optional[X]` rather than `X | None` on purpose: NeMo-Run's dotlist parser rejects `None` for PEP 604
unions (measured with nemo-run 0.11.1), and every recipe must stay a valid NeMo-Run config. For the
same reason this module does not use `from __future__ import annotations`: NeMo-Run's parser needs
real types, not strings.

A string with a fixed set of values is a `Literal[...]`, one from a registry carries `one_of`
metadata, every number `within` metadata (config/bounds.py); `config.tree` (overrides) and the
checker (config/rules/choices.py, ranges.py: values set in Python) read these to refuse others.
"""

from dataclasses import dataclass, field
from typing import Literal, Optional  # see the module docstring: not X | None

from config.bounds import (
    BETA,
    DROPOUT,
    EPSILON,
    HEADS,
    INTERVAL,
    LAYERS,
    MAX_HEADS,
    MAX_IMAGE,
    MAX_LAYERS,
    MAX_SAMPLES,
    MAX_SEQ,
    MAX_STEPS,
    MAX_VOCAB,
    NON_NEGATIVE,
    POSITIVE,
    RANKS,
    SEED,
    STEPS,
    WIDTH,
    one_of,
    within,
)
from config.precision import PRESETS
from config.registry import DATA_KINDS, MODEL_ARCHS, DataKind, ModelArch


@dataclass(kw_only=True, slots=True)
class VisionConfig:
    """A ViT encoder (CLIP / SigLIP style) and the MLP that projects its output into the LM."""

    num_layers: int = field(metadata=LAYERS)
    hidden_size: int = field(metadata=WIDTH)
    ffn_hidden_size: int = field(metadata=WIDTH)
    num_attention_heads: int = field(metadata=HEADS)
    image_size: int = field(default=336, metadata=within(1, MAX_IMAGE))
    patch_size: int = field(default=14, metadata=within(1, MAX_IMAGE))
    class_token: bool = True
    # None means the language model's hidden size
    projector_hidden_size: Optional[int] = field(default=None, metadata=WIDTH)
    freeze_vision: bool = True
    freeze_language: bool = False


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Architecture. Numbers come from the models' published configs (see models/)."""

    # "gpt" (decoder-only, dense or MoE) or "llava" (vision encoder + projector + gpt); every
    # architecture of config/registry.py
    arch: str = field(default="gpt", metadata=one_of(lambda: MODEL_ARCHS))
    num_layers: int = field(metadata=LAYERS)
    hidden_size: int = field(metadata=WIDTH)
    ffn_hidden_size: int = field(metadata=WIDTH)
    num_attention_heads: int = field(metadata=HEADS)
    # GQA groups; None means one per head (MHA)
    num_query_groups: Optional[int] = field(default=None, metadata=HEADS)
    # Head dimension; None means hidden_size // num_attention_heads
    kv_channels: Optional[int] = field(default=None, metadata=WIDTH)
    seq_length: int = field(metadata=within(1, MAX_SEQ))
    vocab_size: int = field(metadata=within(1, MAX_VOCAB))
    # Megatron pads the vocabulary so that every TP rank holds an equal, GEMM-friendly slice.
    make_vocab_size_divisible_by: int = field(default=128, metadata=within(1, 2**16))
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    layernorm_epsilon: float = field(default=1e-5, metadata=EPSILON)
    # swiglu: gated SiLU (Llama); geglu: gated GELU, tanh approximation (Gemma's
    # gelu_pytorch_tanh); quick_geglu: gated x * sigmoid(1.702 x) (GPT-OSS's experts); gelu: plain
    # (erf) GELU, not gated
    activation: Literal["swiglu", "geglu", "quick_geglu", "gelu"] = "swiglu"
    # GPT-OSS's clamped GLU (Megatron-Core's names): before act(gate) * (linear + offset), the gate
    # is clamped from above and the linear half to [-value, value]. None: no clamp.
    activation_func_clamp_value: Optional[float] = field(default=None, metadata=POSITIVE)
    glu_linear_offset: float = field(default=0.0, metadata=NON_NEGATIVE)
    position_embedding_type: Literal["rope", "learned_absolute", "none"] = "rope"
    # Published bases go up to 1e8 or so; torch takes the base as an int64.
    rotary_base: int = field(default=10000, metadata=within(1, 10**12))
    # RoPE frequency scaling as the model's config.json sets it: "llama3" (Llama 3.1 / 3.2: low
    # frequencies divided by the factor, low/high frequency factors 1 and 4 over 8,192 original
    # positions), "yarn" (DeepSeek-V3 in multi-latent attention, GPT-OSS in GPTModel's own YaRN
    # rotary embedding) or "linear" (positions divided by the factor: Gemma 3's global layers,
    # Megatron-Core's seq_len_interpolation_factor).
    rope_scaling: Optional[Literal["llama3", "yarn", "linear"]] = None
    rope_scaling_factor: float = field(default=8.0, metadata=within(1))
    # YaRN's parameters (DeepSeek-V3's config.json values as defaults)
    rope_original_max_position_embeddings: int = field(default=4096, metadata=within(1, MAX_SEQ))
    rope_beta_fast: float = field(default=32.0, metadata=POSITIVE)
    rope_beta_slow: float = field(default=1.0, metadata=POSITIVE)
    rope_mscale: float = field(default=1.0, metadata=NON_NEGATIVE)
    rope_mscale_all_dim: float = field(default=0.0, metadata=NON_NEGATIVE)
    # YaRN's correction range rounded to whole dimensions (transformers' `truncate`, true unless
    # set; GPT-OSS publishes false). Multi-latent attention always rounds.
    rope_correction_range_round_to_int: bool = True
    # The local (sliding-window) layers' RoPE base, unscaled (Gemma 3: 10,000 where the global
    # layers take rotary_base 1,000,000); None: rotary_base and its scaling, as the global layers.
    # The window itself: window_size and window_attn_skip_freq below.
    rotary_base_local: Optional[int] = field(default=None, metadata=within(1, 10**12))
    # Attention logits' scale; None: 1 / sqrt(head dim). Gemma 3 27B: 1 / sqrt(168)
    # (query_pre_attn_scalar) with heads of 128.
    softmax_scale: Optional[float] = field(default=None, metadata=POSITIVE)
    # Norms scale by (1 + weight), the weight stored centred on 0 (Gemma's RMSNorm, Qwen3.5 /
    # Qwen3-Next; the weights map as published): weight decay pulls the scale towards 1, not 0.
    layernorm_zero_centered_gamma: bool = False
    # Gemma 2 / 3: a norm on the attention's and on the MLP's output before each residual add, on
    # top of the norms in front of them (four per layer).
    sandwich_norm: bool = False
    scale_embeddings: bool = False  # Gemma: embeddings x sqrt(hidden_size), in the weights' dtype
    # The share of each head's channels that RoPE rotates (the first ones); Qwen3.5 rotates 0.25.
    rotary_percent: float = field(default=1.0, metadata=within(0, 1, low_open=True))
    add_bias_linear: bool = False
    add_qkv_bias: bool = False  # Qwen2-style QKV bias
    qk_layernorm: bool = False  # Qwen3 normalises queries and keys per head
    # Attention's output times sigmoid(a gate projected with the queries), per channel, before
    # the output projection (Qwen3.5 / Qwen3-Next's full-attention layers).
    attention_output_gate: bool = False
    # Linear attention in most layers (Qwen3.5, Qwen3-Next); None: softmax attention in every layer
    experimental_attention_variant: Optional[Literal["gated_delta_net"]] = None
    # Every linear_attention_freq-th layer keeps softmax attention, the others are linear
    # (Qwen3.5: 4, three Gated DeltaNet layers then one full-attention layer).
    linear_attention_freq: Optional[int] = field(default=None, metadata=LAYERS)
    # Gated DeltaNet's sizes: the causal convolution's width over q/k/v, the query/key and the
    # value/gate heads (value heads a multiple of key heads, each key head serving a group).
    linear_conv_kernel_dim: int = field(default=4, metadata=within(1, 64))
    linear_key_head_dim: int = field(default=128, metadata=WIDTH)
    linear_value_head_dim: int = field(default=128, metadata=WIDTH)
    linear_num_key_heads: int = field(default=16, metadata=HEADS)
    linear_num_value_heads: int = field(default=32, metadata=HEADS)
    share_embeddings_and_output_weights: bool = False  # Llama 3.2 ties them, larger Llamas do not
    init_method_std: float = field(default=0.02, metadata=within(0, 1, low_open=True))
    hidden_dropout: float = field(default=0.0, metadata=DROPOUT)
    attention_dropout: float = field(default=0.0, metadata=DROPOUT)
    # Sliding-window attention (GPT-OSS, Gemma 3), as Megatron-Core's window (window_size, 0): each
    # token sees itself and the window_size tokens before it (config.json's 128 is 127). None: full.
    window_size: Optional[int] = field(default=None, metadata=within(0, MAX_SEQ))
    # With a window: every window_attn_skip_freq-th layer (counted from 1) attends in full
    # (GPT-OSS: 2, windowed and full layers alternate; Gemma 3: 6); None: every layer is windowed.
    window_attn_skip_freq: Optional[int] = field(default=None, metadata=LAYERS)
    # "learnable": GPT-OSS's attention sinks, a learned logit per head in each softmax's denominator
    softmax_type: Literal["vanilla", "learnable"] = "vanilla"
    # Megatron-Core's: "auto", TE picks flash or cuDNN's fused kernel; "unfused" writes each head's
    # seq x seq scores to memory (TE's unfused kernel; torch's math kernel where SDPA runs).
    attention_backend: Literal["auto", "flash", "fused", "unfused"] = "auto"

    # Mixture of experts (num_moe_experts None means dense).
    num_moe_experts: Optional[int] = field(
        default=None, metadata=within(1, MAX_HEADS, note="None means a dense model")
    )
    moe_router_topk: int = field(default=2, metadata=HEADS)
    moe_ffn_hidden_size: Optional[int] = field(default=None, metadata=WIDTH)  # or ffn_hidden_size
    moe_shared_expert_intermediate_size: Optional[int] = field(default=None, metadata=WIDTH)
    # The shared expert's output times a sigmoid of a learned projection (Qwen3.5-MoE, Qwen3-Next)
    moe_shared_expert_gate: bool = False
    moe_first_k_dense_layers: int = field(default=0, metadata=within(0, MAX_LAYERS))  # DSV3: 3
    moe_router_score_function: Literal["softmax", "sigmoid"] = "softmax"  # sigmoid: DeepSeek-V3
    # Softmax over all experts before the top-k, weights not renormalised (Qwen3-MoE with
    # norm_topk_prob false); off: softmax over the top-k logits (Mixtral, Qwen3-30B-A3B).
    moe_router_pre_softmax: bool = False
    # DeepSeek-V3: a per-expert bias added to the scores to pick the experts (not to weigh them),
    # adjusted by the balance of the load instead of by a loss; node-limited routing over groups
    # of experts; routed experts' weights scaled by a factor.
    moe_router_enable_expert_bias: bool = False
    moe_router_num_groups: Optional[int] = field(default=None, metadata=HEADS)
    moe_router_group_topk: Optional[int] = field(default=None, metadata=HEADS)
    moe_router_topk_scaling_factor: Optional[float] = field(default=None, metadata=POSITIVE)
    # Megatron-Core's names; "none" trains without a balancing loss, "sinkhorn" balances by routing.
    moe_router_load_balancing_type: Literal[
        "aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"
    ] = "aux_loss"
    moe_aux_loss_coeff: float = field(default=1e-2, metadata=NON_NEGATIVE)
    # "alltoall": the fast path on GPUs; "allgather": on the CPU over gloo; "flex": a token once per
    # node holding its experts, its backend's package (DeepEP's deep_ep, or HybridEP) installed.
    moe_token_dispatcher_type: Literal["alltoall", "allgather", "flex"] = "alltoall"
    moe_flex_dispatcher_backend: Literal["deepep", "hybridep"] = "deepep"
    # Token dropping: an expert takes at most factor x its even share of the tokens (None: all);
    # padded, exactly that many, and the dispatcher skips its copy of the counts to the host.
    moe_expert_capacity_factor: Optional[float] = field(default=None, metadata=POSITIVE)
    moe_pad_expert_input_to_capacity: bool = False
    # The shared experts compute on a side stream while the alltoall or flex dispatcher exchanges
    # the routed tokens (Megatron-Core's moe_shared_expert_overlap).
    moe_shared_expert_overlap: bool = False
    moe_grouped_gemm: bool = False
    # The experts' FC1, activation and FC2 as one Transformer Engine op (CuTe DSL, on Blackwell).
    moe_fused_grouped_mlp: bool = False
    # The loss's fused cross entropy where TE's layers are built: Megatron-Core's ("native"), or
    # TE's, which keeps a third of the logits' bytes and which Megatron-LM refuses for stability.
    cross_entropy_fusion_impl: Literal["native", "te"] = "native"

    # Multi-latent attention (DeepSeek-V2/V3).
    multi_latent_attention: bool = False
    q_lora_rank: Optional[int] = field(default=None, metadata=WIDTH)
    kv_lora_rank: int = field(default=512, metadata=WIDTH)
    qk_head_dim: int = field(default=128, metadata=WIDTH)
    qk_pos_emb_head_dim: int = field(default=64, metadata=WIDTH)
    v_head_dim: int = field(default=128, metadata=WIDTH)
    # Multi-token prediction heads (DeepSeek-V3 has one)
    mtp_num_layers: Optional[int] = field(
        default=None, metadata=within(1, MAX_LAYERS, note="None means none")
    )

    # Activation recomputation: None, "selective" (the recompute_modules of every layer) or "full".
    recompute_granularity: Optional[Literal["selective", "full"]] = None
    recompute_method: Optional[Literal["uniform", "block"]] = None  # with "full"
    recompute_num_layers: Optional[int] = field(default=None, metadata=LAYERS)
    # With "selective": comma-separated RECOMPUTE_MODULES (a dotlist override is one string), e.g.
    # "mla_up_proj,mlp"; None means Megatron-Core's default, core_attn.
    recompute_modules: Optional[str] = None
    # Megatron-Core's CPU activation offloading of the first N decoder layers; 0: none.
    cpu_offloading_num_layers: int = field(default=0, metadata=within(0, MAX_LAYERS))

    # Vision-language (arch "llava"): the encoder and projector in front of the language model.
    vision: Optional[VisionConfig] = None


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """How the model and the batch are split over GPUs. The data-parallel size is derived."""

    tensor_model_parallel_size: int = field(default=1, metadata=RANKS)
    # Every stage holds at least one layer (or the embedding or the loss).
    pipeline_model_parallel_size: int = field(default=1, metadata=LAYERS)
    virtual_pipeline_model_parallel_size: Optional[int] = field(default=None, metadata=LAYERS)
    # Megatron-Core's layout string ("Et*3|(tt|)*29,m|L"); derived evenly when None.
    pipeline_model_parallel_layout: Optional[str] = None
    context_parallel_size: int = field(default=1, metadata=RANKS)
    # How CP ranks exchange attention inputs (Transformer Engine): p2p, a ring of keys and values
    # hidden behind attention; a2a, heads for sequence (windows, sinks); all_gather, whole K and V.
    cp_comm_type: Literal["p2p", "a2a", "all_gather"] = "p2p"
    sequence_parallel: bool = False
    expert_model_parallel_size: int = field(default=1, metadata=RANKS)
    # None means tensor_model_parallel_size
    expert_tensor_parallel_size: Optional[int] = field(default=None, metadata=RANKS)
    # Megatron DDP: overlap the gradient reduce-scatter and parameter all-gather with compute.
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    # Keep gradients in FP32 for the reduction (costs 2 bytes/param more than BF16 grads).
    grad_reduce_in_fp32: bool = True
    # Megatron-FSDP in place of Megatron DDP: shards the weights, gradients and optimizer state
    # over the data-parallel (x CP) ranks (ZeRO-3, Megatron-Core's optim_grads_params), gathering
    # each transformer layer's weights just before it runs. Needs the distributed optimizer;
    # checkpoints are torch DCP folders (Megatron-LM's fsdp_dtensor format), so a run cannot
    # switch it on or off across a resume.
    use_megatron_fsdp: bool = False
    # MoE: run one microbatch's token alltoall while another microbatch computes (Megatron-Core's
    # combined 1F1B schedule). Needs EP > 1, the alltoall or flex dispatcher, virtual pipeline
    # stages when PP > 1, BF16/FP16 weights and no full recompute; holds one microbatch more.
    overlap_moe_expert_parallel_comm: bool = False


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    optimizer: Literal["adam", "sgd"] = "adam"  # adam: AdamW, decoupled weight decay
    lr: float = field(default=3e-4, metadata=POSITIVE)
    min_lr: float = field(default=3e-5, metadata=NON_NEGATIVE)
    weight_decay: float = field(default=0.1, metadata=NON_NEGATIVE)
    adam_beta1: float = field(default=0.9, metadata=BETA)
    adam_beta2: float = field(default=0.95, metadata=BETA)
    adam_eps: float = field(default=1e-8, metadata=EPSILON)
    # The largest global gradient norm; a larger one is scaled down to it.
    clip_grad: float = field(default=1.0, metadata=within(0, note="0 turns clipping off"))
    # Shards FP32 master weights and Adam moments over the data-parallel group (ZeRO-1).
    use_distributed_optimizer: bool = True


@dataclass(kw_only=True, slots=True)
class SchedulerConfig:
    """Learning-rate schedule: linear warmup, then decay to optimizer.min_lr."""

    warmup_steps: int = field(default=2000, metadata=within(0, MAX_STEPS))
    decay_style: Literal["cosine", "linear", "constant", "wsd"] = (
        "cosine"  # wsd: warmup-stable-decay
    )
    decay_steps: Optional[int] = field(default=None, metadata=STEPS)  # None: train.max_steps
    # Length of the final decay phase of "wsd"
    wsd_decay_steps: Optional[int] = field(default=None, metadata=STEPS)
    wsd_decay_style: Literal["linear", "cosine", "exponential"] = "linear"


@dataclass(kw_only=True, slots=True)
class DataConfig:
    # A kind of config/registry.py: "mock", "indexed" (Megatron .bin/.idx blends), "sft"
    # (prompt/response JSONL, loss on the response), "chat" ({"messages": [...]} JSONL rendered
    # with the tokenizer's chat template, loss on the assistant's turns) or "energon" (multimodal)
    kind: str = field(default="mock", metadata=one_of(lambda: DATA_KINDS))
    # indexed: one prefix or "w1 prefix1 w2 prefix2 ..."; sft and chat: a JSONL file; energon: a
    # prepared folder or blend file.
    path: Optional[str] = None
    split: str = "969,30,1"  # train, validation, test weights of an indexed blend or SFT file
    # A local tokenizer.json or HF tokenizer folder; None uses a null tokenizer (mock data only).
    tokenizer: Optional[str] = None
    # indexed: where Megatron's dataset index caches (sample orders, blend indices) are written;
    # None puts them beside the data, in <first prefix>/cache, which needs the data's folder
    # writable. Point it elsewhere for read-only data (a shared, scratch-mounted dataset).
    index_cache_dir: Optional[str] = None
    # indexed: a node-local folder (/dev/shm/<you>, a node's own disk) into which one rank per node
    # copies the blend's .bin/.idx files before training, so that the ranks read them there and
    # not from the shared filesystem (for data that fits: the JSC course's advice). The index
    # caches stay where they would be without it, shared by the nodes. None: read in place.
    stage_dir: Optional[str] = None
    num_workers: int = field(default=2, metadata=within(0, 1024))
    seed: int = field(default=1234, metadata=SEED)
    # SFT and Energon: pack several samples into one sequence instead of padding each.
    sequence_packing: bool = False
    # Energon loader
    shuffle_buffer_size: int = field(default=100, metadata=within(0, MAX_SAMPLES))
    max_samples_per_sequence: int = field(default=100, metadata=within(1, MAX_SAMPLES))
    prefetch_factor: int = field(default=2, metadata=within(1, 1024))
    pin_memory: bool = True


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    global_batch_size: int = field(metadata=within(1, MAX_SAMPLES))
    micro_batch_size: int = field(default=1, metadata=within(1, MAX_SAMPLES))
    max_steps: int = field(default=100_000, metadata=STEPS)
    seed: int = field(default=1234, metadata=SEED)
    # Every eval_interval steps, the mean loss over eval_iters global batches of the validation
    # split (the same batches each time, so the numbers compare) is logged as val_loss; 0: never.
    eval_interval: int = field(default=0, metadata=INTERVAL)
    eval_iters: int = field(default=10, metadata=STEPS)
    # "auto" picks CUDA when present; "cpu" runs the CPU smoke mode (gloo, no FP8).
    device: Literal["auto", "cuda", "cpu"] = "auto"
    # Exit cleanly (after a checkpoint) this many minutes into the job; None means never.
    exit_duration_minutes: Optional[float] = field(default=None, metadata=NON_NEGATIVE)


# The linear layers of Megatron-Core's GPT layers that LoRA can adapt, by their module names:
# attention's fused QKV and output projections, the dense MLP's fused gate/up and down projections
# (in MoE layers: the shared expert's; routed experts are not adapted).
# Megatron-Core's selective recompute modules (TransformerConfig.recompute_modules), less the
# GatedDeltaNet one (no such attention here). Output-discarding: moe_act, layernorm, mla_up_proj.
RECOMPUTE_MODULES = (
    "core_attn",  # the attention kernel
    "mla_up_proj",  # MLA's query / key-value up projections and RoPE
    "layernorm",  # the input and pre-MLP norms
    "mlp",  # the dense MLP (dense layers only)
    "moe_act",  # the experts' activation (needs moe_grouped_gemm)
    "shared_experts",  # the shared experts of an MoE layer
    "moe",  # the whole MoE layer, token dispatch included
)


def comma_names(text: str) -> list[str]:
    """A comma-separated field (peft.target_modules, model.recompute_modules) as a list of names."""
    return [name.strip() for name in text.split(",") if name.strip()]


def is_gated(model: ModelConfig) -> bool:
    """Whether fc1 is a gated linear unit (twice the FFN width: gate and linear halves)."""
    return model.activation in ("swiglu", "geglu", "quick_geglu")


def selective_modules(model: ModelConfig) -> list[str]:
    """The modules selective recompute rebuilds, as Megatron-Core reads them: none without
    recompute_granularity=selective, core_attn when recompute_modules is unset."""
    if model.recompute_granularity != "selective":
        return []
    if model.recompute_modules is None:
        return ["core_attn"]
    return comma_names(model.recompute_modules)


LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@dataclass(kw_only=True, slots=True)
class PeftConfig:
    """Parameter-efficient fine-tuning: low-rank adapters (LoRA, Hu et al. 2021) on the linear
    layers; the base weights stay frozen (no gradient, no optimizer state) and checkpoints hold the
    adapters only. The update of a layer is (alpha / rank) x B A x, B zero at the start."""

    scheme: Literal["none", "lora"] = "none"
    rank: int = field(default=16, metadata=within(1, 65536))
    alpha: float = field(default=32.0, metadata=POSITIVE)
    dropout: float = field(default=0.0, metadata=DROPOUT)  # on the adapter's input only
    # Comma-separated module names (LORA_TARGETS): a dotlist override is one string.
    target_modules: str = "linear_qkv,linear_proj,linear_fc1,linear_fc2"


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    save_dir: Optional[str] = None  # None means <run directory>/checkpoints
    save_interval: int = field(default=500, metadata=STEPS)
    # Older complete checkpoints are removed; 0 keeps every one
    keep_last: int = field(default=3, metadata=within(0, MAX_STEPS, note="0 keeps every one"))
    async_save: bool = True  # GPUs only; the CPU and Megatron-FSDP save synchronously
    load_dir: Optional[str] = None  # resume from here; None means save_dir
    # Fine-tuning: a complete checkpoint (a run's checkpoints folder or one iter_XXXXXXX) whose
    # model weights start a fresh run; its step, optimizer and data position are not taken. Used
    # only when neither save_dir nor load_dir holds a checkpoint, so a requeued job resumes instead.
    pretrained_dir: Optional[str] = None
    # Megatron-Core's resharding strategy for the distributed optimizer's state.
    dist_optimizer_sharding: Literal["dp_reshardable", "fully_reshardable"] = "dp_reshardable"


@dataclass(kw_only=True, slots=True)
class LoggingConfig:
    run_dir: Optional[str] = None  # None means runs/<recipe>-<timestamp> under the working dir
    log_interval: int = field(default=1, metadata=STEPS)
    tensorboard: bool = True
    wandb_project: Optional[str] = None  # W&B is off unless a project is given
    wandb_mode: Literal["online", "offline", "disabled"] = "online"
    progress_bar: bool = True


@dataclass(kw_only=True, slots=True)
class ResilienceConfig:
    """Stragglers, hangs and failed jobs (training/resilience/straggler.py, training/resilience/watchdog.py, the sbatch
    script). Every field may change when a run resumes: none of them shapes a checkpoint."""

    # Every this many steps the ranks gather their mean step and collective times over the last
    # interval (one all_gather of three numbers) and rank 0 names a rank whose compute time (its
    # step minus its waits in the gradient sync and parameter all-gather) exceeds
    # straggler_factor x the median of the others of its pipeline stage. One slow GPU gates every
    # collective: the others wait for it.
    straggler_interval: int = field(default=100, metadata=INTERVAL)
    # 1.5: well above the spread of healthy ranks, well below a throttled or failing GPU.
    straggler_factor: float = field(default=1.5, metadata=within(1, low_open=True))
    # Hang watchdog: a rank whose step makes no progress for max(hang_min_seconds,
    # hang_timeout_factor x its slowest recent step) dumps every thread's stack (stderr and
    # <run_dir>/hang/) and exits 75, so that torchrun stops the job (and Slurm may requeue it)
    # instead of a hung collective holding the allocation until the wall time. 0 or None: off.
    hang_min_seconds: Optional[float] = field(
        default=600.0, metadata=within(0, note="0 turns the watchdog off")
    )
    hang_timeout_factor: float = field(default=10.0, metadata=within(1))
    # The allowance for what is not a training step: start-up up to the first step (imports,
    # rendezvous, model build, checkpoint load, compilation) and the work between steps
    # (evaluation, checkpoint saves, the stop decision).
    hang_startup_seconds: float = field(default=1800.0, metadata=POSITIVE)
    # On Slurm, a job whose training step fails (a crash, the watchdog) requeues itself with
    # `scontrol requeue` while SLURM_RESTART_COUNT is below this; the requeued job resumes from
    # the newest complete checkpoint. 0: never requeue.
    max_requeues: int = field(default=3, metadata=within(0, 1000, note="0 never requeues"))
    # On Slurm, start the ranks with nvidia-resiliency-ext's ft_launcher instead of torchrun (its
    # rank monitors restart failed ranks in place). Needs the package where the ranks run (NGC
    # containers carry it); the launcher refuses a run whose environment cannot import it.
    ft_launcher: bool = False
    # Restart in the same processes when a rank raises (nvidia-resiliency-ext's in-process
    # Wrapper, training/inprocess.py): every rank aborts its process groups and trains again from
    # the newest complete checkpoint, without a new job or new interpreters (seconds, not the
    # minutes of a requeue). Needs the package where the ranks run (NGC containers carry it).
    inprocess_restart: bool = False
    # With inprocess_restart: restarts per launch before the error ends the job as usual.
    inprocess_max_restarts: int = field(default=3, metadata=within(0, 1000))


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """The root: one complete, launchable description of a training run."""

    name: str  # the recipe's name, used for run directories and job names
    model: ModelConfig
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # A preset name, see config/precision.py.
    precision: str = field(default="bf16_mixed", metadata=one_of(lambda: PRESETS))
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    peft: PeftConfig = field(default_factory=PeftConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)


def data_kind(cfg: TrainingConfig) -> Optional[DataKind]:
    """The registry entry of a config's data.kind (None for an unknown kind: the checker says so)."""
    return DATA_KINDS.get(cfg.data.kind)


def masks_packed_rows(cfg: TrainingConfig) -> bool:
    """Whether the rows hold packed samples kept apart by an explicit attention mask (SFT and chat
    packing): the model then attends through SDPA's core attention, whatever the layers."""
    kind = data_kind(cfg)
    return cfg.data.sequence_packing and kind is not None and kind.masks_packed_rows


def model_arch(cfg: TrainingConfig) -> Optional[ModelArch]:
    """The registry entry of a config's model.arch (None for an unknown one: the checker says so)."""
    return MODEL_ARCHS.get(cfg.model.arch)
