"""`recipes run` on a real one-node Slurm started on this machine (tests/support/slurm_cluster.py):
jobs without a container (slurm-bare), and in a pyxis/enroot container (slurm) where pyxis and
enroot are installed.

The jobs train tiny_gpt_pretrain on the CPU with two ranks (the same config as
tests/golden/sbatch/slurm-bare-cpu.sbatch). The container jobs run in an image made here
(tests/support/container_image.py: a Debian root filesystem whose `python` is the project's
environment, mounted).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.support import children, container_image
from tests.support.slurm_cluster import (
    cancelled,
    cluster,
    last_step,
    log_of,
    pyxis_plugin,
    run,
    signal_when_training,
    steps,
    unavailable,
    wait_for,
    wait_for_checkpoint,
)

pytestmark = pytest.mark.slurm
REPO = Path(__file__).parents[2]
# The system's own directories only: the ranks of a container job find `python` and `torchrun` in
# the image, never in the project's venv through the submitting shell's PATH.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

slurm = pytest.fixture(scope="session")(cluster)


def profile(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'executor = "slurm-bare"\npartition = "debug"\ntime = "00:15:00"\nexit_margin_minutes = 1\n'
        f'venv = "{sys.prefix}"\nworkdir = "{REPO}"\n'
    )
    return path


def pyxis_profile(tmp_path: Path, image: Path) -> Path:
    """A pyxis profile as a site writes one (launchers/profiles/slurm.toml), for this machine: the
    image made here, the project's mounts, and the test's folder for the run."""
    mounts = [*container_image.mounts(REPO), f"{tmp_path}:{tmp_path}"]
    path = tmp_path / "pyxis.toml"
    path.write_text(
        f'executor = "slurm"\npartition = "debug"\ntime = "00:15:00"\nexit_margin_minutes = 1\n'
        f'container_image = "{image}"\nmounts = {mounts!r}\nworkdir = "{REPO}"\n'.replace("'", '"')
    )
    return path


def submit(
    env: dict[str, str],
    tmp_path: Path,
    run_dir: Path,
    *extra: str,
    cluster_toml: Path | None = None,
) -> tuple[list[str], str]:
    """`recipes run tiny_gpt_pretrain --profile <the profile>` on one node of two CPU ranks; the
    job ids and what the command printed. By default the slurm-bare profile of `profile`."""
    cluster_toml = cluster_toml or profile(tmp_path)
    argv = [sys.executable, "-m", "recipes", "run", "tiny_gpt_pretrain", "--profile"]
    argv += [str(cluster_toml), "--nodes", "1", "--gpus-per-node", "2", "--device", "cpu"]
    argv += [f"logging.run_dir={run_dir}", "logging.tensorboard=false", *extra]
    # The job outlives the command that submits it: `cancelled` ends it, or the fixture's end.
    done = children.run(
        argv,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
        keep_descendants=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"run directory: {run_dir}"
    ids = re.search(r"submitted \S+ job\(s\): ([\d ]+)", done.stdout).group(1).split()
    return ids, done.stdout


def run_chain(env: dict[str, str], tmp: Path, cluster_toml: Path | None = None) -> dict:
    """One `--chain 2` run; each job is told its wall time is near (USR1, as Slurm's --signal
    sends it) after it has trained a step, saves and exits; the second resumes from the first's
    checkpoint. The run directory holds a space: the #SBATCH and srun lines must quote it."""
    run_dir = tmp / "chain run"
    ids, out = submit(
        env, tmp, run_dir, "--chain", "2", "train.max_steps=100", cluster_toml=cluster_toml
    )
    states = []
    with cancelled(env, ids):
        for job in ids:
            signal_when_training(env, run_dir, job)
            states.append(wait_for(env, job))
    logs = [log_of(run_dir, job) for job in ids]
    return {"ids": ids, "out": out, "states": states, "logs": logs, "run_dir": run_dir}


def pyxis_image() -> Path:
    """The image of the container jobs; skips where pyxis or enroot is missing (in CI too: neither
    is on PyPI or Debian, so a clean machine has them only where its owner installed them)."""
    if not pyxis_plugin():
        pytest.skip(
            "pyxis and enroot are not installed (NVIDIA's releases, or built from NVIDIA/pyxis "
            "and NVIDIA/enroot): the container jobs need them"
        )
    try:
        return container_image.image()
    except container_image.Unavailable as err:
        unavailable(f"no container image could be made here: {err}")
        raise


@pytest.fixture(scope="module", params=["slurm-bare", "slurm"])
def chain(
    request: pytest.FixtureRequest, slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> dict:
    """A `--chain 2` run (run_chain) without a container, and in a pyxis/enroot container."""
    tmp = tmp_path_factory.mktemp(f"chain-{request.param}")
    if request.param == "slurm-bare":
        return run_chain(slurm, tmp) | {"kind": request.param}
    image = pyxis_image()
    env = slurm | {"PATH": SYSTEM_PATH}
    return run_chain(env, tmp, pyxis_profile(tmp, image)) | {"kind": request.param}


def test_job_trains_and_checkpoints(chain: dict) -> None:
    assert len(chain["ids"]) == 2 and "a chain" in chain["out"]
    first = chain["logs"][0]
    assert chain["states"][0] == "COMPLETED", first[-3000:]
    assert "exit signal: saving at step" in first and "resumed" not in first, first[-3000:]
    stopped = last_step(first)
    assert 1 <= stopped < 100, first[-3000:]  # stopped by the signal, not by max_steps
    ckpt = chain["run_dir"] / "checkpoints" / f"iter_{stopped:07d}"
    assert (ckpt / "train_state.json").is_file(), first[-3000:]


def test_chain_resumes_from_the_previous_job(chain: dict) -> None:
    first, second = chain["logs"]
    assert chain["states"][1] == "COMPLETED", second[-3000:]
    resumed_at = last_step(first)
    assert f"at step {resumed_at}" in second and "resumed from" in second, second[-3000:]
    assert re.findall(r"^step (\d+)/", second, re.M)[0] == str(resumed_at + 1), second[-3000:]
    done = steps(chain["run_dir"])  # metrics.jsonl continues across the jobs, no step twice
    assert done == list(range(1, last_step(second) + 1)), done


def test_a_failed_job_requeues_and_resumes(
    slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The ranks of a running job die (USR2 kills torchrun and every rank, as a crash would) after
    a checkpoint: the script requeues the job (resilience.max_requeues=1), which resumes from
    that checkpoint and completes; the log says what it did. Slurm holds a requeued job until the
    old job's credential has expired (AuthInfo cred_expire: 120 s by default, 10 s here)."""
    tmp = tmp_path_factory.mktemp("requeue")
    run_dir = tmp / "run"
    ids, _ = submit(
        slurm,
        tmp,
        run_dir,
        "train.max_steps=12",
        "checkpoint.save_interval=4",
        "resilience.max_requeues=1",
    )
    (job,) = ids
    with cancelled(slurm, ids):
        wait_for_checkpoint(run_dir, job, 4)
        assert run("scancel", "--signal=USR2", job, env=slurm).returncode == 0
        state = wait_for(slurm, job)
    log = log_of(run_dir, job)
    assert state == "COMPLETED", log[-3000:]
    assert "requeueing job " + job + ", requeue 1 of 1 (resilience.max_requeues)" in log, log[
        -3000:
    ]
    shown = run("scontrol", "show", "job", job, env=slurm).stdout
    assert re.search(r"Restarts=1\b", shown), shown
    resumed_at = re.search(r"resumed from \S*iter_(\d+)", log)
    assert resumed_at and int(resumed_at.group(1)) >= 4, log[-3000:]
    assert last_step(log) == 12, log[-3000:]
    assert steps(run_dir) == list(range(1, 13))  # one record per step across the two attempts


def test_a_run_folder_a_queued_job_will_start_in_is_refused(
    slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A job submitted into a run folder and still queued (held here: SBATCH_HOLD, as
    `sbatch --hold`) will start with the config.yaml it finds there: a second `recipes run` into
    the folder is refused before it writes anything, naming the job and the fix. (In one CI run
    the job was already RUNNING when asked, the hold notwithstanding: refused the same, and its
    steps outlast the test.)"""
    tmp = tmp_path_factory.mktemp("queued")
    run_dir = tmp / "run"
    ids, _ = submit(slurm | {"SBATCH_HOLD": "1"}, tmp, run_dir, "train.max_steps=100000")
    (job,) = ids
    with cancelled(slurm, ids):
        config = (run_dir / "config.yaml").read_bytes()
        argv = [sys.executable, "-m", "recipes", "run", "tiny_gpt_pretrain", "--profile"]
        argv += [str(profile(tmp)), "--nodes", "1", "--gpus-per-node", "2", "--device", "cpu"]
        argv += [f"logging.run_dir={run_dir}", "train.max_steps=20"]
        done = children.run(argv, capture_output=True, text=True, env=slurm, timeout=120, cwd=tmp)
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        assert re.search(rf"{job} \((PENDING|CONFIGURING|RUNNING)\)", out), out
        assert f"scancel {job}" in out, out
        assert "logging.run_dir" in out, out
        assert (run_dir / "config.yaml").read_bytes() == config  # the queued job's, untouched


def test_the_container_jobs_ran_in_pyxis_containers(chain: dict, slurm: dict[str, str]) -> None:
    """pyxis's own word (slurmd's log) that it started each job's step in a container from the
    image, and none for the jobs without one; the ranks found `python` and `torchrun` only in the
    image (the submitting PATH held neither)."""
    log = (Path(slurm["SLURM_CONF"]).parent / "slurmd.log").read_text()
    for job in chain["ids"]:
        started = re.search(
            rf"\[{job}\.0\].*pyxis: (starting container|creating container filesystem)", log
        )
        assert bool(started) == (chain["kind"] == "slurm"), (job, log[-3000:])
    if chain["kind"] == "slurm":
        script = next((chain["run_dir"] / "slurm").glob("*.sbatch")).read_text()
        assert "--container-image=" in script and "source " not in script, script


def test_tokenize_runs_as_an_array_job(
    slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """`recipes data tokenize ... --profile P --tasks 2`: each array task takes its shards in the
    profile's venv; the task that finds them all done writes the blend."""
    from data.tools.make_tokenizer import train_bpe_tokenizer

    tmp = tmp_path_factory.mktemp("tokenize")
    texts = [f"the model trains on token {i} of layer {i % 7}" for i in range(300)]
    for i in range(3):
        lines = "".join(f'{{"text": "{t}"}}\n' for t in texts[i * 100 : (i + 1) * 100])
        (tmp / f"part-{i}.jsonl").write_text(lines)
    tok = train_bpe_tokenizer(texts=texts, vocab_size=300, out=tmp / "tok.json")
    out = tmp / "out"
    argv = [sys.executable, "-m", "recipes", "data", "tokenize", str(tmp / "part-*.jsonl")]
    argv += [str(out), "--tokenizer", str(tok), "--profile", str(profile(tmp)), "--tasks", "2"]
    done = children.run(argv, capture_output=True, text=True, env=slurm, timeout=120, cwd=tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    (array,) = re.findall(r"submitted array job (\d+)", done.stdout)
    with cancelled(slurm, [array]):
        # Each task's own final state, from scontrol (an empty squeue can also be a slurmctld
        # too busy to answer: under load the test once read the folder while a task still ran).
        states = [wait_for(slurm, f"{array}_{task}", timeout=300) for task in (0, 1)]
    logs = {p.name: p.read_text() for p in (out / "slurm").glob("*.out")}
    assert states == ["COMPLETED", "COMPLETED"], (states, logs)
    assert sorted(logs) == [f"tokenize-out-{array}_0.out", f"tokenize-out-{array}_1.out"], logs
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["documents"] == 300 and len(manifest["shards"]) == 3, logs
    assert json.loads((out / "blend.json").read_text())["sources"], logs
