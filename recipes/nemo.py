"""Where the fast path meets NeMo-Run: a recipe as a `run.Partial` of the training entry point,
checked before launch on every NeMo-Run path.

The catalog builds plain `TrainingConfig` dataclasses (no torch, no NeMo-Run: `list`, `show` and
`check` answer in well under a second). This module mirrors that same tree, node by node, as
`run.Config` objects under `run.Partial(training.entry.pretrain, config=...)`; `from_partial` builds
it back. Nothing else converts between the two worlds.

What `recipes run` does before launching (recipes/launch.py `prepare`: the checker, the input
files, the run directory, the resume check, the environment plan) is the `Checks` plugin here.
Importing this module attaches it to NeMo-Run's `Experiment.add` for every recipe partial, so that
`run.run(partial(...), executor=...)` and `run.Experiment` refuse an invalid config with the same
message, naming the field, before anything starts (`run.run` without an executor calls the function
in this process, without plugins: `run` below defaults to the local executor instead). `executor`
builds the executor `recipes run` would use from a cluster profile:

    import recipes.nemo as rn

    if __name__ == "__main__":  # the launch runs the script's module again: launch only from the top
        task = rn.partial("tiny_gpt_pretrain", ["train.max_steps=20"])
        rn.run(task, executor=rn.executor(gpus_per_node=2, device="cpu"))

`nemo recipes pretrain --factory RECIPE [OVERRIDES...]` is the same through NeMo-Run's own CLI (the
entry point at the end of this module, found through pyproject's `nemo_run.cli` group).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nemo_run as nr

from config.hardware import GPUS, Cluster
from config.schema import TrainingConfig
from config.tree import ConfigError, apply_overrides
from launchers.env import plan_env
from launchers.jobsize import JobSize, job_cluster
from launchers.profile import Profile, load_profile, profile_path, replace
from recipes.registry import all_recipes, get
from training.entry import pretrain


def _resolve_annotations(fn: Any) -> None:
    """NeMo-Run's help reads a function's annotations as types; `from __future__ import
    annotations` leaves them strings, and `run.cli.main(pretrain) --help` crashed in
    nemo_run/help.py. A name imported only for type checkers (it would import torch) becomes Any."""
    for name, annotation in list(fn.__annotations__.items()):
        if isinstance(annotation, str):
            try:
                fn.__annotations__[name] = eval(annotation, fn.__globals__)  # noqa: S307
            except NameError:
                fn.__annotations__[name] = Any


_resolve_annotations(pretrain)  # once, where NeMo-Run meets the entry point

# What an executor built by `executor()` remembers for the Checks plugin, in its env_vars (the one
# place NeMo-Run keeps through clone and serialization; the ranks see them too, harmlessly).
PROFILE_VAR = "RECIPES_PROFILE"  # the cluster profile's absolute path
DEVICE_VAR = "RECIPES_DEVICE"  # cpu | cuda: what train.device becomes


def to_config(node: Any) -> Any:
    """The `run.Config` mirror of a config dataclass tree (other values pass through)."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return nr.Config(
            type(node),
            **{f.name: to_config(getattr(node, f.name)) for f in dataclasses.fields(node)},
        )
    if isinstance(node, list):
        return [to_config(v) for v in node]
    return node


def partial(recipe: str | TrainingConfig, overrides: list[str] | None = None) -> nr.Partial:
    """`run.Partial(pretrain, config=...)` of a catalog recipe name (a typo gets the closest name)
    or a built config, with dotlist overrides applied by our parser (a typo gets the closest field)."""
    cfg = get(recipe).config() if isinstance(recipe, str) else recipe
    return nr.Partial(pretrain, config=to_config(apply_overrides(cfg, overrides or [])))


def from_partial(task: nr.Partial) -> TrainingConfig:
    """Build the `TrainingConfig` that a (possibly edited) partial would pass to the entry point."""
    import fiddle as fdl

    return fdl.build(task).keywords["config"]


def is_recipe(task: Any) -> bool:
    """A `run.Partial` of the training entry point (what `partial` returns)."""
    return isinstance(task, nr.Partial) and task.__fn_or_cls__ is pretrain


# --- executors from a cluster profile -------------------------------------------------------------


def load(profile: str | Path | None) -> tuple[Profile, str | None]:
    """A profile and its absolute path: a TOML path or a shipped profile's name
    (launchers/profiles/), or None / "local" for this machine."""
    if profile is None or str(profile) == "local":
        return Profile(executor="local"), None
    path = os.path.abspath(profile_path(profile))
    if shlex.quote(path) != path:  # NeMo-Run writes env_vars into its sbatch script unquoted
        problem = f"{path!r}: keep a profile at a path without spaces or shell characters"
        raise ConfigError([("--profile", problem)])
    return load_profile(path), path


def executor(
    profile: str | Path | None = None,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    device: str | None = None,
) -> nr.Executor:
    """The NeMo-Run executor `recipes run --profile PROFILE` would launch with.

    `profile`: None or "local" (this machine: LocalExecutor + torchrun), or a cluster profile TOML
    (launchers/profiles/): slurm (pyxis), slurm-apptainer (srun runs `apptainer exec`), slurm-bare
    (the profile's venv activated on every node), all NeMo-Run SlurmExecutors. Sizes come from the
    arguments, then the profile; `device="cpu"` runs the CPU smoke mode (gloo, no GPUs asked for).
    Any `run.run` / `run.Experiment` of a recipe with it passes the Checks plugin first.

    Not carried over: `reservation`, `sbatch_flags` and `nvlink_domain` (NeMo-Run's template has
    no place for them: use `recipes run`). On this path NeMo-Run's own runner starts the ranks
    from its job folder (<run_root>/nemo_run, or the profile's job_dir), so with Apptainer that
    folder must be bound at the same path inside the container (a `host:host` mount).
    """
    prof, path = load(profile)
    if device not in (None, "cpu", "cuda"):
        raise ConfigError([("device", f"{device!r}: choose 'cpu' or 'cuda'")])
    nodes = nodes if nodes is not None else prof.nodes or 1
    per_node = gpus_per_node if gpus_per_node is not None else prof.gpus_per_node
    if per_node is None or per_node < 1 or nodes < 1:
        raise ConfigError(
            [
                (
                    "gpus_per_node",
                    f"nodes={nodes}, gpus_per_node={per_node}: give at least one process per node, e.g. executor(gpus_per_node=8), or set gpus_per_node in the profile",
                )
            ]
        )
    remembered = {PROFILE_VAR: path} if path else {}
    remembered |= {DEVICE_VAR: device} if device else {}
    if prof.executor == "local":
        from launchers.local import interpreter_env
        from recipes.launch import check_local

        check_local(nodes)
        # torchrun, python and the project's code: this process's (PATH, PYTHONPATH)
        env = interpreter_env(os.environ) | remembered
        return nr.LocalExecutor(ntasks_per_node=per_node, launcher="torchrun", env_vars=env)
    from launchers.slurm import nemo_slurm_executor

    return nemo_slurm_executor(prof, nodes, per_node, device or "cuda", remembered)


# --- the checks, as a NeMo-Run plugin --------------------------------------------------------------


def profile_of(executor: nr.Executor) -> Profile | None:
    """The profile an executor was built from, or the one it amounts to; None for executors
    `recipes run` has no launcher for (their input paths are not checked here)."""
    path = executor.env_vars.get(PROFILE_VAR)
    if isinstance(executor, nr.LocalExecutor):
        return load(path)[0] if path else Profile(executor="local")
    if not isinstance(executor, nr.SlurmExecutor):
        return None
    if path:
        return load(path)[0]
    if executor.container_image:  # a SlurmExecutor of the user's own: pyxis
        return Profile(
            executor="slurm",
            time=executor.time,
            container_image=executor.container_image,
            mounts=list(executor.container_mounts),
        )
    return Profile(executor="slurm-bare", time=executor.time, venv=sys.prefix)


def cluster_of(cfg: TrainingConfig, executor: nr.Executor, gpu: str | None) -> Cluster:
    """The cluster `recipes run` would judge (launchers/profile.py `job_cluster`): nodes and
    processes from the executor; the GPU kind from `gpu`, else the profile's, else the recipe's
    published one (the CPU for a recipe published there); the CPU when train.device is."""
    published = all_recipes().get(cfg.name)
    profile = profile_of(executor)
    device = cfg.train.device if cfg.train.device in ("cpu", "cuda") else None
    if not (published or gpu or (profile and profile.gpu) or device == "cpu"):
        raise ConfigError(
            [
                (
                    "gpu",
                    f"{cfg.name!r} names no GPU kind to check against: pass Checks(gpu='h100') "
                    f"({', '.join(GPUS)}), or train.device=cpu",
                )
            ]
        )
    size = JobSize(
        nodes=getattr(executor, "nodes", 1),
        gpus_per_node=getattr(executor, "ntasks_per_node", 1),
        gpu=gpu,
        device=device,
    )
    return job_cluster(published.cluster if published else None, profile, size)


@dataclass(kw_only=True)
class Checks(nr.Plugin):
    """What `recipes run` does before a launch, for a recipe's `run.Partial` on any executor.

    Refuses (raises, before anything starts) a config the checker finds invalid or predicts not
    to fit, and input files the ranks would not find, naming the field; a run directory whose
    checkpoint cannot be resumed with this config. Then completes the task as `recipes run` would:
    logging.run_dir (runs/<recipe>-<UTC time> unless set), the environment plan's defaults in the
    executor's env_vars (yours win), and for Slurm the container paths and the stop before the wall
    time. Tasks that are not a recipe's partial pass untouched.
    """

    gpu: str | None = None  # GPU kind to check against; default: the profile's, else the recipe's
    applied: bool = False  # the task is already checked and completed (nemo recipes pretrain)

    def setup(self, task: Any, executor: nr.Executor) -> None:
        if self.applied or not is_recipe(task):
            return
        from recipes.launch import check_local, prepare

        cfg = from_partial(task)
        device = executor.env_vars.get(DEVICE_VAR)
        if device:
            cfg.train.device = device
        cluster = cluster_of(cfg, executor, self.gpu)
        if cluster.gpu == "cpu":
            cfg.train.device = "cpu"  # gloo, no FP8, no memory limit to check
        profile = profile_of(executor)
        if profile is None:  # no launcher of ours: the checker only
            from recipes.advice.check import check, render

            report = check(cfg, cluster)
            if not report.valid:
                raise ConfigError([(p.field, p.message) for p in report.problems]) from None
            print(render(report).splitlines()[0])
            return
        if profile.executor == "local":
            check_local(cluster.num_nodes)
            profile = replace(profile, executor="local")
        run_dir = prepare(cfg, cluster, profile)
        if profile.executor == "local":
            cfg.logging.run_dir = str(run_dir)
            plan = plan_env(cfg, profile.fabric, profile.env, os.environ)
            names = plan.process_env(os.environ)
        else:
            from launchers.slurm import apply_resilience, slurm_job

            cfg, job = slurm_job(
                cfg,
                profile,
                nodes=cluster.num_nodes,
                procs_per_node=cluster.gpus_per_node,
                run_dir=str(run_dir),
                user_env=os.environ,
            )
            names = {v.name: v.value for v in job.env.defaults}
            apply_resilience(executor, job)  # resilience.ft_launcher and its restarts
            if executor.container_image and job.env.names:
                executor.container_env = sorted(
                    set(executor.container_env or []) | set(job.env.names)
                )
        executor.env_vars = {**names, **executor.env_vars}  # what the executor sets wins
        task.config = to_config(cfg)
        print(
            f"recipes: {cfg.name} checked on {cluster.world_size} x {cluster.gpu}; run directory: {run_dir}"
        )


def with_checks(plugins: nr.Plugin | list[nr.Plugin] | None) -> list[nr.Plugin]:
    """`plugins` with a Checks plugin in front unless one is there already."""
    plugins = [plugins] if isinstance(plugins, nr.Plugin) else list(plugins or [])
    return plugins if any(isinstance(p, Checks) for p in plugins) else [Checks(), *plugins]


def run(
    task: nr.Partial | str,
    executor: nr.Executor | None = None,
    *,
    plugins: nr.Plugin | list[nr.Plugin] | None = None,
    **kwargs: Any,
) -> None:
    """`nemo_run.run` with the Checks plugin attached (a recipe name is `partial(name)`); without an
    executor, the local one sized by the recipe's published run (`executor(gpus_per_node=...)`).
    Other keyword arguments (name, dryrun, detach, tail_logs, ...) go to `nemo_run.run`."""
    if isinstance(task, str):
        task = partial(task)
    executor = executor or _default_executor(task)
    kwargs.setdefault("name", from_partial(task).name)  # the experiment's title and id
    nr.run(task, executor=executor, plugins=with_checks(plugins), **kwargs)


def _default_executor(task: nr.Partial) -> nr.Executor:
    """The local executor on this machine's one node, sized as `recipes run` sizes the recipe."""
    cfg = from_partial(task)
    recipe = all_recipes().get(cfg.name)
    if recipe is None:  # a config outside the catalog: one process, the Checks plugin names the GPU
        return executor(gpus_per_node=1, device="cpu" if cfg.train.device == "cpu" else None)
    device = "cpu" if cfg.train.device == "cpu" else None
    cluster = job_cluster(recipe.cluster, None, JobSize(nodes=1, device=device))
    on_cpu = cluster.gpu == "cpu"
    return executor(gpus_per_node=cluster.gpus_per_node, device="cpu" if on_cpu else None)


def _add_with_checks(add: Any) -> Any:
    """NeMo-Run's `Experiment.add` (which `run.run` calls too), attaching the Checks plugin to
    every recipe partial: importing this module, which `partial` lives in, is enough."""

    @functools.wraps(add)
    def checked_add(
        self: nr.Experiment,
        task: Any,
        executor: Any = None,
        name: str = "",
        plugins: Any = None,
        **kw: Any,
    ) -> str:
        tasks = task if isinstance(task, list) else [task]
        if any(is_recipe(t) for t in tasks):
            plugins = with_checks(plugins)
            if not name and not isinstance(task, list):
                name = from_partial(task).name  # the task's name: the recipe's, not the function's
        return add(self, task, executor=executor, name=name, plugins=plugins, **kw)

    # A mark on the function object, read back by getattr below: functions declare no attributes.
    checked_add.attaches_checks = True  # type: ignore[attr-defined]
    return checked_add


if not getattr(nr.Experiment.add, "attaches_checks", False):
    nr.Experiment.add = _add_with_checks(nr.Experiment.add)
Experiment = nr.Experiment  # `recipes.nemo.Experiment` is NeMo-Run's, with the checks attached


def register_factories() -> None:
    """Expose every catalog recipe as a NeMo-Run CLI factory of the entry point's `config`."""
    for name in all_recipes():
        nr.cli.factory(target=pretrain, target_arg="config", name=name)(_factory(name))


def _factory(name: str):
    def build() -> nr.Config[TrainingConfig]:
        return to_config(get(name).config())

    build.__name__ = name
    return build


# --- `nemo recipes pretrain`: the entry point NeMo-Run's CLI finds (pyproject: nemo_run.cli) ----

EXECUTOR_KEYS = (
    "nodes",
    "gpus_per_node",
    "device",
    "gpu",
)  # executor.<key>=value on the command line


def cli_task(factory: str | None, args: list[str]) -> tuple[nr.Partial, nr.Executor, Checks]:
    """The task, executor and checks of `nemo recipes pretrain --factory RECIPE [ARGS...]`.

    ARGS: dotlist overrides (`parallel.tensor_model_parallel_size=2`, or NeMo-Run's
    `config.parallel...`), and `executor=local|PROFILE.toml` with `executor.nodes=`,
    `executor.gpus_per_node=`, `executor.device=cpu|cuda`, `executor.gpu=KIND`. Sizes default as in
    `recipes run`: the profile's, then the recipe's published run (on the CPU: 1 node x 2)."""
    from config.tree import suggest

    if not factory:
        raise ConfigError(
            [("--factory", "name the recipe, e.g. --factory tiny_gpt_pretrain (`recipes list`)")]
        )
    recipe = get(factory)
    where, options, overrides = None, {}, []
    for arg in args:
        key, eq, value = arg.partition("=")
        if key == "executor" and eq:
            where = value
        elif key.startswith("executor."):
            name = key.removeprefix("executor.")
            if name not in EXECUTOR_KEYS:
                hint = suggest(name, list(EXECUTOR_KEYS)) or f" Valid: {', '.join(EXECUTOR_KEYS)}."
                raise ConfigError([(key, f"unknown executor option.{hint}")])
            options[name] = value
        else:
            overrides.append(arg.removeprefix("config."))
    cfg = apply_overrides(recipe.config(), overrides)
    profile = load(where)[0]
    size = JobSize(
        nodes=_count(options, "nodes"),
        gpus_per_node=_count(options, "gpus_per_node"),
        gpu=options.get("gpu"),
        device=options.get("device"),
    )
    cluster = job_cluster(recipe.cluster, profile, size)
    device = "cpu" if cluster.gpu == "cpu" else size.device
    ex = executor(
        where, nodes=cluster.num_nodes, gpus_per_node=cluster.gpus_per_node, device=device
    )
    return partial(cfg), ex, Checks(gpu=None if cluster.gpu == "cpu" else cluster.gpu)


def _count(options: dict[str, str], key: str) -> int | None:
    """executor.<key>=N as an int (None when not given)."""
    if key not in options:
        return None
    try:
        return int(options[key])
    except ValueError:
        raise ConfigError(
            [(f"executor.{key}", f"{options[key]!r} is not a whole number, e.g. executor.{key}=2")]
        ) from None


@dataclass(kw_only=True)
class RecipeRunContext(nr.cli.RunContext):
    """NeMo-Run's RunContext with our parsing: our suggestions for a recipe or field typo, the
    Checks plugin before --dryrun, the confirmation or the launch (exit 2 invalid, 3 no fit)."""

    def _execute_task(self, fn: Any, task_args: list[str]) -> None:
        from recipes.launch import Refused

        try:
            task, ex, checks = cli_task(self.factory, task_args)
            checks.setup(task, ex)  # once: the run directory it picks is the one launched
        except Refused as refused:
            print(refused.text)
            sys.exit(refused.exit_code)
        except ConfigError as err:
            print(f"{len(err.problems)} problem(s):", file=sys.stderr)
            for field, message in err.problems:
                print(f"  {field}: {message}", file=sys.stderr)
            sys.exit(2)
        name = self.name if self.name != "pretrain" else task.config.name
        plugins = [*(self.plugins or []), Checks(applied=True)]  # checked above, once
        if self.dryrun:
            nr.run(task, executor=ex, plugins=plugins, name=name, dryrun=True)
            print("dry run: checked, nothing launched")
        elif self._should_continue(self.skip_confirmation):
            nr.run(task, executor=ex, plugins=plugins, name=name, detach=self.detach)


def _entry(config: TrainingConfig) -> None:
    pretrain(config)


_entry.__name__ = _entry.__qualname__ = "pretrain"  # `nemo recipes pretrain`
_entry.__annotations__ = {"config": TrainingConfig, "return": None}
nr.cli.entrypoint(
    _entry,
    namespace="recipes",
    run_ctx_cls=RecipeRunContext,
    help="Train a catalog recipe: --factory RECIPE (see `recipes list`), dotlist overrides "
    "(parallel.tensor_model_parallel_size=2), executor=local|PROFILE.toml with executor.nodes=N "
    "executor.gpus_per_node=G executor.device=cpu|cuda executor.gpu=KIND. The recipe is checked "
    "as by `recipes run` first; --dryrun checks and prints, --yes skips the confirmation.",
)
