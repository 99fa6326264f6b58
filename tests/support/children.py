"""Processes that tests start, and that die with the test that started them.

Every process a test starts goes through here: `run` (as subprocess.run) for one that runs to its
end, `started` (a `with` block around subprocess.Popen) for one the test talks to meanwhile, and
`start` / `stop` for one that a fixture owns.

- Each child starts in a session of its own, so a Ctrl-C at the terminal reaches pytest alone
  (pytest then stops its children as below), and its process group can be signalled whole.
- Each child carries a token in its environment (MARKER), and so does everything it starts, even
  processes that leave its process group: torchrun starts every rank in a session of its own, and
  a rank's multiprocessing helpers outlive a rank killed by SIGKILL. /proc/PID/environ names them.
- Stopping a child: SIGTERM to its process group and to every process carrying its token,
  GRACE_S for them to exit, then SIGKILL to whatever is left, until nothing carries the token.

That happens on every way out of a test: at the end of `run` or of the `with started(...)` block,
whether the test passed or failed; when pytest-timeout fires (its signal method, set in
pyproject.toml, raises inside the test, so these `finally` blocks run); on Ctrl-C (SIGINT), and on
SIGTERM or SIGHUP to pytest, which tests/conftest.py turns into the same interrupt. A fixture's
children stop at its teardown; whatever a test left running stops when the test ends, and at the end
of the session every process carrying the session's token (tests/conftest.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

MARKER = "RECIPES_TEST_CHILD"  # space-separated tokens: the sessions and children it belongs to
# Between SIGTERM and SIGKILL; RECIPES_TEST_GRACE_S shortens it where a test stops processes
# that ignore SIGTERM on purpose (tests/unit/test_children.py).
GRACE_S = float(os.environ.get("RECIPES_TEST_GRACE_S", "5"))
KILL_WAIT_S = 30.0  # for the kernel to take what SIGKILL ended (bounded, never expected to pass)
POLL_S = 0.05
# Delivered after a stop, never during one: an interrupt in the middle would leave the rest running.
_DEFERRED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM}

SESSION = f"s{uuid.uuid4().hex[:12]}"  # this process's token: every child of it carries it too
_count = 0  # children started so far; the n-th child's token is f"{SESSION}-{n}"
_live: dict[int, subprocess.Popen] = {}  # number -> child, until it is stopped


def _tokens(env: dict[str, str] | None) -> list[str]:
    """The tokens a child inherits: those of whatever started this process, and this session's."""
    inherited = os.environ.get(MARKER, "").split() + (env or {}).get(MARKER, "").split()
    return list(dict.fromkeys([*inherited, SESSION]))


def adopt_descendants() -> None:
    """Every process started from now on, by this one or by its children however they start
    theirs (pytest-xdist's workers), carries this session's token: `sweep` stops them all."""
    os.environ[MARKER] = " ".join(_tokens(None))


def start(args: Sequence[str] | str, *, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """subprocess.Popen(args, ...) in a session of its own, marked; stopped by `stop`, or when the
    test that started it ends, or at the end of the session. Returns the Popen, with `.token`."""
    if "start_new_session" in kwargs or "process_group" in kwargs:
        raise TypeError("tests.support.children starts every child in a session of its own")
    global _count
    _count += 1
    token = f"{SESSION}-{_count}"
    child_env = dict(os.environ if env is None else env)
    child_env[MARKER] = " ".join([*_tokens(env), token])
    proc = subprocess.Popen(args, env=child_env, start_new_session=True, **kwargs)
    proc.token, proc.number = token, _count  # type: ignore[attr-defined]
    _live[_count] = proc
    return proc


@contextmanager
def started(args: Sequence[str] | str, **kwargs: Any) -> Iterator[Any]:
    """`start(args, ...)` for the `with` block; stopped when it ends, however it ends."""
    proc = start(args, **kwargs)
    try:
        yield proc
    finally:
        stop(proc)


def run(
    args: Sequence[str] | str,
    *,
    input: str | bytes | None = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    keep_descendants: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess:
    """subprocess.run with the same arguments; nothing it started outlives it, whatever ends it
    (its end, its timeout, an exception in this process).

    `keep_descendants`: only its process group is stopped; what it handed to a daemon lives on (a
    batch job that sbatch gave to Slurm: the test cancels it, and the daemons' fixture stops them).
    """
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    proc = start(args, **kwargs)
    try:
        try:
            out, err = proc.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            stop(proc, descendants=not keep_descendants)
            expired.stdout, expired.stderr = proc.communicate()
            raise
    finally:
        stop(proc, descendants=not keep_descendants)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def marked(token: str) -> list[int]:
    """The processes alive now whose environment carries `token` (zombies have none)."""
    needle = f"{MARKER}=".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for var in environ.split(b"\0"):
            if var.startswith(needle):
                if token in var[len(needle) :].decode(errors="replace").split():
                    found.append(int(entry.name))
                break
    return found


def leftovers(proc: Any, wait_s: float = 10.0) -> list[int]:
    """What `proc` started and is still running once `proc` has ended (given `wait_s` to exit):
    nothing, for a program that cleans up after itself."""
    proc.wait()
    deadline = time.monotonic() + wait_s
    while (left := marked(proc.token)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return left


def stop(proc: Any, grace_s: float = GRACE_S, descendants: bool = True) -> None:
    """Stop `proc`, its process group and everything carrying its token (with `descendants`):
    SIGTERM, `grace_s`, then SIGKILL. Quick when all of it has ended already. Interrupts that
    arrive meanwhile are delivered afterwards."""
    _live.pop(proc.number, None)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
    try:
        _terminate(proc, proc.token if descendants else None, grace_s)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def count() -> int:
    """How many children this process has started so far (for `stop_all(since=...)`)."""
    return _count


def stop_all(since: int = 0, grace_s: float = GRACE_S) -> None:
    """Stop every child still running that was started after the `since`-th (`count()` then)."""
    for number, proc in list(_live.items()):
        if number > since:
            stop(proc, grace_s)


def sweep(grace_s: float = GRACE_S) -> None:
    """Stop every process this session started, and what they started, still running."""
    stop_all(grace_s=grace_s)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED)
    try:
        _terminate(None, SESSION, grace_s)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _terminate(proc: subprocess.Popen | None, token: str | None, grace_s: float) -> None:
    def running() -> bool:
        return (proc is not None and proc.poll() is None) or bool(token and marked(token))

    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if not running():
            break
        if proc is not None and proc.returncode is None:  # not reaped: its group id is still its
            _signal(os.killpg, proc.pid, signum)
        for pid in marked(token) if token else []:
            _signal(os.kill, pid, signum)
        deadline = time.monotonic() + wait_s
        while running() and time.monotonic() < deadline:
            time.sleep(POLL_S)
    if proc is not None:
        proc.wait()


def _signal(send: Any, target: int, signum: int) -> None:
    try:
        send(target, signum)
    except (ProcessLookupError, PermissionError):  # ended meanwhile
        pass
