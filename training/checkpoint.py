"""Checkpoints and exact resume with Megatron-Core's dist_checkpointing, as a Trainer hook.

`CheckpointHook(cfg, run_dir, device)` saves every `checkpoint.save_interval` steps and when training
ends (max_steps, train.exit_duration_minutes, or an exit signal); `resume(trainer)` continues from
the newest complete checkpoint in `checkpoint.save_dir` (default `<run_dir>/checkpoints`), else in
`checkpoint.load_dir`. That makes Slurm job chains and requeues work: every job of a chain runs the
same command and carries on where the previous one stopped.

What a checkpoint holds, and what resumes exactly (bitwise on the CPU, see tests/smoke):
- model chunks (`sharded_state_dict` of each, `model` / `model0`, `model1` ... with virtual stages)
  and the optimizer (`optimizer.sharded_state_dict`, the distributed optimizer in
  `checkpoint.dist_optimizer_sharding` format; `dp_reshardable` also loads on the CPU but reshards
  over DP only, so TP and PP must stay the same across a resume);
- `train_state.json`: step, consumed samples (the data position), the LR schedule's state, the
  config's name and hash, the parallel layout, the sharding type;
- `rng/rank_XXXXX.pt`: every RNG of each rank (python, numpy, torch, CUDA, Megatron's tracker),
  restored when the world size is unchanged.
The atomic publication (write to `iter_XXXXXXX.tmp`, rename, then `latest`) is in
training/checkpoint_dirs.py. On GPUs with `checkpoint.async_save` the shards are written by a
background process (Megatron's AsyncCallsQueue; NVRx's when nvidia-resiliency-ext supports it);
the folder is published when the write has finished on every rank, checked at each step, and at
the latest before the next save and at the end. The CPU saves synchronously.

Leaving before the wall-time limit: SIGUSR1 and SIGTERM set a flag; at the next step boundary the
ranks agree (all-reduce MAX: one signalled rank is enough), save and leave the loop, and the job
exits 0. A second signal ends the process at once. With Slurm, ask for the signal ahead of the limit:

    #SBATCH --signal=B:USR1@300   # USR1 to the batch shell 300 s before the time limit

then forward it from the batch script to the training processes (`trap 'kill -USR1 $PIDS' USR1`);
or use `--signal=USR1@300` (no `B:`) so that Slurm signals the job step's tasks. torchrun starts
its workers in their own sessions and forwards USR1 only when told to
(`torchrun --signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1`); its `--shutdown-timeout`
must then cover the save. Slurm's own SIGTERM at the limit works too when KillWait covers the save.

Test-only: RECIPES_TEST_SLOW_SAVE=<seconds> makes rank 0 sleep after a checkpoint is fully written
and before its rename, so that tests can kill a job inside that window. Never set it otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from megatron.core.utils import unwrap_model

from training import checkpoint_dirs as dirs
from training.config import TrainingConfig
from training.tree import to_dict

FORMAT_VERSION = 1
SLOW_SAVE_ENV = "RECIPES_TEST_SLOW_SAVE"  # test-only, see the module docstring


def config_hash(cfg: TrainingConfig) -> str:
    text = json.dumps(to_dict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _layout(cfg: TrainingConfig) -> dict[str, Any]:
    """What must match for a checkpoint to load into this run's shards."""
    par = cfg.parallel
    return {
        "tensor_model_parallel_size": par.tensor_model_parallel_size,
        "pipeline_model_parallel_size": par.pipeline_model_parallel_size,
        "virtual_pipeline_model_parallel_size": par.virtual_pipeline_model_parallel_size,
        "expert_model_parallel_size": par.expert_model_parallel_size,
        "use_distributed_optimizer": cfg.optimizer.use_distributed_optimizer,
    }


class ExitSignals:
    """SIGUSR1/SIGTERM handlers that only set a flag; a second signal ends the process at once."""

    def __init__(self, signums: tuple[int, ...] = (signal.SIGUSR1, signal.SIGTERM)) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # signal.signal's own rule
            for signum in signums:
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        self.received = signum

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


class CheckpointHook:
    """Saves at the interval and at the end, publishes atomically, resumes exactly (Trainer hook)."""

    def __init__(self, cfg: TrainingConfig, run_dir: Path, device: str) -> None:
        ckpt = cfg.checkpoint
        self.cfg = cfg
        self.save_dir = Path(ckpt.save_dir) if ckpt.save_dir else Path(run_dir) / "checkpoints"
        self.load_dir = Path(ckpt.load_dir) if ckpt.load_dir else None
        self.device = device
        self.rank = dist.get_rank()
        self.last_saved_step: int | None = None
        self._signals = ExitSignals()
        self._async_queue = None
        self._async_strategy = "mcore"
        if ckpt.async_save and device == "cuda":
            self._async_strategy = _async_strategy()
            from megatron.core.dist_checkpointing.strategies.torch import get_async_strategy

            self._async_queue = get_async_strategy(self._async_strategy)[1]["AsyncCallsQueue"]()
        if self.rank == 0:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            # No save of this job is in flight yet: whatever is half-written belongs to a dead one.
            for path in dirs.clean_stale(self.save_dir):
                print(f"checkpoint: removed incomplete {path}", flush=True)
        dist.barrier()

    # --- resume -------------------------------------------------------------------------------
    def resume(self, trainer: Any) -> Path | None:
        """Load the newest complete checkpoint into `trainer`, if any; returns its folder."""
        path = dirs.latest_checkpoint(self.save_dir)
        if path is None and self.load_dir is not None:
            path = dirs.latest_checkpoint(self.load_dir)
            if path is None:
                raise FileNotFoundError(
                    f"checkpoint.load_dir={str(self.load_dir)!r} holds no complete checkpoint "
                    f"(an iter_XXXXXXX folder with {dirs.STATE_FILE}); fix the path or unset it"
                )
        if path is None:
            return None
        state = dirs.read_state(path)
        self._check_layout(path, state)
        sharding = state["dist_optimizer_sharding"]
        _allocate_optimizer_state(trainer.optimizer)
        loaded = dist_checkpointing.load(
            self._sharded_state_dict(trainer, sharding, True), str(path)
        )
        for key, chunk in self._chunks(trainer).items():
            chunk.load_state_dict(loaded[key])
        trainer.optimizer.load_state_dict(loaded["optimizer"])
        _restore_adam_steps(trainer.optimizer)
        restored = {k: state[k] for k in ("step", "consumed_samples", "scheduler")}
        rng_file = path / "rng" / f"rank_{self.rank:05d}.pt"
        if state["world_size"] == dist.get_world_size() and rng_file.is_file():
            restored["rng"] = torch.load(rng_file, weights_only=False)
        elif self.rank == 0:
            print(
                f"checkpoint: world size changed ({state['world_size']} -> "
                f"{dist.get_world_size()}): RNG streams start afresh",
                flush=True,
            )
        trainer.restore(restored)
        self.last_saved_step = trainer.step
        if self.rank == 0:
            if state["config_hash"] != config_hash(self.cfg):
                print(
                    f"checkpoint: the config differs from the one that saved {path.name}",
                    flush=True,
                )
            print(f"resumed from {path} at step {trainer.step}", flush=True)
        return path

    def _check_layout(self, path: Path, state: dict[str, Any]) -> None:
        if state.get("format_version") != FORMAT_VERSION:
            raise ValueError(
                f"{path}: checkpoint format {state.get('format_version')}, expected {FORMAT_VERSION}"
            )
        saved, now = state["layout"], _layout(self.cfg)
        changed = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
        if changed and state["dist_optimizer_sharding"] == "dp_reshardable":
            detail = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in changed.items())
            raise ValueError(
                f"{path} was saved with another parallel layout ({detail}); its "
                "'dp_reshardable' optimizer state reshards over data parallelism only. Resume with "
                "the saved layout, or save with checkpoint.dist_optimizer_sharding=fully_reshardable"
            )

    # --- the hook -----------------------------------------------------------------------------
    def after_step(self, trainer: Any) -> None:
        if self._async_queue is not None:
            self._finalize(blocking=False)
        if self._exit_requested(trainer):
            trainer.stop_requested = True  # the loop ends at this boundary; at_end saves
            if self.rank == 0:
                print(f"exit signal: saving at step {trainer.step} and exiting", flush=True)
        elif trainer.step % max(1, self.cfg.checkpoint.save_interval) == 0:
            self.save(trainer)

    def at_end(self, trainer: Any) -> None:
        self.save(trainer)
        self.close()

    def close(self) -> None:
        """Finish any asynchronous save and give the signal handlers back."""
        if self._async_queue is not None:
            self._async_queue.close()
            self._async_queue = None
        self._signals.restore()

    def _exit_requested(self, trainer: Any) -> bool:
        flag = torch.tensor(
            [0 if self._signals.received is None else 1], device=trainer.torch_device
        )
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _finalize(self, blocking: bool) -> None:
        self._async_queue.maybe_finalize_async_calls(blocking=blocking)

    # --- save ---------------------------------------------------------------------------------
    def save(self, trainer: Any) -> None:
        """Write this step's checkpoint (all ranks call this at the same step boundary)."""
        step = trainer.step
        if step == self.last_saved_step:
            return  # e.g. at_end right after an interval save or a resume
        if self._async_queue is not None:
            self._finalize(blocking=True)  # one save in flight at a time
        tmp = self.save_dir / (dirs.iter_name(step) + dirs.TMP_SUFFIX)
        if self.rank == 0:
            dirs.clean_stale(self.save_dir)
            tmp.mkdir(parents=True)
        dist.barrier()
        state = trainer.state_for_checkpoint()
        for chunk in state["model"]:
            # The distributed optimizer gathers updated weights lazily, in the next forward:
            # make every rank's copy current before it is written.
            if getattr(chunk, "use_forward_hook", False):
                chunk.disable_forward_pre_hook(param_sync=True)
                chunk.enable_forward_pre_hook()
        sharding = self.cfg.checkpoint.dist_optimizer_sharding
        info = {
            "format_version": FORMAT_VERSION,
            "step": step,
            "consumed_samples": state["consumed_samples"],
            "scheduler": state["scheduler"],
            "config_name": self.cfg.name,
            "config_hash": config_hash(self.cfg),
            "layout": _layout(self.cfg),
            "world_size": dist.get_world_size(),
            "dist_optimizer_sharding": sharding,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        request = dist_checkpointing.save(
            self._sharded_state_dict(trainer, sharding, False),
            str(tmp),
            sharded_strategy=self._save_strategy(),
            async_sharded_save=self._async_queue is not None,
            async_strategy=self._async_strategy,
        )
        # After save(): Megatron warns when the folder it is given is not empty.
        (tmp / "rng").mkdir(exist_ok=True)
        torch.save(state["rng"], tmp / "rng" / f"rank_{self.rank:05d}.pt")
        if request is None:
            self._publish(tmp, info)
        else:
            request.add_finalize_fn(lambda: self._publish(tmp, info))
            self._async_queue.schedule_async_request(request)
        self.last_saved_step = step

    def _publish(self, tmp: Path, info: dict[str, Any]) -> None:
        """Every rank's shards are on disk: rank 0 writes train_state.json, renames, prunes."""
        dist.barrier()  # every rank's RNG file too
        if self.rank == 0:
            dirs.write_state(tmp, info)
            if os.environ.get(SLOW_SAVE_ENV):
                print(f"checkpoint: {SLOW_SAVE_ENV} sleep before publishing {tmp.name}", flush=True)
                time.sleep(float(os.environ[SLOW_SAVE_ENV]))
            final = dirs.publish(tmp)
            for old in dirs.prune(self.save_dir, self.cfg.checkpoint.keep_last):
                print(
                    f"checkpoint: removed {old.name} (checkpoint.keep_last={self.cfg.checkpoint.keep_last})",
                    flush=True,
                )
            print(f"checkpoint: saved {final} (step {info['step']})", flush=True)
        dist.barrier()

    def _save_strategy(self) -> Any:
        """torch_dist, with the writes of replicated tensors spread over the data-parallel ranks."""
        from megatron.core.dist_checkpointing.strategies.fully_parallel import (
            FullyParallelSaveStrategyWrapper,
        )
        from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

        # Two writer threads per rank on GPUs (Megatron-LM's default); the CPU ranks own every core.
        base = TorchDistSaveShardedStrategy(thread_count=2 if self.device == "cuda" else 1)
        group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        return FullyParallelSaveStrategyWrapper(base, group, do_cache_distribution=True)

    # --- state dicts --------------------------------------------------------------------------
    @staticmethod
    def _chunks(trainer: Any) -> dict[str, torch.nn.Module]:
        """The bare GPT modules by checkpoint key, as Megatron-LM names them."""
        chunks = unwrap_model(list(trainer.model))
        if len(chunks) == 1:
            return {"model": chunks[0]}
        return {f"model{i}": chunk for i, chunk in enumerate(chunks)}

    def _sharded_state_dict(self, trainer: Any, sharding: str, is_loading: bool) -> dict[str, Any]:
        metadata = {"distrib_optim_sharding_type": sharding, "chained_optim_avoid_prefix": True}
        state = {
            key: c.sharded_state_dict(metadata=metadata) for key, c in self._chunks(trainer).items()
        }
        state["optimizer"] = trainer.optimizer.sharded_state_dict(
            state, is_loading=is_loading, metadata=metadata
        )
        return state


def _allocate_optimizer_state(optimizer: Any) -> None:
    """Give a fresh distributed optimizer its Adam state before a load.

    Megatron builds the loading state dict from the optimizer's own, which with torch's Adam (no
    TE or Apex: the CPU) must already hold a per-parameter 'step'. One zero-gradient step allocates
    it, as Megatron-FSDP's loader does; the load then overwrites every value that step touched.
    """
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(opt, distrib_optimizer.DistributedOptimizer) and not opt.optimizer.state:
            opt._init_optimizer_states_with_dummy_values()


def _restore_adam_steps(optimizer: Any) -> None:
    """Each parameter's Adam 'step' from the loaded param groups, as its own tensor.

    Without TE or Apex (the CPU; GPUs without TE) torch's Adam keeps a 'step' tensor per
    parameter. Megatron (0.19) saves it in the param groups, but its `dp_reshardable` load then
    copies the pre-load (dummy) step back over it, and hands every parameter the same tensor, which
    torch increments in place once per parameter. Either breaks the bias correction of a resumed run.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        for group in getattr(inner, "param_groups", []):
            if "step" not in group:
                continue
            for param in group["params"]:
                old = inner.state.get(param, {}).get("step")
                if isinstance(old, torch.Tensor):
                    inner.state[param]["step"] = torch.tensor(
                        float(group["step"]), dtype=old.dtype, device=old.device
                    )


def _async_strategy() -> str:
    """NVRx's asynchronous writer where nvidia-resiliency-ext supports it, else Megatron's own."""
    try:
        from megatron.core.dist_checkpointing.strategies.nvrx import has_nvrx_async_support

        return "nvrx" if has_nvrx_async_support() else "mcore"
    except (ImportError, AssertionError):  # too old an NVRx asserts its minimum version
        return "mcore"
