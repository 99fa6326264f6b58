"""A researcher's folder holding `config.py`, `data/`, `models/` and `training.py` shadows none of
the project's packages: not for the CLI (console script and `python -m recipes`), not for a script
that imports `recipes` (NeMo-Run's included), not for the ranks of any executor.

Each of those user files, if imported, writes SHADOWED to stderr and exits 97, so that every
command below fails loudly on the first wrong import. Every command runs with the shadowing folder
as its working directory (and, for scripts, as the script's folder: the first entry of sys.path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.tree import write_yaml
from launchers.profile import Profile, from_toml
from launchers.sbatch import render
from launchers.slurm import slurm_job
from recipes.registry import get

REPO = Path(__file__).resolve().parents[3]
SHADOW = "import sys; sys.stderr.write('SHADOWED {}\\n'); sys.exit(97)\n"
USER_FILES = ("config.py", "data/__init__.py", "models/__init__.py", "training.py")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A research folder whose modules take the project's package names."""
    home = tmp_path / "research"
    for name in USER_FILES:
        path = home / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SHADOW.format(name))
    return home


def env_for(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    for var in ("NEMORUN_HOME", "HF_HOME", "MPLCONFIGDIR"):
        env[var] = str(tmp_path / var.lower())
    return env


def run_in(folder: Path, cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(
        cmd,
        cwd=folder,
        env=env_for(folder.parent),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "SHADOWED" not in done.stdout + done.stderr, done.stderr[-3000:]
    return done


def test_the_shadowing_files_are_found_first(folder: Path) -> None:
    """The test's premise: without safe path, Python imports the folder's files first."""
    done = subprocess.run(
        [sys.executable, "-c", "import config"],
        cwd=folder,
        env=env_for(folder.parent),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 97 and "SHADOWED config.py" in done.stderr


CLI = {
    "module list": [sys.executable, "-m", "recipes", "list"],
    "console list": [str(Path(sys.executable).parent / "recipes"), "list"],
    "module check": [sys.executable, "-m", "recipes", "check", "tiny_gpt_pretrain"],
}


@pytest.mark.parametrize("name", sorted(CLI))
def test_cli_from_the_folder(folder: Path, name: str) -> None:
    cmd = CLI[name]
    if not Path(cmd[0]).is_file():
        pytest.skip(f"{cmd[0]}: the project is not installed in this interpreter's venv")
    done = run_in(folder, cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tiny_gpt_pretrain" in done.stdout or "valid" in done.stdout


def test_python_m_recipes_leaves_the_working_directory(folder: Path) -> None:
    """As the console script does: a module of the folder named like a dependency is not taken."""
    (folder / "yaml.py").write_text(SHADOW.format("yaml.py"))
    done = run_in(folder, [sys.executable, "-m", "recipes", "show", "tiny_gpt_pretrain"])
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_script_importing_recipes_gets_the_projects_packages(folder: Path) -> None:
    (folder / "build.py").write_text(
        "import json, sys\n"
        "from recipes.registry import get\n\n"
        "cfg = get('tiny_gpt_pretrain').config()\n"
        "import config, data, models, training, launchers\n"
        "print(json.dumps({'layers': cfg.model.num_layers, 'files': {\n"
        "    m.__name__: m.__file__ for m in (config, data, models, training, launchers)}}))\n"
    )
    done = run_in(folder, [sys.executable, "build.py"])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["layers"] == get("tiny_gpt_pretrain").config().model.num_layers
    for name, file in out["files"].items():
        assert Path(file) == REPO / name / "__init__.py", (name, file)


def test_the_launcher_and_recipes_agree_on_the_project_folder() -> None:
    """The local ranks' PYTHONPATH starts where recipes binds its sibling packages from."""
    import recipes
    from launchers.local import project_root

    assert project_root() == str(recipes.PROJECT_ROOT) == str(REPO)


def test_a_script_holding_its_own_config_first_is_told_how_to_fix_it(folder: Path) -> None:
    """Two modules cannot share the name `config` in one process: the error names both files."""
    (folder / "config.py").write_text("lr = 0.1\n")
    (folder / "mine.py").write_text("import config\nimport recipes\n")
    done = run_in(folder, [sys.executable, "mine.py"])
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:"), done.stderr[-3000:]
    assert str(folder / "config.py") in last and str(REPO / "config") in last
    assert "Rename yours" in last and "myproject.config" in last


def test_nemo_run_script_and_recipes_run_give_the_ranks_one_environment(folder: Path) -> None:
    """A NeMo-Run script in the folder: its local executor, once the Checks plugin has run, gives
    the ranks the interpreter settings `recipes run` gives them (launchers.local.process_env)."""
    (folder / "launch.py").write_text(
        "import json, os\n"
        "import recipes.nemo as rn\n"
        "from launchers.env import plan_env\n"
        "from launchers.local import process_env\n\n"
        'if __name__ == "__main__":\n'
        "    run_dir = os.path.abspath('runs/tiny')\n"
        "    task = rn.partial('tiny_gpt_pretrain', [f'logging.run_dir={run_dir}'])\n"
        "    with rn.Experiment('t', executor=rn.executor(gpus_per_node=2, device='cpu')) as exp:\n"
        "        exp.add(task)\n"
        "        nemo = exp.jobs[0].executor.env_vars\n"
        "    cfg = rn.from_partial(exp.jobs[0].task)\n"
        "    local = process_env(plan_env(cfg, {}, {}, os.environ), os.environ)\n"
        "    keys = ('PATH', 'PYTHONPATH', 'PYTHONSAFEPATH')\n"
        "    print(json.dumps({'nemo': {k: nemo.get(k) for k in keys},\n"
        "                      'local': {k: local.get(k) for k in keys}}))\n"
    )
    done = run_in(folder, [sys.executable, "launch.py"])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["nemo"] == out["local"]
    assert out["local"]["PYTHONSAFEPATH"] == "1"
    assert out["local"]["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)


def test_nemo_run_slurm_executors_keep_the_working_directory_off_sys_path(tmp_path: Path) -> None:
    pytest.importorskip("nemo_run")
    import recipes.nemo as rn

    images = {"slurm": 'container_image = "img.sqsh"', "slurm-bare": f'venv = "{sys.prefix}"'}
    for kind, line in images.items():
        toml = tmp_path / f"{kind}.toml"
        toml.write_text(
            f'executor = "{kind}"\ntime = "01:00:00"\ngpus_per_node = 2\ngpu = "h100"\n'
            f'run_root = "{tmp_path}/runs"\nmounts = ["{tmp_path}:{tmp_path}"]\n{line}\n'
        )
        with rn.Experiment("t", executor=rn.executor(toml, nodes=1)) as exp:
            exp.add(rn.partial("tiny_gpt_pretrain", ["train.device=cuda"]))
            executor = exp.jobs[0].executor
        assert executor.env_vars["PYTHONSAFEPATH"] == "1", kind
        if kind == "slurm":  # let through over the image's own ENV lines
            assert "PYTHONSAFEPATH" in executor.container_env


# --- the sbatch scripts -----------------------------------------------------------------------------


def stand_ins(bin_dir: Path) -> None:
    """srun runs its command here, without its options (the job's one task on this machine);
    torchrun starts one rank's interpreter on its module as the real one would, with `--help`
    (the rank's imports, without the training); scontrol names this host."""
    bin_dir.mkdir(parents=True)
    fakes = {
        "srun": 'while [[ "$1" == --* ]]; do shift; done\nexec "$@"',
        "torchrun": 'while [ "$1" != "-m" ]; do shift; done\nexec python -m "$2" --help',
        "scontrol": "echo localhost",
    }
    for name, body in fakes.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)


def test_bare_slurm_job_runs_from_the_folder(folder: Path, tmp_path: Path) -> None:
    """The slurm-bare script, run with the folder as the profile's workdir: the node's preflight
    (`python -m launchers.preflight`, real) and a rank's interpreter import the project's code."""
    fakebin = tmp_path / "fakebin"
    stand_ins(fakebin)
    venv = tmp_path / "venv"  # activates this venv, with the stand-ins first
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(
        f'export PATH="{fakebin}:{Path(sys.executable).parent}:$PATH"\n'
    )
    profile = Profile(executor="slurm-bare", venv=str(venv), workdir=str(folder))
    cfg = get("tiny_gpt_pretrain").config()
    ranks_cfg, job = slurm_job(
        cfg, profile, nodes=1, procs_per_node=2, run_dir=str(tmp_path / "run"), user_env={}
    )
    write_yaml(ranks_cfg, Path(job.config_path))
    script = tmp_path / "job.sbatch"
    script.write_text(render(job))
    env = env_for(tmp_path) | {"SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "7"}
    env |= {"SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_ON_NODE": "2", "PATH": "/usr/bin:/bin"}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run(
        ["bash", str(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )
    assert "SHADOWED" not in done.stdout + done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "usage: python -m training.entry" in done.stdout


@pytest.mark.parametrize("kind", ["slurm", "slurm-apptainer"])
def test_container_jobs_let_safe_path_through(kind: str, tmp_path: Path) -> None:
    """In a container the ranks import the image's installed project: PYTHONSAFEPATH reaches them
    over the image's own variables (pyxis --container-env, Apptainer's APPTAINERENV_)."""
    record = tmp_path / "out"
    record.mkdir()
    fakebin = tmp_path / "fakebin"
    fakebin.mkdir()
    (fakebin / "srun").write_text(
        f'#!/bin/bash\nprintf "%s\\0" "$@" > {record}/argv\nenv -0 > {record}/env\n'
    )
    (fakebin / "scontrol").write_text("#!/bin/bash\necho node001\n")
    for fake in fakebin.iterdir():
        fake.chmod(0o755)
    profile = from_toml(
        {"executor": kind, "container_image": "img", "mounts": [f"{tmp_path}:/data"]}
    )
    _, job = slurm_job(
        get("tiny_gpt_pretrain").config(),
        profile,
        nodes=1,
        procs_per_node=2,
        run_dir=str(tmp_path / "run"),
        user_env={},
    )
    script = tmp_path / "job.sbatch"
    script.write_text(render(job))
    env = {"PATH": f"{fakebin}:/usr/bin:/bin", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "7"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    argv = (record / "argv").read_text().split("\0")
    items = (record / "env").read_text().split("\0")
    seen = dict(item.split("=", 1) for item in items if "=" in item)
    assert seen["PYTHONSAFEPATH"] == "1"
    if kind == "slurm":
        names = next(a for a in argv if a.startswith("--container-env=")).split("=", 1)[1]
        assert "PYTHONSAFEPATH" in names.split(",")
    else:
        assert seen["APPTAINERENV_PYTHONSAFEPATH"] == "1"


# --- one real run ----------------------------------------------------------------------------------


@pytest.mark.smoke
def test_recipes_run_trains_from_the_folder(folder: Path) -> None:
    """`python -m recipes run` from the folder: NeMo-Run's local executor, torchrun and two CPU
    ranks of `python -m training.entry` with the folder as their working directory, one step."""
    run_dir = folder.parent / "run"
    cmd = [sys.executable, "-m", "recipes", "run", "tiny_gpt_pretrain", "--shrink"]
    cmd += ["train.max_steps=1", "scheduler.warmup_steps=0", f"logging.run_dir={run_dir}"]
    cmd += ["logging.tensorboard=false"]
    done = run_in(folder, cmd, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"run directory: {run_dir}"
    steps = [
        json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [1]
