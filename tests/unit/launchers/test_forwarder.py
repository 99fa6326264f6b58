"""The local launcher's stop signals (launchers/local.py, Forwarder), in a process of their own.

A script installs the Forwarder over a stand-in rank (a child whose command line names
training.entry, as torchrun's ranks do) and blocks its main thread in a wait, as NeMo-Run's wait for
the job does; a thread of the script sends it SIGINT, once or twice. The first must reach the rank
as SIGUSR1 and nothing else; a second must kill it, and nothing may escape into the main thread's
wait. The CI run of 2026-11-27 hung there: the second Ctrl-C re-entered the first one's handler
while that imported psutil on a loaded machine, the half-imported module raised in NeMo-Run's wait,
and NeMo-Run then waited forever for a torchrun nobody had signalled. The script makes psutil's
import slow from the first signal on, so that the second arrives in the middle of it, as it did.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.support import children

SCRIPT = r"""
import importlib.abc, json, os, signal, subprocess, sys, threading, time

twice = sys.argv[1] == "twice"
signalled = threading.Event()  # from the first signal on, importing psutil takes a second


class SlowPsutil(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "psutil._pslinux" and signalled.is_set():
            time.sleep(1.0)
        return None


sys.meta_path.insert(0, SlowPsutil())
for name in [m for m in sys.modules if m == "psutil" or m.startswith("psutil.")]:
    del sys.modules[name]

from launchers.local import Forwarder

# On SIGUSR1 the stand-in says so, and then exits at once or, asked twice, keeps on (saving).
RANK = (
    "import signal, sys, time\n"
    "def usr1(*_):\n"
    "    print('SIGUSR1', flush=True)\n"
    "    if sys.argv[1] == 'once': sys.exit(0)\n"
    "signal.signal(signal.SIGUSR1, usr1)\n"
    "print('ready', flush=True)\n"
    "time.sleep(50)\n"
)
rank = subprocess.Popen(
    [sys.executable, "-c", RANK, sys.argv[1], "training.entry"], stdout=subprocess.PIPE, text=True
)
assert rank.stdout.readline() == "ready\n"
ended = threading.Event()
threading.Thread(target=lambda: (rank.wait(), ended.set()), daemon=True).start()


def send():
    signalled.set()
    os.kill(os.getpid(), signal.SIGINT)
    if twice:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGINT)


with Forwarder() as forwarder:
    threading.Thread(target=send, daemon=True).start()
    ended.wait(timeout=60)  # the main thread blocks here, as in NeMo-Run's wait for the job
    forwarder.wait(timeout=30)
print(json.dumps({"count": forwarder.count, "rank": rank.returncode, "said": rank.stdout.read()}))
"""


def stop(how: str) -> tuple[dict, str]:
    done = children.run(
        [sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_one_signal_reaches_the_ranks_as_their_exit_signal() -> None:
    result, said = stop("once")
    assert result == {"count": 1, "rank": 0, "said": "SIGUSR1\n"}, said
    assert "SIGINT: the ranks save a checkpoint at the next step and exit" in said


@pytest.mark.parametrize("attempt", range(2))
def test_a_second_signal_while_the_first_is_handled_kills_at_once(attempt: int) -> None:
    result, said = stop("twice")
    assert result["count"] == 2 and result["rank"] == -9, said  # SIGKILL, while it saved
    assert "SIGINT again: stopping every process now, without saving" in said
    assert "Traceback" not in said
