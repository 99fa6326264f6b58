"""What straggler timing costs per step: the tiny recipe on CPU ranks, straggler timing on or off.

    .venv/bin/python bench/straggler.py [--nproc 2] [--steps 40] [--rounds 3] [--gathers 300]

Two figures, both on `--nproc` CPU ranks under one torchrun launch (gloo):

1. The gather alone: `StragglerMonitor.observe` on a gather step (one all_gather of three numbers
   over the default group, the host names once, rank 0's verdict), `--gathers` times back to back
   after a barrier; the median per call. With resilience.straggler_interval=N a run pays this once
   every N steps.
2. End to end: tiny_gpt_pretrain for `--steps` steps with resilience.straggler_interval=1 (a
   gather every step, and the waits timed every step) and with 0 (off), `--rounds` times each,
   alternating, in one process group; the median wall time between consecutive steps' metrics
   records, the first 5 steps of each run (warm-up) left out.

Prints one JSON object (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def gather_cost(calls: int) -> float:
    """Median seconds of one gather step of StragglerMonitor.observe (every rank calls it)."""
    import torch
    import torch.distributed as dist

    from training.resilience.straggler import StragglerMonitor

    monitor = StragglerMonitor(1, 1.5, torch.device("cpu"), stage=0, say=lambda line: None)
    monitor.observe(1, 0.1)  # the host names are gathered once, on the first gather
    times = []
    for step in range(2, calls + 2):
        dist.barrier()
        t0 = time.perf_counter()
        monitor.observe(step, 0.1)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_walls(run_dir: Path, skip: int = 5) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    stamps = [r["time"] for r in records if "event" not in r][skip:]
    return [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)]


def rank_side(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from recipes.registry import resolve
    from training import distributed
    from training.entry import pretrain
    from training.ranks import launch_from_env

    launch = launch_from_env()
    distributed.init_process_group(launch, "cpu")
    gather_s = gather_cost(args.gathers)
    walls: dict[int, list[float]] = {0: [], 1: []}
    root = Path(args.out)
    for round_ in range(args.rounds):
        for interval in (0, 1):
            run_dir = root / f"interval{interval}-round{round_}"
            _, cfg = resolve(
                "tiny_gpt_pretrain",
                [
                    "train.device=cpu",
                    f"train.max_steps={args.steps}",
                    "checkpoint.save_interval=1000000",
                    f"checkpoint.save_dir={run_dir}/checkpoints",
                    f"logging.run_dir={run_dir}",
                    "logging.tensorboard=false",
                    "logging.progress_bar=false",
                    "logging.log_interval=1000000",
                    f"resilience.straggler_interval={interval}",
                ],
            )
            pretrain(cfg)
            dist.barrier()
            if launch.rank == 0:
                walls[interval] += step_walls(run_dir)
    if launch.rank == 0:
        on, off = statistics.median(walls[1]), statistics.median(walls[0])
        print(
            json.dumps(
                {
                    "ranks": dist.get_world_size(),
                    "gather_ms_median": round(gather_s * 1e3, 3),
                    "step_ms_median_interval_1": round(on * 1e3, 2),
                    "step_ms_median_off": round(off * 1e3, 2),
                    "overhead_ms_per_step_interval_1": round((on - off) * 1e3, 2),
                    "steps_measured_each": len(walls[1]),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gathers", type=int, default=300)
    parser.add_argument("--out", help=argparse.SUPPRESS)  # set on the rank side
    args = parser.parse_args()
    if args.out:
        rank_side(args)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        env = os.environ | {
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(REPO),
            "MPLCONFIGDIR": tmp,
            "NEMORUN_HOME": tmp,
        }
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", str(args.nproc), __file__, "--out", tmp]
        cmd += ["--steps", str(args.steps), "--rounds", str(args.rounds)]
        cmd += ["--gathers", str(args.gathers)]
        done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode != 0 or not lines:
            print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
            return 1
        print(lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
