"""The training loop on one rank: set up, step, log, tear down.

What a run trains with comes from the registries (config/registry.py): the architecture's model
builder and forward, the data kind's batch source. Checkpointing plugs in at step boundaries
without touching the loop:

- `Trainer.checkpoint_states()` names, once, the objects a checkpoint holds besides the model
  chunks and the optimizer, each with `state_dict()` / `load_state_dict()`: the step counter, the
  LR schedule, the RNG states and the batch source (its data position). The checkpointer
  (training/checkpoint/store.py) saves them and loads them back in place.
- `Trainer.train(hooks, stop)` calls `hook.after_step(trainer, stopping)` after every step and
  `hook.at_end(trainer)` once the loop ends, on every rank. `stop` (training/resilience/stop.py) makes the one
  stop decision of each step: an exit signal on any rank, or train.exit_duration_minutes.

Resilience (cfg.resilience): every step's time and the time in its gradient sync feed the straggler
monitor (training/resilience/straggler.py: a gather every straggler_interval steps, whose verdict joins that
step's metrics), and the loop moves the hang watchdog's deadline (training/resilience/watchdog.py) at the
start and the end of every step.
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

from config.cost.memory import model_flops_per_token
from config.finalize import Derived
from config.registry import DATA_KINDS, MODEL_ARCHS, load
from config.schema import TrainingConfig
from models.gpt import chunks_per_rank
from training import distributed
from training.build import build_model, build_optimizer, build_scheduler, wire_schedules
from training.metrics import MetricsLogger
from training.resilience.stop import StopPolicy
from training.resilience.straggler import StragglerMonitor
from training.resilience.watchdog import Watchdog
from training.step import eval_step, train_step


class StepLogger(Protocol):
    """Receives each step's numbers: metrics.jsonl, TensorBoard, W&B (training/metrics.py)."""

    def on_step(self, step: int, metrics: dict[str, Any]) -> None: ...

    def resume_from(self, step: int, resumed: dict[str, Any] | None = None) -> None: ...

    def close(self) -> None: ...


class Hook(Protocol):
    def after_step(self, trainer: Trainer, stopping: bool) -> None: ...

    def at_end(self, trainer: Trainer) -> None: ...


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class TrainProgress:
    """The step counter, as a checkpointed object."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


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


class RNGState:
    """This rank's random generators (python, numpy, torch, CUDA, Megatron's tracker)."""

    def state_dict(self) -> dict[str, Any]:
        return rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_rng_state(state)


def _no_hook(*_: Any) -> None:
    return None


class Trainer:
    """One rank's model chunks, optimizer, LR schedule, batches and step counter.

    Needs the default process group (training/distributed.py `init_process_group`); builds
    Megatron-Core's model-parallel groups itself.
    """

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
        self.progress = TrainProgress()
        self._groups_before = distributed.process_groups()  # close() destroys the ones it builds
        distributed.init_model_parallel(cfg, derived, chunks_per_rank(cfg, derived))
        distributed.set_seeds(cfg.train.seed)
        self.dp_rank = distributed.replica_rank()  # its TP, PP and CP peers read its samples
        self.torch_device = (
            torch.device("cuda", torch.cuda.current_device())
            if device == "cuda"
            else torch.device("cpu")
        )

        self.model, self.config = build_model(cfg, derived, device)
        self.optimizer = build_optimizer(cfg, self.model, self.config)
        self.scheduler = build_scheduler(cfg, self.optimizer)
        wire_schedules(self.config, self.model, self.optimizer)
        res = cfg.resilience
        self.straggler = StragglerMonitor(
            res.straggler_interval,
            res.straggler_factor,
            self.torch_device,
            stage=parallel_state.get_pipeline_model_parallel_rank(),
        )
        self.straggler.wrap_sync(self.config, self.model)  # times the waits for other ranks
        self.forward = load(MODEL_ARCHS[cfg.model.arch].forward)

        # The data kind's batch source. Every rank builds it (Megatron's dataset builders
        # synchronise the ranks), the validation one too when the run evaluates.
        source = load(DATA_KINDS[cfg.data.kind].source)
        self.batches = source(cfg, derived, self.dp_rank, device, "train")
        evaluating = cfg.train.eval_interval > 0
        self.valid_batches = (
            source(cfg, derived, self.dp_rank, device, "valid") if evaluating else None
        )
        # Anything with on_step(step, metrics) and close() can stand here (StepLogger).
        self.logger: StepLogger = MetricsLogger(run_dir, cfg, is_writer=dist.get_rank() == 0)
        self.flops_per_token = float(model_flops_per_token(cfg))

    @property
    def step(self) -> int:
        return self.progress.step

    def checkpoint_states(self) -> dict[str, Stateful]:
        """What a checkpoint holds besides the model chunks and the optimizer, by name."""
        return {
            "train": self.progress,
            "scheduler": self.scheduler,
            "rng": RNGState(),
            "data": self.batches,
        }

    # --- the loop -----------------------------------------------------------------------------
    def train(
        self,
        hooks: Sequence[Hook] = (),
        stop: StopPolicy | None = None,
        resumed: dict[str, Any] | None = None,
        watchdog: Watchdog | None = None,
    ) -> None:
        """Train to train.max_steps or the stop decision. `resumed`: what the checkpointer loaded
        (and passed over), recorded in the metrics; `watchdog`: the hang watchdog to keep fed."""
        cfg = self.cfg
        # One record per step across restarts: a job that died before its first checkpoint
        # logged steps that this one trains again, from 0.
        self.logger.resume_from(self.step, resumed)
        tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_length
        while self.step < cfg.train.max_steps:
            if watchdog is not None:
                watchdog.step_started()
            self.straggler.sync.discard()  # waits timed since the last step (evaluation) do not count
            t0 = time.perf_counter()
            result = train_step(
                self.forward,
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
            if watchdog is not None:
                watchdog.step_ended(elapsed)
            self.progress.step += 1
            health = self.straggler.observe(self.step, elapsed)  # a gather every N steps
            self._log(result, tokens_per_step / elapsed, elapsed, self._maybe_evaluate(), health)
            reason = stop.check() if stop is not None else None
            for hook in hooks:
                hook.after_step(self, stopping=reason is not None)
            if reason is not None:
                if dist.get_rank() == 0:
                    why = "exit signal" if reason == "signal" else "train.exit_duration_minutes"
                    print(f"{why}: saving at step {self.step}, then exiting", flush=True)
                break
        for hook in hooks:
            hook.at_end(self)

    def _maybe_evaluate(self) -> float | None:
        """val_loss every train.eval_interval steps: the same eval_iters batches each time."""
        interval = self.cfg.train.eval_interval
        if interval <= 0 or self.step % interval or self.valid_batches is None:
            return None
        cfg, batches = self.cfg, self.valid_batches
        batches.load_state_dict({"consumed_samples": 0})  # from the start of the split again
        losses = [
            eval_step(
                self.forward,
                self.model,
                batches.next_step(),
                cfg.model.seq_length,
                cfg.train.micro_batch_size,
                self.torch_device,
            )
            for _ in range(cfg.train.eval_iters)
        ]
        known = [loss for loss in losses if loss is not None]  # rank 0 only
        return None if len(known) < len(losses) else sum(known) / len(known)

    def _log(
        self,
        result: Any,
        tokens_per_s: float,
        elapsed: float,
        val_loss: float | None = None,
        health: dict[str, Any] | None = None,
    ) -> None:
        world = dist.get_world_size()
        # On the CPU there is no accelerator whose throughput the figure would describe.
        on_gpu = self.device == "cuda"
        tflops = self.flops_per_token * tokens_per_s / world / 1e12 if on_gpu else None
        metrics = {
            "loss": result.loss,
            "lr": result.lr,
            "grad_norm": result.grad_norm,
            "tokens_per_s": tokens_per_s,
            "tflops_per_gpu": tflops,
            "mfu": tflops / self.peak_tflops if self.peak_tflops and tflops else None,
            "step_time_s": elapsed,
        }
        if val_loss is not None:
            metrics["val_loss"] = val_loss
        if result.skipped:
            metrics["skipped"] = True
        metrics |= health or {}  # the straggler verdict, on the steps that gather it
        self.logger.on_step(self.step, metrics)  # writes on global rank 0 only

    def close(self) -> None:
        """Close the logs and leave Megatron-Core's process state as a new process has it: no
        model-parallel groups (torch's groups that this Trainer built are destroyed too), and none
        of the per-layer metric trackers (MoE load-balancing and MTP losses) that its layers record
        into. Megatron-LM reports and zeroes those each step; this engine does not read them, and a
        tracker sized by this model's layers would make the next model in the same process
        (tests/smoke/run_many.py) index past its end. The rotary embeddings' forward caches
        (lru_cache on the class) go as well: they hold the module, through it the model's config
        and DDP, and so every process group of the model, for the life of the process.

        The data-parallel wrapper's gradient hooks go too. Each refers to the wrapper, and so to
        the whole model, and torch holds it in C++ (on a parameter's AccumulateGrad node for DDP,
        on the parameter for Megatron-FSDP), where the garbage collector cannot see it: a
        Megatron-FSDP hook keeps its model alive for good, a DDP hook for as long as an autograd
        graph that reaches its node lives (an MoE token dispatcher keeps its last forward's
        routing probabilities; the distributed optimizer's shards of fp32 parameters are views of
        them). With the model would live its optimizer and its process groups."""
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
        from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
            YarnRotaryEmbedding,
        )
        from megatron.core.transformer.moe.moe_logging import destroy_moe_metrics_tracker
        from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

        self.logger.close()
        for chunk in self.model:
            # Megatron DDP keeps no handles: one more hook's handle is the node's, to all of them.
            for node in getattr(chunk, "grad_accs", ()):
                node.register_hook(_no_hook).hooks_dict_ref().clear()
            for handle in getattr(chunk.module, "grad_acc_hooks", {}).values():  # Megatron-FSDP
                handle.remove()
        destroy_moe_metrics_tracker()
        MTPLossLoggingHelper.tracker.clear()
        RotaryEmbedding.forward.cache_clear()
        YarnRotaryEmbedding.forward.cache_clear()
        distributed.destroy(keep=self._groups_before)
