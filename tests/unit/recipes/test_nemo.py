"""Every recipe is also a NeMo-Run config: a `run.Partial` of the training entry point.

The fast path (dataclasses + our dotlist) and NeMo-Run (run.Config tree + its dotlist parser) must
reach the same config for the same overrides.
"""

from __future__ import annotations

import pytest

from tests.support import children

run = pytest.importorskip("nemo_run")

from nemo_run.cli.cli_parser import ParseError, parse_cli_args  # noqa: E402

from config.tree import apply_overrides  # noqa: E402
from recipes.nemo import from_partial, partial, register_factories  # noqa: E402
from recipes.registry import all_recipes, get  # noqa: E402
from training.entry import pretrain  # noqa: E402


@pytest.mark.parametrize("name", sorted(all_recipes()))
def test_partial_builds_the_same_config(name: str) -> None:
    task = partial(name)
    assert isinstance(task, run.Partial)
    assert task.__fn_or_cls__ is pretrain
    assert from_partial(task) == get(name).config()


def test_editing_the_partial_is_an_override() -> None:
    task = partial("llama3_8b_pretrain")
    task.config.parallel.tensor_model_parallel_size = 2
    task.config.train.max_steps = 10
    expected = apply_overrides(
        get("llama3_8b_pretrain").config(),
        ["parallel.tensor_model_parallel_size=2", "train.max_steps=10"],
    )
    assert from_partial(task) == expected


OVERRIDES = [
    "parallel.tensor_model_parallel_size=4",
    "parallel.virtual_pipeline_model_parallel_size=None",
    "precision=bf16_with_fp8_current_scaling_mixed",
    "optimizer.lr=0.0001",
    "train.max_steps=100",
]


def test_nemo_run_cli_factory_and_dotlist_agree_with_ours() -> None:
    """NeMo-Run's own CLI: pick the recipe by factory name, override with its dotlist parser."""
    register_factories()
    args = ["config=llama3_70b_pretrain", *(f"config.{o}" for o in OVERRIDES)]
    task = parse_cli_args(pretrain, args, output_type=run.Partial)
    expected = apply_overrides(get("llama3_70b_pretrain").config(), OVERRIDES)
    assert from_partial(task) == expected


def test_nemo_run_refuses_a_value_outside_a_literal_as_we_do() -> None:
    """The schema's Literal fields are checked by NeMo-Run's own parser too (not only by ours)."""
    from config.tree import ConfigError

    task = partial("tiny_gpt_pretrain")
    ok = parse_cli_args(pretrain, ["config.scheduler.decay_style=linear"], task)
    assert from_partial(ok).scheduler.decay_style == "linear"
    with pytest.raises(ParseError, match="cosin"):
        parse_cli_args(
            pretrain, ["config.scheduler.decay_style=cosin"], partial("tiny_gpt_pretrain")
        )
    with pytest.raises(ConfigError, match="Did you mean 'cosine'"):
        apply_overrides(get("tiny_gpt_pretrain").config(), ["scheduler.decay_style=cosin"])


# --- every NeMo-Run path passes through the checks of `recipes run` ------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import recipes.nemo as rn  # noqa: E402
from config.tree import ConfigError  # noqa: E402
from recipes.launch import Refused  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
BAD_TP = ["parallel.tensor_model_parallel_size=3"]


def cpu_executor() -> run.LocalExecutor:
    return rn.executor(gpus_per_node=2, device="cpu")


def test_run_refuses_an_invalid_recipe_before_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Refused, match="parallel.tensor_model_parallel_size") as refused:
        rn.run(rn.partial("tiny_gpt_pretrain", BAD_TP), executor=cpu_executor(), dryrun=True)
    assert refused.value.exit_code == 2
    # plain NeMo-Run, without naming the plugin: run.run and run.Experiment refuse it the same way
    plain = run.LocalExecutor(ntasks_per_node=2, launcher="torchrun")
    with pytest.raises(Refused, match="parallel.tensor_model_parallel_size"):
        run.run(rn.partial("tiny_gpt_pretrain", BAD_TP), executor=plain, dryrun=True)
    with pytest.raises(Refused, match="parallel.tensor_model_parallel_size"):
        with run.Experiment("t", executor=cpu_executor()) as exp:
            exp.add(rn.partial("tiny_gpt_pretrain", BAD_TP))
    assert not (tmp_path / "runs").exists()


def test_run_refuses_a_missing_input_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    task = rn.partial(
        "tiny_gpt_pretrain", ["train.max_steps=6", f"checkpoint.load_dir={tmp_path}/nope/ckpt"]
    )
    with pytest.raises(ConfigError, match="checkpoint.load_dir"):
        rn.run(task, executor=cpu_executor(), dryrun=True)


def test_partial_suggests_recipe_and_field() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'tiny_gpt_pretrain'"):
        rn.partial("tiny_gpt_pretrian")
    with pytest.raises(ConfigError, match="Did you mean 'max_steps'"):
        rn.partial("tiny_gpt_pretrain", ["train.max_stpes=3"])


def test_checks_complete_the_task_as_recipes_run_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with rn.Experiment("t", executor=cpu_executor()) as exp:
        exp.add(rn.partial("tiny_gpt_pretrain", ["train.max_steps=6"]))
        job = exp.jobs[0]
    cfg = from_partial(job.task)
    assert cfg.train.device == "cpu" and job.id == "tiny_gpt_pretrain"
    assert cfg.logging.run_dir.startswith(f"{tmp_path}/runs/tiny_gpt_pretrain-")
    assert job.executor.env_vars["PATH"].startswith(str(Path(sys.executable).parent))
    assert job.executor.ntasks_per_node == 2 and job.executor.launcher == "torchrun"


def slurm_profile(tmp_path: Path, kind: str) -> Path:
    extra = {
        "slurm": 'container_image = "nvcr.io#nvidia/pytorch:25.04-py3"\nmpi = "pmix"',
        "slurm-apptainer": f'container_image = "{tmp_path}/img.sif"\nworkdir = "/work"',
        "slurm-bare": f'venv = "{tmp_path}/venv"\nsetup = ["module load cuda"]',
    }[kind]
    path = tmp_path / f"{kind}.toml"
    path.write_text(
        f'executor = "{kind}"\naccount = "llm"\npartition = "batch"\ntime = "04:00:00"\n'
        f'gpus_per_node = 8\ngpu = "h100"\nrun_root = "{tmp_path}/runs"\n'
        f'mounts = ["{tmp_path}:{tmp_path}"]\n{extra}\n[fabric]\nNCCL_SOCKET_IFNAME = "bond0"\n'
    )
    return path


def test_executor_from_each_profile_kind(tmp_path: Path) -> None:
    local = rn.executor(gpus_per_node=4)
    assert isinstance(local, run.LocalExecutor) and local.ntasks_per_node == 4
    pyxis = rn.executor(slurm_profile(tmp_path, "slurm"), nodes=2)
    assert isinstance(pyxis, run.SlurmExecutor)
    assert (pyxis.nodes, pyxis.ntasks_per_node, pyxis.gpus_per_node) == (2, 8, 8)
    assert pyxis.account == "llm" and pyxis.partition == "batch" and pyxis.time == "04:00:00"
    assert pyxis.container_mounts == [f"{tmp_path}:{tmp_path}"] and "--mpi=pmix" in pyxis.srun_args
    apptainer = rn.executor(slurm_profile(tmp_path, "slurm-apptainer"), nodes=1)
    assert apptainer.container_image is None  # not pyxis: srun runs `apptainer exec` itself
    args = apptainer.srun_args
    assert args[args.index("apptainer") :] == [
        "apptainer", "exec", "--nv", "--no-home", "--bind", f"{tmp_path}:{tmp_path}",
        "--pwd", "/work", f"{tmp_path}/img.sif",
    ]  # fmt: skip
    bare = rn.executor(slurm_profile(tmp_path, "slurm-bare"), nodes=1, device="cpu")
    assert bare.container_image is None and bare.gpus_per_node is None
    assert bare.setup_lines == f"module load cuda\nsource {tmp_path}/venv/bin/activate"
    with pytest.raises(ConfigError, match="gpus_per_node"):
        rn.executor()
    with pytest.raises(ConfigError, match="--executor"):
        rn.executor(nodes=2, gpus_per_node=2)  # local runs one node


def test_slurm_executor_renders_the_checked_job(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Checks plugin on a SlurmExecutor: the profile's fabric and the recipe's variables in
    the job's environment (let through the container), the stop before the wall time."""
    monkeypatch.setattr(sys, "stdin", open(os.devnull))  # NeMo-Run's LocalTunnel reads stdin
    ex = rn.executor(slurm_profile(tmp_path, "slurm"), nodes=2)
    with rn.Experiment("llama", executor=ex) as exp:
        exp.add(rn.partial("llama3_8b_pretrain"))
        job = exp.jobs[0]
        exp.dryrun(log=True)
    cfg = from_partial(job.task)
    assert cfg.train.exit_duration_minutes == 240 - 10
    assert cfg.logging.run_dir.startswith(f"{tmp_path}/runs/llama3_8b_pretrain-")
    env = job.executor.env_vars
    assert env["NCCL_SOCKET_IFNAME"] == "bond0" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "NCCL_SOCKET_IFNAME" in job.executor.container_env
    out = " ".join(capsys.readouterr().out.split())
    for text in ("#SBATCH --nodes=2", "#SBATCH --account=llm", "--container-image", "--mpi=pmix"):
        assert text in out, text
    assert "export NCCL_SOCKET_IFNAME=bond0" in out
    assert type(job.executor.launcher).__name__ == "Torchrun"


def test_checks_give_a_slurm_executor_ft_launcher_when_the_recipe_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resilience.ft_launcher on NeMo-Run's path: its FaultTolerance launcher, not torchrun."""
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    ex = rn.executor(slurm_profile(tmp_path, "slurm"), nodes=2)
    task = rn.partial("llama3_8b_pretrain", ["resilience.ft_launcher=true"])
    with rn.Experiment("llama", executor=ex) as exp:
        exp.add(task)
        job = exp.jobs[0]
    assert type(job.executor.launcher).__name__ == "FaultTolerance"
    assert job.executor.retries == job.executor.launcher.max_restarts == 3  # the default cap


def nemo_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"NEMORUN_HOME": str(cwd / "nemo_run"), "COLUMNS": "200"}
    nemo = Path(sys.executable).parent / "nemo"
    return children.run(
        [str(nemo), *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )


def test_nemo_cli_entry_point(tmp_path: Path) -> None:
    """`nemo recipes pretrain`, found through the nemo_run.cli entry-point group (pyproject)."""
    out = nemo_cli("recipes", "pretrain", "--factory", "tiny_gpt_pretrian", cwd=tmp_path)
    assert out.returncode == 2 and "Did you mean 'tiny_gpt_pretrain'" in out.stderr
    args = ["recipes", "pretrain", "-f", "tiny_gpt_pretrain", "train.max_stpes=3"]
    out = nemo_cli(*args, cwd=tmp_path)
    assert out.returncode == 2 and "Did you mean 'max_steps'" in out.stderr
    out = nemo_cli(*args[:-1], "executor.gpus_per_nod=2", cwd=tmp_path)
    assert out.returncode == 2 and "Did you mean 'gpus_per_node'" in out.stderr
    out = nemo_cli(*args[:-1], *BAD_TP, "--yes", cwd=tmp_path)
    assert out.returncode == 2 and "parallel.tensor_model_parallel_size" in out.stdout
    out = nemo_cli(*args[:-1], "train.max_steps=6", "executor.device=cpu", "--dryrun", cwd=tmp_path)
    assert out.returncode == 0 and "dry run: checked, nothing launched" in out.stdout, out.stderr
    assert "checked on 2 x cpu" in out.stdout and not (tmp_path / "runs").exists()
    out = nemo_cli("recipes", "pretrain", "--help", cwd=tmp_path)
    assert out.returncode == 0 and "--factory" in out.stdout and "--dryrun" in out.stdout


def test_run_cli_main_help_does_not_crash(tmp_path: Path) -> None:
    script = tmp_path / "main.py"
    script.write_text(
        "import nemo_run as run\n"
        "from recipes.nemo import pretrain\n\n"
        'if __name__ == "__main__":\n    run.cli.main(pretrain)\n'
    )
    env = os.environ | {"PYTHONPATH": str(REPO), "NEMORUN_HOME": str(tmp_path)}
    out = children.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0 and "config" in out.stdout, out.stderr[-2000:]


def test_readme_python_snippet_runs_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's snippet, as written, under its guard (launched as a dry run here)."""
    import re

    text = (REPO / "README.md").read_text(encoding="utf-8")
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "recipes.nemo" in b]
    assert 'if __name__ == "__main__":' in snippet and 'device="cpu"' in snippet
    launched, real = [], run.run

    def dry(*args: object, **kw: object) -> None:
        launched.append(kw)
        real(*args, **{**kw, "dryrun": True})

    monkeypatch.setattr(rn.nr, "run", dry)
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), {"__name__": "__main__"})
    assert launched and isinstance(launched[0]["executor"], run.LocalExecutor)


@pytest.mark.smoke
def test_nemo_run_python_path_trains_checked(tmp_path: Path) -> None:
    """A script as the README writes it: plain `run.run` of a recipe partial on our executor
    (2 CPU ranks) trains in the run directory the Checks plugin chose, with its config."""
    script = tmp_path / "train.py"
    script.write_text(
        "import nemo_run as run\nimport recipes.nemo as rn\n\n"
        'if __name__ == "__main__":\n'
        '    task = rn.partial("tiny_gpt_pretrain", ["train.max_steps=6", "logging.tensorboard=false"])\n'
        '    run.run(task, executor=rn.executor(gpus_per_node=2, device="cpu"), name="tiny")\n'
    )
    env = os.environ | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env |= {"NEMORUN_HOME": str(tmp_path / "nemo_run"), "MPLCONFIGDIR": str(tmp_path)}
    out = children.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (
        run_dir.name.startswith("tiny_gpt_pretrain-") and f"run directory: {run_dir}" in out.stdout
    )
    from training.metrics import read_metrics

    steps = [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")]
    assert steps[-1] == 6 and (run_dir / "config.yaml").is_file()


def test_recipes_run_and_nemo_run_share_the_pre_launch_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One function, `recipes.launch.prepare`, holds the checks both paths run (no copy)."""
    import recipes.launch as launch
    from recipes.cli import main

    seen, real = [], launch.prepare

    def spy(cfg, cluster, profile, cwd=None, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.append((cfg.name, cluster.gpu, profile.executor))
        return real(cfg, cluster, profile, cwd, **kw)

    monkeypatch.setattr(launch, "prepare", spy)
    monkeypatch.chdir(tmp_path)
    assert main(["run", "tiny_gpt_pretrain", "train.max_steps=6", "--dryrun"]) == 0
    rn.run(rn.partial("tiny_gpt_pretrain", ["train.max_steps=6"]), cpu_executor(), dryrun=True)
    assert seen == [("tiny_gpt_pretrain", "cpu", "local")] * 2


# --- one job size for every command -------------------------------------------------------------

SIZED_PROFILE = """executor = "slurm-bare"
venv = "{venv}"
gpu = "a100"
gpus_per_node = 4
nodes = 2
nvlink_domain = 2
"""


def judged(
    monkeypatch: pytest.MonkeyPatch, recipe: str, options: list[str], nemo_args: list[str]
) -> dict[str, object]:
    """The cluster each command judges for the same recipe, profile and sizes: `recipes check`,
    `recipes plan`, `recipes run --dryrun`, and `nemo recipes pretrain` (its Checks plugin)."""
    import contextlib
    import io

    import recipes.cli as cli
    import recipes.launch as launch
    from config.hardware import Cluster

    seen: dict[str, object] = {}

    def spy(name: str, real: object, result: object = None) -> object:
        def record(cfg, cluster, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
            seen[name] = cluster
            return result if result is not None else real(cfg, cluster, *args, **kw)

        return record

    monkeypatch.setattr(cli, "check", spy("check", cli.check))
    monkeypatch.setattr(cli, "plan", spy("plan", cli.plan, ([], 0)))
    where = ["run"]

    def stop(cfg, cluster, profile, cwd=None, **kw):  # noqa: ANN001, ANN003, ANN202
        seen[where[0]] = cluster
        raise Refused("", 0)

    monkeypatch.setattr(launch, "prepare", stop)  # every launch path's pre-launch steps
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        cli.main(["check", recipe, *options])
        cli.main(["run", recipe, *options, "--dryrun"])
        if "cpu" not in options:  # plan prices GPUs only
            cli.main(["plan", recipe, *options])
    where[0] = "nemo recipes pretrain"
    task, ex, checks = rn.cli_task(recipe, nemo_args)
    with pytest.raises(Refused):
        checks.setup(task, ex)
    assert all(isinstance(c, Cluster) for c in seen.values())
    return seen


@pytest.mark.parametrize(
    ("options", "nemo_args", "expected"),
    [
        ([], [], (2, 4, "a100", 2)),  # the profile's size and GPU kind
        (
            ["--nodes", "1", "--gpu", "h100"],
            ["executor.nodes=1", "executor.gpu=h100"],
            (1, 4, "h100", 2),
        ),
        (["--gpus-per-node", "8"], ["executor.gpus_per_node=8"], (2, 8, "a100", 2)),
    ],
)
def test_every_command_judges_the_cluster_the_profile_and_options_give(
    options: list[str],
    nemo_args: list[str],
    expected: tuple,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile = tmp_path / "site.toml"
    profile.write_text(SIZED_PROFILE.format(venv=sys.prefix))
    monkeypatch.chdir(tmp_path)
    seen = judged(
        monkeypatch,
        "llama3_8b_pretrain",
        ["--profile", str(profile), *options],
        [f"executor={profile}", *nemo_args],
    )
    assert set(seen) == {"check", "plan", "run", "nemo recipes pretrain"}
    sizes = {
        name: (c.num_nodes, c.gpus_per_node, c.gpu, c.nvlink_domain) for name, c in seen.items()
    }
    assert sizes == dict.fromkeys(seen, expected)


def test_the_cpu_mode_judges_one_node_of_two_processes_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe published for 8 GPUs, on the CPU: `check --gpu cpu`, `run`, `nemo recipes pretrain`
    and `rn.run`'s default executor all judge (and start) 2 processes on one node, not 8."""
    monkeypatch.chdir(tmp_path)
    seen = judged(monkeypatch, "llama3_8b_pretrain", ["--gpu", "cpu"], ["executor.device=cpu"])
    import recipes.launch as launch

    def stop(cfg, cluster, profile, cwd=None, **kw):  # noqa: ANN001, ANN003, ANN202
        seen["rn.run, its default executor"] = cluster
        raise Refused("", 0)

    monkeypatch.setattr(launch, "prepare", stop)
    with pytest.raises(Refused):
        rn.run(rn.partial("llama3_8b_pretrain", ["train.device=cpu"]), dryrun=True)
    sizes = {name: (c.num_nodes, c.gpus_per_node, c.gpu) for name, c in seen.items()}
    assert sizes == dict.fromkeys(seen, (1, 2, "cpu")), sizes
