"""When to stop early: an exit signal (SIGUSR1 / SIGTERM) or train.exit_duration_minutes, decided
once per step for all ranks -> checkpoint at that step -> exit 0.

The handlers only set a flag (nothing else is safe inside a signal handler). At every step boundary
the train loop asks `StopPolicy.check()`: one all-reduce (MAX) of [signal received, time is up] over
all ranks, so one signalled (or late) rank is enough and every rank leaves at the same step. The
job then saves a checkpoint at that step and exits 0; the next job of the chain resumes from it. A
second signal ends the process at once (a job that must die is not held up by a slow save), unless
it comes within REPEAT_WINDOW_S of the first: Slurm sends SIGTERM to every process and torchrun
forwards it again, so a rank sees the same request twice in quick succession.

With Slurm, ask for the signal ahead of the time limit, long enough to finish a step and a save.
Two ways to get it to the ranks:

    #SBATCH --signal=USR1@300      # what launchers/slurm.py renders: USR1 to every process of the
                                   # job step 300 s before the limit; torchrun runs with USR1
                                   # ignored (it would die of it), the ranks catch it themselves
    #SBATCH --signal=B:USR1@300    # USR1 to the batch shell only; forward it to the ranks, e.g.
                                   # trap 'kill -USR1 $RANK_PIDS' USR1 (one rank per job suffices)

torchrun starts its workers in their own sessions, so a signal to torchrun's process group does not
reach them; torchrun forwards USR1 only with `--signals-to-handle ...,SIGUSR1`, and then gives the
workers `--shutdown-timeout` seconds, which must cover the save. Slurm's own SIGTERM at the limit
is handled like USR1, but only KillWait (30 s by default) separates it from SIGKILL.
train.exit_duration_minutes ends the loop the same way, without a signal.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

EXIT_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)
REPEAT_WINDOW_S = (
    5.0  # a repeat within this window is the same request (Slurm + torchrun forwarding)
)


class ExitSignals:
    """Handlers for SIGUSR1 and SIGTERM that set a flag; `restore()` gives the old ones back."""

    def __init__(self, signums: tuple[int, ...] = EXIT_SIGNALS) -> None:
        self.received: int | None = None
        self._received_at = 0.0
        self._previous: dict[int, Any] = {}
        # Python delivers signals to the main thread only, and refuses handlers from others.
        if threading.current_thread() is threading.main_thread():
            for signum in signums:
                self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        now = time.monotonic()
        if self.received is not None:
            if now - self._received_at < REPEAT_WINDOW_S:
                return  # the same request delivered twice: keep saving
            signal.signal(
                signum, signal.SIG_DFL
            )  # a later one: die as if no handler were installed
            os.kill(os.getpid(), signum)
        self.received = signum
        self._received_at = now

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()


class StopPolicy:
    """One stop decision per step for all ranks: an exit signal anywhere, or the time limit."""

    def __init__(self, exit_duration_minutes: float | None, device: torch.device) -> None:
        self.limit_s = None if exit_duration_minutes is None else 60 * exit_duration_minutes
        self.device = device
        self.started = time.monotonic()
        self.signals = ExitSignals()

    def check(self) -> str | None:
        """ "signal", "time" or None, the same on every rank (a collective: all ranks call it)."""
        late = self.limit_s is not None and time.monotonic() - self.started > self.limit_s
        flags = torch.tensor(
            [float(self.signals.received is not None), float(late)], device=self.device
        )
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[0].item():
            return "signal"
        return "time" if flags[1].item() else None

    def close(self) -> None:
        """Give the signal handlers back."""
        self.signals.restore()
