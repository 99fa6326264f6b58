"""Optimizer, LR schedule, train loop, data, checkpoints and logging."""

from __future__ import annotations

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig, split_weights


def training(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    opt, sched, train, data, ckpt, log = (
        cfg.optimizer,
        cfg.scheduler,
        cfg.train,
        cfg.data,
        cfg.checkpoint,
        cfg.logging,
    )
    out = []
    enums = {
        "optimizer.optimizer": (opt.optimizer, ("adam", "sgd")),
        "scheduler.decay_style": (sched.decay_style, ("cosine", "linear", "constant", "wsd")),
        "scheduler.wsd_decay_style": (sched.wsd_decay_style, ("linear", "cosine", "exponential")),
        "data.kind": (data.kind, ("mock", "indexed", "sft", "energon")),
        "train.device": (train.device, ("auto", "cuda", "cpu")),
        "checkpoint.dist_optimizer_sharding": (
            ckpt.dist_optimizer_sharding,
            ("dp_reshardable", "fully_reshardable"),
        ),
        "logging.wandb_mode": (log.wandb_mode, ("online", "offline", "disabled")),
    }
    for field, (value, allowed) in enums.items():
        if value not in allowed:
            out.append(Problem(field, f"'{value}' is not one of {', '.join(allowed)}"))
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
    if data.kind in ("indexed", "sft", "energon") and not data.path:
        out.append(Problem("data.path", f"data.kind='{data.kind}' needs a path to the dataset"))
    if data.kind in ("indexed", "sft") and not data.tokenizer:
        out.append(
            Problem(
                "data.tokenizer", f"data.kind='{data.kind}' needs a local tokenizer file or folder"
            )
        )
    out += _evaluation(cfg)
    if data.kind in ("mock", "indexed") and data.sequence_packing:
        out.append(
            Problem(
                "data.sequence_packing",
                f"packs SFT pairs or Energon samples; data.kind='{data.kind}' already fills every "
                "row with documents end to end. Set data.sequence_packing=false",
            )
        )
    if data.kind == "sft" and data.sequence_packing and cfg.parallel.context_parallel_size > 1:
        out.append(
            Problem(
                "data.sequence_packing",
                "packed SFT rows keep their samples apart with an explicit attention mask, which "
                f"has no context-parallel form here (parallel.context_parallel_size="
                f"{cfg.parallel.context_parallel_size}); set data.sequence_packing=false or "
                "parallel.context_parallel_size=1",
            )
        )
    if ckpt.save_interval < 1:
        out.append(
            Problem("checkpoint.save_interval", f"must be at least 1, got {ckpt.save_interval}")
        )
    if ckpt.keep_last < 0:
        out.append(Problem("checkpoint.keep_last", "must be 0 (keep all) or more"))
    return out


def _evaluation(cfg: TrainingConfig) -> list[Problem]:
    """data.split's weights, and train.eval_interval's validation batches."""
    train, data, out = cfg.train, cfg.data, []
    try:
        weights = split_weights(data.split)
    except ValueError:
        out.append(
            Problem(
                "data.split",
                f"'{data.split}' is not up to three non-negative weights for train, validation "
                "and test, e.g. data.split=969,30,1",
            )
        )
        weights = [1.0, 0.0, 0.0]
    if train.eval_interval < 0:
        out.append(
            Problem("train.eval_interval", f"must be 0 (never) or more, got {train.eval_interval}")
        )
    if train.eval_interval <= 0:
        return out
    if train.eval_iters < 1:
        out.append(Problem("train.eval_iters", f"must be at least 1, got {train.eval_iters}"))
    if data.kind == "energon":
        out.append(
            Problem(
                "train.eval_interval",
                "evaluation reads the validation split of mock, indexed or sft data; Energon "
                "data has no validation loader here yet. Set train.eval_interval=0",
            )
        )
    elif data.kind in ("indexed", "sft") and weights[1] == 0:
        out.append(
            Problem(
                "data.split",
                f"'{data.split}' gives the validation split no weight, but train.eval_interval="
                f"{train.eval_interval} evaluates on it; e.g. data.split=969,30,1",
            )
        )
    return out
