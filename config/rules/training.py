"""Optimizer and LR schedule against the train loop's length (each number's own range is
config/rules/ranges.py's)."""

from __future__ import annotations

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig


def training(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    opt, sched, train = cfg.optimizer, cfg.scheduler, cfg.train
    out = []
    if opt.min_lr > opt.lr:
        out.append(Problem("optimizer.min_lr", f"{opt.min_lr} is above optimizer.lr={opt.lr}"))
    decay_steps = sched.decay_steps or train.max_steps
    if sched.decay_style != "constant" and sched.warmup_steps >= decay_steps:
        out.append(
            Problem(
                "scheduler.warmup_steps",
                f"{sched.warmup_steps} warmup steps leave no decay within {decay_steps} steps "
                "(scheduler.decay_steps or train.max_steps); lower it",
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
