"""Hostile and odd profile values: refused with the key, the value and the fix, before any script.

What a fault-injection probe found, one section each: a newline in `time` (and in any other value)
that broke the #SBATCH block and the script's quoting; `mpi` unchecked; a NaN, negative or
sub-second `exit_margin_minutes`; secrets in `setup` and `sbatch_flags`; a run name that moved the
run directory out of `run_root`. Scripts are executed with the recording stand-ins of
tests/unit/launchers/test_launchers.py, in a sandbox folder, and must run no injected command.
"""

from __future__ import annotations

import dataclasses
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from config.tree import ConfigError, apply_overrides
from launchers.profile import Profile, check_profile, from_toml, time_to_minutes
from launchers.sbatch import render
from launchers.slurm import slurm_job
from tests.support import children
from tests.support.golden_sbatch import sbatch_goldens
from tests.unit.launchers.test_launchers import job_of, problems, run_script, tiny

KINDS = ["slurm", "slurm-apptainer", "slurm-edf", "slurm-bare"]


def base(kind: str = "slurm", root: str = "/lustre/llm") -> dict:
    """A valid profile of `kind` whose mount covers `root`."""
    return {
        "executor": kind,
        "container_image": "img.sif" if kind == "slurm-apptainer" else "img.sqsh",
        "mounts": [f"{root}:/data"],
        "venv": "/venv",
        "time": "02:00:00",
    }


def refused(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as err:
        from_toml(data)
    return err.value.problems


def slurm_reads(text: str) -> list[str]:
    """The #SBATCH lines sbatch reads: it stops at the first line that is not a comment."""
    lines = []
    for line in text.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            lines.append(line)
    return lines


# --- 1. control characters in every value, and `time` in Slurm's formats exactly ------------------

CONTROL = ["\n", "\r", "\t", "\x00", "\x1b", "\x7f"]
# (profile key in the error, TOML data with {c} where the control character goes)
# fmt: off
FIELDS = [
    ("time", {"time": "01:00{c}:00"}),
    ("account", {"account": "llm{c}x"}),
    ("partition", {"partition": "batch{c}"}),
    ("qos", {"qos": "{c}high"}),
    ("reservation", {"reservation": "r{c}1"}),
    ("constraint", {"constraint": "h100{c}"}),
    ("mem", {"mem": "0{c}"}),
    ("gpu", {"gpu": "h100{c}"}),
    ("job_dir", {"job_dir": "/lustre/llm/jobs{c}"}),
    ("run_root", {"run_root": "/lustre/llm/runs{c}"}),
    ("container_image", {"container_image": "img{c}.sqsh"}),
    ("workdir", {"workdir": "/work{c}dir"}),
    ("mpi", {"mpi": "pmix{c}"}),
    ("venv", {"venv": "/venv{c}"}),
    ("sbatch_flags[1]", {"sbatch_flags": ["--comment=ok", "--comment=a{c}b"]}),
    ("setup[0]", {"setup": ["module load cuda{c}"]}),
    ("mounts[0]", {"mounts": ["/lustre/llm{c}:/data"]}),
    ("env.HF_HOME", {"env": {"HF_HOME": "/hf{c}home"}}),
    ("fabric.NCCL_IB_HCA", {"fabric": {"NCCL_IB_HCA": "mlx5{c}"}}),
    ("launcher", {"launcher": "torchrun{c}"}),
    ("rdzv_host_suffix", {"rdzv_host_suffix": "i{c}"}),
    ("srun_flags[0]", {"srun_flags": ["--exclusive{c}"]}),
    ("annotations.a", {"executor": "slurm-edf", "annotations": {"a": "b{c}"}}),
]
# fmt: on


@pytest.mark.parametrize("char", CONTROL, ids=repr)
@pytest.mark.parametrize("key, data", FIELDS, ids=[k for k, _ in FIELDS])
def test_control_characters_are_refused_in_every_value(key: str, data: dict, char: str) -> None:
    def put(value: object) -> object:
        if isinstance(value, str):
            return value.replace("{c}", char)
        if isinstance(value, list):
            return [put(v) for v in value]
        return {k: put(v) for k, v in value.items()}

    data = {k: put(v) for k, v in data.items()}
    found = dict(refused(base() | data))
    assert key in found, found
    assert repr(char) in found[key] and "delete it from the profile" in found[key], found[key]


@pytest.mark.parametrize("table", ["env", "fabric"])
def test_control_characters_in_variable_names_are_refused(table: str) -> None:
    found = dict(refused(base() | {table: {"NCCL_IB_HCA\n": "x"}}))
    assert found[f"{table}['NCCL_IB_HCA\\n']"].startswith("'NCCL_IB_HCA\\n' is not a valid")


@pytest.mark.parametrize(
    "text",
    ["01:00:00\n", "\n01:00:00", "01:00:00\n#SBATCH --x", "01:00:00\r", " 01:00:00", "01:00:00 ",
     "٠١:00:00", "1:2:3:4", "1-", "-1", "UNLIMITED", ""],
    ids=repr,
)  # fmt: skip
def test_time_must_be_exactly_a_slurm_time(text: str) -> None:
    found = dict(refused(base() | {"time": text}))
    assert repr(text) in found["time"], found


@pytest.mark.parametrize(
    "text, minutes",
    [("90", 90), ("5:30", 5.5), ("01:02:03", 62.05), ("2-3", 3060), ("1-2:30", 1590),
     ("1-00:00:30", 1440.5)],
)  # fmt: skip
def test_every_slurm_time_format_is_accepted(text: str, minutes: float) -> None:
    assert time_to_minutes(text) == pytest.approx(minutes)
    assert from_toml(base() | {"time": text, "exit_margin_minutes": 1}).time == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(st.sampled_from("0123456789:-\n\r\t #'$() "), max_size=12))
def test_any_time_is_refused_or_read_whole_by_slurm(text: str) -> None:
    """Whatever `time` holds, either the profile is refused or Slurm reads every option."""
    try:
        profile = from_toml(base() | {"time": text, "exit_margin_minutes": 1 / 60})
    except ConfigError:
        return
    options = slurm_reads(render(job_of(profile, "/lustre/llm/r")))
    assert f"#SBATCH --time={text}" in options
    assert {"--signal", "--output", "--open-mode"} <= {o.split()[1].split("=")[0] for o in options}


@pytest.mark.parametrize("path", sorted(sbatch_goldens()), ids=lambda p: p.name)
def test_slurm_reads_every_option_of_the_goldens(path: Path) -> None:
    text = sbatch_goldens()[path]
    assert slurm_reads(text) == [line for line in text.splitlines() if line.startswith("#SBATCH")]


def test_a_profile_changed_after_loading_is_checked_before_rendering() -> None:
    """Validation is not only at load time: render() checks the job's profile as it is now."""
    job = job_of(from_toml(base()), "/lustre/llm/r")
    bad = dataclasses.replace(job.profile, time="01:00:00\n")  # dataclasses.replace checks nothing
    with pytest.raises(ConfigError) as err:
        render(dataclasses.replace(job, profile=bad))
    assert err.value.problems[0][0] == "time" and "'01:00:00\\n'" in problems(err)
    with pytest.raises(ConfigError, match="mpi"):
        slurm_job(
            tiny(),
            Profile(executor="slurm-bare", venv="/v", mpi="pmix\n"),
            nodes=1,
            procs_per_node=2,
            run_dir="/r",
            user_env={},
        )


def test_a_python_profile_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="time: expected str"):
        slurm_job(
            tiny(),
            Profile(executor="slurm-bare", venv="/v", time=None),  # type: ignore[arg-type]
            nodes=1,
            procs_per_node=2,
            run_dir="/r",
            user_env={},
        )


# --- values from the training config: quoted, never run ------------------------------------------

INJECTIONS = [
    "$(touch PWNED)",
    "`touch PWNED`",
    "';touch PWNED;'",
    '";touch PWNED;"',
    "\\$(touch PWNED)",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field", ["name", "logging.run_dir", "checkpoint.save_dir",
                                   "checkpoint.load_dir", "logging.wandb_project"])  # fmt: skip
def test_config_values_reaching_the_script_never_run(kind: str, field: str, tmp_path: Path) -> None:
    """Each injection in the field, the whole script executed in a sandbox: no PWNED file. The
    sentinel is relative, so it would land in the sandbox (the script's working directory)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("")
    profile = from_toml(base(kind, str(tmp_path)) | {"venv": str(venv)})
    for i, bad in enumerate(INJECTIONS):
        cfg, run_dir = tiny(), f"{tmp_path}/runs/tiny-{i}"
        if field == "logging.run_dir":
            run_dir = f"{tmp_path}/runs/{bad}"
        elif field == "name":  # as recipes/launch.py names a new run directory
            cfg = apply_overrides(cfg, [f"name={bad}"])
            run_dir = f"{tmp_path}/runs/{bad}-20250101-000000"
        elif field.startswith("checkpoint."):
            cfg = apply_overrides(cfg, [f"{field}={tmp_path}/ckpt/{bad}"])
        else:
            cfg = apply_overrides(cfg, [f"{field}={bad}"])
        text = render(job_of(profile, run_dir, cfg))
        assert children.run(["bash", "-n"], input=text, text=True).returncode == 0
        sandbox = tmp_path / f"sandbox{i}"
        sandbox.mkdir()
        argv, _ = run_script(text, sandbox)
        assert not any(p.name == "PWNED" for p in tmp_path.rglob("*")), (bad, text)
        assert argv[argv.index("--config") + 1].endswith("/config.yaml")


# --- 2. mpi ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mpi", ["pmix\n", "pmix\nsrun touch PWNED", "pmix\r", "pm\tix"], ids=repr)
def test_mpi_with_control_characters_is_refused(mpi: str) -> None:
    found = dict(refused(base() | {"mpi": mpi}))
    assert list(found) == ["mpi"] and repr(mpi) in found["mpi"], found


# --- 3. exit_margin_minutes --------------------------------------------------------------------


@pytest.mark.parametrize(
    "margin, words",
    [
        (float("nan"), "not a finite margin"),
        (float("inf"), "not a finite margin"),
        (float("-inf"), "not a finite margin"),
        (-5.0, "at least 1 second"),
        (0.0, "at least 1 second"),
        (0.001, "at least 1 second"),
        (0.99 / 60, "at least 1 second"),  # 0.99 s: sbatch would get --signal=USR1@0
        (120.0, "no training time"),  # time is 02:00:00
        (1100.0, "more than sbatch --signal takes (65535 s)"),
    ],
    ids=repr,
)
def test_exit_margin_must_be_finite_positive_and_below_time(margin: float, words: str) -> None:
    found = dict(refused(base() | {"time": "2-00:00:00" if margin == 1100 else "02:00:00",
                                   "exit_margin_minutes": margin}))  # fmt: skip
    assert words in found["exit_margin_minutes"] and repr(margin) in found["exit_margin_minutes"]


def test_exit_margin_nan_in_a_toml_file_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    data = tomllib.loads('executor = "slurm-bare"\nvenv = "/v"\nexit_margin_minutes = nan\n')
    assert dict(refused(data))["exit_margin_minutes"].startswith("nan is not a finite margin")


def test_the_smallest_margin_still_signals() -> None:
    profile = from_toml(base() | {"exit_margin_minutes": 1 / 60})
    assert "#SBATCH --signal=USR1@1" in slurm_reads(render(job_of(profile, "/lustre/llm/r")))


# --- 4. secrets in any value -------------------------------------------------------------------

HF = "hf_" + "a1B2" * 9  # the shape of a Hugging Face token
WANDB = "0123456789abcdef" * 2 + "01234567"  # 40 hex digits, the shape of a W&B key
GITHUB, GITHUB_PAT = "ghp_" + "x" * 36, "github_pat_" + "Y" * 30
AWS = "AKIAABCDEFGHIJKLMNOP"
# fmt: off
SECRETS = [
    ({"setup": ["export WANDB_API_KEY=s3cr3tvalue"]}, "setup[0]", "assigns WANDB_API_KEY"),
    ({"setup": ["module load x", f"HF_TOKEN={HF} python -c pass"]}, "setup[1]", "assigns HF_TOKEN"),
    ({"setup": ["export db_password=s3cr3tvalue"]}, "setup[0]", "assigns db_password"),
    ({"setup": [f"wandb login {WANDB}"]}, "setup[0]", "W&B API key"),
    ({"setup": [f"huggingface-cli login --token {HF}"]}, "setup[0]", "Hugging Face token"),
    ({"sbatch_flags": ["--export=ALL,HF_TOKEN=s3cr3tvalue"]}, "sbatch_flags[0]", "assigns HF_TOKEN"),
    ({"sbatch_flags": ["--wandb-api-key=s3cr3tvalue"]}, "sbatch_flags[0]", "assigns wandb-api-key"),
    ({"sbatch_flags": [f"--comment={HF}"]}, "sbatch_flags[0]", "Hugging Face token"),
    ({"env": {"HF_HOME": f"/x/{GITHUB}"}}, "env.HF_HOME", "GitHub token"),
    ({"fabric": {"NCCL_IB_HCA": AWS}}, "fabric.NCCL_IB_HCA", "AWS access key"),
    ({"container_image": f"user:{GITHUB_PAT}@nvcr.io#img"}, "container_image", "GitHub token"),
    ({"mpi": "pmix SECRET_KEY=s3cr3tvalue"}, "mpi", "assigns SECRET_KEY"),
]
# fmt: on


@pytest.mark.parametrize("data, key, words", SECRETS, ids=[k for _, k, _ in SECRETS])
def test_secrets_are_refused_in_every_value_and_never_shown(
    data: dict, key: str, words: str
) -> None:
    found = dict(refused(base() | data))
    assert words in found[key] and "export it in the shell you submit from" in found[key], found
    shown = "\n".join(m for _, m in found.items())
    for secret in ("s3cr3tvalue", HF, WANDB, GITHUB, GITHUB_PAT, AWS):
        assert secret not in shown, shown


def test_secrets_by_name_and_ordinary_values_are_accepted() -> None:
    digest = "sha256:" + "ab" * 32  # 64 hex digits: an image digest, not a W&B key
    profile = from_toml(
        base()
        | {
            "setup": [
                "export HF_HOME=/x",
                "export TOKENIZERS_PARALLELISM=false",
                "export HF_TOKEN",
            ],
            "sbatch_flags": ["--export=ALL,HF_TOKEN", "--gres=gpu:8"],
            "container_image": f"nvcr.io#nvidia/pytorch@{digest}",
        }
    )
    assert render(job_of(profile, "/lustre/llm/r"))


# --- 5. run names stay one folder inside run_root ----------------------------------------------


@pytest.mark.parametrize(
    "name, why",
    [("../x", "holds '/'"), ("/etc/x", "holds '/'"), ("a/b", "holds '/'"), ("..", "starts with '.'"),
     (".hidden", "starts with '.'"), ("", "is empty"), ("a\nb", "control character"),
     ("x" * 201, "longer than 200 bytes")],
    ids=repr,
)  # fmt: skip
def test_run_names_that_leave_run_root_are_refused(name: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        job_of(from_toml(base()), "/lustre/llm/r", apply_overrides(tiny(), [f"name={name}"]))
    (key, message), = err.value.problems  # fmt: skip
    assert key == "name" and why in message and "one folder name" in message, message
    assert repr(name) in message


@pytest.mark.parametrize("executor", ["slurm-bare", "local"])
def test_run_name_is_refused_by_recipes_check_and_run(tmp_path: Path, executor: str) -> None:
    """The checker refuses it (config/rules/training.py), so every executor and the ranks do."""
    argv = [sys.executable, "-m", "recipes", "run", "tiny_gpt_pretrain", "--executor", executor]
    argv += ["--dryrun", "name=../escaped"]
    out = children.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    said = out.stdout + out.stderr
    assert out.returncode == 2 and "name: '../escaped' holds '/'" in said, said
    assert not (tmp_path / "escaped").exists() and not list(tmp_path.glob("*escaped*"))


def test_a_run_directory_without_a_folder_name_has_no_job_folder() -> None:
    with pytest.raises(ConfigError, match="logging.run_dir"):
        job_of(from_toml(base("slurm-bare") | {"job_dir": "/jobs"}), "/")


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"workdir": "work/here"}, "workdir"),
        ({"container_image": "--writable.sif"}, "container_image"),
        ({"stage_data": "shm/data"}, "stage_data"),
    ],
)
def test_a_path_a_script_would_misread_is_refused(changes: dict, key: str) -> None:
    """A relative working directory or staging folder means nothing on the nodes; an image
    named like an option would be read as one by srun or apptainer."""
    with pytest.raises(ConfigError) as err:
        check_profile(
            Profile(executor="slurm-apptainer", **({"container_image": "/i/x.sif"} | changes))
        )
    assert [k for k, _ in err.value.problems] == [key]
