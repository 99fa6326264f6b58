"""Render a SlurmJob into an sbatch script, and submit it (K times for a chain).

Why our own template rather than NeMo-Run's (nemo_run/core/execution/slurm.py, slurm.sh.j2), read
for nemo-run 0.11.1:
- it writes environment values unquoted (`export K=V`) and the srun log path unquoted, so a space
  or `$(...)` in a value or a job directory breaks or runs in the script; it also writes every
  env_vars value into the file, secrets included;
- it knows pyxis only: Apptainer and bare-metal jobs would need a second mechanism anyway;
- its job directories and rendezvous ids carry timestamps and random numbers, so its scripts cannot
  be golden files; and it runs srun in the foreground, so a trapped signal would wait for the step.
Here every value passes through one quoting filter (`q`), values that no script can carry
(control characters such as newlines, secrets) are refused before rendering (`check_job` checks
the profile as it is at that moment), and the same template serves all four kinds.
`tests/unit/launchers/test_launchers.py` and `tests/unit/launchers/test_hostile_profiles.py` check this with hostile strings
under `bash -n` and by running the script with a sentinel command.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import jinja2

from config import paths
from config.tree import ConfigError
from launchers.containers import Arg, Raw
from launchers.slurm import (
    PREFLIGHT_EXIT,
    PSSLURM_CPUS,
    SlurmJob,
    check_job,
    edf_text,
    rendezvous_host,
    sbatch_options,
    srun_command,
)

_TEMPLATES = Path(__file__).parent / "templates"


def q(value: object) -> str:
    """Shell-quote a value (Raw text passes as is: only fixed runtime expansions are Raw)."""
    return value if isinstance(value, Raw) else shlex.quote(str(value))


def quote_arg(arg: str) -> str:
    """Quote one argument; "--option=value" keeps the option bare and quotes only the value."""
    if isinstance(arg, Raw):
        return arg
    option, eq, value = arg.partition("=")
    if eq and option.startswith("--") and shlex.quote(option) == option:
        return f"{option}={shlex.quote(value)}"
    return shlex.quote(arg)


def shell_join(args: list[Arg]) -> str:
    """A command line, one option (with its value) per continued line for reading."""
    lines = [
        " ".join(quote_arg(a) for a in arg) if isinstance(arg, tuple) else quote_arg(arg)
        for arg in args
    ]
    return " \\\n    ".join(lines)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # a shell script: quoting is the `q` filter's job, not HTML escaping
    )
    env.filters["q"] = q
    return env


def render(job: SlurmJob) -> str:
    """The sbatch script of `job`; ConfigError for values no script can carry."""
    check_job(job)
    template = _environment().get_template("sbatch.sh.j2")
    return template.render(
        job=job,
        options=sbatch_options(job),
        srun=shell_join(srun_command(job)),
        rdzv_host=rendezvous_host(job),
        preflight_exit=PREFLIGHT_EXIT,
        psslurm_cpus=PSSLURM_CPUS,
    )


def write(job: SlurmJob) -> Path:
    """Render and write the script next to the job's logs (and a slurm-edf job's environment
    definition beside it); returns the script's path."""
    path = Path(job.script_path)
    text = render(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    if job.kind == "slurm-edf":
        Path(job.edf_path).write_text(edf_text(job), encoding="utf-8")
    path.write_text(text, encoding="utf-8")
    return path


def submit(script: Path, chain: int = 1, sbatch: str = "sbatch") -> list[str]:
    """Submit `script` `chain` times, each job waiting for the previous one to end (afterany).

    afterany, not afterok: a job that stops at the wall time or fails still leaves its latest
    checkpoint, and the next link resumes from it. Returns the job ids in order.
    """
    if chain < 1:
        raise ConfigError([("--chain", f"{chain}: a chain has at least one job")])
    ids: list[str] = []
    for _ in range(chain):
        argv = [sbatch, "--parsable"]
        if ids:
            argv.append(f"--dependency=afterany:{ids[-1]}")
        try:
            done = subprocess.run([*argv, str(script)], capture_output=True, text=True)
        except FileNotFoundError:
            raise RuntimeError(
                f"{sbatch} not found: submit from a Slurm login node (--dryrun shows the script)"
            ) from None
        if done.returncode != 0:
            submitted = f" (submitted so far: {', '.join(ids)})" if ids else ""
            raise RuntimeError(
                f"sbatch failed{submitted}: {done.stderr.strip() or done.stdout.strip()}"
            )
        ids.append(done.stdout.strip().split(";")[0])  # --parsable: "id" or "id;cluster"
    return ids


def queued(run_dir: Path, squeue: str = "squeue") -> list[str]:
    """The jobs `recipes run` submitted into `run_dir` (its launch record) that Slurm still holds,
    as "id (STATE)": each will start with the config.yaml it finds there, so another launch into
    the folder must not replace it. [] where there are none, where the run never went to Slurm,
    and where squeue cannot say (a machine without Slurm: nothing can be queued from there)."""
    ids = paths.read_launch_record(run_dir).get("job_ids") or []
    held = []
    for job in ids:  # one at a time: squeue refuses a whole list when one id is already purged
        try:
            done = subprocess.run(
                [squeue, "-h", "-o", "%i %T", "-j", str(job)],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
        for line in done.stdout.splitlines() if done.returncode == 0 else []:
            found, _, state = line.partition(" ")
            if found == str(job) and state.strip() not in ("", "COMPLETING"):
                held.append(f"{job} ({state.strip()})")
    return held
