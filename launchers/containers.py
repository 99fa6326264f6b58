"""How a node's command runs in a profile's environment, and the shell pieces the Slurm scripts are
built from (launchers/slurm.py, launchers/data_job.py): the pyxis options of `slurm`, `apptainer
exec` of `slurm-apptainer`, the Container Engine's environment definition (EDF) of `slurm-edf`, or
nothing for `slurm-bare`."""

from __future__ import annotations

import json

from launchers.mounts import parse_mounts
from launchers.profile import Profile


class Raw(str):
    """A piece of shell text written as is (runtime expansions such as "$head_node:29500")."""


# A command-line argument, or a few that belong on one line ("--config", path).
Arg = str | tuple[str, ...]


# What `apptainer exec --bind src:dest:opts` takes for opts (its bind options image-src= and id=
# are for data images); pyxis's other mount flags (rbind, private, ...) Apptainer refuses.
APPTAINER_BIND_FLAGS = ("ro", "rw")


def apptainer_bind_problems(mounts: list[str]) -> list[tuple[str, str]]:
    """The mounts whose flags `apptainer exec --bind` would refuse when the job starts."""
    return [
        (
            f"mounts[{i}]",
            f"{text!r}: Apptainer's --bind takes {' or '.join(APPTAINER_BIND_FLAGS)} after "
            f"host:container, not {mount.flags!r}: drop the flag, or give one of those",
        )
        for i, (text, mount) in enumerate(zip(mounts, parse_mounts(mounts), strict=True))
        if mount.flags and mount.flags not in APPTAINER_BIND_FLAGS
    ]


def container_wrap(p: Profile, device: str, edf_path: str, env_names: list[str]) -> list[Arg]:
    """What goes between srun's own options and the command for the profile's environment: the
    pyxis options, `--environment=<EDF>`, `apptainer exec ... IMAGE`, or nothing (bare)."""
    mounts = ",".join(str(m) for m in parse_mounts(p.mounts))
    if p.executor == "slurm-edf":
        return [f"--environment={edf_path}"]
    if p.executor == "slurm":
        wrap: list[Arg] = [f"--container-image={p.container_image}"]
        wrap += [f"--container-mounts={mounts}"] if mounts else []
        wrap += [f"--container-workdir={p.workdir}"] if p.workdir else []
        # Home stays out (its ~/.local packages would shadow the image's); the image is writable
        # for caches that libraries write next to themselves (Triton, TE JIT).
        wrap += ["--no-container-mount-home", "--container-writable"]
        wrap += [f"--mpi={p.mpi}"] if p.mpi else []
        # Our variables must win over the image's ENV lines: pyxis sets these from the job's.
        wrap += [f"--container-env={','.join(env_names)}"] if env_names else []
        return wrap
    if p.executor == "slurm-apptainer":
        wrap = [("apptainer", "exec")]
        wrap += ["--nv"] if device != "cpu" else []
        wrap += ["--no-home"] + ([("--bind", mounts)] if mounts else [])
        wrap += [("--pwd", p.workdir)] if p.workdir else []
        return wrap + [p.container_image or ""]
    return []


def edf_text_of(p: Profile, env_names: list[str]) -> str:
    """The environment definition of a profile: the image, the mounts, the working directory, a
    writable container (caches that libraries write beside themselves), its annotations, and the
    job's variables `env_names` in its [env] table.

    The Container Engine lets the image's ENV lines win over the variables a container inherits
    from the job, and its [env] table win over both (docs.cscs.ch, container-engine/edf.md at
    eth-cscs/cscs-docs 80abed1: "Environment Variable Resolution Order"; pyxis's --container-env
    does the same for the `slurm` executor). Each name goes there as a reference to the job's
    value, `${NAME:-}`, which the page says resolves from the host (it also says the image wins in
    such references: then this is what inheritance gave). Values never: secrets stay out of files;
    one the job leaves unset is unset in the container (an empty value unsets)."""

    def s(value: str) -> str:  # a TOML basic string (JSON's escapes are TOML's; no control chars)
        return json.dumps(value, ensure_ascii=False)

    lines = [f"image = {s(p.container_image or '')}"]
    mounts = [str(m) for m in parse_mounts(p.mounts)]
    lines.append(f"mounts = [{', '.join(s(m) for m in mounts)}]")
    if p.workdir:
        lines.append(f"workdir = {s(p.workdir)}")
    lines.append("writable = true")
    if p.annotations:
        lines += ["", "[annotations]"] + [f"{s(k)} = {s(v)}" for k, v in p.annotations.items()]
    if env_names:
        lines += ["", "[env]"] + [f"{s(name)} = {s('${' + name + ':-}')}" for name in env_names]
    return "\n".join(lines) + "\n"
