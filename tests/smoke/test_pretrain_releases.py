"""A finished `pretrain` leaves no thread behind: one that ended normally, one that raised, and one
restarted in process (resilience.inprocess_restart). Ten runs in one process end with as many
threads as one run did, Python's and native ones (gloo's workers and transport loops, NCCL's
watchdogs) alike: its process groups, its model, its loggers, its checkpoint helpers all go.

The ranks run this module under torchrun (`python -m tests.smoke.test_pretrain_releases --mode M
--root DIR`), on two CPU processes, and print what they counted:

- `runs`: as tests/smoke/run_many.py does, one default process group for RUNS runs of a tiny GPT;
- `errors`: the same, but after one run that ends normally, every run raises after its first step
  on every rank, and the caller goes on with the next run, as a restarting caller does; a failed
  run must leave no more behind than the normal one did (the error's traceback holds the run's
  frames, which hold its model: they must not keep its process groups);
- `restart`: `training.entry.run` with resilience.inprocess_restart: RUNS attempts raise after
  their first step, the last one trains to the end, all in the same processes. Counted at the
  first step of each attempt: at attempt 2 after one run, at attempt RUNS + 1 after RUNS.

`--kind` picks the model (VARIANTS): the dense GPT of every mode above or, in mode `runs` with
KIND_RUNS runs each, a model whose run leaves more for Trainer.close to cut: an autograd graph or a
hook that torch holds in C++, out of the garbage collector's sight, which would keep the model and
its process groups alive. An MoE (its token dispatcher keeps the last forward's routing
probabilities), fp32 parameters (the distributed optimizer's shards are views of them) and
Megatron-FSDP (its gradient hooks sit on the parameters; DTensor's caches hold its device meshes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.smoke.conftest import BASE, MOE, REPO, _env
from tests.support import children

pytestmark = pytest.mark.smoke
RUNS = 10
KIND_RUNS = 3  # per model kind other than dense: as many as tell a leak from a steady count
MARK = "threads:"
# Small, and no decay left to check: every run (every attempt) trains from step 0.
OVERRIDES = ["train.max_steps=1", "scheduler.warmup_steps=0", "model.num_layers=2"]
VARIANTS: dict[str, tuple[str, ...]] = {
    "dense": (),
    "moe": (*MOE, "parallel.expert_model_parallel_size=2"),
    "fp32": ("precision=fp32",),
    "fsdp": ("parallel.use_megatron_fsdp=true",),
}


# --- the rank side -------------------------------------------------------------------------------
def thread_counts() -> tuple[int, int]:
    """(Python threads, native threads) of this process, once the threads that are ending have
    ended: the count has not changed for a second."""
    last, steady, deadline = -1, 0, time.monotonic() + 60
    while steady < 10 and time.monotonic() < deadline:
        native = len(os.listdir("/proc/self/task"))
        steady = steady + 1 if native == last else 0
        last = native
        time.sleep(0.1)
    return threading.active_count(), last


class FailAfterFirstStep:
    """Raises after the first step of a run, on every rank (so that no rank waits for another in
    a collective), in the first `failures` runs it sees; counts threads at each run's first step."""

    def __init__(self, failures: int) -> None:
        self.failures, self.seen, self.counts = failures, 0, []

    def after_step(self, trainer: Any, stopping: bool) -> None:
        if trainer.step != 1:
            return
        self.seen += 1
        self.counts.append(thread_counts())
        if self.seen <= self.failures:
            raise RuntimeError(f"planned failure of run {self.seen}")

    def at_end(self, trainer: Any) -> None:
        pass


def config(root: Path, kind: str, name: str, *overrides: str) -> Any:
    from config.schema import TrainingConfig
    from config.tree import apply_overrides, from_dict

    cfg = from_dict(TrainingConfig, {**BASE, "logging": {"run_dir": str(root / name)}})
    return apply_overrides(cfg, [*OVERRIDES, *VARIANTS[kind], *overrides])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["runs", "errors", "restart"], required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--kind", choices=list(VARIANTS), default="dense")
    args = parser.parse_args(argv)
    import torch.distributed as dist

    from training import distributed
    from training.entry import pretrain, run
    from training.ranks import launch_from_env

    rank = launch_from_env().rank
    after: dict[int | str, tuple[int, int]] = {}
    if args.mode == "restart":
        hook = FailAfterFirstStep(failures=args.runs)
        restarts = f"resilience.inprocess_max_restarts={args.runs}"
        restartable = ("resilience.inprocess_restart=true", restarts)
        run(config(args.root, args.kind, "restart", *restartable), [hook])
        after = {1: hook.counts[1], args.runs: hook.counts[args.runs]}
    else:
        distributed.init_process_group(launch_from_env(), "cpu")
        if args.mode == "errors":
            pretrain(config(args.root, args.kind, "normal"))
            dist.barrier()
            after["normal"] = thread_counts()
        for k in range(1, args.runs + 1):
            cfg = config(args.root, args.kind, f"run{k}")
            if args.mode == "runs":
                pretrain(cfg)
            else:
                try:
                    pretrain(cfg, [FailAfterFirstStep(failures=1)])
                except RuntimeError as err:
                    if "planned failure" not in str(err):
                        raise
                else:
                    raise AssertionError("the run did not fail as planned")
            dist.barrier()
            if k in (1, args.runs):
                after[k] = thread_counts()
        distributed.destroy()
    # One write of the whole line: the ranks share the launch's output, and theirs may interleave.
    sys.stdout.write(f"{MARK} {json.dumps({'rank': rank, 'after': after})}\n")
    sys.stdout.flush()
    return 0


# --- the test ------------------------------------------------------------------------------------
def counts_of(log: str) -> dict[int, dict[str, list[int]]]:
    """Each rank's counts by number of runs, from the ranks' lines in a launch's log."""
    found = {}
    for line in re.findall(rf"^(?:\[\S+\]:)?{MARK} (.+)$", log, re.M):
        record = json.loads(line)
        found[record["rank"]] = record["after"]
    return found


def launch(tmp_path: Path, *args: str) -> dict[int, dict[str, list[int]]]:
    """Each rank's counts from a two-rank launch of this module's `main` with `args`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "tests.smoke.test_pretrain_releases", "--root", str(tmp_path), *args]
    done = children.run(
        cmd,
        cwd=REPO,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    counts = counts_of(done.stdout)
    assert sorted(counts) == [0, 1], done.stdout[-4000:]
    return counts


@pytest.mark.parametrize("mode", ["runs", "errors", "restart"])
def test_ten_runs_in_one_process_leave_as_many_threads_as_one(tmp_path: Path, mode: str) -> None:
    if mode == "restart":
        from launchers.inputs import inprocess_import_error

        why = inprocess_import_error()
        if why is not None:
            pytest.skip(f"nvidia-resiliency-ext's in-process restart does not import here: {why}")
    for rank, after in launch(tmp_path, "--mode", mode).items():
        # (Python threads, native threads): the same after ten runs as after one
        assert after[str(RUNS)] == after["1"], f"rank {rank}: {after}"
        if mode == "errors":  # and a failed run leaves what a run that ended normally left
            assert after["1"] == after["normal"], f"rank {rank}: {after}"


@pytest.mark.parametrize("kind", [kind for kind in VARIANTS if kind != "dense"])
def test_runs_of_each_model_kind_leave_as_many_threads_as_one(tmp_path: Path, kind: str) -> None:
    args = ["--mode", "runs", "--kind", kind, "--runs", str(KIND_RUNS)]
    for rank, after in launch(tmp_path, *args).items():
        assert after[str(KIND_RUNS)] == after["1"], f"rank {rank}: {after}"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
