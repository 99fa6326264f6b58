"""How long `make test` takes, on an idle machine or beside a CPU hog, and what the load was.

    .venv/bin/python bench/suite_time.py              # idle
    .venv/bin/python bench/suite_time.py --hog 4      # beside 4 busy-looping processes

The hog is HOG processes spinning on the CPU for the whole run (other users' jobs on a shared
login or build node). The load average is sampled every 10 s while the suite runs; the report is
the suite's last line, its wall time, and the load's mean and range. Every hog process ends with
the run, whatever ends it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE_S = 10.0


def _spin(parent: int) -> None:
    """Busy until the parent is gone (also when it was killed and could not stop us)."""
    while os.getppid() == parent:
        for _ in range(1_000_000):
            pass


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--hog", type=int, default=0, help="busy-looping processes beside the suite"
    )
    parser.add_argument(
        "--log", type=Path, default=Path("suite_time.log"), help="the suite's output"
    )
    args = parser.parse_args(argv)

    spin = mp.get_context("fork")
    hogs = [spin.Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(args.hog)]
    for hog in hogs:
        hog.start()
    loads: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_S):
            loads.append(_load())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    began = time.monotonic()
    try:
        with args.log.open("w") as log:
            code = subprocess.call(["make", "test"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    finally:
        done.set()
        for hog in hogs:
            if hog.pid is not None:
                os.kill(hog.pid, signal.SIGKILL)
            hog.join()
    wall = time.monotonic() - began
    lines = args.log.read_text(errors="replace").strip().splitlines()
    last = next((line for line in reversed(lines) if " in " in line and "passed" in line), "?")
    print(f"make test beside {args.hog} busy processes: exit {code}, {wall / 60:.1f} min wall")
    print(f"  {last}")
    if loads:
        print(
            f"  load average (1 min, every {SAMPLE_S:.0f} s): mean {statistics.mean(loads):.1f}, "
            f"min {min(loads):.1f}, max {max(loads):.1f}"
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
