"""training/distributed.py `destroy(keep=...)`: the process groups that existed before stay, every
one built since goes, and with it (once nothing refers to it) the threads it held. One process,
gloo; the ten-run version under torchrun is tests/smoke/test_pretrain_releases.py.

The count runs in a fresh interpreter: pytest's own process carries threads of earlier tests that
end on their own schedule, which would move the count either way."""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import pytest

from tests.support import children

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]


def native_threads() -> int:
    """This process's threads once those that are ending have ended (unchanged for a second)."""
    last, steady, deadline = -1, 0, time.monotonic() + 60
    while steady < 10 and time.monotonic() < deadline:
        count = len(os.listdir("/proc/self/task"))
        steady = steady + 1 if count == last else 0
        last = count
        time.sleep(0.1)
    return last


def destroy_keeps_the_groups_before_and_frees_the_threads_of_the_rest() -> None:
    import torch.distributed as dist

    from training import distributed
    from training.ranks import Launch

    assert distributed.init_process_group(Launch(0, 1, 0, 1), "cpu")
    before, threads = distributed.process_groups(), native_threads()
    groups = [dist.new_group([0], backend="gloo") for _ in range(4)]
    assert native_threads() > threads  # each gloo group runs threads of its own
    assert distributed.process_groups() == before | set(groups)
    distributed.destroy(keep=before)
    assert distributed.process_groups() == before
    assert dist.is_initialized()
    del groups
    gc.collect()
    assert native_threads() == threads
    distributed.destroy()
    assert distributed.process_groups() == frozenset()


def test_destroy_keeps_the_groups_before_and_frees_the_threads_of_the_rest() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    done = children.run(
        [sys.executable, "-m", "tests.unit.training.test_process_groups"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


if __name__ == "__main__":
    destroy_keeps_the_groups_before_and_frees_the_threads_of_the_rest()
