"""Optimizer, LR schedule, the train loop's length and checkpoints."""

from __future__ import annotations

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig


def training(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    opt, sched, train, ckpt = cfg.optimizer, cfg.scheduler, cfg.train, cfg.checkpoint
    out = []
    if opt.lr <= 0:
        out.append(Problem("optimizer.lr", f"must be positive, got {opt.lr}"))
    if opt.min_lr > opt.lr:
        out.append(Problem("optimizer.min_lr", f"{opt.min_lr} is above optimizer.lr={opt.lr}"))
    if train.max_steps < 1:
        out.append(Problem("train.max_steps", f"must be at least 1, got {train.max_steps}"))
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
    if ckpt.save_interval < 1:
        out.append(
            Problem("checkpoint.save_interval", f"must be at least 1, got {ckpt.save_interval}")
        )
    if ckpt.keep_last < 0:
        out.append(Problem("checkpoint.keep_last", "must be 0 (keep all) or more"))
    return out
