"""Container mounts: parse them, map host paths into the container, refuse what would be lost.

A containerised rank sees only what is mounted. A checkpoint written to an unmounted path lands in
the container's throw-away filesystem (or fails on a read-only image) and is gone when the job
ends, which is exactly the failure a chain of jobs cannot survive; so the launcher refuses such a
run before it is submitted. Mounts use pyxis's and Apptainer's common form, "host[:container[:flags]]".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from config.tree import ConfigError

# Checkpoint folders given as host paths: the Slurm launcher maps them into the container itself
# (launchers/slurm.py); every other path in a config is as the container sees it.
HOST_CHECKPOINT_FIELDS = ("save_dir", "load_dir")

# Characters no generated file can carry safely: they end an #SBATCH line or a mount list.
_CONTROL = {chr(c) for c in range(32)} | {"\x7f"}


def check_text(field: str, value: str) -> list[tuple[str, str]]:
    """A value that goes into a generated script must not hold control characters (newlines)."""
    bad = sorted({repr(c) for c in value if c in _CONTROL})
    return [(field, f"contains {', '.join(bad)}: not allowed in a path or name")] if bad else []


@dataclass(frozen=True, slots=True)
class Mount:
    host: str
    container: str
    flags: str = ""

    def __str__(self) -> str:
        return f"{self.host}:{self.container}" + (f":{self.flags}" if self.flags else "")


def parse_mount(text: str, field: str = "mounts") -> Mount:
    """ "host[:container[:flags]]" with absolute paths, no commas (the list separator)."""
    problems = check_text(field, text)
    parts = text.split(":")
    if "," in text:
        problems.append((field, f"'{text}': a comma separates mounts; list each mount on its own"))
    if len(parts) > 3 or not all(parts[:2]):
        problems.append((field, f"'{text}' is not host[:container[:flags]]"))
    elif not all(p.startswith("/") for p in parts[:2]):
        problems.append((field, f"'{text}': mount paths must be absolute"))
    if problems:
        raise ConfigError(problems)
    host = parts[0]
    container = parts[1] if len(parts) > 1 else host
    return Mount(host, container, parts[2] if len(parts) > 2 else "")


def parse_mounts(texts: list[str]) -> list[Mount]:
    problems, out = [], []
    for i, text in enumerate(texts):
        try:
            out.append(parse_mount(text, f"mounts[{i}]"))
        except ConfigError as err:
            problems += err.problems
    if problems:
        raise ConfigError(problems)
    return out


def _covering(path: str, mounts: list[Mount], side: str) -> Mount | None:
    """The mount whose `side` ("host" or "container") holds `path`: the longest match, as the
    container stacks them."""
    best: Mount | None = None
    for mount in mounts:
        if PurePosixPath(path).is_relative_to(getattr(mount, side)) and (
            best is None or len(getattr(mount, side)) > len(getattr(best, side))
        ):
            best = mount
    return best


def covering(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount that holds host `path`."""
    return _covering(path, mounts, "host")


def to_container(path: str, mounts: list[Mount]) -> str | None:
    """Where the container sees host `path`, or None when no mount covers it."""
    mount = covering(path, mounts)
    return None if mount is None else _in_container(path, mount)


def _in_container(path: str, mount: Mount) -> str:
    """Where the container sees host `path`, which `mount` covers."""
    return str(PurePosixPath(mount.container) / PurePosixPath(path).relative_to(mount.host))


def to_host(path: str, mounts: list[Mount]) -> str | None:
    """Where the host keeps the container's `path`, or None when no mount covers it (the image)."""
    mount = _covering(path, mounts, "container")
    if mount is None:
        return None
    return str(PurePosixPath(mount.host) / PurePosixPath(path).relative_to(mount.container))


def require_mounted(paths: dict[str, str], mounts: list[Mount]) -> dict[str, str]:
    """Each writable field's host path as the container sees it; ConfigError for any outside the
    mounts or on a read-only one."""
    inside, problems = {}, []
    listed = ", ".join(str(m) for m in mounts) or "none"
    for field, path in paths.items():
        mount = covering(path, mounts)
        if mount is None:
            problems.append(
                (
                    field,
                    f"{path} is outside the container's mounts ({listed}): what the job writes there is lost when it ends; add a mount that covers it to the profile's `mounts`, or move it under one",
                )
            )
        elif "ro" in mount.flags.split("+") + mount.flags.split(","):
            problems.append(
                (field, f"{path} is on the read-only mount {mount}; the job must write there")
            )
        else:
            inside[field] = _in_container(path, mount)
    if problems:
        raise ConfigError(problems)
    return inside
