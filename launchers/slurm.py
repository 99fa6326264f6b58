"""The four Slurm executors: what one node runs, in each kind of environment.

- `slurm`: pyxis/enroot containers (what NeMo-Run's SlurmExecutor targets): srun --container-image
  with the mounts, the working directory, --no-container-mount-home, --container-writable and, when
  the profile asks, --mpi=pmix.
- `slurm-apptainer`: `apptainer exec --nv` with --bind mounts, for centres without pyxis.
- `slurm-edf`: CSCS's Container Engine (Alps): an environment definition file (EDF) written beside
  the script names the image, mounts, working directory and annotations (hooks); `srun
  --environment=<that file>` starts the container (pyxis underneath).
- `slurm-bare`: no container; the batch script activates a venv on a shared filesystem.

launchers/containers.py writes each kind's wrapping of the node's command.

What a site needs of the script comes from the profile: the GPU request form (`gpu_request`),
psslurm's SRUN_CPUS_PER_TASK (`psslurm`), more srun options (`srun_flags`), the launcher (a site's
torchrun wrapper), and the rendezvous host (`rdzv_host_suffix`: JSC's "<node>i" InfiniBand names,
with which torchrun's own test for "am I the rendezvous host" fails, so the first node is told).

In every kind srun starts one task per node, and that task is torchrun with the node's ranks
(nvidia-resiliency-ext's `ft_launcher` with resilience.ft_launcher, which restarts failed ranks in
the job up to resilience.max_requeues times); the c10d rendezvous runs on the first node of the
allocation. A job whose training step fails requeues itself (`scontrol requeue`) while
SLURM_RESTART_COUNT is below resilience.max_requeues; it resumes from the newest checkpoint.
`launchers.sbatch` renders the job into a script; `nemo_slurm_executor` gives Python users the same
job, of any kind but slurm-edf, as a NeMo-Run `SlurmExecutor` for `run.run` / `run.Experiment`
(recipes/nemo.py `executor`), and `nemo_executor` that of a resolved job.
"""

from __future__ import annotations

import copy
import os
import posixpath
import re
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from config import paths
from config.schema import TrainingConfig
from config.tree import ConfigError
from launchers.containers import Arg, Raw, apptainer_bind_problems, container_wrap, edf_text_of
from launchers.env import EnvPlan, plan_env
from launchers.mounts import HOST_CHECKPOINT_FIELDS, parse_mounts, require_mounted
from launchers.profile import Profile, check_profile, check_run_name, control_problems

ENTRY_MODULE = "training.entry"  # what every rank runs: python -m training.entry --config PATH


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """One job of a run, complete: rendering it needs nothing else (and reads no clock)."""

    kind: str  # "slurm", "slurm-apptainer", "slurm-edf" or "slurm-bare"
    name: str  # the Slurm job name
    nodes: int
    procs_per_node: int  # ranks per node: torchrun --nproc-per-node
    device: str  # "cuda" asks Slurm for GPUs; "cpu" runs the CPU smoke mode
    profile: Profile
    run_dir: str  # host path: config.yaml, metrics.jsonl, checkpoints (by default)
    job_dir: str  # host path: the sbatch script and the Slurm log
    config_path: str  # the resolved config as the ranks see it (inside the container)
    env: EnvPlan
    signal_s: int | None = None  # USR1 to every rank this long before the wall time
    max_requeues: int = 0  # requeue a failed job while SLURM_RESTART_COUNT is below this
    ft_launcher: bool = False  # nvidia-resiliency-ext's ft_launcher instead of torchrun

    @property
    def log_path(self) -> str:
        return f"{self.job_dir}/{self.name}-%j.out"  # %j: the job id (one log per link of a chain)

    @property
    def script_path(self) -> str:
        return f"{self.job_dir}/{self.name}.sbatch"

    @property
    def edf_path(self) -> str:
        """slurm-edf: the Container Engine's environment definition, beside the script."""
        return f"{self.job_dir}/{self.name}.edf.toml"


def slurm_job(
    cfg: TrainingConfig,
    profile: Profile,
    *,
    nodes: int,
    procs_per_node: int,
    run_dir: str,
    user_env: Mapping[str, str],
) -> tuple[TrainingConfig, SlurmJob]:
    """The config the ranks read and the job that runs it; pure (no clock, no files).

    - The run stops itself before the wall time: train.exit_duration_minutes (unless set) becomes
      the profile's time minus exit_margin_minutes, and Slurm sends USR1 to the ranks at the same
      margin before the limit (a backstop for a slow start or queue-time drift).
    - In a container, the run directory and any checkpoint directory must lie in a writable
      mount; the config then names them as the container sees them.
    - The recipe's name names the Slurm job (and, by default, the run directory): one folder name.
    """
    check_profile(profile)  # also a Profile built or changed in Python, before any value is used
    check_run_name(cfg.name)
    cfg = copy.deepcopy(cfg)
    kind = profile.executor
    if cfg.train.exit_duration_minutes is None:
        cfg.train.exit_duration_minutes = profile.time_minutes - profile.exit_margin_minutes
    if profile.stage_data and cfg.data.kind == "indexed" and cfg.data.stage_dir is None:
        cfg.data.stage_dir = profile.stage_data  # node-local copies of the blend (data/stage.py)
    writable = {"logging.run_dir": run_dir}
    writable |= {
        f"checkpoint.{k}": getattr(cfg.checkpoint, k)
        for k in HOST_CHECKPOINT_FIELDS
        if getattr(cfg.checkpoint, k)
    }
    if cfg.checkpoint.save_dir:  # `~` and a relative path as launchers/resume.py checked them
        writable["checkpoint.save_dir"] = str(
            paths.checkpoint_dir(cfg.checkpoint.save_dir, run_dir)
        )
    if profile.containerised:
        inside = require_mounted(writable, parse_mounts(profile.mounts))
    else:
        inside = writable
    cfg.logging.run_dir = inside["logging.run_dir"]
    cfg.checkpoint.save_dir = inside.get("checkpoint.save_dir", cfg.checkpoint.save_dir)
    cfg.checkpoint.load_dir = inside.get("checkpoint.load_dir", cfg.checkpoint.load_dir)
    device = "cpu" if cfg.train.device == "cpu" else "cuda"
    env = plan_env(cfg, profile.fabric, profile.env, user_env)
    job_dir = f"{run_dir}/slurm"
    if profile.job_dir:  # one folder per run under job_dir, named as the run directory
        leaf = posixpath.basename(posixpath.normpath(run_dir))
        if leaf in ("", ".", ".."):
            raise ConfigError(
                [
                    (
                        "logging.run_dir",
                        f"{run_dir!r} has no folder name to name its folder under job_dir by; give a run directory such as /path/runs/my_run",
                    )
                ]
            )
        job_dir = f"{profile.job_dir.rstrip('/')}/{leaf}"
    job = SlurmJob(
        kind=kind,
        name=job_name(cfg.name),
        nodes=nodes,
        procs_per_node=procs_per_node,
        device=device,
        profile=profile,
        run_dir=run_dir,
        job_dir=job_dir,
        config_path=f"{cfg.logging.run_dir}/{paths.CONFIG_FILE}",
        env=env,
        signal_s=profile.exit_margin_s,
        max_requeues=cfg.resilience.max_requeues,
        ft_launcher=cfg.resilience.ft_launcher,
    )
    check_job(job)
    return cfg, job


def job_name(name: str) -> str:
    """A Slurm job name from a recipe name: letters, digits, '_', '.', '-' only."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100] or "recipe"


def check_job(job: SlurmJob) -> None:
    """Refuse what no generated script can carry, before anything is rendered: every profile
    value (check_profile), and control characters in the job's own paths and name."""
    check_profile(job.profile)
    run_dir_fix = "pick another logging.run_dir"
    texts = [
        ("logging.run_dir", job.run_dir, run_dir_fix),
        ("job_dir", job.job_dir, "pick another job_dir in the profile, or another logging.run_dir"),
        ("config", job.config_path, run_dir_fix),
        ("name", job.name, "pick another name"),
    ]
    problems = [pr for key, text, fix in texts for pr in control_problems(key, text, fix)]
    if job.kind == "slurm-apptainer":
        problems += apptainer_bind_problems(job.profile.mounts)
    if problems:
        raise ConfigError(problems)
    if job.ft_launcher and job.kind == "slurm-bare":
        check_ft_launcher(job.profile.venv or "")


# What ft_launcher needs on the ranks: its fault-tolerance package, importable beside
# megatron-core (nvidia-resiliency-ext 0.4.1, the newest wheel for Debian 12's glibc, breaks
# megatron-core's import; NGC containers carry a working one).
FT_IMPORT = "import nvidia_resiliency_ext.fault_tolerance, megatron.core"
FT_FIX = (
    "install nvidia-resiliency-ext (>= 0.6) where the ranks run (pip install .[resiliency]), "
    "run in an NGC container that carries it, or set resilience.ft_launcher=false (torchrun)"
)


def check_ft_launcher(venv: str) -> None:
    """ConfigError unless the bare-metal venv's Python imports nvidia-resiliency-ext with
    megatron-core and holds bin/ft_launcher. (A container is checked when the job starts: the
    script stops, without requeueing, when the image lacks ft_launcher.)"""
    python = posixpath.join(venv, "bin", "python")
    launcher = posixpath.join(venv, "bin", "ft_launcher")
    try:
        done = subprocess.run(
            [python, "-c", FT_IMPORT], capture_output=True, text=True, timeout=300
        )
        why = done.stderr.strip().splitlines()[-1:] if done.returncode else []
    except (OSError, subprocess.TimeoutExpired) as err:
        why = [f"{python} could not run: {err}"]
    if not why and not posixpath.isfile(launcher):
        why = [f"{launcher} does not exist"]
    if why:
        raise ConfigError(
            [
                (
                    "resilience.ft_launcher",
                    f"is true, but the profile's venv {venv!r} cannot start it ({why[0]}); "
                    + FT_FIX,
                )
            ]
        )


Options = list[tuple[str, str | None]]  # #SBATCH lines as (option, value); None: a bare flag


def _queue_options(p: Profile) -> Options:
    pairs = (
        ("--account", p.account),
        ("--partition", p.partition),
        ("--qos", p.qos),
        ("--reservation", p.reservation),
        ("--constraint", p.constraint),
    )
    return [(option, value) for option, value in pairs if value]


def _resource_options(p: Profile) -> Options:
    opts: Options = [("--cpus-per-task", str(p.cpus_per_task))] if p.cpus_per_task else []
    opts += [("--mem", p.mem)] if p.mem else []
    return opts + ([("--exclusive", None)] if p.exclusive else [])


def _flag_options(p: Profile) -> Options:
    return [
        (flag.partition("=")[0], flag.partition("=")[2] if "=" in flag else None)
        for flag in p.sbatch_flags
    ]


def site_options(p: Profile) -> Options:
    """The #SBATCH lines a profile gives any job of its site (a data job's too): queue,
    resources, wall time and its own flags."""
    return _queue_options(p) + _resource_options(p) + [("--time", p.time)] + _flag_options(p)


def sbatch_options(job: SlurmJob) -> Options:
    """The #SBATCH lines of a training job."""
    p = job.profile
    opts: Options = [("--job-name", job.name), *_queue_options(p)]
    opts += [("--nodes", str(job.nodes)), ("--ntasks-per-node", "1")]  # one torchrun per node
    if job.device != "cpu" and p.gpu_request == "gpus-per-node":
        opts.append(("--gpus-per-node", str(job.procs_per_node)))
    elif job.device != "cpu" and p.gpu_request == "gres":
        opts.append(("--gres", f"gpu:{job.procs_per_node}"))
    opts += _resource_options(p)
    if job.max_requeues:  # the script requeues itself on failure (scontrol requeue needs this)
        opts.append(("--requeue", None))
    opts += [("--time", p.time), ("--output", job.log_path), ("--open-mode", "append")]
    if job.signal_s:
        # No "B:": Slurm signals the job step's processes (the ranks), not the batch shell.
        opts.append(("--signal", f"USR1@{job.signal_s}"))
    return opts + _flag_options(p)


# What runs on each node before its ranks, in srun's one task per node:
# - Slurm's --signal=USR1@T reaches every process of the step; torchrun would die of it (it handles
#   TERM, INT, HUP, QUIT only), so it starts with USR1 ignored. The ranks install their own handler
#   and receive the signal once, directly. (bash, not `env --ignore-signal`: RHEL 8's env lacks it.)
# - launchers/preflight.py checks the inputs where the ranks will run (the paths the login node could
#   not see), reading --config from torchrun's own arguments; a problem ends the node's task with
#   exit 2 (PREFLIGHT_EXIT) before any rank starts, and the job is not requeued for it.
NODE_WRAPPER = Raw(
    """bash -c 'trap "" USR1 && python -m launchers.preflight "$@" && exec "$0" "$@"'"""
)
# The same, telling torchrun whether its node hosts the rendezvous (the first node does), where
# the endpoint is a name torchrun cannot match to its own host (an InfiniBand alias).
NODE_WRAPPER_IS_HOST = Raw(
    """bash -c 'trap "" USR1 && python -m launchers.preflight "$@" && """
    """exec "$0" --rdzv-conf=is_host=$((SLURM_NODEID == 0)) "$@"'"""
)
PREFLIGHT_EXIT = 2
# psslurm: srun takes the task's CPUs from SRUN_CPUS_PER_TASK, not from the allocation; the batch
# script (ours, or NeMo-Run's setup lines) exports it before srun.
PSSLURM_CPUS = 'export SRUN_CPUS_PER_TASK="${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}"'


def rendezvous_host(job: SlurmJob) -> str:
    """The script's variable holding the rendezvous host: the first node's name, or with the
    profile's rdzv_host_suffix its high-speed interface's."""
    return "rdzv_host" if job.profile.rdzv_host_suffix else "head_node"


def torchrun_command(job: SlurmJob) -> list[Arg]:
    """One node's torchrun (or ft_launcher, which takes torchrun's arguments): all its ranks, c10d
    rendezvous on the first node of the job."""
    if job.ft_launcher:
        launcher = "ft_launcher"
        # Failed ranks restart within the job (each restart resumes from the newest checkpoint)
        # before the job fails and requeues.
        restarts = f"--max-restarts={job.max_requeues}"
    else:
        launcher = job.profile.launcher  # torchrun, or a site's wrapper taking its arguments
        restarts = "--max-restarts=0"  # a failed rank fails the job; a requeue or chain resumes
    wrapper = NODE_WRAPPER_IS_HOST if job.profile.rdzv_host_suffix else NODE_WRAPPER
    return [
        (wrapper, launcher),
        f"--nnodes={job.nodes}",
        f"--nproc-per-node={job.procs_per_node}",
        "--rdzv-backend=c10d",
        Raw(f'--rdzv-endpoint="${rendezvous_host(job)}":{job.profile.rdzv_port}'),
        Raw('--rdzv-id="$SLURM_JOB_ID"'),
        restarts,
        ("-m", ENTRY_MODULE),
        ("--config", job.config_path),
    ]


def srun_command(job: SlurmJob) -> list[Arg]:
    """srun, one task per node holding all the node's CPUs, wrapped for the job's environment."""
    p = job.profile
    # The one task runs every rank of the node: give it all the job's CPUs (psslurm: through
    # SRUN_CPUS_PER_TASK, which the script exports), bind none.
    cpus = [] if p.psslurm else [Raw('--cpus-per-task="$SLURM_CPUS_ON_NODE"')]
    srun: list[Arg] = ["srun", "--ntasks-per-node=1", *cpus, "--cpu-bind=none"]
    srun += ["--kill-on-bad-exit=1", *p.srun_flags]
    return srun + container_wrap(p, job.device, job.edf_path, job.env.names) + torchrun_command(job)


def edf_text(job: SlurmJob) -> str:
    """The Container Engine's environment definition (TOML) for a slurm-edf job."""
    return edf_text_of(job.profile, job.env.names)


def nemo_slurm_executor(
    p: Profile,
    nodes: int,
    per_node: int,
    device: str,
    env: Mapping[str, str],
    job_dir: str | None = None,
) -> Any:
    """NeMo-Run's SlurmExecutor for a profile of any kind but slurm-edf: the job `srun_command`
    renders, in NeMo-Run's own template (which writes environment values into the script, so
    export secrets in your shell rather than passing them in `env`). NeMo-Run's job folders (its
    sbatch script, logs, serialized task) go to `job_dir`, else the profile's, else beside the runs.
    """
    import nemo_run as run

    # What only this project's own script does; NeMo-Run renders its own srun and torchrun.
    unsupported = []
    if p.executor == "slurm-edf":
        unsupported.append(("executor", "slurm-edf: NeMo-Run's SlurmExecutor has no EDF mode"))
    if p.launcher != "torchrun":
        unsupported.append(("launcher", f"{p.launcher}: NeMo-Run starts torchrun itself"))
    if p.rdzv_host_suffix:
        unsupported.append(("rdzv_host_suffix", "NeMo-Run names the rendezvous host itself"))
    if unsupported:
        raise ConfigError(
            [(k, f"{why}; launch this profile with `recipes run`") for k, why in unsupported]
        )
    mounts = [str(m) for m in parse_mounts(p.mounts)]
    srun_args = ["--cpu-bind=none", *p.srun_flags]
    setup = list(p.setup)
    if p.psslurm:  # srun inherits --cpus-per-task only through this under psslurm
        setup.append(PSSLURM_CPUS)
    image, container_mounts = None, []
    if p.executor == "slurm":  # pyxis: NeMo-Run's own container flags
        image, container_mounts = p.container_image, mounts
        srun_args += ["--no-container-mount-home", "--container-writable"]
        srun_args += [f"--mpi={p.mpi}"] if p.mpi else []
        srun_args += [f"--container-workdir={p.workdir}"] if p.workdir else []
    elif p.executor == "slurm-apptainer":  # srun's command runs inside `apptainer exec`
        if problems := apptainer_bind_problems(p.mounts):
            raise ConfigError(problems)
        srun_args += ["apptainer", "exec"] + (["--nv"] if device != "cpu" else []) + ["--no-home"]
        srun_args += ["--bind", ",".join(mounts)] if mounts else []
        srun_args += ["--pwd", p.workdir] if p.workdir else []
        srun_args += [p.container_image or ""]
    else:  # slurm-bare: the venv on a shared filesystem
        setup += [f"source {shlex.quote(str(p.venv))}/bin/activate"]
        setup += [f"cd {shlex.quote(p.workdir)}"] if p.workdir else []
    return run.SlurmExecutor(
        account=p.account or "",
        partition=p.partition,
        qos=p.qos,
        constraint=p.constraint,
        time=p.time,
        nodes=nodes,
        ntasks_per_node=per_node,
        gpus_per_node=per_node if device != "cpu" and p.gpu_request == "gpus-per-node" else None,
        gres=f"gpu:{per_node}" if device != "cpu" and p.gpu_request == "gres" else None,
        cpus_per_task=p.cpus_per_task,
        mem=p.mem,
        exclusive=p.exclusive or None,
        container_image=image,
        container_mounts=container_mounts,
        env_vars=dict(env),
        srun_args=srun_args,
        setup_lines="\n".join(setup) or None,
        # No --signal: NeMo-Run's torchrun would die of USR1; train.exit_duration_minutes (set
        # from the profile's time by slurm_job) stops the run before the wall time instead.
        tunnel=run.LocalTunnel(
            job_dir=job_dir or p.job_dir or os.path.abspath(f"{p.run_root or 'runs'}/nemo_run")
        ),
        packager=run.Packager(),  # the code is in the image or the venv, not copied per job
        launcher="torchrun",
    )


def apply_resilience(executor: Any, job: SlurmJob) -> Any:
    """With resilience.ft_launcher: NeMo-Run's FaultTolerance launcher (ft_launcher, restarting
    failed ranks up to resilience.max_requeues times in the job) and the executor's `retries`,
    by which NeMo-Run's fault-tolerance script requeues the job. NeMo-Run's torchrun script has
    no requeue of its own."""
    if job.ft_launcher:
        import nemo_run as run

        executor.launcher = run.FaultTolerance(
            max_restarts=job.max_requeues, rdzv_port=job.profile.rdzv_port
        )
        executor.retries = job.max_requeues
    return executor


def nemo_executor(job: SlurmJob) -> Any:
    """The same job as a NeMo-Run SlurmExecutor, for `run.run(recipes.nemo.partial(...))`."""
    check_job(job)
    executor = nemo_slurm_executor(
        job.profile,
        job.nodes,
        job.procs_per_node,
        job.device,
        {v.name: v.value for v in job.env.defaults},
        job_dir=job.job_dir,
    )
    if job.kind == "slurm" and job.env.names:  # our variables win over the image's ENV lines
        executor.container_env = job.env.names
    return apply_resilience(executor, job)
