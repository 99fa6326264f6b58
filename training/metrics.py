"""Per-step metrics of a run: metrics.jsonl, TensorBoard, W&B, a progress bar and a final plot.

Only the writer rank (global rank 0 in practice) logs; on every other rank each call is a no-op,
so the engine can call `on_step` everywhere. What a step costs is decided by the engine: it calls
`on_step` as often as it has numbers (every `logging.log_interval` steps, typically), and every call
becomes one line of metrics.jsonl, one point in TensorBoard and W&B. On a terminal
`logging.progress_bar` draws a tqdm bar; elsewhere (under `recipes run`, whose ranks write into a
pipe, and in batch jobs) a console line is printed every `logging.log_interval` steps, carrying the
bar, percentage and ETA as text when `logging.progress_bar` is on.

TensorBoard, W&B, tqdm and matplotlib are imported only when used: a rank that does not write never
pays for them.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config import paths

if TYPE_CHECKING:
    from tqdm import tqdm

    from config.schema import TrainingConfig

# Always present in each line (null when the engine had no value), so that readers can rely on them.
STANDARD_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "tflops_per_gpu", "mfu")
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training.png"
WANDB_ID_FILE = "wandb_run_id"  # lets a resumed run continue the same W&B run


def _clean(value: Any) -> float | int | None:
    """A JSON-safe number: tensors and numpy scalars become floats, NaN/inf become null (strict
    JSON has no NaN, and jq and most dashboards reject it)."""
    if value is None:
        return None
    if isinstance(value, bool | int):
        return int(value)
    value = float(value)
    return value if math.isfinite(value) else None


class MetricsLogger:
    """Writes each step's metrics to run_dir/metrics.jsonl (appending, so a resumed run continues
    the same file), TensorBoard (run_dir/tensorboard) and W&B, as cfg.logging asks."""

    def __init__(self, run_dir: Path, cfg: TrainingConfig, *, is_writer: bool) -> None:
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.is_writer = is_writer
        self._closed = False
        self._file = None
        self._tb = None
        self._wandb_run = None
        self._bar: tqdm | None = None
        self._use_bar = False
        if not is_writer:
            return
        log = cfg.logging
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # W&B first: a missing package should fail before any file is touched.
        if log.wandb_project and log.wandb_mode != "disabled":
            self._wandb_run = self._init_wandb()
        self._file = (self.run_dir / METRICS_FILE).open("a", encoding="utf-8")
        if log.tensorboard:
            self._tb = self._tensorboard(purge_step=None)
        # A bar only on a terminal: in Slurm logs its carriage returns make one endless line.
        self._use_bar = log.progress_bar and sys.stderr.isatty()
        self._meter_start: tuple[float, int] | None = None  # (time, step before it) of the meter

    def _init_wandb(self) -> Any:
        log = self.cfg.logging
        try:
            import wandb
        except ImportError as err:
            raise RuntimeError(
                f"logging.wandb_project={log.wandb_project!r} needs the wandb package, which is not "
                "installed: pip install .[wandb] (or unset logging.wandb_project)"
            ) from err
        id_file = self.run_dir / WANDB_ID_FILE
        if id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = uuid.uuid4().hex[:12]
            id_file.write_text(run_id + "\n")
        # The API key comes from WANDB_API_KEY or `wandb login`; it is never written anywhere here.
        return wandb.init(
            project=log.wandb_project,
            name=self.cfg.name,
            id=run_id,
            resume="allow",
            mode=log.wandb_mode,
            dir=str(self.run_dir),
            config=asdict(self.cfg),
        )

    def _tensorboard(self, purge_step: int | None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(
            log_dir=str(self.run_dir / "tensorboard"), flush_secs=30, purge_step=purge_step
        )

    def resume_from(self, step: int, resumed: dict[str, Any] | None = None) -> None:
        """Forget records past `step`, where this run starts (a checkpoint's step, or 0).

        A job that died after its last checkpoint (or before its first) logged steps that this run
        trains again; dropping them keeps one record per step in metrics.jsonl, so it reads as one
        run, and in TensorBoard, whose readers hide the events past `step` of earlier writers.
        `resumed` (what the checkpointer loaded and passed over) becomes an event record:
        {"step": N, "event": "resumed", "checkpoint": ..., "rejected": [...]}.
        """
        if not self.is_writer or self._file is None:
            return
        if self._tb is not None:
            self._tb.close()
            self._tb = self._tensorboard(purge_step=step + 1)
        path = self.run_dir / METRICS_FILE
        self._file.close()
        kept = [
            line
            for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
            if _step_of(line) <= step
        ]
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
        self._file = path.open("a", encoding="utf-8")
        if resumed is not None:
            event = {
                "step": int(step),
                "event": "resumed",
                **resumed,
                "time": round(time.time(), 3),
            }
            self._file.write(json.dumps(event) + "\n")
            self._file.flush()

    def on_step(self, step: int, metrics: dict[str, float | None]) -> None:
        """Record the metrics of global step `step` (the number of optimizer steps done)."""
        if not self.is_writer or self._closed:
            return
        values = {k: _clean(metrics.get(k)) for k in STANDARD_KEYS}
        values.update({k: _clean(v) for k, v in metrics.items() if k not in values})
        record = {"step": int(step), **values, "time": round(time.time(), 3)}
        assert self._file is not None  # opened in __init__ on the writer
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()  # a crash or a requeue loses at most the line being written

        present = {k: v for k, v in values.items() if v is not None}
        if self._tb is not None:
            for key, value in present.items():
                self._tb.add_scalar(key, value, step)
        if self._wandb_run is not None:
            self._wandb_run.log(present, step=step)
        if self._use_bar:
            self._update_bar(step, present)
        elif step % max(1, self.cfg.logging.log_interval) == 0:
            line = self._console_line(step, present)
            if self.cfg.logging.progress_bar:
                line = line.replace(" | ", f" {self._meter(step)} | ", 1)
            print(line, flush=True)

    def _console_line(self, step: int, v: dict[str, float | int]) -> str:
        parts = [f"step {step}/{self.cfg.train.max_steps}"]
        formats = {
            "loss": "loss {:.4f}",
            "val_loss": "val_loss {:.4f}",
            "lr": "lr {:.3e}",
            "grad_norm": "grad_norm {:.3f}",
            "tokens_per_s": "tokens/s {:,.0f}",
            "tflops_per_gpu": "TFLOP/s/GPU {:.1f}",
            "mfu": "MFU {:.1%}",
        }
        parts += [fmt.format(v[k]) for k, fmt in formats.items() if k in v]
        return " | ".join(parts)

    def _meter(self, step: int) -> str:
        """tqdm's bar, percentage, elapsed time and ETA as text, for a log without a terminal
        (under `recipes run` the ranks' output is piped, and in a Slurm log carriage returns make
        one endless line): each console line carries its own bar."""
        from tqdm import tqdm

        now = time.monotonic()
        if self._meter_start is None:  # this process's first step: a resumed run starts here
            self._meter_start = (now, step - 1)
        start, first = self._meter_start
        return tqdm.format_meter(
            step,
            self.cfg.train.max_steps,
            now - start,
            initial=first,
            unit="step",
            bar_format="[{bar:12}] {percentage:3.0f}% {elapsed}<{remaining}",
        )

    def _update_bar(self, step: int, v: dict[str, float | int]) -> None:
        if self._bar is None:
            from tqdm import tqdm

            # A resumed run starts the bar where its checkpoint left off.
            self._bar = tqdm(
                total=self.cfg.train.max_steps, initial=step - 1, unit="step", dynamic_ncols=True
            )
        postfix = {}
        if "loss" in v:
            postfix["loss"] = f"{v['loss']:.4f}"
        if "tokens_per_s" in v:
            postfix["tok/s"] = f"{v['tokens_per_s']:,.0f}"
        self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        """Flush and close everything, then plot loss and tokens/s to run_dir/training.png.

        The run has trained (and saved) by now: a write that fails here (a full disk) is reported,
        never turned into a failed run.
        """
        if not self.is_writer or self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        for what, finish in (
            ("TensorBoard's events", self._tb and self._tb.close),
            ("the W&B run", self._wandb_run and self._wandb_run.finish),
            (str(self.run_dir / METRICS_FILE), self._file and self._file.close),
            (str(self.run_dir / PLOT_FILE), self._plot),
        ):
            try:
                if finish:
                    finish()
            except OSError as err:
                print(f"metrics: could not finish {what}: {err}", file=sys.stderr, flush=True)

    def _plot(self) -> None:
        rows = read_metrics(self.run_dir / METRICS_FILE)
        if rows:
            plot_metrics(rows, self.run_dir / PLOT_FILE, title=self.cfg.name)
            print(summary(rows, self.cfg, self.run_dir), flush=True)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def summary(rows: list[dict[str, Any]], cfg: TrainingConfig, run_dir: Path) -> str:
    """The few lines printed when a run ends: steps, tokens, time, losses, where things are."""
    first, last = rows[0], rows[-1]
    losses = [(r["loss"], r["step"]) for r in rows if r.get("loss") is not None]
    seconds = sum(r.get("step_time_s") or 0.0 for r in rows)
    tokens = len(rows) * cfg.train.global_batch_size * cfg.model.seq_length
    lines = [
        f"summary: steps {first['step']}-{last['step']} of {cfg.train.max_steps}, "
        f"{tokens:,} tokens in {_duration(seconds)} of steps"
    ]
    if losses:
        best, at = min(losses)
        lines.append(
            f"  loss {losses[0][0]:.4f} -> {losses[-1][0]:.4f} (best {best:.4f} at step {at})"
        )
    vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    if vals:
        lines.append(f"  val_loss {vals[-1]:.4f} (best {min(vals):.4f})")
    save_dir = paths.checkpoint_dir(cfg.checkpoint.save_dir, run_dir)
    lines.append(f"  checkpoints {save_dir}; metrics and plot {run_dir / PLOT_FILE}")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    """12.3 s, 4.5 min or 2.1 h: as precise as a reader needs."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _step_of(line: str) -> int:
    """The step of a metrics.jsonl line; a torn last line (a crash mid-write) counts as past all."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The lines of a metrics.jsonl, one per step, sorted by step.

    A run resumed from an earlier checkpoint repeats the steps after it; the later line wins. A
    line cut short by a crash is skipped, and so are the records of events (a resume).
    """
    path = Path(path)
    if not path.is_file():
        return []
    by_step: dict[int, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and "event" not in row:
                by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)]


def plot_metrics(rows: list[dict[str, Any]], out: str | Path, *, title: str = "") -> Path:
    """Loss (and val_loss), the learning rate and tokens/s over step, saved as a PNG with the Agg
    backend (no display needed)."""
    out = Path(out)
    metrics_figure(rows, title).savefig(out, dpi=100)
    return out


def metrics_figure(rows: list[dict[str, Any]], title: str = "") -> Any:
    """The figure plot_metrics saves: one panel per quantity."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Figure + Agg canvas instead of pyplot: no global backend switch, no figure registry to leak.
    fig = Figure(figsize=(14, 4), layout="constrained")
    FigureCanvasAgg(fig)
    # Each panel: (its label, its curves); val_loss shares the loss panel.
    panels = (
        ("loss", ("loss", "val_loss")),
        ("learning rate", ("lr",)),
        ("tokens/s", ("tokens_per_s",)),
    )
    for i, (label, keys) in enumerate(panels, start=1):
        ax = fig.add_subplot(1, len(panels), i)
        drawn = 0
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="." if len(points) < 50 else None, label=key)
                drawn += 1
        if not drawn:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        elif len(keys) > 1 and drawn > 1:
            ax.legend()
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig
