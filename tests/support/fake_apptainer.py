"""A stand-in for `apptainer`, which cannot be installed here: it refuses the command lines that
Apptainer refuses, then runs the command of `apptainer exec` bare, on this machine.

What it knows is taken from Apptainer 1.5.3 (github.com/apptainer/apptainer, tag v1.5.3, commit
6a76317a87c4): the flag names, shorthands and value kinds of cmd/internal/cli/action_flags.go and
apptainer.go; their parsing by spf13/pflag with interspersed flags off (the first argument that is
not an option is the image, and `--` ends the options); the bind grammar of --bind's usage text and
pkg/runtime/engine/apptainer/config/bind.go; the image formats of pkg/image; the environment rules
of internal/pkg/util/env/create.go. Exit status as Apptainer's: 1 for a command-line error, 255 for
one found when the container would start.

Run bare, the command sees:
- the host's environment less APPTAINER_*, SINGULARITY_* and LD_LIBRARY_PATH, with each
  APPTAINERENV_<NAME> (then SINGULARITYENV_<NAME>, then --env NAME=VALUE, the strongest) as
  <NAME>. HOME and PATH stay the host's: the programs that tests put on PATH must be found, and
  the image's own PATH is not known here (APPTAINERENV_PATH, _PREPEND_PATH, _APPEND_PATH do act).
- the directory of --pwd (or --cwd): the host folder a bind maps it to, or the folder inside a
  sandbox image (missing: refused, as Apptainer fails to enter it); in a SIF or squashfs image,
  which cannot be opened here, the same path on this machine if it is a folder, else the
  directory the stand-in was started in. A relative --pwd is refused (stricter than Apptainer,
  whose result would depend on where its starter stands).
- the host's files: binds are checked (the source exists, the destination is absolute, the options
  are Apptainer's) but not mounted, so tests bind each path to itself. Every other option is
  checked and has no effect (--nv, --no-home, --cleanenv, --contain...).
`run`, `shell` and `test` are checked but not run (the image's runscript is not known here).
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

# name: (shorthand, kind). Kinds: "bool"; "str"; "int"; "list" (repeatable, or comma-separated);
# "env" (NAME=VALUE,...). The options of `exec` and `test`; `run` and `shell` add one each.
ACTION_FLAGS: dict[str, tuple[str, str]] = {
    "add-caps": ("", "str"), "allow-setuid": ("", "bool"), "app": ("", "str"),
    "apply-cgroups": ("", "str"), "authfile": ("", "str"), "bind": ("B", "list"),
    "blkio-weight": ("", "int"), "blkio-weight-device": ("", "list"), "cdi-dirs": ("", "list"),
    "cleanenv": ("e", "bool"), "compat": ("", "bool"), "contain": ("c", "bool"),
    "containall": ("C", "bool"), "containlibs": ("", "list"), "cpu-shares": ("", "int"),
    "cpus": ("", "str"), "cpuset-cpus": ("", "str"), "cpuset-mems": ("", "str"),
    "cwd": ("", "str"), "device": ("", "list"), "disable-cache": ("", "bool"),
    "dns": ("", "str"), "docker-host": ("", "str"), "docker-login": ("", "bool"),
    "docker-password": ("", "str"), "docker-username": ("", "str"), "drop-caps": ("", "str"),
    "env": ("", "env"), "env-file": ("", "list"), "fakeroot": ("f", "bool"),
    "fusemount": ("", "list"), "help": ("h", "bool"), "home": ("H", "str"),
    "hostname": ("", "str"), "ignore-fakeroot-command": ("", "bool"),
    "ignore-subuid": ("", "bool"), "ignore-userns": ("", "bool"), "intel-hpu": ("", "bool"),
    "ipc": ("i", "bool"), "keep-privs": ("", "bool"), "memory": ("", "str"),
    "memory-reservation": ("", "str"), "memory-swap": ("", "str"), "mount": ("", "list"),
    "net": ("n", "bool"), "netns-path": ("", "str"), "network": ("", "str"),
    "network-args": ("", "list"), "no-env": ("", "list"), "no-eval": ("", "bool"),
    "no-home": ("", "bool"), "no-https": ("", "bool"), "no-init": ("", "bool"),
    "no-mount": ("", "list"), "no-nv": ("", "bool"), "no-pid": ("", "bool"),
    "no-privs": ("", "bool"), "no-rocm": ("", "bool"), "no-umask": ("", "bool"),
    "nohttps": ("", "bool"), "nv": ("", "bool"), "nvccli": ("", "bool"),
    "oom-kill-disable": ("", "bool"), "overlay": ("o", "list"), "passphrase": ("", "bool"),
    "pem-path": ("", "str"), "pid": ("p", "bool"), "pids-limit": ("", "int"),
    "pwd": ("", "str"), "rocm": ("", "bool"), "scratch": ("S", "list"),
    "security": ("", "list"), "sharens": ("", "bool"), "tmpdir": ("", "str"),
    "underlay": ("", "bool"), "unsquash": ("", "bool"), "userns": ("u", "bool"),
    "uts": ("", "bool"), "workdir": ("W", "str"), "writable": ("w", "bool"),
    "writable-tmpfs": ("", "bool"),
}  # fmt: skip
COMMAND_FLAGS = {
    "exec": ACTION_FLAGS,
    "test": ACTION_FLAGS,
    "run": ACTION_FLAGS | {"runscript-timeout": ("", "str")},
    "shell": ACTION_FLAGS | {"shell": ("s", "str")},
}
MIN_ARGS = {"exec": 2, "run": 1, "shell": 1, "test": 1}  # the image, and for exec a command
ROOT_FLAGS = {
    "build-config": ("", "bool"), "config": ("c", "str"), "debug": ("d", "bool"),
    "help": ("h", "bool"), "nocolor": ("", "bool"), "quiet": ("q", "bool"),
    "silent": ("s", "bool"), "verbose": ("v", "bool"), "version": ("", "bool"),
}  # fmt: skip
# Apptainer's other commands: real, but not stood in for.
OTHER_COMMANDS = (
    "build buildcfg cache capability checkpoint completion config delete help inspect instance "
    "key keys keyserver oci overlay plugin pull push registry remote run-help search sif siftool "
    "sign verify version"
).split()
# Image sources that Apptainer fetches itself (transport://ref, or transport:ref for these).
TRANSPORTS = (
    "library oras ipfs shub http https docker docker-archive docker-daemon oci oci-archive instance"
).split()
BOOLS = {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}
BIND_OPTION = re.compile(r"ro|rw|(image-src|id)=.*")  # flags, and options that take a value
UNSET = ("APPTAINER_", "SINGULARITY_", "APPTAINERENV_", "SINGULARITYENV_")
# Command shims for a fake bin folder (tests/unit/launchers/test_launchers.py: run_script).
SHIM = f'exec {shlex.quote(sys.executable)} -I {shlex.quote(str(Path(__file__)))} "$@"'


class UsageError(Exception):
    """A command line Apptainer's parser refuses (exit 1)."""


class Fatal(Exception):
    """What Apptainer refuses when it would start the container (exit 255)."""


def parse_flags(
    args: list[str], flags: Mapping[str, tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[str]]:
    """pflag's parse with interspersed flags off: the (name, value) options, and the arguments
    from the first one that is not an option (or after `--`)."""
    by_short = {short: name for name, (short, _) in flags.items() if short}
    found: list[tuple[str, str]] = []
    rest = list(args)
    while rest and rest[0].startswith("-") and rest[0] != "-":
        arg = rest.pop(0)
        if arg == "--":
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if not name or name[0] in "-=":
                raise UsageError(f"bad flag syntax: {arg}")
            if name not in flags:
                raise UsageError(f"unknown flag: --{name}")
            shown, attached = f"--{name}", value if eq else None
            found.append((name, _value(flags[name][1], shown, attached, rest)))
            continue
        letters = arg[1:]
        while letters:
            short, letters = letters[0], letters[1:]
            if short not in by_short:
                raise UsageError(f"unknown shorthand flag: {short!r} in {arg}")
            name, shown = by_short[short], f"{short!r} in {arg}"
            kind = flags[name][1]
            if letters.startswith("="):  # -x=value
                attached, letters = letters[1:], ""
            elif kind != "bool" and letters:  # -Bvalue
                attached, letters = letters, ""
            else:
                attached = None
            found.append((name, _value(kind, shown, attached, rest)))
    return found, rest


def _value(kind: str, shown: str, attached: str | None, rest: list[str]) -> str:
    """The option's value, taken from `rest` where it is not attached; checked as pflag does."""
    if attached is None:
        if kind == "bool":
            return "true"
        if not rest:
            raise UsageError(f"flag needs an argument: {shown}")
        attached = rest.pop(0)
    bad = f"invalid argument {attached!r} for {shown} flag"
    if kind == "bool" and attached not in BOOLS:
        raise UsageError(f"{bad}: not true or false")
    if kind == "int" and not re.fullmatch(r"[+-]?[0-9]+", attached):
        raise UsageError(f"{bad}: not an integer")
    if kind == "env" and attached:
        for item in next(csv.reader([attached])):
            if "=" not in item:
                raise UsageError(f"{bad}: {item} must be formatted as key=value")
    return attached


def parse(argv: list[str]) -> tuple[str, list[tuple[str, str]], list[str]]:
    """The command, its options and its arguments (image first); UsageError as Apptainer's."""
    _, rest = parse_flags(argv, ROOT_FLAGS)
    if not rest:
        raise UsageError("no command: apptainer [global options...] <command>")
    command, args = rest[0], rest[1:]
    if command in OTHER_COMMANDS:
        raise UsageError(f"the stand-in does not stand in for `apptainer {command}`")
    if command not in COMMAND_FLAGS:
        raise UsageError(f'unknown command "{command}" for "apptainer"')
    options, args = parse_flags(args, COMMAND_FLAGS[command])
    if len(args) < MIN_ARGS[command]:
        need = MIN_ARGS[command]
        raise UsageError(f"requires at least {need} arg(s), only received {len(args)}")
    return command, options, args


def parse_binds(spec: str) -> list[tuple[str, str, list[str]]]:
    """--bind's `src[:dest[:opts]]`, comma-separated (`\\,` and `\\:` escape): (source,
    destination, options). An option after a spec's options joins them (`/a:/b:ro,rw`)."""
    binds: list[tuple[str, str, list[str]]] = []
    for item in re.split(r"(?<!\\),", spec):
        if not item:
            continue  # Apptainer skips empty items
        if binds and binds[-1][2] and BIND_OPTION.fullmatch(item):
            binds[-1][2].append(item)
            continue
        parts = [p.replace("\\:", ":").replace("\\,", ",") for p in re.split(r"(?<!\\):", item)]
        if len(parts) > 3:
            raise Fatal(f"bad bind syntax {item!r}: should be src[:dest[:opts]]")
        source, dest = parts[0], parts[1] if len(parts) > 1 else parts[0]
        if not source:
            raise Fatal(f"empty bind source for bind path {item!r}")
        if not dest.startswith("/"):
            raise Fatal(f"bind destination {dest!r} of {item!r} must be an absolute path")
        options = parts[2:]
        for option in options:
            if not BIND_OPTION.fullmatch(option):
                raise Fatal(f"{option} is not a valid bind option (ro, rw, image-src=, id=)")
        if not Path(source).exists():
            raise Fatal(f"mount source {source} doesn't exist")
        binds.append((source, dest, options))
    return binds


def check_image(image: str) -> Path | None:
    """A local image as Apptainer recognises one by its content (a sandbox folder, SIF, squashfs,
    ext3), or None for a source Apptainer fetches itself (docker://...)."""
    transport, colon, ref = image.partition(":")
    if colon and ref.startswith("//"):
        if transport not in TRANSPORTS:
            raise Fatal(f"Unsupported transport type: {transport}")
        return None
    if colon and transport in TRANSPORTS:
        return None
    path = Path(image)
    if not image or not path.exists():
        raise Fatal(f"could not open image {image!r}: no such file or directory")
    if path.is_dir():
        return path  # a sandbox
    with path.open("rb") as f:
        head = f.read(2048)
    sif = len(head) == 2048 and b"SIF_MAGIC" in head
    if sif or head.startswith(b"hsqs") or head[1080:1082] == b"\x53\xef":
        return None
    raise Fatal(f"image format not recognized: {image} (neither SIF, squashfs, ext3 nor a folder)")


def write_sif(path: Path) -> Path:
    """The smallest file the stand-in (like Apptainer's format check) reads as a SIF image."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = b"#!/usr/bin/env run-singularity\n".ljust(32, b"\0") + b"SIF_MAGIC"
    path.write_bytes(header.ljust(2048, b"\0"))
    return path


def container_env(host: Mapping[str, str], env_options: list[str]) -> dict[str, str]:
    """The command's environment (see the module's docstring)."""
    names: dict[str, str] = {}
    for prefix in ("APPTAINERENV_", "SINGULARITYENV_"):  # the first prefix wins
        for key, value in host.items():
            if key.startswith(prefix) and key[len(prefix) :]:
                names.setdefault(key[len(prefix) :], value)
    for option in env_options:  # --env sets APPTAINERENV_<NAME> over the host's
        names |= dict(item.split("=", 1) for item in next(csv.reader([option])) if item)
    env = {k: v for k, v in host.items() if not k.startswith(UNSET) and k != "LD_LIBRARY_PATH"}
    path = names.pop("PATH", env.get("PATH", ""))
    parts = (names.pop("PREPEND_PATH", ""), path, names.pop("APPEND_PATH", ""))
    path = ":".join(p for p in parts if p)
    names.pop("HOME", None)  # Apptainer does not let it be overridden
    return env | names | {"PATH": path}


def workdir(pwd: str, binds: list[tuple[str, str, list[str]]], sandbox: Path | None) -> Path:
    """Where the command starts, for --pwd `pwd` (see the module's docstring)."""
    if not pwd:
        return Path.cwd()
    inside = PurePosixPath(pwd)
    if not inside.is_absolute():
        raise Fatal(f"--pwd {pwd!r} is not an absolute path in the container")
    mapped = [(src, dst) for src, dst, _ in binds if inside.is_relative_to(dst)]
    if mapped:
        src, dst = max(mapped, key=lambda m: len(m[1]))  # the innermost mount shows
        host = Path(src).absolute() / inside.relative_to(dst)
    elif sandbox is not None:
        host = sandbox / inside.relative_to("/")
    else:
        return Path(pwd) if Path(pwd).is_dir() else Path.cwd()
    if not host.is_dir():
        raise Fatal(f"failed to set working directory: {pwd} does not exist in the container")
    return host


def main(argv: list[str]) -> int:
    """Check `argv` as Apptainer would, then exec the command of `exec` bare."""
    try:
        command, options, args = parse(argv)
    except UsageError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    if ("help", "true") in options:
        print(f"apptainer {command}: the stand-in (tests/support/fake_apptainer.py)")
        return 0
    values = {name: [v for n, v in options if n == name] for name, _ in options}
    try:
        sandbox = check_image(args[0])
        binds = [b for spec in values.get("bind", []) for b in parse_binds(spec)]
        pwd = next((v for n, v in reversed(options) if n in ("pwd", "cwd")), "")  # synonyms
        start = workdir(pwd, binds, sandbox)
        if command != "exec":
            raise Fatal(f"the stand-in checked `apptainer {command}` but runs only `exec`")
        env = container_env(os.environ, values.get("env", []))
        os.chdir(start)
        os.execvpe(args[1], args[1:], env)
    except Fatal as err:
        print(f"FATAL:   {err}", file=sys.stderr)
        return 255
    except OSError as err:  # the command: not found, not executable
        print(f"FATAL:   {args[1]}: {err.strerror}", file=sys.stderr)
        return 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
