"""Wall time of `recipes list`, `recipes check` and `recipes plan` on the largest recipes, as a user
sees it (`plan deepseek_v3_pretrain` searches the catalog's largest space: 1024 GPUs, MoE; `check`
of a config that does not fit, or whose groups leave their NVLink domain, asks the planner too).

    .venv/bin/python bench/cli_latency.py [--repeat 10]

Each command runs in a fresh interpreter (what a user at a login-node prompt pays, imports
included); the script prints the median and the best of the repeats. Target: under 1 s each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "recipes list": ["list"],
    "recipes check llama31_405b_pretrain": ["check", "llama31_405b_pretrain"],
    "recipes check deepseek_v3_pretrain": ["check", "deepseek_v3_pretrain"],
    # Does not fit: the planner finds what does, and the layout that keeps EP inside a node.
    "recipes check deepseek_v3_pretrain --gpu a100-40g": [
        "check",
        "deepseek_v3_pretrain",
        "--gpu",
        "a100-40g",
    ],
    "recipes plan deepseek_v3_pretrain": ["plan", "deepseek_v3_pretrain"],
    "recipes plan llama31_405b_pretrain": ["plan", "llama31_405b_pretrain"],
}


def time_command(args: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "recipes", *args], check=False, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.repeat} runs each")
    for name, argv in COMMANDS.items():
        times = time_command(argv, args.repeat)
        print(f"{name:<40} median {statistics.median(times):.3f} s  best {min(times):.3f} s")


if __name__ == "__main__":
    main()
