"""bench/plan_speed.py, as BENCHMARKS.md runs it: the search's CPU seconds, the layouts it ranks and
the whole step predictions it makes, which the floors keep to a few of the layouts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_plan_speed_prints_the_search_and_its_predictions() -> None:
    script = REPO / "bench" / "plan_speed.py"
    args = ["--recipe", "deepseek_v3_pretrain_1024gpu_h100_fp8sc", "--repeat", "1"]
    out = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, check=True
    ).stdout
    found = re.search(r"([\d,]+) layouts ranked in ([\d.]+) CPU-s .*, ([\d,]+) whole step", out)
    assert found, out
    ranked, seconds, predictions = (float(g.replace(",", "")) for g in found.groups())
    assert seconds > 0 and 0 < predictions < ranked / 10, out
