"""`recipes data tokenize ... --profile P --tasks N`: the same command as a Slurm array job.

Each of the N tasks runs `python -m recipes data tokenize SRC... OUT ... --task $SLURM_ARRAY_TASK_ID
--tasks N` on one node, in the profile's environment (its container through `container_wrap`, or
its venv), with all the task's CPUs as workers; task i takes every N-th shard. The shards are
independent files and each is recorded when whole (data/tools/tokenize.py), so the tasks need no
coordination: the one that finds every shard done writes OUT/manifest.json and OUT/blend.json, and
a rerun of the same command finishes whatever a failed task left. No merge step: a blend of many
prefixes is what data.path takes.

The paths are as the job sees them (inside the container: under the profile's mounts).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from launchers.containers import Arg, Raw, container_wrap, edf_text_of
from launchers.profile import Profile, check_profile
from launchers.slurm import PSSLURM_CPUS, site_options


@dataclass(frozen=True, slots=True)
class ArrayJob:
    name: str
    profile: Profile
    tasks: int
    job_dir: str  # the script and the tasks' logs
    sources: list[str]
    out: str
    options: list[tuple[str, ...]]  # ("--tokenizer", DIR), ("--no-eod",), ...

    @property
    def script_path(self) -> str:
        return f"{self.job_dir}/{self.name}.sbatch"


def _line(args: list[Arg]) -> str:
    from launchers.sbatch import shell_join

    return shell_join(args)


def render(job: ArrayJob) -> str:
    """The array job's sbatch script."""
    p = check_profile(job.profile)
    options = [("--job-name", job.name), *site_options(p)]
    options += [("--nodes", "1"), ("--ntasks", "1"), ("--array", f"0-{job.tasks - 1}")]
    options += [("--output", f"{job.job_dir}/{job.name}-%A_%a.out")]
    lines = ["#!/bin/bash", f"# {job.name}: `recipes data tokenize` as {job.tasks} array task(s)."]
    lines += [f"#SBATCH {o}" + (f"={shlex.quote(v)}" if v is not None else "") for o, v in options]
    lines += ["", 'default_env() { [ -n "${!1+set}" ] || export "$1=$2"; }']
    lines += [f"default_env {k} {shlex.quote(v)}  # profile [env]" for k, v in p.env.items()]
    lines += list(p.setup)
    if p.executor == "slurm-bare":
        lines.append(f"source {shlex.quote(str(p.venv))}/bin/activate || exit 1")
        if p.workdir:
            lines.append(f"cd {shlex.quote(p.workdir)} || exit 1")
    if p.psslurm:
        lines.append(PSSLURM_CPUS)
    # The task's one process spreads its shards over all the node's CPUs (psslurm: through
    # SRUN_CPUS_PER_TASK, exported above).
    cpus = [] if p.psslurm else [Raw('--cpus-per-task="$SLURM_CPUS_ON_NODE"')]
    argv: list[Arg] = ["srun", "--ntasks=1", *cpus, "--cpu-bind=none", *p.srun_flags]
    argv += container_wrap(p, "cpu", f"{job.job_dir}/{job.name}.edf.toml", list(p.env))
    argv += [("python", "-m", "recipes", "data", "tokenize"), *job.sources, job.out]
    argv += [*job.options]
    argv += [("--quiet", Raw('--workers="${SLURM_CPUS_ON_NODE:-$(nproc)}"'))]
    argv += [(Raw('--task="$SLURM_ARRAY_TASK_ID"'), f"--tasks={job.tasks}")]
    lines += ["", _line(argv), ""]
    return "\n".join(lines)


def write(job: ArrayJob) -> Path:
    path = Path(job.script_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if job.profile.executor == "slurm-edf":
        edf = edf_text_of(job.profile, list(job.profile.env))
        Path(f"{job.job_dir}/{job.name}.edf.toml").write_text(edf)
    path.write_text(render(job), encoding="utf-8")
    return path
