"""Every catalog recipe, shrunk, trains 3 steps on the CPU with its own layout scaled to 4 processes.

Through the user's command: `recipes run NAME --shrink --executor local --device cpu
--gpus-per-node W`. A recipe whose shrunk layout still needs a GPU feature (sequence or context
parallel, FP8) is skipped with the reason, as the CPU mode cannot run it.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config.hardware import Cluster
from config.rules import validate
from recipes.registry import all_recipes
from recipes.shrink import fit_to_world, shrink, use_cpu_collectives

pytestmark = pytest.mark.smoke
REPO = Path(__file__).resolve().parents[2]
MAX_PROCESSES = 4  # on 2 cores: enough for TP x PP = 2 x 2 or EP 4, still quick


def cpu_blockers(name: str, world: int) -> list[str]:
    """What the shrunk recipe still needs a GPU for, as the checker words it."""
    cfg = shrink(all_recipes()[name].config())
    cfg.train.device = "cpu"
    fit_to_world(cfg, world)
    use_cpu_collectives(cfg)
    problems = validate(cfg, Cluster(num_nodes=1, gpus_per_node=world, gpu="cpu"))
    return [f"{p.field}: {p.message}" for p in problems]


@pytest.mark.parametrize("name", sorted(all_recipes()))
def test_shrunk_recipe_trains_on_cpu(name: str, tmp_path: Path) -> None:
    recipe = all_recipes()[name]
    world = min(MAX_PROCESSES, recipe.cluster.world_size)
    blockers = cpu_blockers(name, world)
    if blockers:
        print(f"{name}: skipped on the CPU: {blockers}")
        pytest.skip(f"CPU mode cannot run it: {'; '.join(b.split(':')[0] for b in blockers)}")
    overrides = []
    if recipe.config().data.kind == "energon":
        from data.synthetic_vlm import make_synthetic_vlm

        data = tmp_path / "vlm"
        make_synthetic_vlm(data, samples=32)
        overrides += [f"data.path={data}", f"data.tokenizer={data / 'tokenizer.json'}"]
    if recipe.config().data.kind == "sft":  # arithmetic Q&A; a shrunk model has no weights to load
        from data.synthetic_sft import make_synthetic_sft

        jsonl = make_synthetic_sft(tmp_path / "sft", samples=200)
        overrides += [f"data.path={jsonl}", f"data.tokenizer={jsonl.parent / 'tokenizer.json'}"]
        overrides += ["checkpoint.pretrained_dir=None"]
    cmd = [sys.executable, "-m", "recipes", "run", name, "--shrink", "--executor", "local"]
    cmd += [
        "--device",
        "cpu",
        "--gpus-per-node",
        str(world),
        f"logging.run_dir={tmp_path / 'run'}",
        *overrides,
    ]
    env = os.environ | {"OMP_NUM_THREADS": "1", "NEMORUN_HOME": str(tmp_path / "nemo_run")}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    match = re.fullmatch(r"run directory: (.+)", last)
    assert match, f"last line was {last!r}"
    records = [
        json.loads(line)
        for line in (Path(match.group(1)) / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in records)
