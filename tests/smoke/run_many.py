"""Train several resolved configs one after another in one torchrun launch: one process group.

    python -m torch.distributed.run --standalone --nproc-per-node W -m tests.smoke.run_many \\
        --config a.yaml --config b.yaml ...

Test helper for the smoke tests that train many small CPU runs (test_catalog_shrink.py,
test_engine_cpu.py, test_checkpoint.py's exact resume): on a small machine process start-up costs
more than a run's few steps, and here every rank pays the Python, torch and Megatron-Core imports
and the gloo rendezvous once for the whole list instead of once per config.

The runner (`main`, under torchrun): the default process group is created here, on the configs'
one train.device (NCCL on "cuda", as tests/gpu/ launch);
`training.entry.pretrain` leaves a group it did not create alone and tears down only
Megatron-Core's model-parallel groups, so each config builds its own layout on the same group.
Each config trains as `python -m training.entry --config PATH` would train it, into its own
logging.run_dir; the engine's `Trainer.close` leaves no Megatron-Core state behind that the next
config could trip over, and the stop policy installs its signal handlers per config and gives them
back after it. With RECIPES_TEST_SIGNAL_AT_STEP=N in the environment, the last rank of every config
sends itself SIGUSR1 after step N (tests/smoke/signal_at_step.py), as that script does for one.

Rank 0 prints `run_many: start NAME` and `run_many: done NAME in T s` (NAME: the YAML file's stem, unique
within a launch), so the caller can tell which config a failure belongs to. The first failure ends
the launch with exit 1: after an exception the ranks may be stopped at different collectives, and
nothing run after that would be trustworthy (torchrun then stops the other ranks).

The client (`launch_many`, in the pytest process; torch-free): launches the runner over a list of
configs, cuts its output at those lines into one `Outcome` per config, and launches the configs
after a failed one again, so that a failure costs only its own config.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import children

MARK = "run_many:"
REPO = Path(__file__).resolve().parents[2]


# --- the runner: every rank, under torchrun --------------------------------------------------------
def _say(rank: int, text: str) -> None:
    if rank == 0:  # one write: other ranks' lines cannot land inside it
        sys.stdout.write(f"{MARK} {text}\n")
        sys.stdout.flush()


def launch_device(paths: list[str]) -> str:
    """The one device the configs of a launch train on (their train.device, "auto" resolved):
    the process group is NCCL's for "cuda", gloo's (and the engine's CPU mode) for "cpu"."""
    from training.distributed import resolve_device

    requested = {
        Path(path).stem: yaml.safe_load(Path(path).read_text())["train"]["device"] for path in paths
    }
    devices = {resolve_device(device) for device in requested.values()}
    if len(devices) != 1:
        raise ValueError(f"run_many: one launch trains on one device; train.device: {requested}")
    return devices.pop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.smoke.run_many", description=__doc__)
    parser.add_argument("--config", action="append", required=True, help="a resolved config YAML")
    args = parser.parse_args(argv)

    import torch.distributed as dist

    from tests.smoke.signal_at_step import signal_at_step_from_env
    from training import distributed
    from training.entry import load_config, pretrain
    from training.ranks import launch_from_env

    signal_at_step_from_env()
    launch = launch_from_env()
    owns_group = distributed.init_process_group(launch, launch_device(args.config))
    for path in args.config:
        name = Path(path).stem
        _say(launch.rank, f"start {name}")
        began = time.monotonic()
        try:
            pretrain(load_config(path, []))
            dist.barrier()  # "done" means done on every rank, not only on rank 0
        except BaseException:
            print(f"{MARK} failed {name} on rank {launch.rank}", file=sys.stderr)
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            # Not sys.exit: interpreter shutdown would tear down a gloo group whose peers may be
            # blocked in a collective, and could hang there instead of exiting.
            os._exit(1)
        _say(launch.rank, f"done {name} in {time.monotonic() - began:.1f} s")
    if owns_group:
        distributed.destroy()
    return 0


# --- the client: the pytest process ---------------------------------------------------------------
@dataclass
class Outcome:
    """One config's result from a launch: its part of the log, and why it failed, if it did."""

    run_dir: Path
    log: str
    error: str | None = None

    def excerpt(self, limit: int = 6000) -> str:
        """The first rank's traceback when the runner caught one (torchrun's summary follows it
        and says little), else the end of the log."""
        start = self.log.find(f"{MARK} failed")
        return self.log[start : start + limit] if start >= 0 else self.log[-limit:]

    def failure(self, name: str) -> str:
        """What a test reports when this config failed."""
        return f"{name}: {self.error}\n{self.excerpt()}"


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A run's metrics.jsonl step records, in file order ([] when it logged none); the records of
    events (a resume) are left out."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in records if "event" not in r]


def run_dir_of(config: Path) -> Path:
    """logging.run_dir of a config YAML: the grouped runs all set it (each its own)."""
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    return Path(data["logging"]["run_dir"])


def launch_many(
    configs: list[Path],
    nproc: int,
    env: dict[str, str],
    log_dir: Path,
    seconds_per_config: float = 300,
) -> dict[str, Outcome]:
    """Train `configs` (stems unique) on `nproc` CPU processes; their outcomes by stem.

    One torchrun launch of the runner, unless a config fails: the launch ends there, that config
    gets its failure, and the configs after it go on in a new launch. Each launch's whole output
    goes to log_dir/launch-K-nW.log; its time limit is `seconds_per_config` per config in it.
    """
    names = [path.stem for path in configs]
    assert len(set(names)) == len(names), f"config stems must differ within a launch: {names}"
    by_name = dict(zip(names, configs, strict=True))
    outcomes: dict[str, Outcome] = {}
    pending = names
    while pending:
        outcomes |= _launch([by_name[n] for n in pending], nproc, env, log_dir, seconds_per_config)
        pending = [n for n in pending if n not in outcomes]
    return outcomes


def _launch(
    configs: list[Path], nproc: int, env: dict[str, str], log_dir: Path, seconds_per_config: float
) -> dict[str, Outcome]:
    """One torchrun launch of the runner over `configs`; the outcomes of those it got to."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "-m", "tests.smoke.run_many"]
    for path in configs:
        cmd += ["--config", str(path)]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"launch-{len(list(log_dir.glob('launch-*.log'))) + 1}-n{nproc}.log"
    # Unbuffered, so that each rank's lines land between their config's start and done.
    returncode, ended = run_logged(
        cmd, env | {"PYTHONUNBUFFERED": "1"}, log_path, seconds_per_config * len(configs)
    )
    return split_outcomes(
        log_path.read_text(encoding="utf-8", errors="replace"),
        [path.stem for path in configs],
        {path.stem: run_dir_of(path) for path in configs},
        failed=returncode != 0,
        ended=f"{ended}, whole log {log_path}",
    )


def run_logged(
    cmd: list[str], env: dict[str, str], log_path: Path, timeout: float
) -> tuple[int | None, str]:
    """Run a torchrun command from the repository, its stdout and stderr into `log_path`, and
    leave none of its processes behind; its exit status (None: timed out) and how it ended.

    Not through a pipe: a rank that dies without its interpreter's exit handlers (os._exit after a
    failure, SIGKILL) leaves its multiprocessing helpers running (Megatron-Core's checkpoint writer
    starts a spawn-context Manager on the first save), which would hold the pipe open for ever.
    tests/support/children.py stops whatever of the launch is still running when torchrun has ended (or
    timed out): the workers run in sessions of their own, out of torchrun's process group.
    """
    with log_path.open("w", encoding="utf-8") as out:  # the children keep their own handles
        proc = children.start(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        returncode: int | None = proc.wait(timeout=timeout)
        ended = f"exit {returncode}"
    except subprocess.TimeoutExpired:
        returncode, ended = None, f"timed out after {timeout} s"
    finally:
        left = children.marked(proc.token) if proc.poll() is not None else []
        children.stop(proc)
    if left:
        ended += f"; stopped {len(left)} processes it left behind"
    return returncode, ended


def split_outcomes(
    output: str, names: list[str], run_dirs: dict[str, Path], failed: bool, ended: str
) -> dict[str, Outcome]:
    """Cut a launch's output at the runner's start/done lines: finished configs, and the one it
    stopped in. A launch that stopped outside any config fails all it had not finished."""
    marker = re.compile(rf"{MARK} (start|done) (\S+)(?: in [\d.]+ s)?")
    outcomes: dict[str, Outcome] = {}
    current: str | None = None
    lines: dict[str | None, list[str]] = {None: []}
    for line in output.splitlines():
        match = marker.fullmatch(line)
        if match and match.group(1) == "start":
            current = match.group(2)
            lines[current] = []
        elif match:
            done = match.group(2)
            outcomes[done] = Outcome(run_dirs[done], "\n".join(lines.get(done, [])))
            current = None
        else:
            lines[current].append(line)
    if current is not None:
        error = f"the launch ended in it ({ended})"
        outcomes[current] = Outcome(run_dirs[current], "\n".join(lines[current]), error)
    elif failed or len(outcomes) < len(names):
        log = "\n".join(lines[None])
        unfinished = [name for name in names if name not in outcomes]
        for name in unfinished:
            error = f"the launch ended outside any config ({ended})"
            outcomes[name] = Outcome(run_dirs[name], log, error)
        if not unfinished:  # every config finished, then the runner failed: say so on the last
            error = f"the launch failed after it, outside any config ({ended})"
            outcomes[names[-1]] = Outcome(run_dirs[names[-1]], log, error)
    return outcomes


if __name__ == "__main__":
    sys.exit(main())
