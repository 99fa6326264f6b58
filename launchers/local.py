"""The local executor: NeMo-Run's LocalExecutor running torchrun in the foreground.

The ranks run `python -m training.entry --config <run dir>/config.yaml` as a NeMo-Run
`run.Script(..., m=True)` under NeMo-Run's torchrun launcher; they never import NeMo-Run. NeMo-Run
keeps its experiment record (logs, status) under NEMORUN_HOME, which defaults to <run dir>/nemo_run
so that a run's files stay together. `nemo experiment status|logs <id>` looks in the
NEMORUN_HOME of its own shell (~/.nemo_run unless exported), so the commands printed after a run
carry `NEMORUN_HOME=<that folder>` whenever it differs; <run dir>/launch.json keeps the experiment
id, that folder, this process's pid and host, and the run's final state for `recipes runs`.
`nemo experiment cancel` cannot stop a local run from another shell (NeMo-Run 0.11's local
scheduler keeps its processes in the memory of the process that started them: KeyError); SIGTERM
to the pid in launch.json does, through the Forwarder below (save, then exit).
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from config import paths
from config.tree import ConfigError
from launchers.env import EnvPlan
from launchers.slurm import ENTRY_MODULE


def local_executor(procs_per_node: int, env: Mapping[str, str]) -> Any:
    """NeMo-Run's LocalExecutor: one node, `procs_per_node` ranks under torchrun."""
    import nemo_run as run

    return run.LocalExecutor(
        ntasks_per_node=procs_per_node, launcher="torchrun", env_vars=dict(env)
    )


def process_env(plan: EnvPlan, user_env: Mapping[str, str]) -> dict[str, str]:
    """What the executor adds to the inherited environment: defaults the user has not set, and
    the interpreter's paths (`interpreter_env`)."""
    return plan.process_env(user_env) | interpreter_env(user_env)


def interpreter_env(user_env: Mapping[str, str]) -> dict[str, str]:
    """PATH and PYTHONPATH of the local ranks: this interpreter's bin/ first on PATH, so that
    torchrun and python are the venv's, and the project's folder as this process imports it first
    on PYTHONPATH, so that the ranks run this process's code (their working directory stays off
    sys.path: PYTHONSAFEPATH, launchers/env.py). A site-packages folder is not put there: on
    PYTHONPATH it would come before the standard library, and the ranks find it anyway."""
    bin_dir = str(Path(sys.executable).parent)
    env = {"PATH": os.pathsep.join([bin_dir, user_env.get("PATH", os.defpath)])}
    root = project_root()
    if root not in _site_dirs():
        theirs = [p for p in user_env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
        env["PYTHONPATH"] = os.pathsep.join([root, *theirs])
    return env


def project_root() -> str:
    """The folder holding the `training` package this process imports (and its siblings)."""
    import training

    return str(Path(training.__file__).resolve().parent.parent)


def _site_dirs() -> set[str]:
    import site

    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return {str(Path(d).resolve()) for d in dirs}


def config_argument(config: Path, cwd: Path | None = None) -> str:
    """The --config argument for torchrun.

    NeMo-Run 0.11.1 shell-quotes torchrun's arguments and then starts it without a shell, so an
    argument that needs quoting reaches the ranks with the quotes inside. A path relative to the
    working directory (runs/<recipe>-<time>/config.yaml) needs none; otherwise the absolute path
    must need none either.
    """
    relative = os.path.relpath(config, cwd or Path.cwd())
    for candidate in ([] if relative.startswith("..") else [relative]) + [str(config)]:
        if shlex.quote(candidate) == candidate:
            return candidate
    raise ConfigError(
        [
            (
                "logging.run_dir",
                f"{config.parent}: a local run directory may hold only letters, digits and ._-/+@%=:, (NeMo-Run 0.11.1 passes torchrun's arguments quoted twice); pick another logging.run_dir",
            )
        ]
    )


def entry_script(config_arg: str) -> Any:
    """`python -m training.entry --config PATH` as a NeMo-Run Script."""
    import nemo_run as run

    return run.Script(path=ENTRY_MODULE, m=True, entrypoint="python", args=["--config", config_arg])


def dryrun_command(executor: Any, script: Any) -> str:
    """The torchrun command NeMo-Run would start (its own packaging; the rdzv id is random)."""
    from nemo_run.run.torchx_backend.packaging import package

    role = package("train", script, executor, serialize_metadata_for_scripts=False).roles[0]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in executor.env_vars.items() if k != "PATH")
    return f"{env} {role.entrypoint} {' '.join(role.args)}".strip()


def nemorun_home(run_dir: Path, user_env: Mapping[str, str]) -> Path:
    """NEMORUN_HOME: the user's if set, else <run dir>/nemo_run; it must be writable."""
    home = Path(user_env.get("NEMORUN_HOME") or run_dir / "nemo_run").expanduser()
    try:
        home.mkdir(parents=True, exist_ok=True)
        probe = home / ".write-test"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise ConfigError(
            [
                (
                    "NEMORUN_HOME",
                    f"{home} is not writable ({err.strerror}); NeMo-Run keeps its experiment records there: set NEMORUN_HOME to a writable folder",
                )
            ]
        ) from None
    return home


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_INTERRUPTED = 130  # the shell's code for a run ended by Ctrl-C


class Forwarder:
    """Ctrl-C, SIGTERM and a closed terminal, passed on to the ranks.

    torchrun starts in its own session and starts each rank in another, so a terminal's Ctrl-C
    (SIGINT to the foreground process group) reaches this process alone, and a SIGTERM or hangup
    that ended it would leave torchrun and the ranks training as orphans. The first such signal
    sends the ranks SIGUSR1, their exit signal (training/resilience/stop.py): every rank stops at the same
    step boundary, saves a checkpoint and exits 0, and torchrun with them. A second one kills every
    process below this one at once: the checkpoint being written stays an iter_N.tmp folder, never
    published, which the next run removes (training/checkpoint/store.py).

    The handler only records the signal; a thread of this class does the work. Python runs a
    handler in the main thread, between any two bytecodes, even those of the same handler still
    running: a second Ctrl-C while the first was being handled (importing psutil, walking /proc)
    re-entered it. And whatever a handler raises surfaces in NeMo-Run's wait for the job, which
    then waits for a torchrun that nothing signalled, forever. Appending to a list and putting on a
    queue are single calls into C: they cannot be re-entered half-done, and do not raise.
    """

    def __init__(self) -> None:
        self.received: list[int] = []  # every stop signal, in order; `count` is how many
        self.signalled: list[Any] = []  # the processes told to stop, waited for at the end
        self._pending: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._work, name="stop-signals", daemon=True)
        self._previous: dict[int, Any] = {}

    @property
    def count(self) -> int:
        return len(self.received)

    def __enter__(self) -> Forwarder:
        import psutil  # here, never in a handler (above)

        self._psutil = psutil
        self._worker.start()
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._pending.put(None)  # after every signal received: they are handled first
        self._worker.join(timeout=60)

    def _handle(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        self._pending.put(signum)

    def _work(self) -> None:
        handled = 0
        while (signum := self._pending.get()) is not None:
            handled += 1
            name = signal.Signals(signum).name
            try:
                self._stop(name, first=handled == 1)
            except Exception as err:  # psutil.Error, OSError: say so, and take the next signal
                print(f"\n{name}: could not pass it on to the ranks: {err!r}", file=sys.stderr)

    def _stop(self, name: str, first: bool) -> None:
        below = self._psutil.Process().children(recursive=True)
        if first:
            print(
                f"\n{name}: the ranks save a checkpoint at the next step and exit "
                "(again to stop at once, without saving)",
                file=sys.stderr,
                flush=True,
            )
            self.signalled += below
            _send([p for p in below if _is_rank(p)], signal.SIGUSR1)
            return
        print(f"\n{name} again: stopping every process now, without saving", file=sys.stderr)
        self.signalled += below
        _send(self.signalled, signal.SIGKILL)

    def wait(self, timeout: float = 120.0) -> None:
        """Return once every process told to stop is gone: torchrun may end before its ranks have
        finished exiting. Whatever outlives `timeout` is killed."""
        _, alive = self._psutil.wait_procs(list(self.signalled), timeout=timeout)
        _send(alive, signal.SIGKILL)
        self._psutil.wait_procs(alive, timeout=10)


def _is_rank(process: Any) -> bool:
    try:
        return ENTRY_MODULE in " ".join(process.cmdline())
    except Exception:  # psutil.Error: it ended meanwhile
        return False


def _send(processes: list[Any], signum: int) -> None:
    for process in processes:
        try:
            process.send_signal(signum)
        except Exception:  # psutil.NoSuchProcess: it ended meanwhile
            pass


def write_record(run_dir: Path, **fields: Any) -> None:
    """Merge `fields` into <run dir>/launch.json (read by `recipes runs`)."""
    path = run_dir / paths.LAUNCH_RECORD
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    record.update(fields)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def experiment_commands(exp_id: str, home: Path, user_env: Mapping[str, str]) -> list[str]:
    """`nemo experiment status|logs` for this run, as they work from this shell: with NEMORUN_HOME
    set in front unless the shell's own NEMORUN_HOME (or NeMo-Run's default) is it."""
    default = Path(user_env.get("NEMORUN_HOME") or "~/.nemo_run").expanduser()
    prefix = (
        "" if default.resolve() == home.resolve() else f"NEMORUN_HOME={shlex.quote(str(home))} "
    )
    return [
        f"{prefix}nemo experiment {verb} {exp_id}{' 0' if verb != 'status' else ''}"
        for verb in ("status", "logs")
    ]


def run_local(executor: Any, script: Any, name: str, home: Path, run_dir: Path) -> int:
    """Run in the foreground, streaming the ranks' output; 0 when every rank succeeded, 130 when a
    Ctrl-C (or SIGTERM, hangup) stopped it, 1 when a rank failed. The experiment's id, NEMORUN_HOME
    and final state go to <run dir>/launch.json."""
    import nemo_run as run
    from nemo_run.config import set_nemorun_home

    set_nemorun_home(str(home))
    with Forwarder() as forwarder:
        # NeMo-Run's own goodbye lines name `nemo experiment ...` without NEMORUN_HOME: ours below.
        with run.Experiment(
            name, executor=executor, log_level="WARN", enable_goodbye_message=False
        ) as exp:
            exp.add(script, name="train")
            write_record(
                run_dir,
                executor="local",
                experiment_id=exp._id,
                nemorun_home=str(home),
                pid=os.getpid(),  # SIGTERM stops the run: it saves, then exits
                host=socket.gethostname(),
                state="RUNNING",
            )
            exp.run(sequential=True, tail_logs=True)
        status = exp.status(return_dict=True) or {}
        if forwarder.count:  # a second Ctrl-C meanwhile still kills at once
            forwarder.wait()
    state = str(status.get("train", {}).get("status", "UNKNOWN"))
    code = 0 if state.startswith("SUCCEEDED") else 1
    if forwarder.count:
        state, code = "INTERRUPTED", EXIT_INTERRUPTED
    write_record(run_dir, state=state.removeprefix("AppState."), exit_code=code)
    print(
        "NeMo-Run's records of this run:",
        *experiment_commands(exp._id, home, os.environ),
        sep="\n  ",
    )
    if forwarder.count:
        saved = "after its checkpoint" if forwarder.count == 1 else "without a checkpoint"
        print(f"training stopped by a signal, {saved}; the same command resumes", file=sys.stderr)
    elif code:
        print(f"training ended {state}; logs: {home}/experiments/{name}", file=sys.stderr)
    return code
