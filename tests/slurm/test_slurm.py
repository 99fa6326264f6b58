"""`recipes run --executor slurm-bare` on a real one-node Slurm started on this machine.

The session fixture installs Slurm and MUNGE when they are missing (apt, as root), writes a
one-node slurm.conf bound to the loopback address, starts munged, slurmctld and slurmd, and stops
them at the end. Without apt or root the tests are skipped, except in CI (CI=true), where a skip
would hide a broken launcher, so they fail instead. The jobs train tiny_gpt_pretrain on the CPU
with two ranks (the same config as tests/golden/sbatch/slurm-bare-cpu.sbatch).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import children

pytestmark = pytest.mark.slurm
REPO = Path(__file__).parents[2]
IN_CI = os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"Slurm tests must run in CI: {reason}")
    pytest.skip(reason)


def run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return children.run(
        argv, capture_output=True, text=True, timeout=kwargs.pop("timeout", 60), **kwargs
    )


def install() -> None:
    """apt-get install slurm-wlm munge, once, when a daemon is missing."""
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        unavailable("Slurm is not installed and apt-get (as root) is unavailable")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"],
    ):
        done = run(*argv, env=env, timeout=600)
        if done.returncode != 0:
            unavailable(f"{' '.join(argv)} failed: {done.stderr[-500:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_conf(root: Path, host: str) -> str:
    memory_mb = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9)
    return f"""\
ClusterName=recipes-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# The main scheduling pass every 2 s, not 60: a requeued job (once its credential expired) and a
# chain's next job (once its dependency ended) start at that pass.
SchedulerParameters=sched_interval=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
MinJobAge=600
KillWait=10
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


def start_munge(root: Path) -> subprocess.Popen | None:
    """munged as root (--force), unless one already answers."""
    if shutil.which("munge") and run("bash", "-c", "munge -n | unmunge").returncode == 0:
        return None
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    if not Path("/etc/munge/munge.key").exists():
        run("mungekey", "--create")  # Debian's postinst normally does this
    with open(root / "munged.log", "w") as log:
        proc = children.start(
            ["munged", "--foreground", "--force"], stdout=subprocess.DEVNULL, stderr=log
        )
    for _ in range(50):
        if run("bash", "-c", "munge -n | unmunge").returncode == 0:
            return proc
        time.sleep(0.1)
    unavailable(f"munged did not start: {(root / 'munged.log').read_text()[-500:]}")


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A running one-node Slurm; yields the environment its clients need (SLURM_CONF)."""
    if os.geteuid() != 0:
        unavailable("starting slurmctld and slurmd needs root")
    install()
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, host))
    caches = {name: str(root / "cache") for name in ("NEMORUN_HOME", "HF_HOME", "MPLCONFIGDIR")}
    env = os.environ | caches | {"SLURM_CONF": str(conf)}
    procs = []
    try:
        procs += [p for p in [start_munge(root)] if p]
        for daemon in (["slurmctld", "-D", "-c", "-i"], ["slurmd", "-D", "-N", host]):
            with open(root / f"{daemon[0]}.out", "w") as log:
                procs.append(children.start(daemon, env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        while run("sinfo", "-h", "-o", "%T", env=env).stdout.strip() != "idle":
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                logs = "".join(
                    (root / f).read_text()[-1500:]
                    for f in ("slurmctld.out", "slurmd.out")
                    if (root / f).exists()
                )
                unavailable(f"the node never became idle: {run('sinfo', env=env).stdout}\n{logs}")
            time.sleep(0.5)
        yield env
    finally:
        if any(proc.args[0] == "slurmctld" for proc in procs):
            run("scancel", "--partition", "debug", env=env)  # whatever job a test left running
        for proc in reversed(procs):  # with the job steps they started
            children.stop(proc, grace_s=15)


def profile(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(
        f'executor = "slurm-bare"\npartition = "debug"\ntime = "00:15:00"\nexit_margin_minutes = 1\n'
        f'venv = "{sys.prefix}"\nworkdir = "{REPO}"\n'
    )
    return path


def submit(
    env: dict[str, str], tmp_path: Path, run_dir: Path, *extra: str
) -> tuple[list[str], str]:
    argv = [sys.executable, "-m", "recipes", "run", "tiny_gpt_pretrain", "--executor", "slurm-bare"]
    argv += [
        "--cluster",
        str(profile(tmp_path)),
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--device",
        "cpu",
    ]
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
    ids = re.search(r"submitted slurm-bare job\(s\): ([\d ]+)", done.stdout).group(1).split()
    return ids, done.stdout


@contextmanager
def cancelled(env: dict[str, str], ids: list[str]) -> Iterator[None]:
    """The jobs end with the block, however it ends (a job that has ended already stays as it
    is): a test that fails or is interrupted while it waits for them leaves none running."""
    try:
        yield
    finally:
        run("scancel", *ids, env=env)


def wait_for(env: dict[str, str], job_id: str, timeout: float = 400) -> str:
    """The job's final state (COMPLETED, FAILED, ...), polling scontrol."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = run("scontrol", "show", "job", job_id, env=env).stdout
        state = re.search(r"JobState=(\S+)", shown)
        if state and state.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state.group(1)
        time.sleep(1)
    run("scancel", job_id, env=env)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s")


def log_of(run_dir: Path, job_id: str) -> str:
    return (run_dir / "slurm" / f"tiny_gpt_pretrain-{job_id}.out").read_text()


def steps(run_dir: Path) -> list[int]:
    """The steps of metrics.jsonl's step records, in order (a resume's event record left out)."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if "event" not in r]


def signal_when_training(
    env: dict[str, str], run_dir: Path, job_id: str, timeout: float = 400
) -> None:
    """Send USR1 to the job's steps, as `#SBATCH --signal=USR1@...` does before the wall time,
    once the job has logged a training step."""
    deadline = time.monotonic() + timeout
    log = run_dir / "slurm" / f"tiny_gpt_pretrain-{job_id}.out"
    while not (log.exists() and re.search(r"^step \d+/", log.read_text(), re.M)):
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} logged no step in {timeout} s")
        time.sleep(0.5)
    assert run("scancel", "--signal=USR1", job_id, env=env).returncode == 0


@pytest.fixture(scope="module")
def chain(slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One `--chain 2` run; each job is told its wall time is near (USR1, as Slurm's --signal
    sends it) after it has trained a step, saves and exits; the second resumes from the first's checkpoint.
    The run directory holds a space: the #SBATCH and srun lines must quote it."""
    tmp = tmp_path_factory.mktemp("chain")
    run_dir = tmp / "chain run"
    ids, out = submit(slurm, tmp, run_dir, "--chain", "2", "train.max_steps=100")
    states = []
    with cancelled(slurm, ids):
        for job in ids:
            signal_when_training(slurm, run_dir, job)
            states.append(wait_for(slurm, job))
    logs = [log_of(run_dir, job) for job in ids]
    return {"ids": ids, "out": out, "states": states, "logs": logs, "run_dir": run_dir}


def last_step(log: str) -> int:
    return int(re.findall(r"^step (\d+)/", log, re.M)[-1])


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


def wait_for_checkpoint(run_dir: Path, job_id: str, step: int, timeout: float = 400) -> None:
    """Until the run holds a complete checkpoint at `step` (its train_state.json is written last)."""
    deadline = time.monotonic() + timeout
    state = run_dir / "checkpoints" / f"iter_{step:07d}" / "train_state.json"
    while not state.is_file():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} saved no checkpoint at step {step} in {timeout} s")
        time.sleep(0.5)


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
