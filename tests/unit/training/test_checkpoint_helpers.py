"""The checkpoint writer's helper process (training/checkpoint/helpers.py): it ignores the job's exit
signals, so the exit save can still use it, and dies with its rank, so ignoring them never leaves
it behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.support import children

REPO = Path(__file__).resolve().parents[3]
RANK = """
import os, signal, sys
from training.checkpoint import helpers as checkpoint_helpers
checkpoint_helpers.results_queue()
print(checkpoint_helpers._manager._process.pid, flush=True)
sys.stdin.readline()  # the test signals the helper meanwhile
assert checkpoint_helpers.alive(), "the helper died of an exit signal"
print("alive", flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a node failure would
"""


def test_the_helper_survives_exit_signals_and_dies_with_its_rank() -> None:
    with children.started(
        [sys.executable, "-c", RANK],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    ) as rank:
        helper = psutil.Process(int(rank.stdout.readline()))
        for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
            helper.send_signal(signum)
        time.sleep(0.5)
        rank.stdin.write("go\n")
        rank.stdin.flush()
        assert rank.stdout.readline().strip() == "alive"
        assert rank.wait(timeout=30) == -signal.SIGKILL
        try:  # before the end of the block, which would stop it as well
            helper.wait(timeout=10)  # reaped by init once the kernel killed it
        except psutil.NoSuchProcess:
            pass
        assert not helper.is_running()


def test_a_synchronous_save_gets_an_in_process_queue_and_no_helper() -> None:
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    from training.checkpoint import helpers as checkpoint_helpers

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    checkpoint_helpers.results_queue(asynchronous=False)
    try:
        assert isinstance(filesystem_async._results_queue, queue.Queue)
        assert not checkpoint_helpers.alive()
        assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    finally:
        checkpoint_helpers.stop()
    assert filesystem_async._results_queue is None
