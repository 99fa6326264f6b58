"""What a run trains with: model chunks in Megatron DDP, Megatron's optimizer and the LR schedule.

Built as Megatron-LM's `get_model` / `setup_model_and_optimizer` do, without its global args:
GPTModel chunks -> Float16Module (BF16/FP16) -> DistributedDataParallel (grad buffers, bucketed
and overlapped reduce-scatter / all-reduce) -> `get_megatron_optimizer` (the distributed optimizer
shards FP32 master weights and Adam moments over DP) -> OptimizerParamScheduler.

With parallel.use_megatron_fsdp, Megatron-Core's FullyShardedDataParallel takes DDP's place: it
shards weights, gradients and optimizer state over DP x CP and gathers each transformer layer's
weights as the layer runs; the same optimizer steps its shards.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_config import TransformerConfig

from config.backend import fp8_weights
from config.finalize import Derived
from config.layout import ddp_bucket_size
from config.precision import TORCH_DTYPES
from config.registry import MODEL_ARCHS, load
from config.schema import TrainingConfig
from models.cpu_experts import build_with_distinct_experts
from models.gpt import transformer_config


def compute_dtype(cfg: TrainingConfig, derived: Derived, device: str) -> torch.dtype:
    """The dtype of weights and activations: the preset's, on GPUs and on the CPU alike.

    BF16 runs on the CPU too (Float16Module, FP32 master weights in the optimizer: the same code
    path as on GPUs); CPUs with AMX / AVX512-BF16 even multiply faster in BF16 than in FP32.
    """
    return getattr(torch, TORCH_DTYPES[derived.preset.params_dtype])


def ddp_config(cfg: TrainingConfig, derived: Derived) -> DistributedDataParallelConfig:
    par, opt = cfg.parallel, cfg.optimizer
    fp16 = derived.preset.params_dtype == "fp16"
    fp8 = fp8_weights(cfg, derived.preset)
    return DistributedDataParallelConfig(
        # FP8 weights are all-gathered as FP8; MXFP8's gather reuses the gradient buffer, as
        # NeMo's and Megatron-Bridge's presets set it (else Megatron-Core warns of the memory).
        fp8_param_gather=fp8,
        reuse_grad_buf_for_mxfp8_param_ag=fp8 and derived.preset.fp8_recipe == "mxfp8",
        grad_reduce_in_fp32=par.grad_reduce_in_fp32,
        overlap_grad_reduce=par.overlap_grad_reduce,
        # The parameter all-gather exists only when the distributed optimizer shards the weights.
        overlap_param_gather=par.overlap_param_gather and opt.use_distributed_optimizer,
        use_distributed_optimizer=opt.use_distributed_optimizer,
        # Stop at the first NaN gradient, except in FP16: there the loss scale starts high on
        # purpose and the first steps overflow; the dynamic loss scaler skips them and backs off.
        check_for_nan_in_grad=not fp16,
        use_megatron_fsdp=par.use_megatron_fsdp,
        # Weights, gradients and optimizer state (ZeRO-3). Megatron-Core's lighter strategies
        # (optim, optim_grads) fail to save fsdp_dtensor checkpoints in 0.19.2 (measured: their
        # DTensor chunk metadata is refused), and the distributed optimizer is ZeRO-1 already.
        data_parallel_sharding_strategy=(
            "optim_grads_params" if par.use_megatron_fsdp else "no_shard"
        ),
        # Megatron-FSDP keeps its gradients in the compute dtype unless told, and does not read
        # grad_reduce_in_fp32: this field's meaning carries over by its own setting.
        megatron_fsdp_main_grads_dtype=torch.float32 if par.grad_reduce_in_fp32 else None,
    )


def _bucket_size(ddp: DistributedDataParallelConfig, chunk_index: int) -> int | None:
    """DDP's own rule: ~40M elements per bucket when overlapping; one bucket per chunk otherwise
    and on every pipeline stage but the first (their reduction is off the critical path)."""
    if (
        not ddp.overlap_grad_reduce
        or chunk_index > 0
        or parallel_state.get_pipeline_model_parallel_rank() > 0
    ):
        return None
    dp = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    return ddp.bucket_size or ddp_bucket_size(dp)


def build_model(
    cfg: TrainingConfig, derived: Derived, device: str
) -> tuple[list[DistributedDataParallel], TransformerConfig]:
    """This rank's model chunks, on the device, in the compute dtype, wrapped in Megatron DDP."""
    dtype = compute_dtype(cfg, derived, device)
    config = transformer_config(cfg, derived, device, dtype)
    # The architecture's builder (config/registry.py): GPT chunks, or LLaVA's encoder + GPT.
    build_chunks = load(MODEL_ARCHS[cfg.model.arch].builder)
    build = functools.partial(build_chunks, cfg, derived, config, device)
    chunks: list[torch.nn.Module]
    if device == "cpu" and cfg.model.num_moe_experts:  # distinct experts, the same at any EP
        chunks = build_with_distinct_experts(build, cfg.train.seed)
    else:
        chunks = build()
    if cfg.peft.scheme == "lora":  # adapters on the target layers, every base weight frozen
        from training.lora import adapt

        adapt(chunks, cfg)
    for chunk in chunks:
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        if device == "cuda":
            chunk.cuda(torch.cuda.current_device())
    if config.bf16 or config.fp16:
        chunks = [Float16Module(config, chunk) for chunk in chunks]

    ddp = ddp_config(cfg, derived)
    if ddp.use_megatron_fsdp:
        # Scaling fused into the reduction is NCCL's pre-multiplied sum, which gloo lacks.
        ddp.gradient_reduce_div_fusion = device != "cpu"
        return [
            _fully_sharded(config, ddp, chunk, index, device) for index, chunk in enumerate(chunks)
        ], config
    wrapped = []
    for index, chunk in enumerate(chunks):
        layout = None
        if ddp.use_distributed_optimizer:
            # DDP's grad buffers must be laid out the way the distributed optimizer shards them.
            params = [p for p in chunk.parameters() if p.requires_grad]
            layout = DistributedOptimizer.compute_full_param_layout(
                params,
                _bucket_size(ddp, index),
                parallel_state.get_data_parallel_world_size(
                    with_context_parallel=True, partial_data_parallel=True
                ),
                ddp,
                expert_data_parallel_world_size=parallel_state.get_expert_data_parallel_world_size(
                    partial_expert_data_parallel=True
                ),
            )
        wrapped.append(
            DistributedDataParallel(
                config=config,
                ddp_config=ddp,
                module=chunk,
                # Chunks after the first reduce their gradients in one bucket, as in Megatron-LM.
                disable_bucketing=index > 0,
                full_param_layout=layout,
            )
        )
    return wrapped, config


def _fully_sharded(
    config: TransformerConfig,
    ddp: DistributedDataParallelConfig,
    chunk: torch.nn.Module,
    index: int,
    device: str,
) -> torch.nn.Module:
    """One chunk in Megatron-FSDP, its shards on this rank's device; later chunks, like DDP's,
    reduce their gradients in one bucket."""
    from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel

    where = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else device
    return FullyShardedDataParallel(
        config=config,
        ddp_config=ddp,
        module=chunk,
        disable_bucketing=index > 0,
        device=torch.device(where),
    )


def build_optimizer(
    cfg: TrainingConfig, model: list[DistributedDataParallel], config: TransformerConfig
) -> Any:
    """Megatron's optimizer (AdamW with decoupled weight decay, or SGD) with gradient clipping."""
    opt = cfg.optimizer
    optimizer_config = OptimizerConfig(
        optimizer=opt.optimizer,
        lr=opt.lr,
        min_lr=opt.min_lr,
        weight_decay=opt.weight_decay,
        adam_beta1=opt.adam_beta1,
        adam_beta2=opt.adam_beta2,
        adam_eps=opt.adam_eps,
        clip_grad=opt.clip_grad,
        bf16=config.bf16,
        fp16=config.fp16,
        params_dtype=config.params_dtype,
        # FP16 needs dynamic loss scaling (None = dynamic); BF16 and FP32 need none.
        loss_scale=None,
        use_distributed_optimizer=opt.use_distributed_optimizer,
        overlap_param_gather=cfg.parallel.overlap_param_gather and opt.use_distributed_optimizer,
        reuse_grad_buf_for_mxfp8_param_ag=model[0].ddp_config.reuse_grad_buf_for_mxfp8_param_ag,
    )
    return get_megatron_optimizer(optimizer_config, model)


_DECAY_STYLES = {"cosine": "cosine", "linear": "linear", "constant": "constant", "wsd": "WSD"}


def build_scheduler(cfg: TrainingConfig, optimizer: Any) -> OptimizerParamScheduler:
    """Linear warmup from 0, then the decay style down to optimizer.min_lr, counted in steps."""
    sched, opt = cfg.scheduler, cfg.optimizer
    decay_steps = sched.decay_steps or cfg.train.max_steps
    # Megatron asserts warmup < decay steps even for a constant LR, where the decay never starts.
    decay_steps = max(decay_steps, sched.warmup_steps + 1)
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=opt.lr,
        min_lr=opt.min_lr,
        lr_warmup_steps=sched.warmup_steps,
        lr_decay_steps=decay_steps,
        lr_decay_style=_DECAY_STYLES[sched.decay_style],
        start_wd=opt.weight_decay,
        end_wd=opt.weight_decay,
        wd_incr_steps=decay_steps,
        wd_incr_style="constant",
        wsd_decay_steps=sched.wsd_decay_steps,
        lr_wsd_decay_style=sched.wsd_decay_style,
        # On resume the schedule follows this config (a longer train.max_steps stretches the
        # decay), the checkpoint giving only the step: Megatron-LM's
        # --override-opt_param-scheduler. What cannot change is refused before launch
        # (launchers/resume.py).
        override_opt_param_scheduler=True,
        use_checkpoint_opt_param_scheduler=False,
    )


def wire_schedules(
    config: TransformerConfig, model: list[DistributedDataParallel], optimizer: Any
) -> None:
    """Hooks the pipeline schedules call: no_sync between microbatches, grad sync per chunk as
    its last backward finishes, the final grad reductions, and the (FP16) loss scale."""
    from megatron.core.distributed import finalize_model_grads

    config.grad_scale_func = optimizer.scale_loss
    if model[0].ddp_config.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in model]
        grad_sync = [chunk.start_grad_sync for chunk in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    config.finalize_model_grads_func = finalize_model_grads
    if any(getattr(p, "lora_tp_partial", False) for chunk in model for p in chunk.parameters()):
        from training.lora import finalize_with_adapters

        config.finalize_model_grads_func = finalize_with_adapters(finalize_model_grads, config)
