"""Where a run keeps its files: the run directory, its config.yaml and its checkpoint folder.

The launcher (`recipes run`), the ranks (`training.entry`), `recipes runs` and the checks before
launch all ask these functions, so that they look at the same folders: a folder the launcher
checks is the folder the ranks write. Plain Python: the login node asks without torch.

A path given in the config may start with `~` (the user's home) or be relative to the working
directory of the process that reads it; the folders come back with `~` expanded and absolute.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config.tree import write_yaml

if TYPE_CHECKING:
    from config.schema import TrainingConfig

CONFIG_FILE = "config.yaml"  # the resolved config every rank reads: <run dir>/config.yaml
LAUNCH_RECORD = "launch.json"  # how the run was launched (its Slurm job ids) and how it ended
CHECKPOINTS = "checkpoints"  # the checkpoint folder when checkpoint.save_dir is unset
RUNS = "runs"  # the folder new run directories go under when no run_root is given


def expand(path: str | os.PathLike[str]) -> Path:
    """A configured path as a folder on this machine: `~` expanded, relative to the working
    directory made absolute."""
    return Path(os.path.abspath(os.path.expanduser(os.fspath(path))))


def run_dir_for(
    cfg: TrainingConfig, stamp: str, root: str | None = None, *, fresh: bool = False
) -> Path:
    """The run directory: logging.run_dir when set, else <root or ./runs>/<recipe>-<stamp>.

    `stamp` names a run directory that the config does not: the launcher's is the time of launch;
    the ranks' must be the same on every rank (torchrun's run id). `fresh` (the launcher's) adds
    -2, -3 ... to a default folder that exists already, so that a new run never lands in an old
    one; the ranks never ask for it, or two ranks could pick two folders.
    """
    if cfg.logging.run_dir:
        return expand(cfg.logging.run_dir)
    base = expand(root or RUNS) / f"{cfg.name}-{stamp}"
    path, n = base, 2
    while fresh and path.exists():
        path, n = Path(f"{base}-{n}"), n + 1
    return path


def checkpoint_dir(save_dir: str | None, run_dir: str | os.PathLike[str]) -> Path:
    """The folder a run saves its checkpoints in and resumes from: checkpoint.save_dir, else
    <run dir>/checkpoints. Takes the field's value, not the config: `recipes runs` reads it from a
    run's config.yaml."""
    return expand(save_dir) if save_dir else expand(run_dir) / CHECKPOINTS


def write_run_config(cfg: TrainingConfig, run_dir: str | os.PathLike[str]) -> Path:
    """Write the resolved config into <run dir>/config.yaml, where the ranks read it from and
    `recipes runs` finds the run (atomically: a requeued job reads it back)."""
    return write_yaml(cfg, Path(run_dir) / CONFIG_FILE)


def read_launch_record(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """<run dir>/launch.json (launchers/local.py write_record): how the run was launched, its
    Slurm job ids, how it ended; {} where there is none or it cannot be read."""
    try:
        data = json.loads((Path(run_dir) / LAUNCH_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
