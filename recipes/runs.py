"""`recipes runs`: the past runs, read from their run directories; no torch, no NeMo-Run.

A run directory is any folder under the roots (./runs, or `--profile PROFILE`'s run_root, or
`--root DIR`) holding a config.yaml. For each: the recipe, the state, the step reached out of
train.max_steps, the last loss (training/metrics.py `read_metrics`), the newest complete
checkpoint, and how it was launched (launch.json, written by `recipes run`: the NeMo-Run
experiment id and its NEMORUN_HOME, or the Slurm job ids).

States, from what the folder shows: `running` (a live run holds the checkpoint folder's lock),
`finished` (the last step is train.max_steps), `submitted` (Slurm, no step yet), `interrupted`
(stopped by Ctrl-C or a signal), `failed` (the launcher saw a rank fail), else `stopped` (ended
before max_steps: the same command resumes from its newest checkpoint).
"""

from __future__ import annotations

import errno
import json
import os
import shlex
from pathlib import Path
from typing import Any

import yaml

from config import paths
from training.checkpoint import dirs
from training.metrics import read_metrics


def run_dirs(roots: list[Path]) -> list[Path]:
    """Every run directory directly under the roots, oldest first (by config.yaml's time)."""
    found = {
        c.parent.resolve()
        for root in roots
        if root.is_dir()
        for c in root.glob(f"*/{paths.CONFIG_FILE}")
    }
    return sorted(found, key=lambda d: ((d / paths.CONFIG_FILE).stat().st_mtime, str(d)))


def _held(folder: Path) -> bool:
    """Whether a live run holds folder/.run.lock: a shared lock is tried and given back at once,
    on a read-only handle (listing never writes into a run)."""
    import fcntl

    path = folder / dirs.LOCK_FILE
    try:
        with path.open("r") as handle:
            try:
                fcntl.lockf(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as err:
                return err.errno in (errno.EACCES, errno.EAGAIN)
            fcntl.lockf(handle, fcntl.LOCK_UN)
    except OSError:
        return False
    return False


def summarize(run_dir: Path) -> dict[str, Any]:
    """One run: recipe, state, step, max_steps, last_loss, checkpoint, run_dir, launch record."""
    try:
        cfg = yaml.safe_load((run_dir / paths.CONFIG_FILE).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        cfg = {}
    train, ckpt = cfg.get("train") or {}, cfg.get("checkpoint") or {}
    rows = read_metrics(run_dir / "metrics.jsonl")
    last = rows[-1] if rows else {}
    folder = paths.checkpoint_dir(ckpt.get("save_dir"), run_dir)  # where its ranks saved
    latest = dirs.latest_checkpoint(folder) if folder.is_dir() else None
    launch = paths.read_launch_record(run_dir)
    step, max_steps = last.get("step"), train.get("max_steps")
    state = _state(folder, launch, step, max_steps)
    return {
        "recipe": cfg.get("name"),
        "state": state,
        "step": step,
        "max_steps": max_steps,
        "last_loss": last.get("loss"),
        "checkpoint": str(latest) if latest else None,
        "run_dir": str(run_dir),
        "launch": launch,
    }


def _state(folder: Path, launch: dict[str, Any], step: int | None, max_steps: int | None) -> str:
    if folder.is_dir() and _held(folder):
        return "running"
    if step is not None and max_steps is not None and step >= max_steps:
        return "finished"
    recorded = str(launch.get("state", "")).upper()
    if recorded == "SUBMITTED" and step is None:
        return "submitted"
    if recorded == "INTERRUPTED":
        return "interrupted"
    if recorded and recorded not in ("RUNNING", "SUBMITTED", "SUCCEEDED"):
        return "failed"
    return "stopped"


def how_to_follow(launch: dict[str, Any], state: str) -> list[str]:
    """Commands for a run's launcher records (NeMo-Run's, or Slurm's), and to stop a live one."""
    lines = []
    if launch.get("experiment_id"):
        home = launch.get("nemorun_home")
        default = os.path.expanduser(os.environ.get("NEMORUN_HOME") or "~/.nemo_run")
        same = not home or os.path.abspath(home) == os.path.abspath(default)
        prefix = f"NEMORUN_HOME={shlex.quote(home)} " if home and not same else ""
        lines.append(f"{prefix}nemo experiment logs {launch['experiment_id']} 0")
    if launch.get("job_ids"):
        ids = ",".join(launch["job_ids"])
        lines.append(
            f"sacct -j {ids}"
            + (f"; stop: scancel {ids}" if state in ("running", "submitted") else "")
        )
    elif state == "running" and launch.get("pid"):
        lines.append(
            f"stop (saves, then exits): kill -TERM {launch['pid']} on {launch.get('host')}"
        )
    return lines


def render(runs: list[dict[str, Any]]) -> str:
    if not runs:
        return "no runs found (a run directory holds config.yaml; see --root)"
    lines = []
    for r in runs:
        step = f"{r['step'] if r['step'] is not None else '-'}/{r['max_steps'] or '?'}"
        loss = f"{r['last_loss']:.4f}" if isinstance(r["last_loss"], int | float) else "-"
        lines.append(
            f"{r['state']:<11} {r['recipe'] or '?'}  step {step}  loss {loss}  {r['run_dir']}"
        )
        lines += [f"            {line}" for line in how_to_follow(r["launch"], r["state"])]
    return "\n".join(lines)


def cmd_runs(roots: list[Path], as_json: bool) -> int:
    runs = [summarize(d) for d in run_dirs(roots)]
    print(json.dumps(runs, indent=2) if as_json else render(runs))
    return 0
