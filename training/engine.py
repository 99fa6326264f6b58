"""The training loop on one rank: set up, step, log, hand state to checkpointing, tear down.

Checkpointing plugs in at step boundaries without touching the loop:
- `Trainer.state_for_checkpoint()` returns everything a checkpoint holds: the model chunks and
  the optimizer (live objects, for Megatron's `sharded_state_dict`), the LR schedule's state, the
  RNG states, the data position (`consumed_samples`) and the step.
- `Trainer.restore(state)` takes the same dict back after the model and optimizer have been
  loaded in place, and continues from that step with the samples that follow.
- `Trainer.train(hooks)` calls `hook.after_step(trainer)` after every step and
  `hook.at_end(trainer)` once the loop ends (max_steps, the time limit, or a hook that set
  `trainer.stop_requested`, e.g. on an exit signal), on every rank.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel

from config.finalize import Derived
from config.schema import TrainingConfig
from models.gpt import chunks_per_rank
from training import distributed
from training.batches import TrainBatches, build_dataset
from training.build import build_model, build_optimizer, build_scheduler, wire_schedules
from training.metrics import MetricsLogger
from training.step import eval_step, train_step


class StepLogger(Protocol):
    """Receives each step's numbers: metrics.jsonl, TensorBoard, W&B (training/metrics.py)."""

    def on_step(self, step: int, metrics: dict[str, Any]) -> None: ...

    def resume_from(self, step: int) -> None: ...

    def close(self) -> None: ...


class Hook(Protocol):
    def after_step(self, trainer: Trainer) -> None: ...

    def at_end(self, trainer: Trainer) -> None: ...


def _flops_per_token(cfg: TrainingConfig) -> float | None:
    """Model FLOPs per trained token (forward + backward) from config.estimate, when present."""
    try:
        from config.estimate import model_flops_per_token
    except ImportError:
        return None
    return float(model_flops_per_token(cfg))


def rng_state() -> dict[str, Any]:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])


class Trainer:
    """One rank's model chunks, optimizer, LR schedule, batches and step counter."""

    def __init__(
        self,
        cfg: TrainingConfig,
        derived: Derived,
        device: str,
        run_dir: Path,
        peak_tflops: float | None = None,
    ) -> None:
        self.cfg, self.derived, self.device, self.run_dir = cfg, derived, device, run_dir
        self.peak_tflops = peak_tflops  # per GPU in the run's GEMM precision; None: no MFU (CPU)
        self.step = 0
        # A hook sets this (on every rank alike) to end the loop at this step boundary.
        self.stop_requested = False
        distributed.init_model_parallel(cfg, derived, chunks_per_rank(cfg, derived))
        distributed.set_seeds(cfg.train.seed)
        # Every rank of a replica (its TP, PP and CP ranks) reads that replica's samples.
        self.dp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
        self.torch_device = (
            torch.device("cuda", torch.cuda.current_device())
            if device == "cuda"
            else torch.device("cpu")
        )

        self.model, self.config = build_model(cfg, derived, device)
        self.optimizer = build_optimizer(cfg, self.model, self.config)
        self.scheduler = build_scheduler(cfg, self.optimizer)
        wire_schedules(self.config, self.model, self.optimizer)

        samples = cfg.train.max_steps * cfg.train.global_batch_size
        self.dataset = build_dataset(cfg, samples)
        evaluating = cfg.train.eval_interval > 0
        valid_samples = cfg.train.eval_iters * cfg.train.global_batch_size
        self.valid_dataset = build_dataset(cfg, valid_samples, "valid") if evaluating else None
        self.batches = self._batches(consumed_samples=0)
        # Anything with on_step(step, metrics) and close() can stand here (StepLogger).
        self.logger: StepLogger = MetricsLogger(run_dir, cfg, is_writer=dist.get_rank() == 0)
        self.flops_per_token = _flops_per_token(cfg)

    def _batches(self, consumed_samples: int) -> Any:
        cfg, derived, dp_rank = self.cfg, self.derived, self.dp_rank
        if cfg.data.kind == "energon":  # images + text through Energon's savable loader
            from data.energon import EnergonBatches

            return EnergonBatches(cfg, derived, dp_rank, self.device, consumed_samples)
        return TrainBatches(cfg, derived, self.dataset, dp_rank, self.device, consumed_samples)

    # --- the checkpoint seam ------------------------------------------------------------------
    def state_for_checkpoint(self) -> dict[str, Any]:
        """What a checkpoint saves, taken at a step boundary."""
        return {
            "step": self.step,
            "consumed_samples": self.batches.consumed_samples,
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "data": self.batches.state_dict(),  # this rank's loader position (Energon: its state)
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint whose model and optimizer were already loaded in place."""
        self.step = int(state["step"])
        self.logger.resume_from(self.step)  # one metrics.jsonl record per step across restarts
        self.scheduler.load_state_dict(state["scheduler"])
        if "rng" in state:
            set_rng_state(state["rng"])
        self.batches = self._batches(consumed_samples=int(state["consumed_samples"]))
        if "data" in state and hasattr(self.batches, "load_state_dict"):
            self.batches.load_state_dict(state["data"])

    # --- the loop -----------------------------------------------------------------------------
    def train(self, hooks: Sequence[Hook] = ()) -> None:
        cfg = self.cfg
        tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_length
        started = time.monotonic()
        while self.step < cfg.train.max_steps:
            t0 = time.perf_counter()
            result = train_step(
                self.model,
                self.optimizer,
                self.scheduler,
                self.batches.next_step(),
                cfg.model.seq_length,
                cfg.train.micro_batch_size,
                self.torch_device,
            )
            if self.device == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            self.step += 1
            self._log(result, tokens_per_step / elapsed, elapsed, self._maybe_evaluate())
            for hook in hooks:
                hook.after_step(self)
            if self.stop_requested or self._out_of_time(started):
                break
        for hook in hooks:
            hook.at_end(self)

    def _maybe_evaluate(self) -> float | None:
        """val_loss every train.eval_interval steps: the same eval_iters batches each time."""
        interval = self.cfg.train.eval_interval
        if interval <= 0 or self.step % interval:
            return None
        cfg = self.cfg
        batches = TrainBatches(cfg, self.derived, self.valid_dataset, self.dp_rank, self.device)
        losses = [
            eval_step(
                self.model,
                batches.next_step(),
                cfg.model.seq_length,
                cfg.train.micro_batch_size,
                self.torch_device,
            )
            for _ in range(cfg.train.eval_iters)
        ]
        return None if None in losses else sum(losses) / len(losses)  # rank 0 only

    def _log(
        self, result: Any, tokens_per_s: float, elapsed: float, val_loss: float | None = None
    ) -> None:
        world = dist.get_world_size()
        tflops = (
            self.flops_per_token * tokens_per_s / world / 1e12 if self.flops_per_token else None
        )
        metrics = {
            "loss": result.loss,
            "lr": result.lr,
            "grad_norm": result.grad_norm,
            "tokens_per_s": tokens_per_s,
            "tflops_per_gpu": tflops,
            "mfu": tflops / self.peak_tflops if tflops is not None and self.peak_tflops else None,
            "step_time_s": elapsed,
        }
        if val_loss is not None:
            metrics["val_loss"] = val_loss
        if result.skipped:
            metrics["skipped"] = True
        self.logger.on_step(self.step, metrics)  # writes on global rank 0 only

    def _out_of_time(self, started: float) -> bool:
        """train.exit_duration_minutes reached on any rank (all ranks agree, so none is left waiting)."""
        limit = self.cfg.train.exit_duration_minutes
        if limit is None:
            return False
        late = torch.tensor(
            [float(time.monotonic() - started > 60 * limit)], device=self.torch_device
        )
        dist.all_reduce(late, op=dist.ReduceOp.MAX)
        return bool(late.item())

    def close(self) -> None:
        self.logger.close()
