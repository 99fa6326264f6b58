"""`recipes run`: check a recipe, write its resolved config into a run directory, launch it.

    recipe + overrides -> (--shrink) -> check (refuse invalid: 2; does not fit: 3, except on CPU)
    -> the input files exist where the ranks will look (launchers/inputs.py; else 2)
    -> run directory (logging.run_dir, or runs/<recipe>-<UTC time>) -> config.yaml
    -> local: NeMo-Run LocalExecutor + torchrun, in the foreground
    -> slurm, slurm-apptainer, slurm-edf, slurm-bare: an sbatch script per launchers/, submitted (--chain K)

Every rank runs only `python -m training.entry --config <run dir>/config.yaml`. The last line a
real run prints is `run directory: PATH`. The steps before the launch are `prepare`, which the
NeMo-Run paths (recipes/nemo.py: the Checks plugin, `nemo recipes pretrain`) call too.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from config import paths
from config.hardware import Cluster
from config.schema import TrainingConfig
from config.tree import ConfigError, apply_overrides, to_yaml
from launchers.env import EnvPlan, plan_env
from launchers.inputs import check_inputs
from launchers.jobsize import JobSize, job_cluster
from launchers.profile import Profile, load_profile, placeholder_problem, replace
from launchers.resume import check_resume
from recipes.advice.check import EXIT_INVALID, EXIT_NO_FIT, check, render
from recipes.advice.plan import pinned as pinned_fields
from recipes.registry import get
from recipes.shrink import cpu_substitutes, fit_to_world
from recipes.shrink import shrink as shrink_model


class Refused(Exception):
    """The checker refused the config before launch: `text` is what `recipes check` prints."""

    def __init__(self, text: str, exit_code: int) -> None:
        super().__init__(text)
        self.text = text
        self.exit_code = exit_code


def prepare(
    cfg: TrainingConfig,
    cluster: Cluster,
    profile: Profile,
    cwd: Path | None = None,
    *,
    pinned: dict[str, object] | None = None,
) -> Path:
    """The pre-launch steps every launch path shares (`recipes run`, the NeMo-Run plugin and the
    `nemo recipes` entry point in recipes/nemo.py), in order; returns the run directory.

    The checker (Refused: 2 when invalid, 3 when predicted not to fit, except on the CPU); the
    input files where the ranks will look (launchers/inputs.py); the run directory (a new
    runs/<recipe>-<UTC time> unless logging.run_dir); whether a checkpoint there can be resumed with
    this config (launchers/resume.py), before any config.yaml is written. ConfigError names the
    field of anything else. `pinned`: the layout fields the command line set, which the checker's
    suggestions keep (recipes/advice/plan.py `pinned`).
    """
    if profile.executor == "local" and cfg.resilience.ft_launcher:
        raise ConfigError(
            [
                (
                    "resilience.ft_launcher",
                    "is true, but the local executor starts its ranks with torchrun; "
                    "nvidia-resiliency-ext's ft_launcher runs on the Slurm executors. Set "
                    "resilience.ft_launcher=false, or launch with --executor slurm",
                )
            ]
        )
    report = check(cfg, cluster, pinned=pinned)
    on_cpu = cfg.train.device == "cpu"
    if report.exit_code == EXIT_INVALID or (report.exit_code == EXIT_NO_FIT and not on_cpu):
        raise Refused(render(report), report.exit_code)
    check_inputs(cfg, profile, cwd or Path.cwd())  # data, tokenizer, checkpoints: before the queue
    # A new folder for each launch unless logging.run_dir names one (config/paths.py).
    run_dir = paths.run_dir_for(
        cfg, f"{datetime.now(UTC):%Y%m%d-%H%M%S}", profile.run_root, fresh=True
    )
    check_resume(cfg, run_dir)  # before config.yaml is written: a refused resume leaves it
    return run_dir


def run_command(
    recipe: str,
    overrides: list[str],
    size: JobSize,
    *,
    executor: str | None = None,
    profile: str | None = None,
    shrink: bool = False,
    dryrun: bool = False,
    chain: int = 1,
) -> int:
    """`recipes run RECIPE [OVERRIDES...]`: the job's size, the executor (the profile's unless
    `executor` is local; `_profile`), `--shrink`, `--dryrun` and `--chain K`; the exit code."""
    prof = _profile(executor, profile)
    found = get(recipe)
    cluster = job_cluster(found.cluster, prof, size)
    cfg = found.config()
    if size.device == "cuda":
        cfg.train.device = "cuda"
    elif cluster.gpu == "cpu":
        cfg.train.device = "cpu"  # the CPU smoke mode: gloo, no FP8, no memory limit to check
    if shrink:
        cfg = shrink_model(cfg)
        if cfg.train.device == "cpu":
            for change in cpu_substitutes(cfg) + fit_to_world(cfg, cluster.world_size):
                print(f"shrink: {change}")
    # The user's overrides come last: they win over what --shrink chose (train.max_steps=20).
    apply_overrides(cfg, overrides)
    if prof.executor == "local":
        check_local(cluster.num_nodes, chain)
    elif not dryrun and profile and (unfilled := placeholder_problem(prof, profile)):
        raise ConfigError([unfilled])
    try:
        run_dir = prepare(cfg, cluster, prof, pinned=pinned_fields(cfg, overrides))
    except Refused as refused:
        print(refused.text)
        return refused.exit_code
    if prof.executor == "local":
        return _run_local(cfg, cluster, prof, run_dir, dryrun)
    return _run_slurm(cfg, cluster, prof, run_dir, dryrun, chain)


def check_local(nodes: int, chain: int = 1) -> None:
    """The local executor runs one node and one job."""
    if nodes > 1 or chain > 1:
        raise ConfigError(
            [
                (
                    "--executor",
                    "local runs one node and one job; use a Slurm executor for --nodes > 1 or --chain",
                )
            ]
        )


# A shipped profile of each containerised executor, for the hint when --profile is missing.
EXAMPLE_PROFILE = {"slurm": "slurm", "slurm-apptainer": "slurm-apptainer", "slurm-edf": "alps"}


def _profile(executor: str | None, path: str | None) -> Profile:
    """The cluster profile, run with its own executor; `executor` (--executor) may only say the
    same, or `local` (this machine, sized by the profile). Another Slurm executor would start the
    profile's container_image with a runtime it was not made for (a .sif through pyxis)."""
    if path:
        profile = load_profile(path)
        if executor is None or executor == profile.executor:
            return profile
        if executor == "local":
            return replace(profile, executor="local")
        raise ConfigError(
            [
                (
                    "--executor",
                    f"{executor} contradicts the profile {path!r}, whose jobs run with executor = {profile.executor!r}"
                    + (
                        f" (container_image {profile.container_image!r})"
                        if profile.containerised
                        else ""
                    )
                    + f": drop --executor, or use a profile made for {executor} (launchers/profiles/{executor}.toml is one to copy)",
                )
            ]
        )
    if executor in ("slurm", "slurm-apptainer", "slurm-edf"):
        raise ConfigError(
            [
                (
                    "--profile",
                    f"--executor {executor} needs a cluster profile with container_image and mounts: --profile FILE, see launchers/profiles/{EXAMPLE_PROFILE[executor]}.toml (recipes profiles lists them all)",
                )
            ]
        )
    if executor == "slurm-bare":  # default: this interpreter's venv, on a shared filesystem
        if not _importable("torch"):  # a login-node install (requirements-login.txt)
            raise ConfigError(
                [
                    (
                        "--executor",
                        f"slurm-bare without a profile runs the ranks in this venv ({sys.prefix}), "
                        "which has no torch (a login-node install): give --profile FILE with "
                        "venv = <a full install on a filesystem every node sees>",
                    )
                ]
            )
        return replace(Profile(executor="slurm-bare"), venv=sys.prefix)
    return Profile(executor="local")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def describe_env(plan: EnvPlan) -> str:
    defaults = ", ".join(
        f"{v.name}={v.value} ({v.owner})" for v in plan.defaults if v.name not in plan.user_wins
    )
    parts = [f"environment: {defaults or 'no defaults'}"]
    if plan.user_wins:
        parts.append(f"yours win: {' '.join(plan.user_wins)}")
    if plan.secrets:
        parts.append(f"secrets by name: {' '.join(plan.secrets)}")
    return "; ".join(parts)


def _run_local(
    cfg: TrainingConfig, cluster: Cluster, profile: Profile, run_dir: Path, dryrun: bool
) -> int:
    from launchers import local

    cfg.logging.run_dir = str(run_dir)
    plan = plan_env(cfg, profile.fabric, profile.env, os.environ)
    executor = local.local_executor(cluster.gpus_per_node, local.process_env(plan, os.environ))
    script = local.entry_script(local.config_argument(run_dir / paths.CONFIG_FILE))
    if dryrun:
        print(to_yaml(cfg), end="")
        print(f"# launch ({cluster.gpus_per_node} ranks, NeMo-Run LocalExecutor):")
        print(local.dryrun_command(executor, script))
        print(f"dry run: nothing launched; the run would go to {run_dir}")
        return 0
    home = local.nemorun_home(run_dir, os.environ)
    paths.write_run_config(cfg, run_dir)
    print(describe_env(plan), flush=True)
    code = local.run_local(executor, script, cfg.name, home, run_dir)
    print(f"run directory: {run_dir}")
    return code


def _run_slurm(
    cfg: TrainingConfig,
    cluster: Cluster,
    profile: Profile,
    run_dir: Path,
    dryrun: bool,
    chain: int,
) -> int:
    from launchers import sbatch
    from launchers.slurm import edf_text, slurm_job

    ranks_cfg, job = slurm_job(
        cfg,
        profile,
        nodes=cluster.num_nodes,
        procs_per_node=cluster.gpus_per_node,
        run_dir=str(run_dir),
        user_env=os.environ,
    )
    text = sbatch.render(job)
    if dryrun:
        print(to_yaml(ranks_cfg), end="")
        if job.kind == "slurm-edf":
            print(f"# {job.edf_path}")
            print(edf_text(job), end="")
        print(f"# {job.script_path}")
        print(text, end="")
        if chain > 1:
            print(
                f"# then {chain - 1} more: sbatch --dependency=afterany:<previous job id> {job.script_path}"
            )
        print(f"dry run: nothing submitted; the run would go to {run_dir}")
        return 0
    paths.write_run_config(ranks_cfg, run_dir)
    script = sbatch.write(job)
    print(describe_env(job.env))
    try:
        ids = sbatch.submit(script, chain=chain)
    except (OSError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    chained = (
        " (a chain: each waits for the previous one and resumes its checkpoint)"
        if len(ids) > 1
        else ""
    )
    from launchers.local import write_record

    write_record(run_dir, executor=job.kind, job_ids=ids, state="SUBMITTED")  # for `recipes runs`
    print(f"submitted {job.kind} job(s): {' '.join(ids)}{chained}")
    print(f"logs: {job.log_path.replace('%j', '<job id>')}")
    print(f"run directory: {run_dir}")
    return 0
