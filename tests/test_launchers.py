"""Launchers: profiles, environment ownership, mounts, rendered scripts (quoting, secrets), chains.

The golden scripts themselves are compared in tests/test_golden.py; here they must also parse.
Rendered scripts are executed with stand-ins for srun and scontrol that record what they receive,
so quoting is checked by what reaches srun, not by reading the text.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from launchers.env import is_secret, plan_env, recipe_env
from launchers.local import config_argument, process_env
from launchers.profile import Profile, from_toml, load_profile, time_to_minutes
from launchers.sbatch import render, submit
from launchers.slurm import nemo_executor, slurm_job
from recipes.registry import get
from tests.golden_sbatch import sbatch_goldens
from training.tree import ConfigError, apply_overrides

PROFILES = Path(__file__).parent.parent / "launchers" / "profiles"
FAKES = {
    "srun": 'printf "%s\\0" "$@" > "$FAKE_OUT/srun.argv"; env -0 > "$FAKE_OUT/srun.env"',
    "scontrol": "echo node001",
}


def problems(err: pytest.ExceptionInfo[ConfigError]) -> str:
    return "\n".join(f"{f}: {m}" for f, m in err.value.problems)


# --- profiles -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.toml")), ids=lambda p: p.name)
def test_example_profiles_load(path: Path) -> None:
    assert load_profile(path).executor == path.stem


@pytest.mark.parametrize(
    "data, field, words",
    [
        ({"partiton": "batch"}, "partiton", "Did you mean 'partition'"),
        ({"gpus_per_node": "8"}, "gpus_per_node", "expected int"),
        ({"mounts": "/a:/b"}, "mounts", "list of strings"),
        ({"time": "four hours"}, "time", "not a Slurm time"),
        ({"executor": "slurm-apptainr", "container_image": "x.sif"}, "executor", "slurm-apptainer"),
        ({"executor": "slurm-bare"}, "venv", "needs venv"),
        ({"executor": "slurm"}, "container_image", "needs container_image"),
        (
            {"exit_margin_minutes": 90, "time": "01:00:00"},
            "exit_margin_minutes",
            "no training time",
        ),
        (
            {"fabric": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}},
            "fabric.CUDA_DEVICE_MAX_CONNECTIONS",
            "owned by the recipe",
        ),
        ({"fabric": {"NCCL_IB_HAC": "mlx5"}}, "fabric.NCCL_IB_HAC", "NCCL_IB_HCA"),
        ({"fabric": {"HF_HOME": "/x"}}, "fabric.HF_HOME", "go in [env]"),
        ({"env": {"WANDB_API_KEY": "abc"}}, "env.WANDB_API_KEY", "secret"),
        ({"env": {"NVTE_FUSED_ATTN": "0"}}, "env.NVTE_FUSED_ATTN", "owned by the recipe"),
    ],
)
def test_profile_errors_name_the_key(data: dict, field: str, words: str) -> None:
    data = {"executor": "slurm-bare", "venv": "/v"} | data if "executor" not in data else data
    with pytest.raises(ConfigError) as err:
        from_toml(data)
    assert any(f == field and words in m for f, m in err.value.problems), problems(err)


def test_profile_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no profile"):
        load_profile(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("executor = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_profile(tmp_path / "bad.toml")


@pytest.mark.parametrize(
    "text, minutes",
    [("30", 30), ("04:00:00", 240), ("1-00:00:00", 1440), ("2-12", 3600), ("10:30", 10.5)],
)
def test_slurm_time_formats(text: str, minutes: float) -> None:
    assert time_to_minutes(text) == minutes


# --- environment by owner -----------------------------------------------------------------------


def test_recipe_env_follows_the_config() -> None:
    cfg = get("llama3_8b_pretrain").config()
    cfg.parallel.tensor_model_parallel_size, cfg.parallel.context_parallel_size = 1, 1
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {v.name for v in recipe_env(cfg)}
    cfg.parallel.tensor_model_parallel_size = 2
    names = {v.name: v.owner for v in recipe_env(cfg)}
    assert (
        names["CUDA_DEVICE_MAX_CONNECTIONS"] == "recipe"
        and "TORCH_NCCL_AVOID_RECORD_STREAMS" in names
    )
    cfg.train.device = "cpu"
    assert [v.name for v in recipe_env(cfg)] == ["CUDA_DEVICE_MAX_CONNECTIONS"]


def test_secret_names() -> None:
    for name in (
        "WANDB_API_KEY",
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "GITHUB_TOKEN",
        "DB_PASSWORD",
        "AWS_SECRET_ACCESS_KEY",
    ):
        assert is_secret(name), name
    for name in ("NCCL_IB_HCA", "HF_HOME", "TOKENIZERS_PARALLELISM", "PATH"):
        assert not is_secret(name), name


def test_user_environment_wins_locally() -> None:
    cfg = get("tiny_gpt_pretrain").config()
    plan = plan_env(
        cfg, {"NCCL_SOCKET_IFNAME": "ib0"}, {}, {"NCCL_SOCKET_IFNAME": "eth9", "PATH": "/bin"}
    )
    env = process_env(plan, {"NCCL_SOCKET_IFNAME": "eth9", "PATH": "/bin"})
    assert "NCCL_SOCKET_IFNAME" not in env and plan.user_wins == ["NCCL_SOCKET_IFNAME"]
    assert env["PATH"].startswith(str(Path(sys.executable).parent)) and env["PATH"].endswith("/bin")


# --- jobs: mounts, wall time, chains --------------------------------------------------------------


def pyxis_profile(**changes: object) -> Profile:
    base = {
        "executor": "slurm",
        "container_image": "img.sqsh",
        "mounts": ["/lustre/llm:/data"],
        "time": "02:00:00",
    }
    return from_toml(base | changes)


def test_paths_map_into_the_container() -> None:
    cfg = get("tiny_gpt_pretrain").config()
    ranks_cfg, job = slurm_job(
        cfg, pyxis_profile(), nodes=1, procs_per_node=8, run_dir="/lustre/llm/runs/a", user_env={}
    )
    assert (
        ranks_cfg.logging.run_dir == "/data/runs/a"
        and job.config_path == "/data/runs/a/config.yaml"
    )
    assert job.run_dir == "/lustre/llm/runs/a"


@pytest.mark.parametrize(
    "run_dir, overrides, field",
    [
        ("/home/me/runs/a", [], "logging.run_dir"),
        ("/lustre/llm/runs/a", ["checkpoint.save_dir=/scratch/ckpt"], "checkpoint.save_dir"),
    ],
)
def test_refuses_paths_outside_the_mounts(run_dir: str, overrides: list[str], field: str) -> None:
    cfg = apply_overrides(get("tiny_gpt_pretrain").config(), overrides)
    with pytest.raises(ConfigError) as err:
        slurm_job(cfg, pyxis_profile(), nodes=1, procs_per_node=8, run_dir=run_dir, user_env={})
    assert err.value.problems[0][0] == field and "outside the container's mounts" in problems(err)


def test_refuses_a_read_only_mount() -> None:
    profile = pyxis_profile(mounts=["/lustre/llm:/data:ro"])
    with pytest.raises(ConfigError, match="read-only"):
        slurm_job(
            get("tiny_gpt_pretrain").config(),
            profile,
            nodes=1,
            procs_per_node=8,
            run_dir="/lustre/llm/r",
            user_env={},
        )


def test_wall_time_sets_exit_duration_and_signal() -> None:
    cfg = get("tiny_gpt_pretrain").config()
    profile = pyxis_profile(time="02:00:00", exit_margin_minutes=15)
    ranks_cfg, job = slurm_job(
        cfg, profile, nodes=1, procs_per_node=8, run_dir="/lustre/llm/r", user_env={}
    )
    assert ranks_cfg.train.exit_duration_minutes == 105 and cfg.train.exit_duration_minutes is None
    script = render(job)
    assert "#SBATCH --signal=USR1@900" in script
    cfg.train.exit_duration_minutes = 5  # the user's own value is kept
    assert (
        slurm_job(cfg, profile, nodes=1, procs_per_node=8, run_dir="/lustre/llm/r", user_env={})[
            0
        ].train.exit_duration_minutes
        == 5
    )


def test_chain_submits_each_job_after_the_previous(tmp_path: Path) -> None:
    fake = tmp_path / "sbatch"
    fake.write_text(
        f'#!/bin/bash\necho "$@" >> {tmp_path}/calls\necho $(( $(wc -l < {tmp_path}/calls) + 100 ))\n'
    )
    fake.chmod(0o755)
    assert submit(tmp_path / "job.sbatch", chain=3, sbatch=str(fake)) == ["101", "102", "103"]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls[0] == f"--parsable {tmp_path}/job.sbatch"
    assert (
        calls[1].startswith("--parsable --dependency=afterany:101 ") and "afterany:102" in calls[2]
    )


def test_pyxis_job_is_a_nemo_run_executor() -> None:
    _, job = slurm_job(
        get("tiny_gpt_pretrain").config(),
        pyxis_profile(mpi="pmix"),
        nodes=2,
        procs_per_node=8,
        run_dir="/lustre/llm/r",
        user_env={},
    )
    executor = nemo_executor(job)
    assert executor.container_image == "img.sqsh" and executor.container_mounts == [
        "/lustre/llm:/data"
    ]
    assert {"--no-container-mount-home", "--container-writable", "--mpi=pmix"} <= set(
        executor.srun_args
    )
    assert executor.nodes == 2 and executor.signal is None


# --- rendered scripts: they parse, and run what they say ------------------------------------------


@pytest.mark.parametrize("path", sorted(sbatch_goldens()), ids=lambda p: p.name)
def test_golden_scripts_parse(path: Path) -> None:
    text = sbatch_goldens()[path]
    assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert "golden-secret-value" not in text and "WANDB_API_KEY" in text


def run_script(
    text: str, workdir: Path, env: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """Execute a rendered script with recording stand-ins for srun and scontrol."""
    bin_dir = workdir / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in FAKES.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = workdir / "job.sbatch"
    script.write_text(text)
    base = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_OUT": str(workdir),
        "SLURM_JOB_NODELIST": "node001",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_CPUS_ON_NODE": "2",
    }
    done = subprocess.run(
        ["bash", str(script)],
        env=base | (env or {}),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=workdir,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    argv = (workdir / "srun.argv").read_text().split("\0")[:-1]
    srun_env = dict(
        item.split("=", 1) for item in (workdir / "srun.env").read_text().split("\0") if "=" in item
    )
    return argv, srun_env


def bare_job(tmp: Path, **profile: object) -> tuple[str, Path]:
    venv = tmp / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "activate").write_text("export VIRTUAL_ENV=activated\n")
    base = {"executor": "slurm-bare", "venv": str(venv), "fabric": {"NCCL_SOCKET_IFNAME": "ib0"}}
    _, job = slurm_job(
        get("tiny_gpt_pretrain").config(),
        from_toml(base | profile),
        nodes=1,
        procs_per_node=2,
        run_dir=str(tmp / "run"),
        user_env={"HF_TOKEN": "hf-secret-value"},
    )
    return render(job), venv


def test_user_environment_wins_in_the_script(tmp_path: Path) -> None:
    text, _ = bare_job(tmp_path)
    _, env = run_script(
        text, tmp_path, {"NCCL_SOCKET_IFNAME": "eth9", "HF_TOKEN": "hf-secret-value"}
    )
    assert env["NCCL_SOCKET_IFNAME"] == "eth9" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert (
        env["HF_TOKEN"] == "hf-secret-value" and "hf-secret-value" not in text
    )  # inherited, never written
    assert env["VIRTUAL_ENV"] == "activated"


@pytest.mark.parametrize("kind", ["slurm", "slurm-apptainer"])
def test_containers_receive_variables_by_name(kind: str, tmp_path: Path) -> None:
    profile = from_toml(
        {"executor": kind, "container_image": "img", "mounts": [f"{tmp_path}:/data"]}
    )
    _, job = slurm_job(
        get("tiny_gpt_pretrain").config(),
        profile,
        nodes=1,
        procs_per_node=2,
        run_dir=str(tmp_path / "run"),
        user_env={"WANDB_API_KEY": "wb-secret-value"},
    )
    text = render(job)
    assert "wb-secret-value" not in text
    argv, env = run_script(text, tmp_path, {"WANDB_API_KEY": "wb-secret-value"})
    if kind == "slurm":
        assert "WANDB_API_KEY" in next(a for a in argv if a.startswith("--container-env=")).split(
            ","
        )
    else:
        assert (
            env["APPTAINERENV_WANDB_API_KEY"] == "wb-secret-value"
            and argv[argv.index("--bind") + 1] == f"{tmp_path}:/data"
        )
    assert argv[argv.index("--config") + 1] == "/data/run/config.yaml"


HOSTILE = [
    "'",
    '"',
    "`touch {s}`",
    "$(touch {s})",
    ";touch {s};",
    " ",
    "\n",
    "\\",
    "$HOME",
    "&",
    "|",
    "#",
    "*",
    "!",
    "{",
    ":",
    ",",
    "%",
    "=",
    "-",
]


@st.composite
def hostile_text(draw: st.DrawFn) -> str:
    return "".join(
        draw(
            st.lists(
                st.sampled_from(HOSTILE) | st.text("abc", min_size=1, max_size=3),
                min_size=1,
                max_size=6,
            )
        )
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["slurm", "slurm-apptainer", "slurm-bare"]),
    texts=st.fixed_dictionaries(
        {k: hostile_text() for k in ("mount", "run", "env", "name", "override", "job_dir", "image")}
    ),
)
def test_hostile_strings_never_run(kind: str, texts: dict[str, str]) -> None:
    """Quotes, $(...), backticks, newlines, ';' in every user-controlled value: the script either
    is refused before rendering (a newline, or a mount separator) or parses, runs no sentinel and
    hands srun the exact values."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        sentinel = tmp / "PWNED"
        t = {k: v.replace("{s}", str(sentinel)) for k, v in texts.items()}
        mount, venv = tmp / f"m{t['mount']}", tmp / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "activate").write_text("")
        data = {
            "executor": kind,
            "venv": str(venv),
            "container_image": t["image"],
            "job_dir": str(tmp / f"j{t['job_dir']}"),
            "mounts": [f"{mount}:/c{t['mount']}"],
            "env": {"HF_HOME": t["env"]},
        }
        run_dir = f"{mount}/r{t['run']}"
        try:
            cfg = apply_overrides(
                get("tiny_gpt_pretrain").config(),
                [f"name={t['name']}", f"logging.wandb_project={t['override']}"],
            )
            _, job = slurm_job(
                cfg, from_toml(data), nodes=1, procs_per_node=2, run_dir=run_dir, user_env={}
            )
            text = render(job)
        except ConfigError as err:
            refusable = "\n" in "".join(t.values()) or any(c in t["mount"] for c in ",:")
            assert refusable, err.problems
            event("refused before rendering")
            return
        event(f"rendered and ran ({kind})")
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0
        argv, env = run_script(text, tmp)
        assert not sentinel.exists()
        assert (
            argv[argv.index("--config") + 1] == f"/c{t['mount']}/r{t['run']}/config.yaml"
            if kind != "slurm-bare"
            else f"{run_dir}/config.yaml"
        )
        assert env["HF_HOME"] == t["env"]
        if kind == "slurm-apptainer":
            assert t["image"] in argv


def test_local_config_argument_is_relative_when_it_can_be(tmp_path: Path) -> None:
    assert config_argument(tmp_path / "runs/a/config.yaml", cwd=tmp_path) == "runs/a/config.yaml"
    with pytest.raises(ConfigError, match="logging.run_dir"):
        config_argument(Path("/tmp/a b/config.yaml"), cwd=tmp_path)


# --- the CLI --------------------------------------------------------------------------------------


def recipes(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = os.environ | {"NEMORUN_HOME": str(cwd or tempfile.gettempdir())}
    return subprocess.run(
        [sys.executable, "-m", "recipes", "run", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=env,
    )


def test_run_refuses_an_invalid_recipe() -> None:
    out = recipes("llama3_8b_pretrain", "parallel.tensor_model_parallel_size=3", "--dryrun")
    assert out.returncode == 2 and "parallel.tensor_model_parallel_size" in out.stdout


def test_run_refuses_what_does_not_fit_except_on_cpu() -> None:
    one_gpu = ["--nodes", "1", "--gpus-per-node", "1", "parallel.tensor_model_parallel_size=1"]
    one_gpu += ["parallel.pipeline_model_parallel_size=1", "parallel.context_parallel_size=1"]
    out = recipes("llama3_8b_pretrain", *one_gpu, "--executor", "slurm-bare", "--dryrun")
    assert out.returncode == 3 and "DOES NOT FIT" in out.stdout
    out = recipes(
        "llama3_8b_pretrain", *one_gpu, "--executor", "slurm-bare", "--device", "cpu", "--dryrun"
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_slurm_dryrun_prints_config_and_script(tmp_path: Path) -> None:
    out = recipes(
        "tiny_gpt_pretrain",
        "--executor",
        "slurm-bare",
        "--dryrun",
        f"logging.run_dir={tmp_path}/run",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "exit_duration_minutes: 50.0" in out.stdout and "#SBATCH --signal=USR1@600" in out.stdout
    assert f"source {sys.prefix}/bin/activate" in out.stdout and not (tmp_path / "run").exists()


def test_containerised_run_needs_a_profile() -> None:
    out = recipes("tiny_gpt_pretrain", "--executor", "slurm", "--dryrun")
    assert out.returncode == 2 and "--cluster" in out.stderr


def test_local_dryrun_shows_torchrun(tmp_path: Path) -> None:
    out = recipes("tiny_gpt_pretrain", "--device", "cpu", "--dryrun", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (
        "torchrun" in out.stdout
        and "-m training.entry --config runs/tiny_gpt_pretrain-" in out.stdout
    )
    assert not (tmp_path / "runs").exists()
