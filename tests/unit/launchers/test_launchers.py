"""Launchers: profiles, environment by owner, mounts, rendered scripts (quoting, secrets), chains.

The golden scripts are compared in tests/unit/recipes/test_golden.py; here they must also parse. Rendered
scripts are executed with stand-ins for srun and scontrol that record what they receive, so quoting
is checked by what reaches srun, not by reading the text. tests/slurm/test_slurm.py runs the real thing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from config.hardware import Cluster
from config.schema import TrainingConfig
from config.tree import ConfigError, apply_overrides
from launchers.env import is_secret, plan_env, recipe_env
from launchers.jobsize import JobSize, job_cluster
from launchers.local import config_argument, process_env
from launchers.profile import EXECUTORS, Profile, from_toml, load_profile, time_to_minutes
from launchers.sbatch import render, submit
from launchers.slurm import SlurmJob, nemo_executor, slurm_job
from recipes.registry import get
from tests.support import children
from tests.support.golden_sbatch import sbatch_goldens

PROFILES = Path(__file__).parents[3] / "launchers" / "profiles"
FAKES = {
    "srun": 'printf "%s\\0" "$@" > "$FAKE_OUT/srun.argv"; env -0 > "$FAKE_OUT/srun.env"',
    "scontrol": "echo node001",
}


def problems(err: pytest.ExceptionInfo[ConfigError]) -> str:
    return "\n".join(f"{f}: {m}" for f, m in err.value.problems)


def tiny() -> TrainingConfig:
    return get("tiny_gpt_pretrain").config()


def job_of(profile: Profile, run_dir: str, cfg: TrainingConfig | None = None, **kw) -> SlurmJob:
    return slurm_job(
        cfg or tiny(),
        profile,
        nodes=kw.get("nodes", 1),
        procs_per_node=2,
        run_dir=run_dir,
        user_env=kw.get("user_env", {}),
    )[1]


def pyxis(**changes: object) -> Profile:
    base = {"executor": "slurm", "container_image": "img.sqsh", "mounts": ["/lustre/llm:/data"]}
    return from_toml(base | {"time": "02:00:00"} | changes)


# --- profiles -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.toml")), ids=lambda p: p.name)
def test_example_profiles_load(path: Path) -> None:
    """The generic profiles are named after their executor; the sites' in test_sites.py."""
    profile = load_profile(path)
    assert profile.executor == path.stem or path.stem not in EXECUTORS


# fmt: off
PROFILE_ERRORS = [
    ({"partiton": "batch"}, "partiton", "Did you mean 'partition'"),
    ({"gpus_per_node": "8"}, "gpus_per_node", "expected int"),
    ({"mounts": "/a:/b"}, "mounts", "list of strings"),
    ({"time": "four hours"}, "time", "not a Slurm time"),
    ({"executor": "slurm-apptainr", "container_image": "x.sif"}, "executor", "slurm-apptainer"),
    ({"executor": "slurm-bare"}, "venv", "needs venv"),
    ({"executor": "slurm"}, "container_image", "needs container_image"),
    ({"exit_margin_minutes": 90, "time": "01:00:00"}, "exit_margin_minutes", "no training time"),
    ({"fabric": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}}, "fabric.CUDA_DEVICE_MAX_CONNECTIONS", "owned by the recipe"),
    ({"fabric": {"NCCL_IB_HAC": "mlx5"}}, "fabric.NCCL_IB_HAC", "NCCL_IB_HCA"),
    ({"fabric": {"HF_HOME": "/x"}}, "fabric.HF_HOME", "go in [env]"),
    ({"env": {"WANDB_API_KEY": "abc"}}, "env.WANDB_API_KEY", "secret"),
    ({"env": {"NVTE_FUSED_ATTN": "0"}}, "env.NVTE_FUSED_ATTN", "owned by the recipe"),
]
# fmt: on


@pytest.mark.parametrize("data, field, words", PROFILE_ERRORS)
def test_profile_errors_name_the_key(data: dict, field: str, words: str) -> None:
    data = data if "executor" in data else {"executor": "slurm-bare", "venv": "/v"} | data
    with pytest.raises(ConfigError) as err:
        from_toml(data)
    assert any(f == field and words in m for f, m in err.value.problems), problems(err)


def test_profile_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no profile"):
        load_profile(tmp_path / "missing.toml")
    (tmp_path / "bad.toml").write_text("executor = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_profile(tmp_path / "bad.toml")


def test_a_shipped_profile_is_found_by_its_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_profile("slurm") == load_profile(PROFILES / "slurm.toml")
    with pytest.raises(ConfigError, match="slurm, slurm-apptainer, slurm-bare") as err:
        load_profile("slrum")
    assert err.value.problems[0][0] == "--profile"
    monkeypatch.chdir(tmp_path)  # a file of that name in the working directory comes first
    (tmp_path / "slurm").write_text('executor = "local"\n')
    assert load_profile("slurm").executor == "local"


PUBLISHED = Cluster(num_nodes=8, gpus_per_node=8, gpu="h100")
SITE = Profile(executor="slurm-bare", venv="/v", nodes=2, gpus_per_node=4, gpu="a100")


@pytest.mark.parametrize(
    ("published", "profile", "size", "expected"),
    [
        (PUBLISHED, None, JobSize(), Cluster(8, 8, "h100")),
        (PUBLISHED, SITE, JobSize(), Cluster(2, 4, "a100")),  # the profile's defaults
        (PUBLISHED, SITE, JobSize(nodes=1, gpu="h200"), Cluster(1, 4, "h200")),  # the command's
        (PUBLISHED, None, JobSize(nvlink_domain=4), Cluster(8, 8, "h100", nvlink_domain=4)),
        (PUBLISHED, None, JobSize(nodes=0), Cluster(0, 8, "h100")),  # for the checker to refuse
        # The CPU mode of a GPU recipe: one node of two processes, unless told otherwise.
        (PUBLISHED, None, JobSize(gpu="cpu"), Cluster(1, 2, "cpu")),
        (PUBLISHED, None, JobSize(device="cpu"), Cluster(1, 2, "cpu")),
        (PUBLISHED, SITE, JobSize(device="cpu"), Cluster(2, 4, "cpu")),
        (PUBLISHED, None, JobSize(device="cpu", gpus_per_node=4), Cluster(1, 4, "cpu")),
        # A recipe published on the CPU keeps its size; --device cuda keeps its kind.
        (Cluster(1, 2, "cpu"), None, JobSize(), Cluster(1, 2, "cpu")),
        (Cluster(1, 2, "cpu"), None, JobSize(gpu="h100"), Cluster(1, 2, "h100")),
        (Cluster(1, 2, "cpu"), None, JobSize(device="cuda"), Cluster(1, 2, "cpu")),
        # A config outside the catalog: the command and the profile give it all.
        (None, SITE, JobSize(), Cluster(2, 4, "a100")),
    ],
)
def test_job_size_comes_from_the_command_then_the_profile_then_the_recipe(
    published: Cluster | None, profile: Profile | None, size: JobSize, expected: Cluster
) -> None:
    assert job_cluster(published, profile, size) == expected


def test_a_job_size_nobody_gives_is_named() -> None:
    with pytest.raises(ConfigError) as err:
        job_cluster(None, None, JobSize(nodes=1))
    assert [field for field, _ in err.value.problems] == ["gpus_per_node", "gpu"]


@pytest.mark.parametrize(
    "text, minutes", [("30", 30), ("04:00:00", 240), ("1-00:00:00", 1440), ("2-12", 3600)]
)
def test_slurm_time_formats(text: str, minutes: float) -> None:
    assert time_to_minutes(text) == minutes


# --- environment by owner -----------------------------------------------------------------------


def test_recipe_env_follows_the_config() -> None:
    cfg = get("llama3_8b_pretrain").config()
    cfg.parallel.tensor_model_parallel_size, cfg.parallel.context_parallel_size = 1, 1
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in {v.name for v in recipe_env(cfg)}
    cfg.parallel.tensor_model_parallel_size = 2
    owners = {v.name: v.owner for v in recipe_env(cfg)}
    assert owners["CUDA_DEVICE_MAX_CONNECTIONS"] == "recipe"
    assert owners["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "recipe"
    cfg.train.device = "cpu"
    assert [v.name for v in recipe_env(cfg)] == ["CUDA_DEVICE_MAX_CONNECTIONS"]


def test_secret_names() -> None:
    for name in ("WANDB_API_KEY", "HF_TOKEN", "OPENAI_API_KEY", "DB_PASSWORD", "AWS_SECRET_KEY"):
        assert is_secret(name), name
    for name in ("NCCL_IB_HCA", "HF_HOME", "TOKENIZERS_PARALLELISM", "PATH"):
        assert not is_secret(name), name


def test_user_environment_wins_locally() -> None:
    user = {"NCCL_SOCKET_IFNAME": "eth9", "PATH": "/bin"}
    plan = plan_env(tiny(), {"NCCL_SOCKET_IFNAME": "ib0"}, {}, user)
    env = process_env(plan, user)
    assert "NCCL_SOCKET_IFNAME" not in env and plan.user_wins == ["NCCL_SOCKET_IFNAME"]
    assert env["PATH"] == f"{Path(sys.executable).parent}:/bin"


# --- jobs: mounts, wall time, chains --------------------------------------------------------------


def test_paths_map_into_the_container() -> None:
    ranks_cfg, job = slurm_job(
        tiny(), pyxis(), nodes=1, procs_per_node=8, run_dir="/lustre/llm/a", user_env={}
    )
    assert ranks_cfg.logging.run_dir == "/data/a" and job.config_path == "/data/a/config.yaml"
    assert job.run_dir == "/lustre/llm/a"


@pytest.mark.parametrize(
    "run_dir, overrides, field",
    [
        ("/home/me/runs/a", [], "logging.run_dir"),
        ("/lustre/llm/runs/a", ["checkpoint.save_dir=/scratch/ckpt"], "checkpoint.save_dir"),
    ],
)
def test_refuses_paths_outside_the_mounts(run_dir: str, overrides: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        job_of(pyxis(), run_dir, apply_overrides(tiny(), overrides))
    assert err.value.problems[0][0] == field and "outside the container's mounts" in problems(err)


def test_refuses_a_read_only_mount() -> None:
    with pytest.raises(ConfigError, match="read-only"):
        job_of(pyxis(mounts=["/lustre/llm:/data:ro"]), "/lustre/llm/r")


def test_wall_time_sets_exit_duration_and_signal() -> None:
    cfg, profile = tiny(), pyxis(time="02:00:00", exit_margin_minutes=15)
    ranks_cfg, job = slurm_job(
        cfg, profile, nodes=1, procs_per_node=8, run_dir="/lustre/llm/r", user_env={}
    )
    assert ranks_cfg.train.exit_duration_minutes == 105 and cfg.train.exit_duration_minutes is None
    assert "#SBATCH --signal=USR1@900" in render(job)
    cfg.train.exit_duration_minutes = 5  # the user's own value is kept
    kept = slurm_job(cfg, profile, nodes=1, procs_per_node=8, run_dir="/lustre/llm/r", user_env={})
    assert kept[0].train.exit_duration_minutes == 5


def test_chain_submits_each_job_after_the_previous(tmp_path: Path) -> None:
    fake, calls = tmp_path / "sbatch", tmp_path / "calls"
    fake.write_text(f'#!/bin/bash\necho "$@" >> {calls}\necho $(( $(wc -l < {calls}) + 100 ))\n')
    fake.chmod(0o755)
    assert submit(tmp_path / "job.sbatch", chain=3, sbatch=str(fake)) == ["101", "102", "103"]
    lines = calls.read_text().splitlines()
    assert lines[0] == f"--parsable {tmp_path}/job.sbatch"
    assert (
        lines[1].startswith("--parsable --dependency=afterany:101 ") and "afterany:102" in lines[2]
    )


def test_pyxis_job_is_a_nemo_run_executor() -> None:
    executor = nemo_executor(job_of(pyxis(mpi="pmix"), "/lustre/llm/r", nodes=2))
    assert executor.container_image == "img.sqsh" and executor.container_mounts == [
        "/lustre/llm:/data"
    ]
    assert {"--no-container-mount-home", "--container-writable", "--mpi=pmix"} <= set(
        executor.srun_args
    )
    assert executor.nodes == 2 and executor.ntasks_per_node == 2


def test_nemo_runs_slurm_executor_takes_the_gres_and_refuses_what_it_cannot_render(
    tmp_path: Path,
) -> None:
    from launchers.slurm import nemo_slurm_executor
    from tests.unit.launchers.test_sites import filled

    executor = nemo_slurm_executor(filled("leonardo", tmp_path), 2, 4, "cuda", {})
    assert (executor.gres, executor.gpus_per_node) == ("gpu:4", None)
    with pytest.raises(ConfigError) as err:
        nemo_slurm_executor(filled("jupiter", tmp_path), 2, 4, "cuda", {})
    assert [k for k, _ in err.value.problems] == ["rdzv_host_suffix"]
    with pytest.raises(ConfigError) as err:
        nemo_slurm_executor(filled("alps", tmp_path), 2, 4, "cuda", {})
    assert [k for k, _ in err.value.problems] == ["executor"]


# --- rendered scripts: they parse, and hand srun exactly the values ---------------------------------


@pytest.mark.parametrize("path", sorted(sbatch_goldens()), ids=lambda p: p.name)
def test_golden_scripts_parse(path: Path) -> None:
    text = sbatch_goldens()[path]
    assert children.run(["bash", "-n"], input=text, text=True).returncode == 0
    assert "golden-secret-value" not in text and "WANDB_API_KEY" in text


def run_script(
    text: str, workdir: Path, env: dict | None = None, fakes: dict[str, str] = FAKES
) -> tuple[list[str], dict]:
    """Execute a rendered script with recording stand-ins (`fakes`: name -> bash body; srun
    writes its argv and environment to $FAKE_OUT) for srun and scontrol; `env` over the
    one-node Slurm environment."""
    bin_dir = workdir / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (workdir / "job.sbatch").write_text(text)
    slurm = {"SLURM_JOB_NODELIST": "node001", "SLURM_JOB_ID": "7", "SLURM_JOB_NUM_NODES": "1"}
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_OUT": str(workdir), "SLURM_CPUS_ON_NODE": "2"}
    done = children.run(
        ["bash", "job.sbatch"],
        env=base | slurm | (env or {}),
        capture_output=True,
        text=True,
        timeout=30,
        cwd=workdir,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    argv = (workdir / "srun.argv").read_text().split("\0")[:-1]
    items = (workdir / "srun.env").read_text().split("\0")
    return argv, dict(item.split("=", 1) for item in items if "=" in item)


def test_user_environment_wins_in_the_script(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("export VIRTUAL_ENV=activated\n")
    profile = from_toml(
        {"executor": "slurm-bare", "venv": str(venv), "fabric": {"NCCL_SOCKET_IFNAME": "ib0"}}
    )
    text = render(job_of(profile, str(tmp_path / "run"), user_env={"HF_TOKEN": "hf-secret"}))
    _, env = run_script(text, tmp_path, {"NCCL_SOCKET_IFNAME": "eth9", "HF_TOKEN": "hf-secret"})
    assert env["NCCL_SOCKET_IFNAME"] == "eth9" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env["HF_TOKEN"] == "hf-secret" and "hf-secret" not in text  # inherited, never written
    assert env["VIRTUAL_ENV"] == "activated"


@pytest.mark.parametrize("kind", ["slurm", "slurm-apptainer"])
def test_containers_receive_variables_by_name(kind: str, tmp_path: Path) -> None:
    profile = from_toml(
        {"executor": kind, "container_image": "img", "mounts": [f"{tmp_path}:/data"]}
    )
    text = render(job_of(profile, str(tmp_path / "run"), user_env={"WANDB_API_KEY": "wb-secret"}))
    assert "wb-secret" not in text
    argv, env = run_script(text, tmp_path, {"WANDB_API_KEY": "wb-secret"})
    if kind == "slurm":
        names = next(a for a in argv if a.startswith("--container-env=")).split("=")[1]
        assert "WANDB_API_KEY" in names.split(",")
    else:
        assert env["APPTAINERENV_WANDB_API_KEY"] == "wb-secret"
        assert argv[argv.index("--bind") + 1] == f"{tmp_path}:/data"
    assert argv[argv.index("--config") + 1] == "/data/run/config.yaml"


# fmt: off
HOSTILE = ["'", '"', "`touch {s}`", "$(touch {s})", ";touch {s};", " ", "\n", "\\", "$HOME", "&",
           "|", "#", "*", "!", "{", ":", ",", "%", "=", "-"]
# fmt: on
hostile = st.lists(
    st.sampled_from(HOSTILE) | st.text("abc", min_size=1, max_size=3), min_size=1, max_size=6
).map("".join)
FIELDS = ("mount", "run", "env", "name", "override", "job_dir", "image")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["slurm", "slurm-apptainer", "slurm-edf", "slurm-bare"]),
    texts=st.fixed_dictionaries({k: hostile for k in FIELDS}),
)
def test_hostile_strings_never_run(kind: str, texts: dict[str, str]) -> None:
    """Quotes, $(...), backticks, newlines, ';' in every user-controlled value: the job is refused
    before rendering (a newline, or a mount separator), or the script parses, runs no sentinel
    command and hands srun the exact values. The sentinel is relative (the script runs in `tmp`)
    so that it fits in a run name, which may not hold '/'."""
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        t = {k: v.replace("{s}", "PWNED") for k, v in texts.items()}
        mount, venv = tmp / f"m{t['mount']}", tmp / "venv"
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "activate").write_text("")
        data = {
            "executor": kind,
            "venv": str(venv),
            "container_image": t["image"],
            "env": {"HF_HOME": t["env"]},
        }
        data |= {"job_dir": str(tmp / f"j{t['job_dir']}"), "mounts": [f"{mount}:/c{t['mount']}"]}
        run_dir = f"{mount}/r{t['run']}"
        try:
            overrides = [f"name={t['name']}", f"logging.wandb_project={t['override']}"]
            text = render(job_of(from_toml(data), run_dir, apply_overrides(tiny(), overrides)))
        except ConfigError as err:
            fields = {field for field, _ in err.problems}
            not_a_folder_name = fields == {"name"}  # e.g. name='' (config/rules/training.py)
            newline = "\n" in "".join(t.values())
            # an image of another runtime: pyxis's registry#image for Apptainer, a .sif for pyxis
            other_runtime = fields == {"container_image"} and (
                "#" in t["image"] or t["image"].endswith(".sif")
            )
            # an image named like an option (-x), which the runtime would read as one
            # (launchers/profile.py)
            like_an_option = fields == {"container_image"} and t["image"].startswith("-")
            assert (
                newline
                or any(c in t["mount"] for c in ",:")
                or not_a_folder_name
                or other_runtime
                or like_an_option
            ), err.problems
            event("refused before rendering")
            return
        event(f"rendered and ran ({kind})")
        assert children.run(["bash", "-n"], input=text, text=True).returncode == 0
        argv, env = run_script(text, tmp)
        assert not any(path.name == "PWNED" for path in tmp.rglob("*"))
        inside = (
            f"{run_dir}/config.yaml"
            if kind == "slurm-bare"
            else f"/c{t['mount']}/r{t['run']}/config.yaml"
        )
        assert argv[argv.index("--config") + 1] == inside and env["HF_HOME"] == t["env"]
        assert kind != "slurm-apptainer" or t["image"] in argv


# --- the CLI and the local executor -------------------------------------------------------------


def recipes(
    *args: str, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    scratch = str(cwd or tempfile.gettempdir())  # caches the run may write stay out of $HOME
    env = (env or os.environ | {"NEMORUN_HOME": scratch}) | {
        "MPLCONFIGDIR": scratch,
        "HF_HOME": scratch,
    }
    argv = [sys.executable, "-m", "recipes", "run", *args]
    return children.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_run_refuses_an_invalid_recipe() -> None:
    out = recipes("llama3_8b_pretrain", "parallel.tensor_model_parallel_size=3", "--dryrun")
    assert out.returncode == 2 and "parallel.tensor_model_parallel_size" in out.stdout


def test_run_refuses_what_does_not_fit_except_on_cpu() -> None:
    one_gpu = ["--nodes", "1", "--gpus-per-node", "1", "--executor", "slurm-bare", "--dryrun"]
    one_gpu += [
        f"parallel.{p}_parallel_size=1" for p in ("tensor_model", "pipeline_model", "context")
    ]
    out = recipes("llama3_8b_pretrain", *one_gpu)
    assert out.returncode == 3 and "DOES NOT FIT" in out.stdout
    out = recipes("llama3_8b_pretrain", *one_gpu, "--device", "cpu")
    assert out.returncode == 0, out.stdout + out.stderr


def test_slurm_dryrun_prints_config_and_script(tmp_path: Path) -> None:
    out = recipes(
        "tiny_gpt_pretrain",
        "--executor",
        "slurm-bare",
        "--dryrun",
        f"logging.run_dir={tmp_path}/run",
    )
    assert out.returncode == 0, out.stderr
    assert "exit_duration_minutes: 50.0" in out.stdout and "#SBATCH --signal=USR1@600" in out.stdout
    assert f"source {sys.prefix}/bin/activate" in out.stdout and not (tmp_path / "run").exists()


def test_containerised_run_needs_a_profile() -> None:
    out = recipes("tiny_gpt_pretrain", "--executor", "slurm", "--dryrun")
    assert out.returncode == 2 and "--profile" in out.stderr


def test_local_config_argument_is_relative_when_it_can_be(tmp_path: Path) -> None:
    assert config_argument(tmp_path / "runs/a/config.yaml", cwd=tmp_path) == "runs/a/config.yaml"
    with pytest.raises(ConfigError, match="logging.run_dir"):
        config_argument(Path("/tmp/a b/config.yaml"), cwd=tmp_path)


def test_local_dryrun_shows_torchrun(tmp_path: Path) -> None:
    out = recipes("tiny_gpt_pretrain", "--device", "cpu", "--dryrun", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "-m training.entry --config runs/tiny_gpt_pretrain-" in out.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.smoke
def test_local_run_trains_in_the_foreground(tmp_path: Path) -> None:
    """The demo's command: NeMo-Run's LocalExecutor, two CPU ranks, NEMORUN_HOME in the run."""
    env = {k: v for k, v in os.environ.items() if k != "NEMORUN_HOME"}
    out = recipes(
        "tiny_gpt_pretrain",
        "--device",
        "cpu",
        "train.max_steps=6",
        "logging.tensorboard=false",
        cwd=tmp_path,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith(f"run directory: {tmp_path}/runs/tiny_gpt_pretrain-"), last
    run_dir = Path(last.split(": ", 1)[1])
    metrics = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert metrics == [1, 2, 3, 4, 5, 6] and "step 6/6" in out.stdout
    assert (run_dir / "config.yaml").is_file() and (run_dir / "nemo_run" / "experiments").is_dir()
