"""The hang watchdog: a rank that makes no progress dumps its stacks and exits, so the job ends.

A hung collective (a rank that died without its peers noticing, a deadlock, a NIC that stopped)
waits forever: NCCL's own timeout is long and not every hang is a collective. Here a thread per
rank watches a deadline that the train loop moves at every step:

- during a training step: max(resilience.hang_min_seconds, resilience.hang_timeout_factor x the
  slowest of the recent steps), the first step of the process (warm-up, compilation) left out;
- up to the first step and between steps (evaluation, checkpoint saves, the stop decision):
  resilience.hang_startup_seconds.

Past the deadline the rank writes every thread's Python stack (faulthandler) to stderr and to
<run_dir>/hang/<job>/rank<N>.txt, and ends with `os._exit(HANG_EXIT_CODE)`: no cleanup can run
while a collective holds the main thread, and a non-zero exit makes torchrun stop the other ranks
(and the sbatch script requeue the job). Before it exits it waits a few polls, and every other
rank's watchdog that sees the dump folder (looked for once a rank has itself made no progress for
half of hang_min_seconds) dumps its own stacks too: the rank that hangs is rarely the one whose
deadline passes first (the others wait for it in the next step's collective).
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from config.schema import TrainingConfig

HANG_EXIT_CODE = 75  # EX_TEMPFAIL: a retry may succeed (what a requeue does)
RECENT_STEPS = 20  # the steps whose slowest sets the allowance


def hang_folder(run_dir: Path) -> Path:
    """Where this job's ranks write their stacks: one folder per torchrun job (its run id, the
    Slurm job id under our sbatch scripts), so a requeued job never mistakes an old dump for one
    of its own."""
    return Path(run_dir) / "hang" / os.environ.get("TORCHELASTIC_RUN_ID", "local")


class Watchdog:
    """A deadline moved by `step_started` / `step_ended`; a thread acts once it has passed.

    `clock` and `on_hang` are there for tests: `overdue(now)` is the pure check."""

    def __init__(
        self,
        rank: int,
        run_dir: Path,
        *,
        min_seconds: float,
        factor: float,
        startup_seconds: float,
        clock: Callable[[], float] = time.monotonic,
        on_hang: Callable[[str], None] | None = None,
    ) -> None:
        self.rank, self.folder = rank, hang_folder(run_dir)
        self.min_seconds, self.factor, self.startup_seconds = min_seconds, factor, startup_seconds
        self.clock = clock
        self.on_hang = on_hang or self._dump_and_exit
        self.recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self._steps_seen = 0
        # (what runs, its allowance, its deadline): one tuple, so the thread never reads a phase
        # with another phase's deadline
        self._state = (
            "start-up (before the first step)",
            startup_seconds,
            clock() + startup_seconds,
        )
        # Polls often enough to act within a few percent of the smallest allowance.
        self.poll_s = min(5.0, max(0.05, min(min_seconds, startup_seconds) / 20))
        self._started = time.time()  # wall clock: dumps older than this are an earlier job's
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def step_allowance(self) -> float:
        """The allowance of one training step."""
        slowest = max(self.recent, default=0.0)
        if not self.recent:  # no step timed yet: the first step includes the warm-up
            return max(self.min_seconds, self.startup_seconds)
        return max(self.min_seconds, self.factor * slowest)

    def step_started(self) -> None:
        self._set("a training step", self.step_allowance)

    def step_ended(self, seconds: float) -> None:
        """A step took `seconds`; what follows until the next step has the start-up allowance."""
        self._steps_seen += 1
        if self._steps_seen > 1:  # the first one carries the warm-up
            self.recent.append(seconds)
        self._set(
            "the work between steps (evaluation, checkpoint, stop decision)", self.startup_seconds
        )

    def _set(self, phase: str, allowance: float) -> None:
        self._state = (phase, allowance, self.clock() + allowance)

    def overdue(self, now: float) -> str | None:
        """What has made no progress, and for how long, if the deadline has passed."""
        phase, allowance, deadline = self._state
        if now <= deadline:
            return None
        return f"no progress in {phase} for {allowance:g} s ({self._describe()})"

    def stuck_for(self, now: float) -> float:
        """Seconds since the deadline last moved (the last step boundary)."""
        _, allowance, deadline = self._state
        return now - (deadline - allowance)

    def _describe(self) -> str:
        slowest = max(self.recent, default=None)
        recent = f"slowest recent step {slowest:.2f} s" if slowest is not None else "no step timed"
        return (
            f"{recent}; resilience.hang_min_seconds={self.min_seconds:g}, "
            f"hang_timeout_factor={self.factor:g}, hang_startup_seconds={self.startup_seconds:g}"
        )

    # --- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.poll_s + 1)
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = self.clock()
            why = self.overdue(now)
            # Only a rank that is stuck itself looks for a peer's dump: one stat of a shared
            # folder per poll and rank would load a parallel filesystem's metadata server.
            if why is None and self.stuck_for(now) > self.min_seconds / 2 and self._peer_dumped():
                why = f"another rank's watchdog fired (its stacks are in {self.folder})"
            if why is not None:
                self.on_hang(why)
                return

    def _peer_dumped(self) -> bool:
        """Whether another rank of this job has dumped its stacks since this watchdog started."""
        if self._stop.is_set() or not self.folder.is_dir():
            return False
        try:
            return any(
                p.name != f"rank{self.rank}.txt" and p.stat().st_mtime >= self._started - 1
                for p in self.folder.iterdir()
            )
        except OSError:
            return False

    def _dump_and_exit(self, why: str) -> None:
        header = f"hang watchdog: rank {self.rank}: {why}; dumping every thread's stack\n"
        sys.stderr.write(header)
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with open(self.folder / f"rank{self.rank}.txt", "w", encoding="utf-8") as f:
                f.write(header)
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        except OSError as err:
            sys.stderr.write(f"hang watchdog: could not write {self.folder}: {err}\n")
        sys.stderr.write(f"hang watchdog: rank {self.rank} exits {HANG_EXIT_CODE}\n")
        sys.stderr.flush()
        time.sleep(3 * self.poll_s + 1)  # the other ranks see the folder and dump theirs
        os._exit(HANG_EXIT_CODE)


def watchdog_for(cfg: TrainingConfig, rank: int, run_dir: Path) -> Watchdog | None:
    """The watchdog `cfg.resilience` asks for (started), or None when it is off."""
    res = cfg.resilience
    if not res.hang_min_seconds:
        return None
    dog = Watchdog(
        rank,
        run_dir,
        min_seconds=res.hang_min_seconds,
        factor=res.hang_timeout_factor,
        startup_seconds=res.hang_startup_seconds,
    )
    dog.start()
    return dog
