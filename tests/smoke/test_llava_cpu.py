"""tiny_llava_pretrain on two CPU processes through Energon: it learns, and a resume is exact.

The synthetic captioning set is made by the tool itself (`recipes data make-synthetic-vlm`) once
per session. Every run is `torchrun --standalone -m training.entry` with the recipe's resolved
config and two Energon loader workers per rank; with RECIPES_SAMPLE_LOG set, each rank writes the
sample keys of every step, which is how the resume test sees the loader's position.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from data.energon import SAMPLE_LOG_ENV
from recipes.cli import main as recipes_main
from tests.smoke.conftest import REPO, _env, resolved_config
from tests.smoke.run_many import read_metrics
from tests.support import children

pytestmark = pytest.mark.smoke


class LlavaRuns:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "synthetic_vlm"
        assert recipes_main(["data", "make-synthetic-vlm", str(self.data), "--samples", "256"]) == 0
        self.config = resolved_config(root, "tiny_llava_pretrain")

    def run(self, name: str, run_dir: str, overrides: list[str]) -> str:
        """Train; returns the log. The LR schedule spans 20 steps whatever max_steps says, so
        that a run stopped at step 10 and resumed is the same run as one of 20 steps."""
        env = _env(self.root)
        env[SAMPLE_LOG_ENV] = str(self.root / name / "samples")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        cmd += ["2", "-m", "training.entry", "--config", str(self.config)]
        cmd += [
            f"data.path={self.data}",
            f"data.tokenizer={self.data / 'tokenizer.json'}",
            f"logging.run_dir={self.root / run_dir}",
            "scheduler.decay_steps=20",
            "checkpoint.save_interval=10",
            "train.device=cpu",
            *overrides,
        ]
        proc = children.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        log = proc.stdout + "\n--- stderr ---\n" + proc.stderr
        (self.root / f"{name}.log").write_text(log, encoding="utf-8")
        if proc.returncode != 0:
            errors = [line for line in proc.stderr.splitlines() if "Error" in line]
            pytest.fail(f"{name} failed ({proc.returncode}), log {self.root / name}.log:\n{errors}")
        return log

    def metrics(self, run_dir: str) -> list[dict[str, Any]]:
        return read_metrics(self.root / run_dir)  # the step records, without a resume's event

    def keys(self, name: str, rank: int) -> list[list[list[str]]]:
        path = self.root / name / "samples" / f"rank{rank}.jsonl"
        return [json.loads(line)["keys"] for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> LlavaRuns:
    runs = LlavaRuns(tmp_path_factory.mktemp("llava"))
    runs.run("straight", "straight", ["train.max_steps=20"])
    return runs


def assert_learns(records: list[dict[str, Any]]) -> None:
    assert [r["step"] for r in records] == list(range(1, 21))
    losses = [r["loss"] for r in records]
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    # Measured: ~6.2 (uniform over 512 tokens) falls to ~2.5 in 20 steps.
    assert first - last > 1.5, f"loss did not fall: {losses}"


def test_learns_through_energon_with_two_workers(llava: LlavaRuns) -> None:
    assert_learns(llava.metrics("straight"))
    rank0, rank1 = llava.keys("straight", 0), llava.keys("straight", 1)
    assert len(rank0) == len(rank1) == 20
    for step0, step1 in zip(rank0, rank1, strict=True):
        seen0 = {k for micro in step0 for k in micro}
        seen1 = {k for micro in step1 for k in micro}
        assert len(seen0) == len(seen1) == 4  # 2 microbatches of 2 per DP rank
        assert not seen0 & seen1  # the two data-parallel ranks read different samples


def test_resume_continues_with_the_samples_of_an_uninterrupted_run(llava: LlavaRuns) -> None:
    llava.run("first", "chained", ["train.max_steps=10"])
    log = llava.run("second", "chained", ["train.max_steps=20"])
    assert "resumed from" in log and "at step 10" in log
    assert (llava.root / "chained" / "checkpoints" / "iter_0000010" / "data").is_dir()
    for rank in (0, 1):
        straight = llava.keys("straight", rank)
        assert llava.keys("first", rank) == straight[:10]
        assert llava.keys("second", rank) == straight[10:]  # the loader state came back
    straight = {r["step"]: r["loss"] for r in llava.metrics("straight")}
    chained = {r["step"]: r["loss"] for r in llava.metrics("chained")}
    assert [chained[s] for s in range(11, 21)] == [straight[s] for s in range(11, 21)]  # bitwise


def test_packed_sequences_with_tensor_parallel_vision(llava: LlavaRuns) -> None:
    """Packing (several images per row) and TP=2 splitting the ViT, projector and LM."""
    llava.run(
        "packed_tp2",
        "packed_tp2",
        [
            "train.max_steps=20",
            "data.sequence_packing=true",
            "model.seq_length=128",
            "parallel.tensor_model_parallel_size=2",
        ],
    )
    assert_learns(llava.metrics("packed_tp2"))
    rows = [row for step in llava.keys("packed_tp2", 0) for micro in step for row in micro]
    assert max(len(row.split(",")) for row in rows) > 1  # rows hold several samples
