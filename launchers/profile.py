"""A cluster profile: everything about *where* a job runs, in one TOML file (`--cluster PATH`).

Recipes say what to train; the profile says how this cluster wants jobs: the Slurm account and
partition, the wall time, the container image and mounts (or the venv), and the fabric variables
its network needs. Keys are strict: a misspelled key is an error naming the closest valid one, so
`partiton = "batch"` can never be silently ignored and land the job in the default partition.

    executor = "slurm"                       # slurm | slurm-apptainer | slurm-bare | local
    account = "llm"
    partition = "batch"
    time = "04:00:00"
    gpus_per_node = 8
    container_image = "nvcr.io#nvidia/pytorch:25.04-py3"
    mounts = ["/lustre/fsw/llm:/lustre/fsw/llm"]
    [fabric]
    NCCL_IB_HCA = "mlx5"
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.tree import ConfigError, field_types, suggest

EXECUTORS = ("local", "slurm", "slurm-apptainer", "slurm-bare")
CONTAINERISED = ("slurm", "slurm-apptainer")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# `time` in Slurm's formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS.
TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\Z")


@dataclass(kw_only=True, slots=True)
class Profile:
    """One cluster. Every field is optional so that a profile holds only what differs."""

    executor: str = "slurm"
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    reservation: str | None = None
    constraint: str | None = None
    exclusive: bool = True  # whole nodes: NCCL and the memory estimate assume nobody else is there
    time: str = "01:00:00"  # wall time of each job (of each link of a --chain)
    # Save a checkpoint and exit this long before the wall time (checkpoint write + margin).
    exit_margin_minutes: float = 10.0
    nodes: int | None = None  # default for --nodes
    gpus_per_node: int | None = None  # default for --gpus-per-node
    gpu: str | None = None  # default for --gpu: a100, h100, h200, b200, gb200
    cpus_per_task: int | None = None  # one task per node runs torchrun and all its ranks
    mem: str | None = None  # e.g. "0" (all of the node's memory)
    sbatch_flags: list[str] = field(default_factory=list)  # anything else, e.g. "--gres=gpu:8"
    job_dir: str | None = None  # sbatch scripts and Slurm logs; None: <run dir>/slurm
    run_root: str | None = None  # where run directories go; None: ./runs
    # Containers: an image pyxis understands (registry#image:tag or .sqsh) or an Apptainer .sif.
    container_image: str | None = None
    mounts: list[str] = field(default_factory=list)  # "host[:container[:flags]]"
    workdir: str | None = None  # the ranks' working directory (inside the container)
    mpi: str | None = None  # pyxis: srun --mpi=pmix where the cluster's PMIx wants it
    venv: str | None = None  # slurm-bare: the virtual environment to activate on every node
    setup: list[str] = field(default_factory=list)  # shell lines before srun ("module load ...")
    rdzv_port: int = 29500  # torchrun's c10d rendezvous on the first node
    env: dict[str, str] = field(
        default_factory=dict
    )  # cluster-owned, e.g. HF_HOME, TRITON_CACHE_DIR
    fabric: dict[str, str] = field(
        default_factory=dict
    )  # NCCL_IB_*, NCCL_SOCKET_IFNAME, UCX_*, FI_*

    @property
    def time_minutes(self) -> float:
        return time_to_minutes(self.time)

    @property
    def containerised(self) -> bool:
        return self.executor in CONTAINERISED


def time_to_minutes(text: str) -> float:
    """Slurm's time formats as minutes ("04:00:00" -> 240, "1-00:00:00" -> 1440, "30" -> 30)."""
    match = TIME.match(text.strip())
    if not match:
        raise ConfigError([("time", f"'{text}' is not a Slurm time (HH:MM:SS, D-HH:MM:SS or MM)")])
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 1440 + a * 60 + (b or 0) + (c or 0) / 60
    if c is not None:  # HH:MM:SS
        return a * 60 + b + c / 60
    if b is not None:  # MM:SS
        return a + b / 60
    return float(a)  # MM


def _check_type(key: str, value: Any, tp: Any) -> list[tuple[str, str]]:
    """Problems with one TOML value against the field's declared type."""
    text = str(tp)
    if "dict" in text:
        if not isinstance(value, dict):
            return [(key, f"expected a table [{key}], got {value!r}")]
        bad = [k for k, v in value.items() if not isinstance(v, str | int | float | bool)]
        return [(f"{key}.{k}", "values must be strings or numbers") for k in bad]
    if "list" in text:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return [(key, f"expected a list of strings, got {value!r}")]
        return []
    wanted = {"str": str, "int": int, "float": (int, float), "bool": bool}
    for name, cls in wanted.items():
        if name in text:
            ok = isinstance(value, cls) and (name == "bool" or not isinstance(value, bool))
            return [] if ok else [(key, f"expected {name}, got {value!r}")]
    return []


def from_toml(data: dict[str, Any], source: str = "profile") -> Profile:
    """A Profile from parsed TOML, with every problem (unknown keys, types, values) at once."""
    types = field_types(Profile)
    problems: list[tuple[str, str]] = []
    for key, value in data.items():
        if key not in types:
            hint = suggest(key, list(types)) or f" Valid keys: {', '.join(types)}."
            problems.append((key, f"unknown key in {source}.{hint}"))
        else:
            problems += _check_type(key, value, types[key])
    if problems:
        raise ConfigError(problems)
    values = {
        k: ({n: str(v) for n, v in d.items()} if isinstance(d, dict) else d)
        for k, d in data.items()
    }
    if isinstance(values.get("exit_margin_minutes"), int):
        values["exit_margin_minutes"] = float(values["exit_margin_minutes"])
    return check_profile(Profile(**values))


def check_profile(profile: Profile) -> Profile:
    """`profile` itself, or ConfigError with every problem of its values (after any replace)."""
    problems = _check_values(profile)
    if problems:
        raise ConfigError(problems)
    return profile


def _check_values(p: Profile) -> list[tuple[str, str]]:
    from launchers.env import env_problems, fabric_problems, is_secret

    problems: list[tuple[str, str]] = []
    if p.executor not in EXECUTORS:
        hint = suggest(p.executor, list(EXECUTORS)) or f" Choose one of {', '.join(EXECUTORS)}."
        problems.append(("executor", f"unknown executor '{p.executor}'.{hint}"))
    try:
        minutes = time_to_minutes(p.time)
        if minutes <= p.exit_margin_minutes:
            problems.append(
                (
                    "exit_margin_minutes",
                    f"{p.exit_margin_minutes} leaves no training time in time={p.time}; lower it or raise time",
                )
            )
    except ConfigError as err:
        problems += err.problems
    if p.executor == "slurm-bare" and not p.venv:
        problems.append(
            ("venv", 'slurm-bare needs venv = "/path/to/.venv" (activated on every node)')
        )
    if p.executor in CONTAINERISED and not p.container_image:
        problems.append(
            ("container_image", f"{p.executor} needs container_image (see containers/)")
        )
    for name in p.env:
        if not NAME.match(name):
            problems.append((f"env.{name}", "not a valid environment variable name"))
        elif is_secret(name):
            problems.append(
                (
                    f"env.{name}",
                    f"looks like a secret: never write it in a file; export {name} in your shell and it is forwarded by name",
                )
            )
    problems += env_problems(p.env) + fabric_problems(p.fabric)
    return problems


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile TOML; raises ConfigError naming every bad key."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            [("--cluster", f"no profile at {path}; see launchers/profiles/ for examples")]
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([("--cluster", f"{path} is not valid TOML: {err}")]) from None
    return from_toml(data, source=path.name)


def replace(profile: Profile, **changes: Any) -> Profile:
    """A checked copy with some fields changed (e.g. the executor chosen on the command line)."""
    return check_profile(dataclasses.replace(profile, **changes))
