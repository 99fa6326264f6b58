"""The HPC sites' profiles (launchers/profiles/): what `check`, `plan` and `run` take from them, the
job script each one renders, run by bash with stand-ins for srun, scontrol, apptainer and the
launcher, and what a profile may not say (a runtime its executor cannot start, placeholders at
submission)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from config.cost.steptime import predict
from config.hardware import Cluster
from config.rules import derive
from config.tree import ConfigError
from launchers.jobsize import JobSize, job_cluster
from launchers.mounts import parse_mounts
from launchers.profile import (
    Profile,
    from_toml,
    load_profile,
    placeholders,
    replace,
    shipped_profiles,
)
from launchers.sbatch import render, write
from launchers.slurm import SlurmJob, edf_text, slurm_job
from recipes.advice.plan import plan
from recipes.registry import get
from tests.support import children, fake_apptainer
from tests.unit.launchers.test_launchers import run_script

REPO = Path(__file__).resolve().parents[3]
SITES = {  # name: (GPU kind, GPUs per node, network per GPU, executor)
    "jupiter": ("gh200", 4, 25, "slurm-apptainer"),
    "juwels-booster": ("a100-40g", 4, 25, "slurm-apptainer"),
    "jureca-dc": ("a100-40g", 4, 12.5, "slurm-apptainer"),
    "leonardo": ("a100-64g", 4, 12.5, "slurm-apptainer"),
    "alps": ("gh200", 4, 25, "slurm-edf"),
    "dgx-h100": ("h100", 8, 50, "slurm"),
    "dgx-b200": ("b200", 8, 50, "slurm"),
}


def recipes(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = os.environ | {"NEMORUN_HOME": str(cwd or REPO)}
    argv = [sys.executable, "-m", "recipes", *args]
    return children.run(argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


# --- the profiles ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SITES))
def test_a_site_profile_sizes_the_cluster_check_and_plan_judge(name: str) -> None:
    gpu, per_node, network, executor = SITES[name]
    profile = load_profile(name)
    assert profile.executor == executor
    cluster = job_cluster(get("llama3_8b_pretrain").cluster, profile, JobSize(nodes=2))
    assert (cluster.gpu, cluster.gpus_per_node, cluster.network) == (gpu, per_node, network)
    # Another GPU kind on the command line brings its own network, not the profile's.
    other = job_cluster(None, profile, JobSize(nodes=2, gpu="h200"))
    assert other.network == other.spec.network_gb_s


def test_recipes_profiles_lists_every_shipped_one_and_shows_it_verbatim() -> None:
    done = recipes("profiles", "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert set(rows) == set(shipped_profiles()) and set(SITES) <= set(rows)
    for name, (gpu, per_node, network, executor) in SITES.items():
        row = rows[name]
        assert (row["gpu"], row["gpus_per_node"], row["network_gb_s"]) == (gpu, per_node, network)
        assert row["executor"] == executor
    assert "account" in rows["jupiter"]["placeholders"]
    shown = recipes("profiles", "--show", "jupiter")
    assert shown.stdout == (REPO / "launchers/profiles/jupiter.toml").read_text(encoding="utf-8")
    missing = recipes("profiles", "--show", "jupyter")
    assert missing.returncode == 2 and "jupiter" in missing.stdout + missing.stderr


def test_check_on_a_site_profile_answers_and_names_its_placeholders() -> None:
    done = recipes("check", "llama3_8b_pretrain", "--profile", "jupiter")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 GH200" in done.stdout
    assert "account" in done.stdout and "placeholders" in done.stdout


def test_run_submits_nothing_with_placeholders_but_renders_a_dry_run(tmp_path: Path) -> None:
    done = recipes("run", "tiny_gpt_pretrain", "--profile", "jupiter", cwd=tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == 2
    assert "placeholders" in said and "account" in said, said
    dry = recipes("run", "tiny_gpt_pretrain", "--profile", "jupiter", "--dryrun", cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "#SBATCH --gres=gpu:4" in dry.stdout


# --- the network in the step-time model --------------------------------------------------------


def test_a_slower_network_costs_data_parallel_and_expert_traffic_only() -> None:
    """Two clusters that differ in their network only: what crosses nodes (the data-parallel
    gradients, the expert all-to-all of EP 8 over 4-GPU nodes) slows on 12.5 GB/s, the GEMMs
    do not."""
    cfg = get("qwen3_30b_a3b_pretrain").config()
    fast = Cluster(num_nodes=4, gpus_per_node=4, gpu="gh200", network_gb_s=25)
    slow = dataclasses.replace(fast, network_gb_s=12.5)
    a, b = (predict(cfg, c, derive(cfg, c)) for c in (fast, slow))
    assert a is not None and b is not None
    assert b.seconds > a.seconds
    assert b.terms["ep"] > a.terms["ep"] and b.terms["dp"] >= a.terms["dp"]
    assert b.terms["gemm"] == pytest.approx(a.terms["gemm"])


# --- the job scripts, run --------------------------------------------------------------------------

FAKES = {
    # srun: its own options, then the task, run once per node as SLURM_NODEID 0 and 1.
    "srun": """printf '%s\\0' "$@" > "$FAKE_OUT/srun.argv"; env -0 > "$FAKE_OUT/srun.env"
while [[ "$1" == --* ]]; do shift; done
for node in 0 1; do SLURM_NODEID=$node "$@" || exit $?; done""",
    "scontrol": "echo jpbo-001-01; echo jpbo-001-02",
    # apptainer: refuses what Apptainer refuses, then runs `exec`'s command bare.
    "apptainer": fake_apptainer.SHIM,
    "module": "exit 0",  # a site's `module load apptainer`
    "python": "exit 0",  # the preflight
    "torchrun": """printf '%s\\n' "$@" > "$FAKE_OUT/launcher.$SLURM_NODEID"
env -0 > "$FAKE_OUT/launcher.$SLURM_NODEID.env\"""",
}


def run_job(text: str, workdir: Path) -> tuple[list[str], dict[str, str]]:
    """Run a rendered script with the stand-ins, on two nodes of 72 CPUs; srun's argv and
    environment."""
    slurm = {
        "SLURM_JOB_NODELIST": "jpbo-001-[01-02]",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_CPUS_ON_NODE": "72",
    }
    return run_script(text, workdir, env=slurm, fakes=FAKES)


def filled(name: str, root: Path, **changes: object):
    """A shipped profile with its placeholders filled: every path under root."""
    text = (REPO / "launchers/profiles" / f"{name}.toml").read_text(encoding="utf-8")
    for holder in ("<your-project>", "<your-account>", "<project>", "<partition>"):
        text = text.replace(holder, "p1")
    text = text.replace("<user>", "x")
    # A path's start: after a quote, or after the ':' between a mount's two sides.
    sites = "p|capstor|leonardo_scratch|leonardo_work|scratch"
    data = tomllib.loads(re.sub(rf'(?<=[":])(?=/({sites})/)', str(root), text))
    profile = replace(from_toml(data), **changes)
    assert placeholders(profile) == []
    return profile


def with_image_and_mounts(profile: Profile) -> Profile:
    """What Apptainer needs on the node: the image (a SIF header) and every bind's source."""
    fake_apptainer.write_sif(Path(profile.container_image or ""))
    for mount in parse_mounts(profile.mounts):
        Path(mount.host).mkdir(parents=True, exist_ok=True)
    return profile


def tiny_job(profile: Profile, run_dir: Path) -> SlurmJob:
    """tiny_gpt_pretrain on 2 nodes of 4 GPUs with `profile`, into `run_dir`."""
    cfg = get("tiny_gpt_pretrain").config()
    return slurm_job(cfg, profile, nodes=2, procs_per_node=4, run_dir=str(run_dir), user_env={})[1]


def test_jupiter_job_asks_gres_exports_srun_cpus_and_tells_the_first_node_it_hosts(
    tmp_path: Path,
) -> None:
    profile = with_image_and_mounts(filled("jupiter", tmp_path))
    job = tiny_job(profile, tmp_path / "p/scratch/p1/x/runs/tiny")
    text = render(job)
    assert "#SBATCH --gres=gpu:4" in text and "--gpus-per-node" not in text
    srun, env = run_job(text, tmp_path)
    assert env["SRUN_CPUS_PER_TASK"] == "72"  # psslurm: srun's CPUs through the environment
    assert not any(a.startswith("--cpus-per-task") for a in srun)
    for node, host in ((0, "1"), (1, "0")):
        launcher = (tmp_path / f"launcher.{node}").read_text().splitlines()
        assert launcher[0] == f"--rdzv-conf=is_host={host}"
        assert "--rdzv-endpoint=jpbo-001-01i:29500" in launcher  # the InfiniBand name


APPTAINER_PROFILES = [
    n for n in shipped_profiles() if load_profile(n).executor == "slurm-apptainer"
]


@pytest.mark.parametrize("name", APPTAINER_PROFILES)
def test_apptainer_scripts_pass_apptainers_checks_and_hand_the_ranks_their_variables(
    name: str, tmp_path: Path
) -> None:
    """Every Apptainer profile's script, run with the stand-in apptainer, which refuses what
    Apptainer refuses (tests/support/fake_apptainer.py): the command starts on both nodes, and
    the variables exported as APPTAINERENV_<NAME> reach it as <NAME>."""
    profile = with_image_and_mounts(filled(name, tmp_path))
    run_dir = Path(profile.run_root or "") / "tiny"
    srun, _ = run_job(render(tiny_job(profile, run_dir)), tmp_path)
    assert srun[srun.index("apptainer") + 1 :][:2] == ["exec", "--nv"]
    for node in (0, 1):
        items = (tmp_path / f"launcher.{node}.env").read_text().split("\0")
        env = dict(item.split("=", 1) for item in items if "=" in item)
        assert env["PYTHONSAFEPATH"] == "1" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
        assert not any(k.startswith("APPTAINERENV_") for k in env)  # Apptainer takes them
        assert env.get("HF_HOME") == profile.env.get("HF_HOME")


def test_an_option_apptainer_refuses_fails_the_script(tmp_path: Path) -> None:
    profile = with_image_and_mounts(filled("leonardo", tmp_path))
    text = render(tiny_job(profile, Path(profile.run_root or "") / "tiny"))
    for right, wrong, said in [
        ("--no-home", "--no-hom", "unknown flag: --no-hom"),
        ("--pwd /workspace", "--pwd workspace", "not an absolute path"),
        ("megatron-recipes.sif", "megatron-recipes.sqsh", "could not open image"),
    ]:
        assert right in text
        with pytest.raises(AssertionError, match=said):
            run_job(text.replace(right, wrong), tmp_path)


def test_a_mount_flag_apptainer_refuses_is_refused_before_the_script(tmp_path: Path) -> None:
    """pyxis's `rbind` would reach `apptainer exec --bind` and fail the job as it starts (and
    the script would requeue it): refused by name before rendering, for NeMo-Run too."""
    from launchers.slurm import nemo_slurm_executor

    site = with_image_and_mounts(filled("leonardo", tmp_path))
    first, second = site.mounts
    profile = replace(site, mounts=[f"{first}:rbind", second])
    with pytest.raises(ConfigError) as err:
        tiny_job(profile, Path(profile.run_root or "") / "tiny")
    assert [k for k, m in err.value.problems if "rbind" in m] == ["mounts[0]"]
    with pytest.raises(ConfigError, match="rbind"):
        nemo_slurm_executor(profile, 2, 4, "cuda", {})
    read_only = replace(site, mounts=[first, f"{second}:ro"])  # ro and rw are Apptainer's own
    run_job(render(tiny_job(read_only, Path(site.run_root or "") / "tiny")), tmp_path)


@pytest.mark.parametrize("name", ["leonardo", "slurm-apptainer"])  # NeMo-Run renders these
def test_nemo_runs_apptainer_command_passes_apptainers_checks(name: str, tmp_path: Path) -> None:
    from launchers.slurm import nemo_slurm_executor

    profile = with_image_and_mounts(filled(name, tmp_path))
    args = nemo_slurm_executor(profile, 2, 4, "cuda", {}).srun_args
    command = ["bash", "-c", fake_apptainer.SHIM, "apptainer", *args[args.index("apptainer") + 1 :]]
    done = children.run([*command, "echo", "ran"], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "ran\n"), done.stderr


def test_a_site_launcher_replaces_torchrun(tmp_path: Path) -> None:
    profile = filled("juwels-booster", tmp_path, launcher="torchrun_jsc", rdzv_host_suffix="")
    job = tiny_job(profile, tmp_path / "p/scratch/p1/x/runs/tiny")
    text = render(job)
    assert "torchrun_jsc" in text and "is_host" not in text
    assert '--rdzv-endpoint="$head_node":29500' in text


def test_alps_job_starts_its_container_from_an_edf_written_beside_the_script(
    tmp_path: Path,
) -> None:
    profile = filled("alps", tmp_path)
    job = tiny_job(profile, tmp_path / "capstor/scratch/cscs/x/runs/tiny")
    script = write(job)
    edf = tomllib.loads(Path(job.edf_path).read_text(encoding="utf-8"))
    assert Path(job.edf_path).parent == script.parent
    assert edf["image"] == profile.container_image and edf["workdir"] == profile.workdir
    assert edf["mounts"] == profile.mounts and edf["writable"] is True
    assert edf["annotations"]["com.hooks.aws_ofi_nccl.enabled"] == "true"
    assert edf_text(job) == Path(job.edf_path).read_text(encoding="utf-8")
    srun, env = run_job(script.read_text(encoding="utf-8"), tmp_path)
    assert f"--environment={job.edf_path}" in srun
    assert env["NCCL_NET"] == "AWS Libfabric"  # the site's fabric settings reach srun
    # ... and the container, whose image may set them too: the Container Engine's documented
    # order (docs.cscs.ch container-engine/edf.md) puts the image's ENV over the job's and the
    # EDF's [env] over both, ${NAME:-} read from the job's (here: srun's) environment.
    assert set(edf["env"]) == set(job.env.names) and "NCCL_NET" in edf["env"]
    image = {"NCCL_NET": "Socket", "CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    own = {
        k: re.sub(r"\$\{(\w+):-\}", lambda m: env.get(m[1], ""), v) for k, v in edf["env"].items()
    }
    container = {k: v for k, v in {**env, **image, **own}.items() if v != ""}
    assert container["NCCL_NET"] == "AWS Libfabric"
    assert container.get("CUDA_DEVICE_MAX_CONNECTIONS") == env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    assert all(v == f"${{{k}:-}}" for k, v in edf["env"].items())  # names, never values


# --- what a profile may not say -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "key", "words"),
    [
        ({"executor": "slurm", "container_image": "/x/img.sif"}, "container_image", "Apptainer"),
        (
            {"executor": "slurm-apptainer", "container_image": "nvcr.io#nvidia/pytorch:25.04-py3"},
            "container_image",
            ".sif",
        ),
        (
            {"executor": "slurm", "container_image": "/x/i.sqsh", "psslurm": True},
            "executor",
            "SPANK",
        ),
        ({"gpu_request": "gpus"}, "gpu_request", "gres"),
        ({"network_gb_s": 0}, "network_gb_s", "above 0"),
        ({"launcher": "torchrun --foo"}, "launcher", "one command"),
        ({"rdzv_host_suffix": "i;reboot"}, "rdzv_host_suffix", "host-name"),
        ({"annotations": {"a": "b"}}, "annotations", "slurm-edf"),
    ],
)
def test_what_a_site_profile_may_not_say(changes: dict, key: str, words: str) -> None:
    base = {"executor": "slurm-apptainer", "container_image": "/x/img.sif"}
    with pytest.raises(ConfigError) as err:
        from_toml(base | changes)
    assert any(k == key and words in m for k, m in err.value.problems), err.value.problems


def test_an_executor_that_contradicts_the_profile_is_refused(tmp_path: Path) -> None:
    done = recipes(
        "run", "tiny_gpt_pretrain", "--profile", "leonardo", "--executor", "slurm", "--dryrun",
        cwd=tmp_path,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 2
    assert "--executor" in said and "slurm-apptainer" in said, said


# --- the planner on the sites' 4-GPU nodes ----------------------------------------------------------


@pytest.mark.parametrize("site", ["jupiter", "leonardo"])
@pytest.mark.parametrize("recipe", ["llama3_8b_pretrain", "qwen3_30b_a3b_pretrain"])
def test_plans_on_four_gpu_nodes_keep_tensor_parallel_inside_the_node(
    site: str, recipe: str
) -> None:
    """16 GPUs as 4 nodes of 4: every plan keeps TP inside a node, where NVLink is, and the best
    keeps its CP ring and expert all-to-all there too; a group that crosses nodes is priced at
    the site's network (a CP ring over two nodes may still rank among the five)."""
    found = get(recipe)
    cluster = job_cluster(found.cluster, load_profile(site), JobSize(nodes=4))
    assert (cluster.gpus_per_node, cluster.network) == (4, SITES[site][2])
    plans, _ = plan(found.config(), cluster, top=5)
    assert plans
    assert all(p.shape.tp <= 4 for p in plans), [p.describe() for p in plans]
    best = plans[0].shape
    assert best.tp * best.cp <= 4 and best.ep * (best.etp or best.tp) <= 4, plans[0].describe()
