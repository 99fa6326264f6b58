"""MetricsLogger: metrics.jsonl lines (appended on resume), TensorBoard events, the plot, W&B."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import re
import sys
from pathlib import Path

import pytest

from config.schema import LoggingConfig, ModelConfig, TrainConfig, TrainingConfig
from training.metrics import STANDARD_KEYS, MetricsLogger, read_metrics


@pytest.fixture(autouse=True)
def _tmp_homes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_SILENT", "true")


def _cfg(**logging: object) -> TrainingConfig:
    model = ModelConfig(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        seq_length=32,
        vocab_size=128,
    )
    log = LoggingConfig(**{"tensorboard": False, "progress_bar": False, **logging})
    return TrainingConfig(
        name="metrics_test",
        model=model,
        train=TrainConfig(global_batch_size=2, max_steps=10),
        logging=log,
    )


def _step_metrics(step: int) -> dict[str, float | None]:
    return {
        "loss": 10.0 / step,
        "lr": 1e-4,
        "grad_norm": None,
        "tokens_per_s": 1000.0 * step,
        "tflops_per_gpu": 1.5,
        "mfu": 0.01,
    }


def test_one_line_per_step(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    logger = MetricsLogger(tmp_path, _cfg(log_interval=2), is_writer=True)
    for step in (1, 2, 3):
        logger.on_step(step, _step_metrics(step))
        # Flushed at once: a reader (or a crash) sees every finished step.
        assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == step
    logger.on_step(4, {"loss": math.nan, "valid/loss": 2.5})
    logger.close()

    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines] == [1, 2, 3, 4]
    assert all(set(STANDARD_KEYS) <= row.keys() for row in lines)
    assert lines[1]["loss"] == 5.0 and lines[1]["grad_norm"] is None
    assert lines[3]["loss"] is None and lines[3]["valid/loss"] == 2.5  # NaN is not valid JSON
    # Without a terminal, a console line every log_interval steps.
    out = [x for x in capsys.readouterr().out.splitlines() if x.startswith("step")]
    assert [x.split(" | ")[0] for x in out] == ["step 2/10", "step 4/10"]
    assert "loss 5.0000" in out[0] and "MFU 1.0%" in out[0]


def test_resume_appends_and_later_lines_win(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, _cfg(), is_writer=True) as first:
        for step in range(1, 5):
            first.on_step(step, _step_metrics(step))
    # The job died after step 4; its last checkpoint was step 2, so steps 3 and 4 run again.
    with MetricsLogger(tmp_path, _cfg(), is_writer=True) as resumed:
        for step in range(3, 6):
            resumed.on_step(step, {**_step_metrics(step), "loss": 0.5})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 7
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert [r["loss"] for r in rows[2:]] == [0.5, 0.5, 0.5]


def test_plot_written(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, _cfg(), is_writer=True) as logger:
        for step in range(1, 6):
            logger.on_step(step, _step_metrics(step))
    png = tmp_path / "training.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tensorboard_events(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path, _cfg(tensorboard=True), is_writer=True) as logger:
        for step in range(1, 4):
            logger.on_step(step, _step_metrics(step))
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events[0]))
    acc.Reload()
    loss = [(e.step, e.value) for e in acc.Scalars("loss")]  # stored as float32
    assert loss == [(1, 10.0), (2, 5.0), (3, pytest.approx(10.0 / 3, rel=1e-6))]
    assert "grad_norm" not in acc.Tags()["scalars"]  # never had a value


def test_only_the_writer_writes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cfg = _cfg(tensorboard=True, wandb_project="p", wandb_mode="offline")
    with MetricsLogger(run_dir, cfg, is_writer=False) as logger:  # no wandb import either
        logger.on_step(1, _step_metrics(1))
    assert not run_dir.exists()


def test_progress_bar_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    with MetricsLogger(tmp_path, _cfg(progress_bar=True), is_writer=True) as logger:
        for step in (3, 4, 5):  # a resumed run: the bar starts at its checkpoint
            logger.on_step(step, _step_metrics(step))
    assert "5/10" in term.getvalue() and "loss=2.0000" in term.getvalue()


def test_progress_without_a_terminal_is_a_meter_in_each_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Under `recipes run` (a pipe) or in a Slurm log each line carries the bar and the ETA."""
    with MetricsLogger(tmp_path, _cfg(progress_bar=True), is_writer=True) as logger:
        for step in (3, 4, 5):  # a resumed run: the meter counts from its checkpoint
            logger.on_step(step, _step_metrics(step))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert lines[0].startswith("step 3/10 [") and " 30% 00:00<? | loss" in lines[0]
    assert re.search(r"^step 5/10 \[.*\]  50% 00:00<00:00 \| loss 2\.0000", lines[2]), lines[2]
    with MetricsLogger(tmp_path / "plain", _cfg(progress_bar=False), is_writer=True) as logger:
        logger.on_step(1, _step_metrics(1))
    assert capsys.readouterr().out.startswith("step 1/10 | loss 10.0000")


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_missing_gives_clear_error(tmp_path: Path) -> None:
    cfg = _cfg(wandb_project="my-project", wandb_mode="offline")
    with pytest.raises(
        RuntimeError, match=r"logging\.wandb_project='my-project'.*pip install \.\[wandb\]"
    ):
        MetricsLogger(tmp_path, cfg, is_writer=True)
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb is not installed")
def test_wandb_offline(tmp_path: Path) -> None:
    cfg = _cfg(wandb_project="my-project", wandb_mode="offline")
    with MetricsLogger(tmp_path, cfg, is_writer=True) as logger:
        logger.on_step(1, _step_metrics(1))
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    assert list((tmp_path / "wandb").glob(f"offline-run-*-{run_id}"))
    # A resumed run reuses the id, so W&B continues the same run.
    with MetricsLogger(tmp_path, cfg, is_writer=True) as logger:
        logger.on_step(2, _step_metrics(2))
    assert (tmp_path / "wandb_run_id").read_text().strip() == run_id


def test_resume_drops_steps_past_the_checkpoint(tmp_path: Path) -> None:
    """A job that died at step 5 after a checkpoint at step 3: the resumed run retrains 4 and 5."""
    with MetricsLogger(tmp_path, _cfg(), is_writer=True) as first:
        for step in range(1, 6):
            first.on_step(step, _step_metrics(step))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 6, "loss"')  # torn by the crash
    with MetricsLogger(tmp_path, _cfg(), is_writer=True) as second:
        second.resume_from(3)
        for step in range(4, 8):
            second.on_step(step, _step_metrics(step))
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1, 2, 3, 4, 5, 6, 7]


def test_plot_has_loss_with_val_loss_the_lr_and_throughput() -> None:
    from training.metrics import metrics_figure

    rows = [
        {"step": s, **_step_metrics(s), "val_loss": 3.0 if s % 2 == 0 else None}
        for s in (1, 2, 3, 4)
    ]
    fig = metrics_figure(rows)
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "learning rate", "tokens/s"]
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["loss", "val_loss"]


def test_summary_at_the_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with MetricsLogger(tmp_path, _cfg(), is_writer=True) as logger:
        for step in range(1, 6):
            logger.on_step(step, {**_step_metrics(step), "step_time_s": 0.5})
    out = capsys.readouterr().out
    assert "summary: steps 1-5 of 10, 320 tokens in 2.5 s of steps" in out
    assert "loss 10.0000 -> 2.0000 (best 2.0000 at step 5)" in out
    assert f"metrics and plot {tmp_path / 'training.png'}" in out
