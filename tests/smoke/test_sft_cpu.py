"""tiny_gpt_sft on two CPU processes (TP=2): packed SFT learns, resumes exactly, and pretrained
weights start a fresh run.

The arithmetic Q&A set comes from the tool itself (`recipes data make-synthetic-sft`). Every run is
`torchrun --standalone -m training.entry` with the recipe's resolved config, as `recipes run`
launches it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from recipes.cli import main as recipes_main
from tests.smoke.conftest import REPO, _env, resolved_config
from tests.smoke.run_many import read_metrics
from tests.support import children

pytestmark = pytest.mark.smoke


EVAL = ["train.eval_interval=10", "train.eval_iters=1"]  # data.split keeps 3 % of the pairs


class SftRuns:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "synthetic_sft"
        assert recipes_main(["data", "make-synthetic-sft", str(self.data), "--samples", "600"]) == 0
        self.config = resolved_config(root, "tiny_gpt_sft")

    def run(self, run_dir: str, overrides: list[str], device: str = "cpu", nproc: int = 2) -> str:
        """Train; returns stdout. The LR schedule spans 20 steps whatever max_steps says."""
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
        cmd += [str(nproc), "-m", "training.entry", "--config", str(self.config)]
        cmd += [
            f"data.path={self.data / 'sft.jsonl'}",
            f"data.tokenizer={self.data / 'tokenizer.json'}",
            f"logging.run_dir={self.root / run_dir}",
            "scheduler.decay_steps=20",
            f"train.device={device}",
            *overrides,
        ]
        env = _env(self.root)
        proc = children.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    def records(self, run_dir: str) -> list[dict[str, Any]]:
        return read_metrics(self.root / run_dir)  # the step records, without a resume's event

    def losses(self, run_dir: str) -> list[float]:
        return [r["loss"] for r in self.records(run_dir)]


@pytest.fixture(scope="module")
def sft(tmp_path_factory: pytest.TempPathFactory) -> SftRuns:
    runs = SftRuns(tmp_path_factory.mktemp("sft"))
    runs.run("packed", ["train.max_steps=20", "checkpoint.save_interval=20", *EVAL])
    return runs


def test_packed_sft_learns_the_answers(sft: SftRuns) -> None:
    losses = sft.losses("packed")
    assert len(losses) == 20
    # From ln(512) = 6.2 at random; the answers follow from the questions, so it falls fast.
    assert losses[0] > 5.5 and losses[-1] < losses[0] - 3.0, losses
    # Held-out pairs (data.split's validation part) are answered better too.
    val = {r["step"]: r["val_loss"] for r in sft.records("packed") if "val_loss" in r}
    assert list(val) == [10, 20] and val[20] < val[10] < losses[0] - 2.0, val


def test_resume_continues_with_the_rows_of_an_uninterrupted_run(sft: SftRuns) -> None:
    """10 steps, stop, resume to 20: the same losses as the 20 straight steps, exactly (CPU)."""
    sft.run("chained", ["train.max_steps=10", "checkpoint.save_interval=10", *EVAL])
    out = sft.run("chained", ["train.max_steps=20", "checkpoint.save_interval=10", *EVAL])
    assert "resumed from" in out and "at step 10" in out
    assert sft.losses("chained") == sft.losses("packed")
    chained, straight = sft.records("chained"), sft.records("packed")
    assert [r.get("val_loss") for r in chained] == [r.get("val_loss") for r in straight]


def test_pretrained_weights_start_a_fresh_fine_tune(sft: SftRuns) -> None:
    """Weights only: the step restarts at 1 and the first loss is the trained model's, not 6.2.
    The fine-tune reads unpacked rows (no attention mask): both row kinds train the same model."""
    out = sft.run(
        "finetune",
        [
            "train.max_steps=2",
            "data.sequence_packing=false",
            f"checkpoint.pretrained_dir={sft.root / 'packed' / 'checkpoints'}",
        ],
    )
    assert "loaded pretrained weights from" in out and "resumed from" not in out
    records = (sft.root / "finetune" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in records] == [1, 2]
    packed, finetune = sft.losses("packed"), sft.losses("finetune")
    assert abs(finetune[0] - packed[-1]) < 1.0, (packed, finetune)
    # Step 2 runs on the first update's weights: had the optimizer kept its FP32 copies of the
    # random initialisation, that update would have put them back (loss near 6 again).
    assert max(finetune) < packed[0] - 3.0, (packed, finetune)


def test_missing_pretrained_checkpoint_is_named(sft: SftRuns, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "training.entry", "--config", str(sft.config), "train.device=cpu"]
    cmd += [
        f"data.path={sft.data / 'sft.jsonl'}",
        f"data.tokenizer={sft.data / 'tokenizer.json'}",
        f"logging.run_dir={tmp_path / 'run'}",
        f"checkpoint.pretrained_dir={tmp_path / 'nothing'}",
    ]
    proc = children.run(
        cmd, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=900
    )
    assert proc.returncode != 0
    assert "checkpoint.pretrained_dir" in proc.stdout + proc.stderr
