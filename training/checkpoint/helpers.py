"""Megatron-Core's checkpoint helper process, made to outlive the job's exit signals.

At its first save, Megatron-Core's writer (dist_checkpointing/strategies/filesystem_async.py,
`get_write_results_queue`) starts a `multiprocessing.Manager` in a spawned interpreter and keeps its
queue for every later save, synchronous (the CPU) or asynchronous (forked writers on GPUs). That
helper is a child of the rank, in the rank's process group, and a spawned interpreter has default
signal dispositions. So Slurm's `--signal=USR1@margin` and `scancel --signal`, which signal every
process of the job step, and torchrun, which forwards SIGTERM to each rank's process group, kill it
while the ranks wait for the step boundary; the exit save then fails with BrokenPipeError, and the
chain loses every step since the last interval save.

A synchronous save (the CPU's) runs the writer in the rank itself, so it needs no second process:
`results_queue(asynchronous=False)` hands the writer an in-process queue instead, which no signal
can take away and which costs no interpreter start (a spawned helper imports torch to unpickle the
write results: seconds of CPU per rank and run).

`results_queue()` starts that helper the way it has to live: the exit signals ignored (blocked in the
rank while the interpreter starts, then ignored by the helper itself) and ended by the kernel when
its rank dies (PR_SET_PDEATHSIG), so ignoring signals never leaves it behind as an orphan. It hands
the queue to Megatron-Core (and to NVRx's writer, which keeps a queue of its own) before the first
save, and starts a new helper when the old one is gone
all the same (e.g. SIGKILL). This is glue Megatron-Core lacks: its writer takes neither a queue nor a
process factory.
"""

from __future__ import annotations

import ctypes
import importlib
import multiprocessing as mp
import os
import queue
import signal
import sys
from multiprocessing.managers import SyncManager
from typing import Any

# The exit signals of training/resilience/stop.py, and SIGINT (a Ctrl-C reaches the whole foreground group).
SHIELDED = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
_PR_SET_PDEATHSIG = 1

_manager: SyncManager | None = None
# The writer modules that keep such a queue: Megatron-Core's, and NVRx's (its asynchronous writer).
WRITERS = {
    "mcore": "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "nvrx": "nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async",
}


def _shield(parent: int) -> None:
    """In the helper, before it serves: ignore the exit signals; die with the rank."""
    for signum in SHIELDED:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SHIELDED)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the rank's exit still closes the manager
        pass
    if os.getppid() != parent:  # the rank died before prctl took effect
        os._exit(1)


def alive() -> bool:
    # BaseManager's process, which it does not expose (nor typeshed declare).
    return _manager is not None and _manager._process.is_alive()  # type: ignore[attr-defined]  # noqa: SLF001


def _writers(strategy: str) -> list[Any]:
    names = [WRITERS["mcore"]] + ([WRITERS[strategy]] if strategy != "mcore" else [])
    return [importlib.import_module(name) for name in names]


def results_queue(strategy: str = "mcore", asynchronous: bool = True) -> None:
    """Give the checkpoint writer (Megatron-Core's, and NVRx's with `strategy="nvrx"`) a results
    queue: for asynchronous saves, one whose helper survives the exit signals; for synchronous
    ones (`asynchronous=False`), an in-process queue."""
    global _manager
    writers = _writers(strategy)
    if not asynchronous:
        stop()  # a helper left by an asynchronous run in this process
        local: queue.Queue[Any] = queue.Queue()
        for writer in writers:
            writer._results_queue = local
        return
    if alive() and all(w._results_queue is not None for w in writers):
        return
    manager = SyncManager(ctx=mp.get_context("spawn"))
    # Blocked while the interpreter starts (the mask is inherited), so a signal in that window
    # waits for the rank instead of killing the helper; the rank gets it when unblocked.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SHIELDED)
    try:
        manager.start(initializer=_shield, initargs=(os.getpid(),))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    _manager = manager
    shared = manager.Queue()
    for writer in writers:
        writer._results_queue = shared


def stop() -> None:
    """Take the writers' queue back and end the helper, if any (the run is over); the next run in
    this process gets its own."""
    global _manager
    for name in WRITERS.values():
        writer = sys.modules.get(name)
        if writer is not None:  # a module global of the writer's, which we set
            writer._results_queue = None  # type: ignore[attr-defined]
    if _manager is not None:
        if _manager._process.is_alive():  # type: ignore[attr-defined]  # noqa: SLF001
            _manager.shutdown()
        _manager = None
