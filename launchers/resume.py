"""Before launch or queue: what a run would resume from, and whether it can.

A run whose checkpoint folder already holds a complete checkpoint resumes from it (that is how
job chains and requeues work). Some changes between the checkpoint and the new config cannot take
effect on resume, and would fail on every rank after start-up (or, worse, not at all):

- the architecture (`model.*`), LoRA (`peft.*`) and the precision: the saved tensors would not fit;
- the optimizer's `lr`, `min_lr` and kind: Megatron-Core's distributed optimizer finds its saved
  parameter groups by these values (a changed lr is a KeyError on every rank);
- the parallel layout its optimizer state cannot be resharded across, and Megatron-FSDP on or off:
  config/layout.py `layout_problems`, which every rank's resume asks too;
- `train.max_steps` at or below the checkpoint's step: nothing left to train;
- a LoRA checkpoint's base (checkpoint.pretrained_dir) changed, as far as can be told without
  reading its weights (training/checkpoint/lora_base.py).

These are refused here, each naming the field, the checkpoint's value, the new one and the fix.
What can change does: the LR schedule (warmup, decay, `train.max_steps` above the step) follows
the new config, as Megatron-LM's --override-opt_param-scheduler makes it (training/build.py), and
the engine prints every field that differs from the checkpoint's config when it resumes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from config import paths
from config.layout import FSDP_SHARDING, layout_problems, resume_sharding
from config.schema import TrainingConfig
from config.tree import ConfigError, differences
from launchers.sbatch import queued
from training.checkpoint import dirs, lora_base

# Fields that cannot change on resume (a prefix ends with "."), and why.
FIXED = {
    "model.": "the saved weights have the checkpoint's architecture",
    "peft.": "the saved adapters and optimizer state are the checkpoint's LoRA",
    "precision": "the saved optimizer state and weights are in the checkpoint's precision",
    "optimizer.optimizer": "the saved optimizer state is the checkpoint's optimizer's",
    "optimizer.lr": "Megatron-Core's distributed optimizer finds its saved parameter groups by lr",
    "optimizer.min_lr": "Megatron-Core's distributed optimizer finds its saved parameter groups by "
    "min_lr",
}


def latest_state(cfg: TrainingConfig, run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint the run would resume from, and its train_state.json: one
    whose train_state.json cannot be read is passed over, as the ranks' resume passes it over
    (each named on stderr); ConfigError when every one is so."""
    folder = paths.checkpoint_dir(cfg.checkpoint.save_dir, run_dir)
    if not folder.is_dir():
        return None
    found, passed = dirs.resume_state(folder)
    if found is None and passed:
        raise ConfigError(
            [
                (
                    "checkpoint.save_dir",
                    f"no checkpoint in {folder} can be resumed from ({'; '.join(passed)}). "
                    "Restore them from a copy, or move them away to start afresh",
                )
            ]
        )
    if found is not None:
        for problem in passed:
            print(f"checkpoint: {problem}: the run resumes from {found[0]}", file=sys.stderr)
    return found


def check_resume(cfg: TrainingConfig, run_dir: Path) -> None:
    """ConfigError (exit 2, nothing launched, nothing written) for a resume that cannot work, a
    run directory or checkpoint folder another live run holds (training/checkpoint/dirs.py
    RunFolders: what the ranks' `hold_run_folders` would answer), or a run directory a queued
    Slurm job will start in (launchers/sbatch.py `queued`)."""
    folder = paths.checkpoint_dir(cfg.checkpoint.save_dir, run_dir)
    busy = dirs.RunFolders(run_dir, folder).busy()
    jobs = queued(run_dir)
    if jobs:
        ids = " ".join(job.split()[0] for job in jobs)
        busy.append(
            (
                "logging.run_dir",
                f"{run_dir} has Slurm job(s) {', '.join(jobs)} submitted into it, which will "
                f"start with its config.yaml: wait for them to end, cancel them (scancel {ids}), "
                "or give this run its own logging.run_dir",
            )
        )
    if busy:
        raise ConfigError(busy)
    found = latest_state(cfg, run_dir)
    if found is None:
        return
    path, state = found
    problems = []
    saved_name = (state.get("config") or {}).get("name", cfg.name)
    if saved_name != cfg.name:
        problems.append(
            (
                "checkpoint.save_dir",
                f"{path.parent} holds the checkpoints of recipe {saved_name!r}, not {cfg.name!r}; "
                "give this run its own logging.run_dir (or checkpoint.save_dir), with "
                f"checkpoint.pretrained_dir={path} to start from those weights",
            )
        )
    step = int(state.get("step", 0))
    if cfg.train.max_steps <= step:
        problems.append(
            (
                "train.max_steps",
                f"is {cfg.train.max_steps}, but {path} is at step {step}: nothing is left to "
                f"train; raise train.max_steps above {step}, or give the run a new "
                "logging.run_dir (or checkpoint.save_dir) to start afresh",
            )
        )
    # The parallel layout: the same answer every rank's resume gets (training/checkpoint/store.py).
    problems += [(p.field, p.message) for p in layout_problems(state, cfg, str(path))]
    problems += base_problems(cfg, path, state)
    saved = state.get("config")
    sharding = resume_sharding(state, cfg)
    if saved is not None:
        for field, (old, new) in differences(saved, cfg).items():
            why = next((w for k, w in FIXED.items() if field == k or field.startswith(k)), None)
            if why is not None:
                # pretrained_dir takes a torch_dist checkpoint's weights, not an fsdp_dtensor one's
                weights = (
                    ""
                    if sharding == FSDP_SHARDING
                    else (f" with checkpoint.pretrained_dir={path} to take its weights")
                )
                problems.append(
                    (
                        field,
                        f"is {new!r} but the checkpoint {path} was saved with {old!r}, and it "
                        f"cannot change on resume ({why}); keep {field}={old!r}, or start "
                        f"afresh in a new logging.run_dir (or checkpoint.save_dir){weights}",
                    )
                )
    if problems:
        raise ConfigError(problems)


def base_problems(cfg: TrainingConfig, path: Path, state: dict[str, Any]) -> list[tuple[str, str]]:
    """A LoRA checkpoint's base, changed in what can be told without reading its weights (their
    names, sizes and headers, the small files, a checkpoint's manifest): the ranks' message
    (training/checkpoint/store.py `_check_base`), which also compares the weights' bytes."""
    saved = state.get(lora_base.RECORD)
    if not lora_base.applies(cfg) or not saved:
        return []
    folder = lora_base.base_folder(paths.expand(cfg.checkpoint.pretrained_dir or ""))
    if folder is None:
        return []  # not here (a path the ranks see elsewhere): the ranks compare it
    try:
        now = lora_base.describe(folder, lora_base.base_files(folder), whole=False)
    except (OSError, ValueError):
        return []  # unreadable: loading it on the ranks says why
    found = lora_base.problem(saved, folder.resolve(), now, path)
    return [found] if found else []
