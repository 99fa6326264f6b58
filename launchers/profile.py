"""A cluster profile: everything about *where* a job runs, in one TOML file (`--profile FILE`, or
the NAME of one in launchers/profiles/; `--cluster` is an alias).

Recipes say what to train; the profile says how this cluster wants jobs: the Slurm account and
partition, the wall time, the container image and mounts (or the venv), and the fabric variables
its network needs. Keys are strict: a misspelled key is an error naming the closest valid one, so
`partiton = "batch"` can never be silently ignored and land the job in the default partition.
Values are strict too, since any of them may reach a generated script: no control characters (a
newline ends an #SBATCH line, and Slurm reads no option after the next command), no secrets (named
in the error, never shown), `time` in Slurm's formats and a margin sbatch --signal can take.
`check_profile` runs on load, on `replace`, and again on the profile a job is rendered with.

launchers/jobsize.py sizes the job from the command line, then the profile, then the recipe.

    executor = "slurm"                       # slurm | slurm-apptainer | slurm-edf | slurm-bare | local
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
import math
import re
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from config.hardware import NVLINK_TOPOLOGIES, gpu_kind_problem
from config.rules.training import run_name_problem
from config.tree import ConfigError, field_types, suggest
from launchers.mounts import parse_mounts

EXECUTORS = ("local", "slurm", "slurm-apptainer", "slurm-edf", "slurm-bare")
# The container runtime of each Slurm executor: pyxis/enroot, Apptainer, CSCS's Container Engine
# (an EDF file, pyxis underneath).
CONTAINERISED = ("slurm", "slurm-apptainer", "slurm-edf")
GPU_REQUESTS = ("gpus-per-node", "gres", "none")  # how the job asks Slurm for the node's GPUs
# A value still to be filled in: "<your-project>" in a shipped site profile.
PLACEHOLDER = re.compile(r"<[^<>]*>")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# `time` in Slurm's formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS; ASCII digits only, and
# matched whole (fullmatch, no strip): a trailing newline would end the #SBATCH line it is written
# in, and Slurm stops reading options at the line after it.
TIME = re.compile(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?")
TIME_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
# Characters no generated script can carry: a newline ends an #SBATCH line (Slurm then ignores
# every option below it) or a shell line, and shifts the quoting of what follows; the others are
# invisible in review. A tab included: no profile value needs one.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_SIGNAL_S = 0xFFFF  # sbatch --signal=USR1@T refuses T above 65535 seconds
SHIPPED = Path(__file__).resolve().parent / "profiles"  # the profiles `--profile NAME` finds


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
    gpu: str | None = None  # default for --gpu: a GPU kind (config/hardware.py GPUS) or "cpu"
    # default for --nvlink-domain: GPUs joined by NVLink (None: a node; 72 for GB200 NVL72)
    nvlink_domain: int | None = None
    # The scale-out network per GPU, one direction, GB/s (None: the GPU kind's, as in a DGX)
    network_gb_s: float | None = None
    # How NVLink joins a node's GPUs: "switch" (NVSwitch) or "mesh" (each GPU pair linked
    # directly, 4-GPU A100 and GH200 nodes); None: the GPU kind's board for gpus_per_node
    nvlink_topology: str | None = None
    cpus_per_task: int | None = None  # one task per node runs torchrun and all its ranks
    # "gpus-per-node" (#SBATCH --gpus-per-node=G), "gres" (--gres=gpu:G, where a site's Slurm
    # counts GPUs as generic resources only), "none" (the partition hands out whole nodes)
    gpu_request: str = "gpus-per-node"
    # ParaStation's psslurm (JSC) instead of slurmd: no SPANK plugins (so no pyxis), and srun
    # inherits --cpus-per-task only through SRUN_CPUS_PER_TASK, which the job exports.
    psslurm: bool = False
    srun_flags: list[str] = field(default_factory=list)  # more srun options, e.g. "--cpu-bind=none"
    # What starts a node's ranks with torchrun's arguments: torchrun, or a site's wrapper of it
    # (JSC's "torchrun_jsc"); resilience.ft_launcher picks nvidia-resiliency-ext's ft_launcher.
    launcher: str = "torchrun"
    # Appended to the first node's host name for the rendezvous: "i" at JSC, whose "<node>i"
    # names the InfiniBand interface (the plain name is the Ethernet one).
    rdzv_host_suffix: str = ""
    mem: str | None = None  # e.g. "0" (all of the node's memory)
    sbatch_flags: list[str] = field(default_factory=list)  # anything else, e.g. "--gres=gpu:8"
    job_dir: str | None = None  # sbatch scripts and Slurm logs; None: <run dir>/slurm
    run_root: str | None = None  # where run directories go; None: ./runs
    # Containers: an image pyxis understands (registry#image:tag or .sqsh) or an Apptainer .sif.
    container_image: str | None = None
    mounts: list[str] = field(default_factory=list)  # "host[:container[:flags]]"
    workdir: str | None = None  # the ranks' working directory (inside the container)
    # A node-local folder, as the ranks see it (/dev/shm/<you>/data, a node's own disk), to which
    # each node copies an indexed blend before training: data.stage_dir, unless the run sets it.
    stage_data: str | None = None
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
    # slurm-edf: the EDF file's [annotations] (CSCS: the aws-ofi-nccl hook that NCCL needs)
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def time_minutes(self) -> float:
        return time_to_minutes(self.time)

    @property
    def exit_margin_s(self) -> int:
        """The margin as sbatch gets it: --signal=USR1@<whole seconds>."""
        return int(self.exit_margin_minutes * 60)

    @property
    def containerised(self) -> bool:
        return self.executor in CONTAINERISED


def time_to_minutes(text: str) -> float:
    """Slurm's time formats as minutes ("04:00:00" -> 240, "1-00:00:00" -> 1440, "30" -> 30)."""
    match = TIME.fullmatch(text)
    if not match:
        raise ConfigError(
            [("time", f'{text!r} is not a Slurm time ({TIME_FORMATS}); e.g. time = "04:00:00"')]
        )
    a = int(match[2])  # the one number every format has
    days, b, c = (int(g) if g is not None else None for g in match.group(1, 3, 4))
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 1440 + a * 60 + (b or 0) + (c or 0) / 60
    if b is not None and c is not None:  # HH:MM:SS
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
    wanted: dict[str, type | tuple[type, ...]] = {
        "str": str,
        "int": int,
        "float": (int, float),
        "bool": bool,
    }
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
    values: dict[str, Any] = {
        k: ({n: str(v) for n, v in d.items()} if isinstance(d, dict) else d)
        for k, d in data.items()
    }
    if isinstance(values.get("exit_margin_minutes"), int):
        values["exit_margin_minutes"] = float(values["exit_margin_minutes"])
    return check_profile(Profile(**values), source)


def check_profile(profile: Profile, source: str = "the profile") -> Profile:
    """`profile` itself, or ConfigError with every problem of its values (after any replace);
    `source` names the file where a message says where the value is."""
    problems = _check_values(profile, source)
    if problems:
        raise ConfigError(problems)
    return profile


def _check_values(p: Profile, source: str) -> list[tuple[str, str]]:
    from launchers.env import env_problems, fabric_problems

    problems = _type_problems(p)
    if problems:
        return problems  # the checks below read each value as its declared type
    problems = [pr for key, text in _texts(p) for pr in _text_problems(key, text)]
    flagged = {key for key, _ in problems}
    if p.executor not in EXECUTORS:
        hint = suggest(p.executor, list(EXECUTORS)) or f" Choose one of {', '.join(EXECUTORS)}."
        problems.append(("executor", f"unknown executor {p.executor!r}.{hint}"))
    unknown = gpu_kind_problem(p.gpu) if p.gpu is not None and "gpu" not in flagged else None
    if unknown:
        problems.append(("gpu", f"gpu = {p.gpu!r} in {source}: {unknown}"))
    minutes = None
    if "time" not in flagged:
        try:
            minutes = time_to_minutes(p.time)
        except ConfigError as err:
            problems += err.problems
    problems += _margin_problems(p, minutes)
    if p.executor == "slurm-bare" and not p.venv:
        problems.append(
            ("venv", 'slurm-bare needs venv = "/path/to/.venv" (activated on every node)')
        )
    if p.executor in CONTAINERISED and not p.container_image:
        problems.append(
            ("container_image", f"{p.executor} needs container_image (see containers/)")
        )
    problems += _site_problems(p, flagged)
    for i, flag in enumerate(p.sbatch_flags):
        key = f"sbatch_flags[{i}]"
        if key not in flagged and not re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", flag):
            problems.append((key, f"{flag!r} is not one --option or --option=value"))
    if not any(key.startswith("mounts[") for key in flagged):
        try:
            parse_mounts(p.mounts)
        except ConfigError as err:
            problems += err.problems
    problems += _env_name_problems(p.env) + env_problems(p.env) + fabric_problems(p.fabric)
    return problems


def _site_problems(p: Profile, flagged: set[str]) -> list[tuple[str, str]]:
    """The keys that fit a job script to a site: each value one the script can use, and the
    container runtime one the executor (and the batch system) can start."""
    problems = []
    if p.gpu_request not in GPU_REQUESTS:
        problems.append(
            ("gpu_request", f"{p.gpu_request!r} is not one of {', '.join(GPU_REQUESTS)}")
        )
    if p.network_gb_s is not None and not (math.isfinite(p.network_gb_s) and p.network_gb_s > 0):
        problems.append(("network_gb_s", f"{p.network_gb_s!r} is not a bandwidth in GB/s above 0"))
    if p.nvlink_topology not in (None, *NVLINK_TOPOLOGIES):
        problems.append(
            (
                "nvlink_topology",
                f"{p.nvlink_topology!r} is not one of {', '.join(NVLINK_TOPOLOGIES)} (switch: "
                "NVSwitch; mesh: each GPU pair linked directly, as on 4-GPU A100 and GH200 nodes)",
            )
        )
    if p.workdir is not None and not p.workdir.startswith("/"):
        problems.append(("workdir", f"{p.workdir!r} is not an absolute path (the ranks' folder)"))
    if (p.container_image or "").startswith("-"):
        problems.append(
            ("container_image", f"{p.container_image!r} would be read as an option: name a file")
        )
    if p.stage_data is not None and not p.stage_data.startswith("/"):
        problems.append(
            ("stage_data", f"{p.stage_data!r} is not an absolute path to a node-local folder")
        )
    if "launcher" not in flagged and not re.fullmatch(r"[A-Za-z0-9_./+-]+", p.launcher):
        problems.append(("launcher", f"{p.launcher!r} is not one command (e.g. torchrun)"))
    if "rdzv_host_suffix" not in flagged and not re.fullmatch(
        r"[A-Za-z0-9.-]*", p.rdzv_host_suffix
    ):
        problems.append(("rdzv_host_suffix", f"{p.rdzv_host_suffix!r} is not a host-name part"))
    for i, flag in enumerate(p.srun_flags):
        key = f"srun_flags[{i}]"
        if key not in flagged and not re.fullmatch(r"--[a-z][a-z0-9_-]*(=.*)?", flag):
            problems.append((key, f"{flag!r} is not one --option or --option=value"))
    image = p.container_image or ""
    if p.executor == "slurm" and image.endswith(".sif"):
        problems.append(
            (
                "container_image",
                f'{image!r} is an Apptainer image, but executor = "slurm" starts pyxis/enroot, which reads registry#image:tag or a .sqsh; use executor = "slurm-apptainer", or an enroot image (containers/README.md)',
            )
        )
    if p.executor == "slurm-apptainer" and "#" in image and "://" not in image:
        problems.append(
            (
                "container_image",
                f"{image!r} is pyxis's registry#image form, which `apptainer exec` would read as a file; give a .sif (apptainer build, containers/README.md) or docker://registry/image:tag",
            )
        )
    if p.psslurm and p.executor in ("slurm", "slurm-edf"):
        problems.append(
            (
                "executor",
                f'{p.executor} starts its container through pyxis, a SPANK plugin, and psslurm = true (ParaStation, as at JSC) loads none; use executor = "slurm-apptainer" or "slurm-bare"',
            )
        )
    if p.annotations and p.executor != "slurm-edf":
        problems.append(
            ("annotations", f"only slurm-edf writes an EDF file; executor is {p.executor!r}")
        )
    return problems


def placeholders(p: Profile) -> list[str]:
    """The keys whose values are still to be filled in ("<your-project>"): `recipes run` submits
    no job with them."""
    return [key for key, text in _texts(p) if PLACEHOLDER.search(text)]


def placeholder_problem(p: Profile, name: str) -> tuple[str, str] | None:
    """The one problem a profile with placeholders has for a submission, or None."""
    keys = placeholders(p)
    if not keys:
        return None
    stem = Path(name).stem
    return (
        "--profile",
        f"{name} still holds placeholders (<...>) in {', '.join(keys)}: copy it with "
        f"`recipes profiles --show {stem} > my-{stem}.toml`, fill them in, and pass "
        f"--profile my-{stem}.toml (--dryrun renders the job without them)",
    )


def shipped_profiles() -> dict[str, Path]:
    """The profiles `--profile NAME` finds (launchers/profiles/), by name."""
    return {p.stem: p for p in sorted(SHIPPED.glob("*.toml"), key=lambda p: p.stem)}


def _type_problems(p: Profile) -> list[tuple[str, str]]:
    """The TOML type check, for a Profile built in Python too (None where the type allows it)."""
    problems = []
    for key, tp in field_types(Profile).items():
        value = getattr(p, key)
        if not (value is None and "None" in str(tp)):
            problems += _check_type(key, value, tp)
    return problems


def table_key(table: str, name: str) -> str:
    """How an error names one entry of [env] or [fabric] (repr when the name itself is odd)."""
    return f"{table}.{name}" if NAME.match(name) else f"{table}[{name!r}]"


def _texts(p: Profile) -> Iterator[tuple[str, str]]:
    """(profile key, text) of every string in the profile: any of them may reach a script."""
    for f in dataclasses.fields(p):
        value = getattr(p, f.name)
        if isinstance(value, str):
            yield f.name, value
        elif isinstance(value, list):
            yield from ((f"{f.name}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, dict):
            yield from ((table_key(f.name, k), str(v)) for k, v in value.items())


def _text_problems(key: str, text: str) -> list[tuple[str, str]]:
    """A secret (named, never shown), else control characters (shown with repr)."""
    from launchers.env import secrets_in

    found = secrets_in(text)
    if found:
        return [
            (
                key,
                f"{'; '.join(found)}. A secret is never written into a profile or a generated script: delete it here and export it in the shell you submit from (it reaches the ranks by name)",
            )
        ]
    return control_problems(key, text, "delete it from the profile")


def control_problems(key: str, text: str, fix: str) -> list[tuple[str, str]]:
    """A value bound for a generated script must hold no control character (newline, tab, ...)."""
    bad = sorted({repr(c) for c in CONTROL.findall(text)})
    if not bad:
        return []
    return [
        (
            key,
            f"{text!r} holds the control character {', '.join(bad)}: a generated script cannot carry it (a newline ends the #SBATCH or shell line it is in); {fix}",
        )
    ]


def _margin_problems(p: Profile, minutes: float | None) -> list[tuple[str, str]]:
    """The margin becomes --signal=USR1@<whole seconds> and the run's exit_duration_minutes."""
    margin, key = p.exit_margin_minutes, "exit_margin_minutes"
    if not math.isfinite(margin) or int(margin * 60) < 1:
        return [
            (
                key,
                f"{margin!r} is not a finite margin of at least 1 second (1/60 minute): the job saves a checkpoint and exits this many minutes before `time`, and sbatch gets it in whole seconds (--signal=USR1@<s>); e.g. exit_margin_minutes = 10",
            )
        ]
    if p.exit_margin_s > MAX_SIGNAL_S:
        return [
            (
                key,
                f"{margin!r} minutes is {p.exit_margin_s} s, more than sbatch --signal takes ({MAX_SIGNAL_S} s); lower it to at most {MAX_SIGNAL_S // 60}",
            )
        ]
    if minutes is not None and margin >= minutes:
        return [
            (
                key,
                f"{margin!r} leaves no training time in time={p.time!r} ({minutes:g} minutes); lower it or raise time",
            )
        ]
    return []


def _env_name_problems(env: dict[str, str]) -> list[tuple[str, str]]:
    from launchers.env import is_secret

    problems = []
    for name in env:
        if not NAME.match(name):
            problems.append(
                (
                    table_key("env", name),
                    f"{name!r} is not a valid environment variable name (letters, digits and '_', not first a digit)",
                )
            )
        elif is_secret(name):
            problems.append(
                (
                    f"env.{name}",
                    f"looks like a secret: never write it in a file; export {name} in your shell and it is forwarded by name",
                )
            )
    return problems


def run_name_problems(name: str, key: str = "name") -> list[tuple[str, str]]:
    """A run name that would move its run directory out of run_root (config/rules/training.py)."""
    problem = run_name_problem(name, key)
    return [(key, problem)] if problem else []


def check_run_name(name: str, key: str = "name") -> None:
    """ConfigError when `name` would move a run directory out of run_root (see run_name_problems)."""
    problems = run_name_problems(name, key)
    if problems:
        raise ConfigError(problems)


def profile_path(profile: str | Path) -> Path:
    """The TOML file of `--profile NAME|FILE`: a file that exists, else a profile shipped in
    launchers/profiles/ by its name (`slurm` is launchers/profiles/slurm.toml)."""
    path = Path(profile).expanduser()
    shipped = SHIPPED / f"{profile}.toml"
    if not path.is_file() and path.name == str(profile) and shipped.is_file():
        return shipped
    return path


def load_profile(path: str | Path) -> Profile:
    """Read and check a profile (a TOML file, or a shipped profile's name); raises ConfigError
    naming every bad key."""
    path = profile_path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        names = ", ".join(shipped_profiles())
        raise ConfigError(
            [
                (
                    "--profile",
                    f"no profile at {path}: name a TOML file, or a profile in launchers/profiles/ "
                    f"({names})",
                )
            ]
        ) from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([("--profile", f"{path} is not valid TOML: {err}")]) from None
    return from_toml(data, source=path.name)


def replace(profile: Profile, **changes: Any) -> Profile:
    """A checked copy with some fields changed (e.g. the executor chosen on the command line)."""
    return check_profile(dataclasses.replace(profile, **changes))
