"""Stragglers and hangs on real CPU ranks (two processes under torchrun, gloo).

The ranks run this module (`python -m tests.smoke.test_resilience_cpu --config X ...`): the
engine's entry point with one more step hook (training/engine.py `Hook`) that misbehaves on one
rank. `--slow-rank R --slow-seconds S`: from step 2 on, rank R's forward sleeps S seconds per
microbatch, inside the step as a slow GPU would be; its peers then wait for it in the gradient
sync. `--hang-rank R --hang-at-step N`: rank R never returns from its hook after step N, as a rank
stuck outside any collective would; its peers block in the next step's collectives.
`--raise-rank R --raise-at-step N`: rank R raises once, after step N (resilience.inprocess_restart
then trains again in the same processes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.smoke.conftest import BASE, REPO, _env
from tests.support import children

pytestmark = pytest.mark.smoke


# --- the rank side -------------------------------------------------------------------------------
class SlowRank:
    """Rank `rank`'s forward sleeps `seconds` per microbatch from the second step on."""

    def __init__(self, rank: int, seconds: float) -> None:
        self.rank, self.seconds, self.done = rank, seconds, False

    def after_step(self, trainer: Any, stopping: bool) -> None:
        import torch.distributed as dist

        if self.done or dist.get_rank() != self.rank:
            return
        forward, seconds = trainer.forward, self.seconds

        def slow_forward(model: Any, batch: dict) -> Any:
            time.sleep(seconds)
            return forward(model, batch)

        trainer.forward, self.done = slow_forward, True

    def at_end(self, trainer: Any) -> None:
        pass


class HangAt:
    """Rank `rank` never returns from the hook after step `step`."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def after_step(self, trainer: Any, stopping: bool) -> None:
        import torch.distributed as dist

        if trainer.step == self.step and dist.get_rank() == self.rank:
            hang_forever_in_a_hook()

    def at_end(self, trainer: Any) -> None:
        pass


class RaiseOnce:
    """Rank `rank` raises once, after step `step`; every rank prints, at the first step of each
    attempt (a new Trainer), its pid and that step."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step, self.raised, self.last = rank, step, False, None

    def after_step(self, trainer: Any, stopping: bool) -> None:
        import torch.distributed as dist

        # A step that does not follow the last one seen is a new attempt's first.
        if self.last is None or trainer.step <= self.last:
            print(f"attempt: rank {dist.get_rank()} pid {os.getpid()} step {trainer.step}")
        self.last = trainer.step
        if trainer.step == self.step and dist.get_rank() == self.rank and not self.raised:
            self.raised = True
            raise RuntimeError(f"injected failure on rank {self.rank} after step {self.step}")

    def at_end(self, trainer: Any) -> None:
        pass


def hang_forever_in_a_hook() -> None:
    while True:
        time.sleep(3600)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--slow-rank", type=int)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--hang-rank", type=int)
    parser.add_argument("--hang-at-step", type=int, default=0)
    parser.add_argument("--raise-rank", type=int)
    parser.add_argument("--raise-at-step", type=int, default=0)
    args = parser.parse_args(argv)
    from training.entry import load_config, run

    hooks: list[Any] = []
    if args.slow_rank is not None:
        hooks.append(SlowRank(args.slow_rank, args.slow_seconds))
    if args.hang_rank is not None:
        hooks.append(HangAt(args.hang_rank, args.hang_at_step))
    if args.raise_rank is not None:
        hooks.append(RaiseOnce(args.raise_rank, args.raise_at_step))
    run(load_config(args.config, []), hooks)
    return 0


# --- the tests -----------------------------------------------------------------------------------
def launch(tmp_path: Path, overrides: list[str], *rank_args: str) -> tuple[int, str, Path]:
    """Two ranks of BASE with `overrides`; (torchrun's exit code, its log, the run directory)."""
    from config.schema import TrainingConfig
    from config.tree import apply_overrides, from_dict, write_yaml

    run_dir = tmp_path / "run"
    cfg = from_dict(TrainingConfig, {**BASE, "logging": {"run_dir": str(run_dir)}})
    config = write_yaml(apply_overrides(cfg, overrides), tmp_path / "resilience.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "tests.smoke.test_resilience_cpu", "--config", str(config), *rank_args]
    log = tmp_path / "torchrun.log"
    with (
        log.open("w", encoding="utf-8") as out,
        children.started(
            cmd, cwd=REPO, env=_env(tmp_path), stdout=out, stderr=subprocess.STDOUT
        ) as proc,
    ):
        try:
            returncode = proc.wait(timeout=400)
        except subprocess.TimeoutExpired:
            children.stop(proc)
            returncode = proc.returncode
        left = children.leftovers(proc)  # the job's own processes, once torchrun has ended
    assert not left, f"processes left behind: {left}"
    return returncode, log.read_text(encoding="utf-8", errors="replace"), run_dir


def test_a_slow_rank_is_named(tmp_path: Path) -> None:
    overrides = [
        "train.max_steps=8",
        "resilience.straggler_interval=2",
        "logging.tensorboard=false",
    ]
    code, log, run_dir = launch(tmp_path, overrides, "--slow-rank", "1", "--slow-seconds", "0.4")
    assert code == 0, log[-4000:]
    named = re.findall(r"^straggler: rank (\d) \(node \S+\) computes ([\d.]+) s", log, re.M)
    assert named and {rank for rank, _ in named} == {"1"}, log[-4000:]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    verdicts = {r["step"]: r for r in records if "straggler_ratio" in r}
    assert sorted(verdicts) == [2, 4, 6, 8], verdicts  # every straggler_interval steps only
    for step in (4, 6, 8):  # steps 2.. are slow on rank 1: every later window names it
        assert verdicts[step]["straggler_rank"] == 1, verdicts[step]
        assert verdicts[step]["straggler_ratio"] >= 1.5, verdicts[step]


def test_a_hung_rank_dumps_stacks_and_the_job_exits(tmp_path: Path) -> None:
    overrides = [
        "train.max_steps=50",
        "logging.tensorboard=false",
        "resilience.hang_min_seconds=3",
        "resilience.hang_timeout_factor=2",
        "resilience.hang_startup_seconds=120",
    ]
    started = time.monotonic()
    code, log, run_dir = launch(tmp_path, overrides, "--hang-rank", "1", "--hang-at-step", "3")
    assert code != 0, log[-4000:]
    assert time.monotonic() - started < 300, "the watchdog should end the job long before this"
    assert "hang watchdog: rank 0: no progress in a training step" in log, log[-4000:]
    assert "exits 75" in log, log[-4000:]
    dumps = {p.name: p.read_text() for p in (run_dir / "hang").glob("*/rank*.txt")}
    assert set(dumps) == {"rank0.txt", "rank1.txt"}, (dumps.keys(), log[-4000:])
    # The hung rank's stack shows where it hangs; the other waits in the step's collectives.
    assert "hang_forever_in_a_hook" in dumps["rank1.txt"], dumps["rank1.txt"]
    assert "train_step" in dumps["rank0.txt"], dumps["rank0.txt"]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open()]
    assert max(steps) == 3, steps  # and `launch` found no process of the job left behind


def test_a_rank_that_raises_restarts_in_process(tmp_path: Path) -> None:
    """nvidia-resiliency-ext's in-process restart on real ranks: rank 1 raises after step 6; both
    ranks train again in the same processes from the step-4 checkpoint and finish all 8 steps."""
    from launchers.inputs import inprocess_import_error

    why = inprocess_import_error()
    if why is not None:
        pytest.skip(f"nvidia-resiliency-ext's in-process restart does not import here: {why}")
    overrides = [
        "train.max_steps=8",
        "checkpoint.save_interval=4",
        "logging.tensorboard=false",
        "resilience.inprocess_restart=true",
    ]
    code, log, run_dir = launch(tmp_path, overrides, "--raise-rank", "1", "--raise-at-step", "6")
    assert code == 0, log[-4000:]
    assert "injected failure on rank 1 after step 6" in log, log[-4000:]
    attempts = re.findall(r"^attempt: rank (\d) pid (\d+) step (\d+)$", log, re.M)
    for rank in ("0", "1"):
        mine = [(pid, int(step)) for r, pid, step in attempts if r == rank]
        # Two attempts in one process: the first from step 1, the second from the checkpoint.
        assert [step for _, step in mine] == [1, 5], attempts
        assert mine[0][0] == mine[1][0], f"rank {rank} changed process: {attempts}"
    assert re.search(r"resumed from \S+iter_0000004 at step 4", log), log[-4000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open()]
    assert max(steps) == 8 and set(range(1, 9)) <= set(steps), steps
    assert (run_dir / "checkpoints" / "iter_0000008").is_dir()


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
