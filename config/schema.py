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

A string with a fixed set of values is a `Literal[...]` (NeMo-Run's parser checks those too); one
whose values live in a registry carries `one_of` metadata. `config.tree` refuses any other value
at override time, with the closest valid one, and the checker (config/rules/choices.py) does the
same for values a recipe set in Python. Both read the valid values from here.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, Optional  # see the module docstring: not X | None

from config.precision import PRESETS
from config.registry import DATA_KINDS, MODEL_ARCHS


def one_of(choices: Callable[[], Iterable[str]]) -> dict[str, Any]:
    """Field metadata for a string whose valid values live in a registry (data kinds, model
    architectures, precision presets): checked like a Literal, but the registry can grow."""
    return {"one_of": choices}


@dataclass(kw_only=True, slots=True)
class VisionConfig:
    """A ViT encoder (CLIP / SigLIP style) and the MLP that projects its output into the LM."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    image_size: int = 336
    patch_size: int = 14
    class_token: bool = True
    projector_hidden_size: Optional[int] = None  # None means the language model's hidden size
    freeze_vision: bool = True
    freeze_language: bool = False


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Architecture. Numbers come from the models' published configs (see models/)."""

    # "gpt" (decoder-only, dense or MoE) or "llava" (vision encoder + projector + gpt); every
    # architecture of config/registry.py
    arch: str = field(default="gpt", metadata=one_of(lambda: MODEL_ARCHS))
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: Optional[int] = None  # GQA groups; None means one per head (MHA)
    kv_channels: Optional[int] = (
        None  # head dimension; None means hidden_size // num_attention_heads
    )
    seq_length: int
    vocab_size: int
    # Megatron pads the vocabulary so that every TP rank holds an equal, GEMM-friendly slice.
    make_vocab_size_divisible_by: int = 128
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    layernorm_epsilon: float = 1e-5
    activation: Literal["swiglu", "gelu"] = "swiglu"  # swiglu: gated SiLU (Llama)
    position_embedding_type: Literal["rope", "learned_absolute", "none"] = "rope"
    rotary_base: int = 10000
    add_bias_linear: bool = False
    add_qkv_bias: bool = False  # Qwen2-style QKV bias
    qk_layernorm: bool = False  # Qwen3 normalises queries and keys per head
    share_embeddings_and_output_weights: bool = False  # Llama 3.2 ties them, larger Llamas do not
    init_method_std: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0

    # Mixture of experts (num_moe_experts None means dense).
    num_moe_experts: Optional[int] = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: Optional[int] = None  # per expert; None means ffn_hidden_size
    moe_shared_expert_intermediate_size: Optional[int] = None
    moe_first_k_dense_layers: int = 0  # DeepSeek-V3 keeps its first 3 layers dense
    moe_router_score_function: Literal["softmax", "sigmoid"] = "softmax"  # sigmoid: DeepSeek-V3
    # Megatron-Core's names; "none" trains without a balancing loss, "sinkhorn" balances by routing.
    moe_router_load_balancing_type: Literal[
        "aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"
    ] = "aux_loss"
    moe_aux_loss_coeff: float = 1e-2
    # "alltoall" is the fast path on GPUs; "allgather" is the one that runs on the CPU over gloo.
    moe_token_dispatcher_type: Literal["alltoall", "allgather", "flex"] = "alltoall"
    moe_grouped_gemm: bool = False

    # Multi-latent attention (DeepSeek-V2/V3).
    multi_latent_attention: bool = False
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int = 512
    qk_head_dim: int = 128
    qk_pos_emb_head_dim: int = 64
    v_head_dim: int = 128
    mtp_num_layers: Optional[int] = None  # multi-token prediction heads (DeepSeek-V3 has one)

    # Activation recomputation: None, "selective" (attention core only) or "full".
    recompute_granularity: Optional[Literal["selective", "full"]] = None
    recompute_method: Optional[Literal["uniform", "block"]] = None  # with "full"
    recompute_num_layers: Optional[int] = None

    # Vision-language (arch "llava"): the encoder and projector in front of the language model.
    vision: Optional[VisionConfig] = None


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    """How the model and the batch are split over GPUs. The data-parallel size is derived."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: Optional[int] = None
    # Megatron-Core's layout string ("Et*3|(tt|)*29,m|L"); derived evenly when None.
    pipeline_model_parallel_layout: Optional[str] = None
    context_parallel_size: int = 1
    sequence_parallel: bool = False
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: Optional[int] = None  # None means tensor_model_parallel_size
    # Megatron DDP: overlap the gradient reduce-scatter and parameter all-gather with compute.
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    # Keep gradients in FP32 for the reduction (costs 2 bytes/param more than BF16 grads).
    grad_reduce_in_fp32: bool = True


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    optimizer: Literal["adam", "sgd"] = "adam"  # adam: AdamW, decoupled weight decay
    lr: float = 3e-4
    min_lr: float = 3e-5
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    # Shards FP32 master weights and Adam moments over the data-parallel group (ZeRO-1).
    use_distributed_optimizer: bool = True


@dataclass(kw_only=True, slots=True)
class SchedulerConfig:
    """Learning-rate schedule: linear warmup, then decay to optimizer.min_lr."""

    warmup_steps: int = 2000
    decay_style: Literal["cosine", "linear", "constant", "wsd"] = (
        "cosine"  # wsd: warmup-stable-decay
    )
    decay_steps: Optional[int] = None  # None means until train.max_steps
    wsd_decay_steps: Optional[int] = None  # length of the final decay phase of "wsd"
    wsd_decay_style: Literal["linear", "cosine", "exponential"] = "linear"


@dataclass(kw_only=True, slots=True)
class DataConfig:
    # A kind of config/registry.py: "mock", "indexed" (Megatron .bin/.idx blends), "sft"
    # (prompt/response JSONL, loss on the response) or "energon" (multimodal)
    kind: str = field(default="mock", metadata=one_of(lambda: DATA_KINDS))
    # indexed: one prefix or "w1 prefix1 w2 prefix2 ..."; sft: a JSONL file; energon: a prepared
    # folder or blend file.
    path: Optional[str] = None
    split: str = "969,30,1"  # train, validation, test weights of an indexed blend or SFT file
    # A local tokenizer.json or HF tokenizer folder; None uses a null tokenizer (mock data only).
    tokenizer: Optional[str] = None
    num_workers: int = 2
    seed: int = 1234
    # SFT and Energon: pack several samples into one sequence instead of padding each.
    sequence_packing: bool = False
    # Energon loader
    shuffle_buffer_size: int = 100
    max_samples_per_sequence: int = 100
    prefetch_factor: int = 2
    pin_memory: bool = True


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    global_batch_size: int
    micro_batch_size: int = 1
    max_steps: int = 100_000
    seed: int = 1234
    # Every eval_interval steps, the mean loss over eval_iters global batches of the validation
    # split (the same batches each time, so the numbers compare) is logged as val_loss; 0: never.
    eval_interval: int = 0
    eval_iters: int = 10
    # "auto" picks CUDA when present; "cpu" runs the CPU smoke mode (gloo, no FP8).
    device: Literal["auto", "cuda", "cpu"] = "auto"
    # Exit cleanly (after a checkpoint) this many minutes into the job; None means never.
    exit_duration_minutes: Optional[float] = None


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    save_dir: Optional[str] = None  # None means <run directory>/checkpoints
    save_interval: int = 500
    keep_last: int = 3  # older complete checkpoints are removed; 0 keeps every one
    async_save: bool = True  # GPUs only; the CPU saves synchronously
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
    log_interval: int = 1
    tensorboard: bool = True
    wandb_project: Optional[str] = None  # W&B is off unless a project is given
    wandb_mode: Literal["online", "offline", "disabled"] = "online"
    progress_bar: bool = True


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
    logging: LoggingConfig = field(default_factory=LoggingConfig)
