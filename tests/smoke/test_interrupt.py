"""Stopping `recipes run` on the local executor: Ctrl-C, SIGTERM and a second Ctrl-C.

The CLI runs in its own process group, as a shell runs a foreground job; Ctrl-C is SIGINT to that
group, which holds the CLI alone (torchrun and each rank run in sessions of their own). The first
signal must reach the ranks, which save at the next step and exit: the CLI exits 130 with a
complete checkpoint at the last step trained and no process left. A second signal stops every
process at once: no process left, and nothing half-written published as a checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.smoke.conftest import REPO, _env
from tests.support import children
from training.checkpoint import dirs

pytestmark = pytest.mark.smoke


def start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "recipes",
        "run",
        "tiny_gpt_pretrain",
        "train.max_steps=500",
        "checkpoint.save_interval=1000",
        f"logging.run_dir={run_dir}",
    ]
    with (tmp_path / "cli.log").open("w") as log:  # in its own session, as a shell's job
        proc = children.start(
            cmd, cwd=REPO, env=_env(tmp_path), stdout=log, stderr=subprocess.STDOUT
        )
    return proc, run_dir


def steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.open()] if path.is_file() else []


def wait_for_steps(proc: subprocess.Popen, run_dir: Path, count: int) -> None:
    deadline = time.monotonic() + 300
    while len(steps(run_dir)) < count:
        assert proc.poll() is None, f"the run ended early: {proc.returncode}"
        assert time.monotonic() < deadline, "no training steps within 300 s"
        time.sleep(0.5)


def leftovers(proc: subprocess.Popen, run_dir: Path) -> list[str]:
    """The run's processes still running: whatever the CLI started (its environment names it,
    tests/support/children.py), and anything else whose command line names the run directory."""
    found = [str(pid) for pid in children.leftovers(proc)]
    mark = str(run_dir)
    for p in psutil.process_iter(["cmdline"]):
        line = " ".join(p.info["cmdline"] or [])
        if mark in line:
            found.append(line[:120])
    return found


def finish(proc: subprocess.Popen, tmp_path: Path) -> str:
    try:
        proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        children.stop(proc)
        pytest.fail("the CLI did not exit within 180 s of the signal")
    return (tmp_path / "cli.log").read_text(errors="replace")


@pytest.mark.parametrize("how", ["ctrl_c", "sigterm"])
def test_one_signal_saves_at_the_next_step_and_leaves_no_process(tmp_path: Path, how: str) -> None:
    proc, run_dir = start(tmp_path)
    wait_for_steps(proc, run_dir, 2)
    if how == "ctrl_c":
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: the whole foreground group
    else:
        proc.send_signal(signal.SIGTERM)  # to the CLI alone, as `kill PID` or a scheduler does
    log = finish(proc, tmp_path)
    assert proc.returncode == 130, log[-3000:]
    assert leftovers(proc, run_dir) == []
    latest = dirs.latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None and dirs.step_of(latest) == steps(run_dir)[-1], log[-3000:]
    assert "KeyboardInterrupt" not in log


def test_a_second_ctrl_c_stops_at_once_and_publishes_nothing_partial(tmp_path: Path) -> None:
    proc, run_dir = start(tmp_path)
    wait_for_steps(proc, run_dir, 2)
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    log = finish(proc, tmp_path)
    assert proc.returncode == 130, log[-3000:]
    assert leftovers(proc, run_dir) == []
    folder = run_dir / "checkpoints"
    latest = dirs.latest_checkpoint(folder) if folder.is_dir() else None
    assert latest is None or dirs.is_complete(latest)
