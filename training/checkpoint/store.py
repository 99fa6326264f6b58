"""Checkpoints and exact resume with Megatron-Core's dist_checkpointing: a Trainer hook.

`Checkpointer(cfg, run_dir, device, model=..., optimizer=..., states=...)` is given, once, what it
saves: the model chunks, the optimizer, and named objects with `state_dict()` / `load_state_dict()`
(`Trainer.checkpoint_states()`: step counter, LR schedule, RNG, batch source). It saves every
`checkpoint.save_interval` steps and when training ends (train.max_steps, train.exit_duration_minutes,
or an exit signal); `resume()` loads, in place, the newest complete checkpoint in
`checkpoint.save_dir` (default `<run_dir>/checkpoints`), else in `checkpoint.load_dir`, and prints
`resumed from <path> at step N`; with neither, a fine-tuning run takes only the model weights of
`checkpoint.pretrained_dir`. That is what makes Slurm job
chains and requeues work: every job of a chain runs the same command and carries on where the last
complete checkpoint left off. A resume is exact: the same losses as an uninterrupted run, bitwise on
the CPU (tests/smoke/test_checkpoint.py), because model, optimizer, LR schedule, every RNG and the
data position all come back (training/checkpoint/state.py says what is stored where).

Atomic saves (training/checkpoint/dirs.py): every rank writes into `iter_XXXXXXX.tmp`; once all
shards are on disk, rank 0 writes train_state.json, renames the folder to `iter_XXXXXXX` and then
points `latest` at it (write-to-temp + os.replace). A crash or SIGKILL mid-save leaves the previous
checkpoint as the newest complete one; half-written folders are never loaded and are removed at the
next start. Only the newest `checkpoint.keep_last` complete checkpoints are kept (0 keeps all).

On GPUs with `checkpoint.async_save`, a background process writes the shards (Megatron's
AsyncCallsQueue; NVRx's writer where nvidia-resiliency-ext supports it) and the folder is published
when every rank has finished: checked at each step, and awaited before the next save and at the end.
The CPU saves synchronously.

Leaving before the wall-time limit (training/resilience/stop.py): SIGUSR1 or SIGTERM on any rank makes all
ranks save at the next step boundary and exit 0. With Slurm: `sbatch --signal=USR1@<seconds>`
(the ranks get it directly; torchrun must ignore it), or `--signal=B:USR1@<seconds>` forwarded by
the batch script to the ranks; <seconds> must cover a step and a save. Details there. Such a
signal reaches every process of the job, Megatron-Core's checkpoint helper too:
training/checkpoint/helpers.py starts that one so that it survives, and the exit save works.

Test-only: RECIPES_TEST_SLOW_SAVE=<seconds> makes rank 0 sleep after a checkpoint is fully written
and before its rename, so that tests can kill a job inside that window. Never set it otherwise.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from torch.distributed.checkpoint.api import CheckpointException

from config import paths
from config.finalize import padded_vocab_size
from config.hf import is_hf_folder
from config.layout import layout_changes
from config.schema import TrainingConfig
from config.tree import ConfigError
from training.checkpoint import dirs, hf_weights, lora_base
from training.checkpoint import helpers as checkpoint_helpers
from training.checkpoint import state as ckpt_state

SLOW_SAVE_ENV = "RECIPES_TEST_SLOW_SAVE"  # test-only, see the module docstring
# What a failed read or write raises: torch's checkpoint errors are BaseExceptions.
FAILURES = (Exception, CheckpointException)


class Checkpointer:
    """Saves at the interval and at the end, publishes atomically, resumes exactly."""

    def __init__(
        self,
        cfg: TrainingConfig,
        run_dir: Path,
        device: str,
        *,
        model: list[Any],
        optimizer: Any,
        states: dict[str, Any],
    ) -> None:
        ckpt = cfg.checkpoint
        self.cfg = cfg
        self.model, self.optimizer = model, optimizer
        missing = set(ckpt_state.STATES) - set(states)
        if missing:
            raise ValueError(f"a checkpoint needs the states {sorted(missing)} as well")
        self.states = states
        # The folder launchers/resume.py checked before launch and `recipes runs` reads.
        self.save_dir = paths.checkpoint_dir(ckpt.save_dir, run_dir)
        self.load_dir = paths.expand(ckpt.load_dir) if ckpt.load_dir else None
        self.device = device
        self.rank = dist.get_rank()
        self.last_saved_step: int | None = None
        self.resumed: dict[str, Any] | None = None  # what resume() loaded and passed over
        self._base: dict[str, Any] | None = None  # a LoRA run's record of its base (`_base_record`)
        self._async_queue = None
        self._async_strategy = "mcore"
        if ckpt.async_save and device == "cuda":
            from megatron.core.dist_checkpointing.strategies.torch import get_async_strategy

            self._async_strategy = _async_strategy()
            self._async_queue = get_async_strategy(self._async_strategy)[1]["AsyncCallsQueue"]()
        if self.rank == 0:
            self.save_dir.mkdir(parents=True, exist_ok=True)
            # No save of this job is in flight, and no other run's (the folder is this run's:
            # `hold_run_folders`): whatever is half-written belongs to a dead one.
            for path in dirs.clean_stale(self.save_dir):
                print(f"checkpoint: removed incomplete {path}", flush=True)

    # --- resume -------------------------------------------------------------------------------
    def resume(self) -> Path | None:
        """Load the newest complete checkpoint that is intact, in place; returns its folder.

        Candidates come from save_dir (this run's own), else load_dir: the one `latest` names, then
        older ones. One that fails verification or loading is reported by name and the next is
        tried; `self.resumed` says what was loaded and what was passed over (the metrics log it).
        With no checkpoint at all, a fine-tuning run takes the weights of pretrained_dir.
        """
        self.resumed = None
        folder = self.save_dir
        candidates, notes = dirs.resume_candidates(folder)
        if not candidates and self.load_dir is not None:
            folder = self.load_dir
            candidates, notes = dirs.resume_candidates(folder)
            if not candidates:
                raise FileNotFoundError(
                    f"checkpoint.load_dir={str(folder)!r} holds no complete checkpoint "
                    f"(an iter_XXXXXXX folder with {dirs.STATE_FILE}); fix the path or unset it"
                )
        self._say(*notes)
        if not candidates:
            if self.cfg.checkpoint.pretrained_dir:
                self._base_record()  # what this LoRA run's checkpoints will say its base was
                self._load_pretrained(Path(self.cfg.checkpoint.pretrained_dir))
            return None
        rejected = []
        for path in candidates:
            problem = self._agree(self._verify(path))
            if problem is None:
                saved = dirs.read_state(path)  # as written: the manifest verified it
                ckpt_state.check_compatible(self.cfg, path, saved)  # a setting, not damage: raise
                self._check_base(path, saved)  # so is another base under the adapters
                problem = self._agree(self._try(self._load, path, saved))
            if problem is None:
                break
            rejected.append({"checkpoint": str(path), "problem": problem})
            self._say(f"checkpoint: {path} cannot be resumed from: {problem}")
        else:
            listed = "\n".join(f"  {r['checkpoint']}: {r['problem']}" for r in rejected)
            raise RuntimeError(
                f"no checkpoint in {folder} can be resumed from:\n{listed}\nRestore them from a "
                "copy, or move them away to start afresh (the run does not do that on its own)"
            )
        step = self.step
        self.last_saved_step = step
        self.resumed = {"checkpoint": str(path), "resumed_step": step, "rejected": rejected}
        if rejected:
            self._say(f"checkpoint: fell back to {path}, an older checkpoint that is intact")
        self._say(f"resumed from {path} at step {step}")
        return path

    def _load(self, path: Path, saved: dict[str, Any]) -> None:
        """Everything a checkpoint holds, into this run's objects, in place."""
        pretrained = self.cfg.checkpoint.pretrained_dir
        if ckpt_state.adapted(self.model) and pretrained:
            # A LoRA checkpoint holds the adapters; the frozen base is the pretrained weights.
            self._load_pretrained(Path(pretrained), resuming=True)
        if saved["dist_optimizer_sharding"] == dirs.FSDP_SHARDING:
            ckpt_state.load_fsdp(self.model, self.optimizer, path)
        else:
            ckpt_state.load_model_and_optimizer(
                self.model, self.optimizer, path, saved["dist_optimizer_sharding"]
            )
        self.states["train"].load_state_dict({"step": saved["step"]})
        self.states["scheduler"].load_state_dict(saved["scheduler"])
        same_world = saved["world_size"] == dist.get_world_size()
        if not same_world:  # RNG streams are per rank: nothing to map them onto
            self._say("checkpoint: world size changed: RNG streams start afresh")
        elif ckpt_state.rng_file(path, self.rank).is_file():
            self.states["rng"].load_state_dict(ckpt_state.load_rng(path, self.rank))
        # The batch source's own state (Energon's loader) is per DP rank: same layout only;
        # otherwise the global data position alone.
        data = {"consumed_samples": saved["consumed_samples"]}
        same_ranks = same_world and not layout_changes(saved, self.cfg)
        if same_ranks and ckpt_state.data_file(path, self.rank).is_file():
            data = ckpt_state.load_data(path, self.rank)
        self.states["data"].load_state_dict(data)
        if saved["config_hash"] != ckpt_state.config_hash(self.cfg):
            from config.tree import differences

            changed = differences(saved["config"], self.cfg) if "config" in saved else {}
            listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            self._say(
                f"checkpoint: the config differs from the one that saved {path}"
                + (f" ({listed}); the new values apply" if listed else "")
            )

    def _verify(self, path: Path) -> str | None:
        """What is wrong with `path`'s files, by the manifest; each rank checks a share of them."""
        try:
            files = dirs.read_manifest(path)
        except ValueError as err:
            return str(err)
        world = dist.get_world_size()
        problems = dirs.verify_files(path, files, sorted(files)[self.rank :: world])
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            return problems[0] + more
        try:  # a manifest written over an empty or cut train_state.json agrees with it
            dirs.read_state(path)
        except ValueError as err:
            return str(err)
        return None

    @staticmethod
    def _try(load: Any, *args: Any) -> str | None:
        try:
            load(*args)
        except FAILURES as err:  # whatever a damaged or foreign file makes a reader raise
            return f"{type(err).__name__}: {err}"
        return None

    def _agree(self, problem: str | None) -> str | None:
        """One verdict for all ranks: the first problem any rank found, else None."""
        found: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(found, problem)
        return next((p for p in found if p is not None), None)

    def _say(self, *lines: str) -> None:
        if self.rank == 0:
            for line in lines:
                print(line, flush=True)

    def _base_record(self) -> dict[str, Any] | None:
        """What a LoRA run's base is (training/checkpoint/lora_base.py): its files, described by
        the ranks, each a share of them; once per run. None without adapters, or without a base
        to describe (the load says why)."""
        if self._base is not None or not lora_base.applies(self.cfg):
            return self._base
        folder = lora_base.base_folder(paths.expand(self.cfg.checkpoint.pretrained_dir or ""))
        if folder is None:
            return None
        try:
            names = lora_base.base_files(folder)
        except (OSError, ValueError):
            return None  # no manifest, no headers: loading the base reports it
        world = dist.get_world_size()
        shares: list[dict[str, Any]] = [{}] * world
        mine = lora_base.describe(folder, names[self.rank :: world], whole=True)
        dist.all_gather_object(shares, mine)
        files = {name: entry for share in shares for name, entry in share.items()}
        self._base = lora_base.record(folder, files)
        return self._base

    def _check_base(self, path: Path, saved: dict[str, Any]) -> None:
        """ConfigError, before anything is loaded, when a LoRA checkpoint's base has changed:
        the message launchers/resume.py gives where it can tell before launch."""
        if not lora_base.applies(self.cfg):
            return
        now = self._base_record()
        before = saved.get(lora_base.RECORD)
        if now is None or before is None:
            return  # a checkpoint that records no base: nothing to compare it with
        problem = lora_base.problem(before, Path(now["folder"]), now["files"], path)
        if problem is not None:
            raise ConfigError([problem])

    def _load_pretrained(self, folder: Path, resuming: bool = False) -> None:
        """Model weights only: from a Hugging Face folder (each rank reads its slices), or from a
        complete checkpoint (or the latest of a folder of them)."""
        where = f"checkpoint.pretrained_dir={str(folder)!r}"
        start = "the adapters come from the checkpoint" if resuming else "training starts at step 0"
        if is_hf_folder(folder):
            self._load_hf(folder, start)
            return
        path = folder if dirs.is_complete(folder) else dirs.latest_checkpoint(folder)
        if path is None:
            raise FileNotFoundError(
                f"{where} is not a complete checkpoint (an iter_XXXXXXX folder with "
                f"{dirs.STATE_FILE}) and holds none; fix the path"
            )
        problem = self._agree(self._verify(path))
        if problem is not None:
            raise ValueError(f"{where}: {path} is damaged: {problem}")
        load = ckpt_state.load_model_weights
        problem = self._agree(self._try(load, self.model, self.optimizer, path))
        if problem is not None:  # Megatron's own errors name tensors, not the setting
            raise ValueError(
                f"{where}: cannot load the weights in {path} into this model ({problem}); the "
                "checkpoint must come from the same architecture (layers, widths, vocabulary)"
            )
        self._say(f"loaded pretrained weights from {path}; {start}")

    def _load_hf(self, folder: Path, start: str) -> None:
        m, tp = self.cfg.model, self.cfg.parallel.tensor_model_parallel_size
        padded = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
        problem = self._agree(
            self._try(hf_weights.load_hf_weights, self.model, self.cfg, padded, folder)
        )
        if problem is not None:
            raise ValueError(f"cannot load the Hugging Face weights of {folder}: {problem}")
        self.optimizer.reload_model_params()
        self._say(f"loaded Hugging Face weights from {folder}; {start}")

    # --- the hook -----------------------------------------------------------------------------
    def after_step(self, trainer: Any, stopping: bool) -> None:
        """At every step boundary: publish finished asynchronous saves; save at the interval
        (not when the run is stopping: at_end saves that step)."""
        if self._async_queue is not None:
            self._async_queue.maybe_finalize_async_calls(blocking=False)
        if not stopping and self.step % max(1, self.cfg.checkpoint.save_interval) == 0:
            self.save()

    def at_end(self, trainer: Any) -> None:
        self.save()
        self.close()

    def close(self, abort: bool = False) -> None:
        """Finish any asynchronous save; end the writer's helper process.

        `abort`: the run failed; an asynchronous save in flight is not awaited (finishing it is a
        collective that the other ranks may never join) and is never published."""
        if self._async_queue is not None:
            self._async_queue.close(abort=abort)
            self._async_queue = None
        checkpoint_helpers.stop()

    @property
    def step(self) -> int:
        return int(self.states["train"].state_dict()["step"])

    # --- save ---------------------------------------------------------------------------------
    def save(self) -> None:
        """Write this step's checkpoint (all ranks call this at the same step boundary)."""
        step = self.step
        if step == self.last_saved_step:
            return  # e.g. at_end right after an interval save, or right after a resume
        try:
            self._save(step)
        except FAILURES as err:
            if not dirs.disk_full(err, self.save_dir):
                raise
            raise OSError(errno.ENOSPC, self._disk_full_message(step)) from err
        self.last_saved_step = step

    def _disk_full_message(self, step: int) -> str:
        free = dirs.free_space(self.save_dir)
        latest = dirs.latest_checkpoint(self.save_dir)
        kept = f"the newest complete checkpoint is still {latest}" if latest else "none is complete"
        return (
            f"No space left on device saving step {step} into checkpoint.save_dir="
            f"{str(self.save_dir)!r} ({free}); {kept}. Free space there (checkpoint.keep_last "
            "bounds what a run keeps) or point checkpoint.save_dir elsewhere, then run again to resume"
        )

    def _save(self, step: int) -> None:
        if self._async_queue is not None:
            self._async_queue.maybe_finalize_async_calls(blocking=True)  # one save in flight
        tmp = self.save_dir / (dirs.iter_name(step) + dirs.TMP_SUFFIX)
        if self.rank == 0:
            dirs.clean_stale(self.save_dir)
            tmp.mkdir(parents=True)
        dist.barrier()
        states = {name: obj.state_dict() for name, obj in self.states.items()}
        info = ckpt_state.train_state(self.cfg, states, self._base_record())
        ckpt_state.sync_params_for_save(self.model)
        # The writer's results queue: in this process for a synchronous save, else in a helper
        # that outlives the exit signals.
        checkpoint_helpers.results_queue(
            self._async_strategy, asynchronous=self._async_queue is not None
        )
        sharding = info["dist_optimizer_sharding"]
        if sharding == dirs.FSDP_SHARDING:  # torch DCP writes the DTensor shards itself
            ckpt_state.save_fsdp(self.model, self.optimizer, tmp)
            request = None
        else:
            request = dist_checkpointing.save(
                ckpt_state.sharded_state_dict(self.model, self.optimizer, sharding, False),
                str(tmp),
                sharded_strategy=self._save_strategy(),
                async_sharded_save=self._async_queue is not None,
                async_strategy=self._async_strategy,
            )
        # After save(): Megatron warns about a folder that is not empty when it starts.
        ckpt_state.save_rng(tmp, self.rank, states["rng"])
        ckpt_state.save_data(tmp, self.rank, states["data"])
        queue = self._async_queue  # a request comes only from an asynchronous save
        if request is None or queue is None:
            self._publish(tmp, info)
        else:
            request.add_finalize_fn(lambda: self._publish(tmp, info))
            queue.schedule_async_request(request)

    def _publish(self, tmp: Path, info: dict[str, Any]) -> None:
        """Every rank's shards are on disk: the ranks hash them, each a share; rank 0 writes
        train_state.json, then the manifest, renames, prunes."""
        dist.barrier()  # every rank's RNG file too
        world = dist.get_world_size()
        digests = dirs.file_digests(tmp, dirs.checkpoint_files(tmp)[self.rank :: world])
        shares: list[dict[str, Any]] | None = [{}] * world if self.rank == 0 else None
        dist.gather_object(digests, shares, dst=0)
        if self.rank == 0:
            dirs.write_state(tmp, info)
            files = dict(dirs.file_digests(tmp, [dirs.STATE_FILE]))
            for share in shares or []:  # rank 0 gathered them
                files |= share
            dirs.write_manifest(tmp, files)
            if os.environ.get(SLOW_SAVE_ENV):
                print(f"checkpoint: {SLOW_SAVE_ENV}: sleeping before publishing {tmp}", flush=True)
                time.sleep(float(os.environ[SLOW_SAVE_ENV]))
            final = dirs.publish(tmp)
            keep = self.cfg.checkpoint.keep_last
            for old in dirs.prune(self.save_dir, keep):
                print(f"checkpoint: removed {old.name} (checkpoint.keep_last={keep})", flush=True)
            print(f"checkpoint: saved {final} (step {info['step']})", flush=True)
        dist.barrier()

    def _save_strategy(self) -> Any:
        """torch_dist, with the writes of replicated tensors spread over the data-parallel ranks."""
        from megatron.core.dist_checkpointing.strategies.fully_parallel import (
            FullyParallelSaveStrategyWrapper,
        )
        from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

        # Two writer threads per rank on GPUs (Megatron-LM's default); CPU ranks own every core.
        base = TorchDistSaveShardedStrategy(thread_count=2 if self.device == "cuda" else 1)
        group = parallel_state.get_data_parallel_group(with_context_parallel=True)
        return FullyParallelSaveStrategyWrapper(base, group, do_cache_distribution=True)


def hold_run_folders(cfg: TrainingConfig, run_dir: Path) -> dirs.RunFolders:
    """The run directory and the checkpoint folder, locked for this run (every rank calls this,
    once the process group exists, before anything is written into either); release() frees them.

    Global rank 0 takes the locks and every rank gets its answer: FolderInUse, with the message the
    launcher's check gives (launchers/resume.py), when another live run holds either folder.
    """
    folders = dirs.RunFolders(run_dir, paths.checkpoint_dir(cfg.checkpoint.save_dir, run_dir))
    problems: list[list[tuple[str, str]]] = [[]]
    if dist.get_rank() == 0:
        problems[0] = folders.acquire(_holder(cfg, run_dir))
    dist.broadcast_object_list(problems, src=0)
    if problems[0]:
        raise dirs.FolderInUse("; ".join(f"{field}: {why}" for field, why in problems[0]))
    return folders


def _holder(cfg: TrainingConfig, run_dir: Path) -> dict[str, Any]:
    """What the lock file says of this run, for the message another run gets."""
    import socket

    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "recipe": cfg.name,
        "run_dir": str(Path(run_dir).resolve()),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _async_strategy() -> str:
    """NVRx's asynchronous writer where nvidia-resiliency-ext supports it, else Megatron's own."""
    try:
        from megatron.core.dist_checkpointing.strategies.nvrx import has_nvrx_async_support

        return "nvrx" if has_nvrx_async_support() else "mcore"
    except (ImportError, AssertionError):  # an NVRx older than Megatron's minimum asserts
        return "mcore"
