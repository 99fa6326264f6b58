"""A real one-node Slurm on this machine, for tests/slurm: started once per pytest worker, with
pyxis in its plug-in stack where pyxis and enroot are installed.

`cluster` installs Slurm and MUNGE when they are missing (apt, as root), writes a one-node
slurm.conf bound to the loopback address, starts munged, slurmctld and slurmd, and stops them at
the end. Without apt or root the tests are skipped, except in CI (CI=true), where a skip would hide
a broken launcher, so they fail instead.

pyxis (NVIDIA's SPANK plug-in: `srun --container-image`) and enroot come from NVIDIA's own
releases, not from PyPI or Debian, so nothing here installs them: where both are installed
(`PYXIS_PLUGIN` below names where the plug-in is looked for), slurmd loads pyxis and the container
jobs run; elsewhere those jobs skip, in CI too, saying what is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import children

IN_CI = os.environ.get("CI", "").lower() == "true"
# Where pyxis's `make install` and its Debian package put the plug-in.
PYXIS_PLUGINS = (
    "/usr/local/lib/slurm/spank_pyxis.so",
    "/usr/lib/x86_64-linux-gnu/slurm/spank_pyxis.so",
    "/usr/lib/aarch64-linux-gnu/slurm/spank_pyxis.so",
    "/usr/lib64/slurm/spank_pyxis.so",
)


def pyxis_plugin() -> str | None:
    """The installed pyxis plug-in, when enroot (which pyxis runs) is installed too."""
    if not shutil.which("enroot"):
        return None
    return next((p for p in PYXIS_PLUGINS if Path(p).is_file()), None)


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
PlugStackConfig={root}/plugstack.conf
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


def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
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
    plugin = pyxis_plugin()  # pyxis's own options: its defaults (runtime under /run/pyxis)
    (root / "plugstack.conf").write_text(f"required {plugin}\n" if plugin else "")
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


def last_step(log: str) -> int:
    return int(re.findall(r"^step (\d+)/", log, re.M)[-1])


def wait_for_checkpoint(run_dir: Path, job_id: str, step: int, timeout: float = 400) -> None:
    """Until the run holds a complete checkpoint at `step` (its train_state.json is written last)."""
    deadline = time.monotonic() + timeout
    state = run_dir / "checkpoints" / f"iter_{step:07d}" / "train_state.json"
    while not state.is_file():
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} saved no checkpoint at step {step} in {timeout} s")
        time.sleep(0.5)
