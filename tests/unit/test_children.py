"""No process a test starts outlives it (tests/support/children.py): a pytest of its own runs
tests/support/children_case.py, which starts torchrun with two ranks and waits; once the ranks are up, that
pytest is interrupted (Ctrl-C, SIGTERM), or pytest-timeout fires, or the test fails. Then no
process of the run may be left: not torchrun, not a rank, not the helper each rank started in a
session of its own that ignores SIGTERM.

The same with the pytest as `make test` runs it, on pytest-xdist workers: Ctrl-C reaches the whole
process group as a terminal sends it; SIGTERM reaches the controller only, as a batch system or a
CI timeout sends it, and the controller must pass it on (tests/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import children
from tests.support.children_case import HOW_ENV, UP_ENV, ranks_up

pytestmark = pytest.mark.smoke
REPO = Path(__file__).resolve().parents[2]
INTERRUPTED, FAILED = 2, 1  # pytest's exit codes
HOW = {
    "ctrl_c": (signal.SIGINT, INTERRUPTED),
    "sigterm": (signal.SIGTERM, INTERRUPTED),
    # pytest-timeout's signal method: its timer ends with SIGALRM, whose handler fails the test.
    "timeout": (signal.SIGALRM, FAILED),
    "fails": (None, FAILED),
    "xdist_ctrl_c": (signal.SIGINT, INTERRUPTED),
    "xdist_sigterm": (signal.SIGTERM, INTERRUPTED),
}


def alive(pid: int) -> bool:
    """Running (a zombie has ended: only its exit status is left to collect)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _dump_stacks(inner: subprocess.Popen) -> None:
    """Every thread's stack of the hung pytest (and of its xdist worker) into its log: pytest's
    faulthandler plugin writes them on SIGABRT."""
    import psutil

    pytests = [psutil.Process(inner.pid)]
    pytests += [p for p in pytests[0].children() if "python" in p.name()]
    for proc in pytests:
        try:
            proc.send_signal(signal.SIGABRT)
        except psutil.Error:
            pass
    try:
        inner.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


@pytest.mark.parametrize("how", sorted(HOW))
def test_no_process_of_a_stopped_test_is_left(tmp_path: Path, how: str) -> None:
    signum, code = HOW[how]
    up = tmp_path / "up"
    up.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/support/children_case.py",
    ]
    if how.startswith("xdist_"):
        cmd += ["-n", "1"]
    # Unbuffered: a pytest that has to be killed still leaves its log to read.
    # Its helpers ignore SIGTERM: they wait out the grace before SIGKILL, 1 s here, not 5.
    env = os.environ | {UP_ENV: str(up), HOW_ENV: how, "PYTHONUNBUFFERED": "1"}
    env["RECIPES_TEST_GRACE_S"] = "1"
    log = tmp_path / "pytest.log"
    with (
        log.open("w") as out,
        children.started(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT) as inner,
    ):
        while not (pids := ranks_up(up)):
            assert inner.poll() is None, log.read_text()
            time.sleep(0.1)
        if signum is not None:
            # (with "fails" the inner test ends its ranks as soon as they are up, maybe already)
            assert all(alive(pid) for pid in pids)
            if how == "xdist_ctrl_c":  # a terminal's Ctrl-C: pytest's whole process group
                os.killpg(inner.pid, signum)
            else:
                inner.send_signal(signum)
        try:
            inner.wait(timeout=300)  # its stop takes seconds; the bound is for a loaded machine
        except subprocess.TimeoutExpired:
            _dump_stacks(inner)
            pytest.fail(f"pytest had not ended 300 s after {how}:\n{log.read_text()[-8000:]}")
        left = children.leftovers(inner)  # torchrun, its ranks, their helpers: all carry its token
        running = [pid for pid in pids if alive(pid)]
    output = log.read_text()
    assert left == [] and running == [], output
    assert inner.returncode == code, output
    if how == "timeout":
        assert "Timeout" in output, output
