"""The test that tests/unit/test_children.py runs in a pytest of its own and then interrupts (never
collected otherwise: the file name does not start with test_).

It starts torchrun with two ranks, as the smoke tests do, and waits for it. Each rank (Python
without torch, to start quickly) first starts a process of its own in a new session that ignores
SIGTERM, as a stubborn helper would, then writes its pid and that helper's to
$RECIPES_TEST_UP_DIR/rank<N>, and waits. With RECIPES_TEST_HOW=fails the test fails once both ranks
are up, instead of waiting.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.support import children

UP_ENV = "RECIPES_TEST_UP_DIR"
HOW_ENV = "RECIPES_TEST_HOW"
RANK = """
import os, subprocess
helper = subprocess.Popen(["sh", "-c", "trap '' TERM; exec sleep 900"], start_new_session=True)
path = os.path.join(os.environ["UP"], "rank" + os.environ["RANK"])
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {helper.pid}")
os.replace(path + ".tmp", path)
helper.wait()
"""
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def ranks_up(folder: Path) -> list[int]:
    """The pids the ranks wrote (each rank's and its helper's), once both ranks have."""
    files = sorted(folder.glob("rank?"))
    if len(files) < 2:
        return []
    return [int(pid) for path in files for pid in path.read_text().split()]


def test_torchrun_ranks_wait() -> None:
    up = Path(os.environ[UP_ENV])
    cmd = [*TORCHRUN, "--no-python", sys.executable, "-c", RANK]
    env = os.environ | {"UP": str(up)}
    if os.environ.get(HOW_ENV) == "fails":
        with children.started(cmd, env=env):
            while not ranks_up(up):
                time.sleep(0.1)
            pytest.fail("fails while its ranks run")
    children.run(cmd, env=env, timeout=800)
