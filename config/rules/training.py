"""The run's name; optimizer and LR schedule against the train loop's length (each number's own
range is config/rules/ranges.py's)."""

from __future__ import annotations

import re

from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig

CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def run_name_problem(name: str, key: str = "name") -> str | None:
    """Why `name` cannot name a run, or None. It names the run's folder, <run_root>/<name>-<time>
    (runs/<name>-<id> under plain torchrun), and its Slurm job: it must be one folder name, so that
    the run directory stays inside run_root."""
    if not name:
        why = "is empty"
    elif CONTROL.search(name):
        why = "holds a control character"
    elif "/" in name:
        why = "holds '/'"
    elif name.startswith("."):
        why = "starts with '.'"
    elif len(name.encode()) > 200:
        why = "is longer than 200 bytes"
    else:
        return None
    return (
        f"{name!r} {why}: the run directory is <run_root>/<{key}>-<time>, so {key} must be one "
        f"folder name; use letters, digits, '_', '-' and '.' (not first), e.g. {key}=my_llama3_8b"
    )


def training(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    opt, sched, train = cfg.optimizer, cfg.scheduler, cfg.train
    out = []
    bad_name = run_name_problem(cfg.name)
    if bad_name:
        out.append(Problem("name", bad_name))
    if opt.optimizer == "sgd" and opt.use_distributed_optimizer:
        # Megatron-Core 0.19's DistributedOptimizer asserts Adam (or an optimizer with an
        # init_state_fn, which its SGD lacks) when it is built, on GPUs and the CPU alike.
        out.append(
            Problem(
                "optimizer.use_distributed_optimizer",
                "optimizer.optimizer=sgd: Megatron-Core's distributed optimizer shards Adam's "
                "state only (it refuses SGD at start-up); set "
                "optimizer.use_distributed_optimizer=false, or optimizer.optimizer=adam",
            )
        )
    if opt.min_lr > opt.lr:
        out.append(Problem("optimizer.min_lr", f"{opt.min_lr} is above optimizer.lr={opt.lr}"))
    decay_steps = sched.decay_steps or train.max_steps
    if sched.decay_style != "constant" and sched.warmup_steps >= decay_steps:
        out.append(
            Problem(
                "scheduler.warmup_steps",
                f"{sched.warmup_steps} warmup steps leave no decay within {decay_steps} steps "
                "(scheduler.decay_steps or train.max_steps); lower it below "
                f"{decay_steps}, e.g. scheduler.warmup_steps={max(0, decay_steps // 10)}, or "
                "raise train.max_steps",
            )
        )
    if sched.decay_style == "wsd" and not sched.wsd_decay_steps:
        out.append(
            Problem(
                "scheduler.wsd_decay_steps",
                "the 'wsd' schedule needs the length of its decay phase",
            )
        )
    return out
