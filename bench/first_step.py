"""Time to first step of the tiny recipe, as a user sees it: from pressing Enter on
`recipes run tiny_gpt_pretrain` to the first step's line, and to the command's end.

    .venv/bin/python bench/first_step.py [--repeat 3] [--steps 5]

Each repeat runs the whole command in a fresh interpreter in a temporary working directory (the
CLI's imports and checks, NeMo-Run's LocalExecutor, torchrun, two CPU ranks importing torch and
Megatron-Core, building the model, the first step), reading its output as it comes. The script
prints the median and the best of each time, and the lines before the first step (what a user
waits through).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run(steps: int) -> tuple[float, float, int]:
    """(seconds to the first step's line, seconds to the end, lines printed before the first)."""
    with tempfile.TemporaryDirectory() as cwd:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "recipes",
                "run",
                "tiny_gpt_pretrain",
                f"train.max_steps={steps}",
            ],
            cwd=cwd,
            env={"PYTHONPATH": str(REPO), "PATH": str(Path(sys.executable).parent) + ":/usr/bin"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        first, before = None, 0
        assert proc.stdout is not None
        for line in proc.stdout:
            if first is None and ":step 1/" in line:
                first = time.perf_counter() - start
            elif first is None:
                before += 1
        if proc.wait() != 0 or first is None:
            raise SystemExit(f"recipes run failed (exit {proc.returncode}) or printed no step 1")
        return first, time.perf_counter() - start, before


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    runs = [one_run(args.steps) for _ in range(args.repeat)]
    for label, values in (
        ("first step", [r[0] for r in runs]),
        ("whole run", [r[1] for r in runs]),
    ):
        print(f"{label:>10}: median {statistics.median(values):.1f} s, best {min(values):.1f} s")
    print(f"lines before the first step: {runs[-1][2]}")


if __name__ == "__main__":
    main()
