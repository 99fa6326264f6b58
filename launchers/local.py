"""The local executor: NeMo-Run's LocalExecutor running torchrun in the foreground.

The ranks run `python -m training.entry --config <run dir>/config.yaml` as a NeMo-Run
`run.Script(..., m=True)` under NeMo-Run's torchrun launcher; they never import NeMo-Run. NeMo-Run
keeps its experiment record (logs, status, `nemo experiment logs`) under NEMORUN_HOME, which
defaults to <run dir>/nemo_run so that a run's files stay together.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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
    this interpreter's bin/ first on PATH so that torchrun and python are the venv's."""
    env = plan.process_env(user_env)
    env["PATH"] = os.pathsep.join(
        [str(Path(sys.executable).parent), user_env.get("PATH", os.defpath)]
    )
    return env


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


def run_local(executor: Any, script: Any, name: str, home: Path) -> int:
    """Run in the foreground, streaming the ranks' output; 0 when every rank succeeded."""
    import nemo_run as run
    from nemo_run.config import set_nemorun_home

    set_nemorun_home(str(home))
    with run.Experiment(name, executor=executor, log_level="WARN") as exp:
        exp.add(script, name="train")
        exp.run(sequential=True, tail_logs=True)
    status = exp.status(return_dict=True) or {}
    state = str(status.get("train", {}).get("status", "UNKNOWN"))
    if not state.startswith("SUCCEEDED"):
        print(f"training ended {state}; logs: {home}/experiments/{name}", file=sys.stderr)
        return 1
    return 0
