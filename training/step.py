"""One optimizer step: forward and backward over every microbatch, gradient sync, clip, update.

The loss is the masked mean cross-entropy per token. Megatron's schedules divide each
microbatch's summed loss by its token count and by the number of microbatches, and DDP averages
gradients over the data-parallel group, so the gradient is that of the mean over microbatches and
replicas. The logged loss is the same mean, gathered onto global rank 0 (see `_global_loss`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel
from megatron.core.optimizer_param_scheduler import get_canonical_lr_for_logging
from megatron.core.pipeline_parallel import get_forward_backward_func


@dataclass(frozen=True, slots=True)
class StepResult:
    loss: float | None  # mean loss per token of the global batch (on global rank 0; None elsewhere)
    grad_norm: float | None  # before clipping, over the whole model
    lr: float
    skipped: bool  # the update was skipped (FP16 overflow)


def loss_func(
    loss_mask: torch.Tensor, output_tensor: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Summed masked loss, its token count, and a [sum, count] pair for reporting.

    Returned as a triple, Megatron's schedules divide the sum by the count (and by the number of
    microbatches) before backward.
    """
    losses = output_tensor.float().view(-1)
    mask = loss_mask.float().view(-1)
    loss_sum = torch.sum(losses * mask)
    num_tokens = mask.sum().to(torch.int)
    # clone: the schedule divides loss_sum in place after this returns.
    report = torch.stack([loss_sum.detach().clone(), num_tokens.detach().float()])
    return loss_sum, num_tokens, {"lm loss": report}


Forward = Callable[..., tuple[Any, torch.Tensor]]  # (model, batch[, schedule_plan])


def forward_step(
    forward: Forward,
    data_iterator: Iterator[dict],
    model: torch.nn.Module,
    return_schedule_plan: bool = False,
) -> tuple[Any, Callable]:
    """Megatron's forward_step_func (bound to the architecture's `forward`, config/registry.py):
    one microbatch through one model chunk, and the loss function of its loss mask. Megatron-Core's
    combined 1F1B schedule (parallel.overlap_moe_expert_parallel_comm) asks for the chunk's
    schedule plan instead of its output."""
    batch = next(data_iterator)
    if return_schedule_plan:
        output, loss_mask = forward(model, batch, schedule_plan=True)
    else:
        output, loss_mask = forward(model, batch)
    return output, partial(loss_func, loss_mask)


def _global_loss(per_microbatch: list[dict], device: torch.device) -> float | None:
    """Mean loss per microbatch, averaged over microbatches and data-parallel replicas, on rank 0.

    Only the last pipeline stage holds losses. Summing [mean, 1] over the DP group and then over
    the pipeline group (the other stages add zeros) brings it to every rank of pipeline stage 0,
    global rank 0 among them; TP ranks hold identical values.
    """
    total = torch.zeros(2, dtype=torch.float64, device=device)
    if per_microbatch:
        pairs = torch.stack([m["lm loss"].to(total) for m in per_microbatch])
        means = pairs[:, 0] / pairs[:, 1].clamp(min=1)
        total[0] = means.mean()
        total[1] = 1.0
    dist.all_reduce(total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    if dist.get_rank() != 0:
        return None
    return (total[0] / total[1]).item() if total[1] > 0 else None


def _data_iterators(microbatches: list[dict], num_chunks: int) -> Any:
    """One iterator over the step's microbatches per model chunk (virtual stages each read them)."""
    if num_chunks == 1:
        return iter(microbatches)
    return [iter(microbatches) for _ in range(num_chunks)]


def _run_schedule(
    forward: Forward,
    model: list[torch.nn.Module],
    microbatches: list[dict],
    seq_length: int,
    micro_batch_size: int,
    forward_only: bool,
) -> list[dict]:
    """The step's microbatches through Megatron's (pipeline) schedule; each one's loss report."""
    return get_forward_backward_func()(
        forward_step_func=partial(forward_step, forward),
        data_iterator=_data_iterators(microbatches, len(model)),
        model=model,
        num_microbatches=len(microbatches),
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        forward_only=forward_only,
    )


def train_step(
    forward: Forward,
    model: list[DistributedDataParallel],  # Megatron-FSDP's wrapper has the same interface
    optimizer: Any,
    scheduler: Any,
    microbatches: list[dict],
    seq_length: int,
    micro_batch_size: int,
    device: torch.device,
) -> StepResult:
    """Forward/backward over the microbatches, then the optimizer and LR-schedule step."""
    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    losses = _run_schedule(
        forward, model, microbatches, seq_length, micro_batch_size, forward_only=False
    )
    lr = get_canonical_lr_for_logging(optimizer.param_groups)  # the LR this update uses
    updated, grad_norm, _ = optimizer.step()
    if updated and not grad_norm and optimizer.config.clip_grad <= 0:
        # Without clipping, Megatron-Core's mixed-precision optimizer (Megatron-FSDP's) reports
        # 0.0 as the norm; the gradients are still in its main grads: measure them.
        grad_norm = optimizer.get_grad_norm()
    if updated:
        scheduler.step(increment=1)
    return StepResult(
        loss=_global_loss(losses, device),
        grad_norm=None if grad_norm is None else float(grad_norm),
        lr=float(lr or 0.0),
        skipped=not updated,
    )


def eval_step(
    forward: Forward,
    model: list[torch.nn.Module],
    microbatches: list[dict],
    seq_length: int,
    micro_batch_size: int,
    device: torch.device,
) -> float | None:
    """Forward only over one global batch, dropout off: its mean loss (on global rank 0)."""
    for chunk in model:
        chunk.eval()
    try:
        with torch.no_grad():
            losses = _run_schedule(
                forward, model, microbatches, seq_length, micro_batch_size, forward_only=True
            )
    finally:
        for chunk in model:
            chunk.train()
    return _global_loss(losses, device)
