"""Where the engine sends each step's numbers: anything with `on_step(step, metrics)` and `close()`.

`training.metrics` (TensorBoard, W&B, plots) plugs in through `create_step_logger`; until it
provides `create_logger(cfg, run_dir)`, `JsonlStepLogger` writes the one JSON object per step that
the run directory contract asks for (`<run_dir>/metrics.jsonl`). Only global rank 0 logs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from training.config import TrainingConfig


class StepLogger(Protocol):
    def on_step(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlStepLogger:
    """Appends {"step": ..., **metrics} to metrics.jsonl, one line per step, flushed at once."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")

    def on_step(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in metrics.items()
        }
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class NullStepLogger:
    """What every rank but global rank 0 gets."""

    def on_step(self, step: int, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def create_step_logger(cfg: TrainingConfig, run_dir: Path, rank: int) -> StepLogger:
    if rank != 0:
        return NullStepLogger()
    try:
        from training import metrics
    except ImportError:
        metrics = None
    if metrics is not None and hasattr(metrics, "create_logger"):
        return metrics.create_logger(cfg, run_dir)
    return JsonlStepLogger(run_dir / "metrics.jsonl")
