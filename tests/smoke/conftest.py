"""Launch real multi-process training runs: BASE, a tiny GPT, with overrides under torchrun.

`Runs` (fixture `runs`) trains a named variant once and hands its metrics.jsonl records to every
test that asks. The CPU engine tests (test_engine_cpu.py) plan their variants up front, so that all
of one process count train in one torchrun launch of tests/smoke/run_many.py (on two cores each
launch's start-up, Python + torch + Megatron-Core on every rank, costs as much as a run); the GPU
tests (tests/gpu) train each variant alone, as `-m training.entry`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from config.schema import TrainingConfig
from config.tree import apply_overrides, from_dict, write_yaml
from tests.smoke.run_many import Outcome, launch_many, read_metrics, run_dir_of, run_logged

REPO = Path(__file__).resolve().parents[2]

# A tiny Llama-style GPT (GQA, SwiGLU, RoPE): a step takes well under a second on two cores.
# Mock data counts upwards inside each document, so a model that learns "next = this + 1" drops
# quickly below the uniform ln(256) = 5.55; lr 3e-3 with 2 warmup steps gets there in 20 steps.
BASE: dict[str, Any] = {
    "name": "smoke",
    "model": {
        "num_layers": 4,
        "hidden_size": 64,
        "ffn_hidden_size": 256,
        "num_attention_heads": 4,
        "num_query_groups": 2,
        "seq_length": 64,
        "vocab_size": 256,
    },
    "optimizer": {"lr": 3e-3, "min_lr": 3e-4},
    "scheduler": {"warmup_steps": 2},
    "train": {"global_batch_size": 8, "micro_batch_size": 2, "max_steps": 20, "device": "cpu"},
}


# Overrides that make BASE a small MoE (4 experts, top 2, the CPU's allgather dispatcher) or give
# it MLA attention (DeepSeek-V3's), for the tests that compare two runs of it.
MOE = (
    "model.num_moe_experts=4",
    "model.moe_router_topk=2",
    "model.moe_ffn_hidden_size=64",
    "model.moe_token_dispatcher_type=allgather",
)
MLA = (
    "model.multi_latent_attention=true",
    "model.q_lora_rank=32",
    "model.kv_lora_rank=16",
    "model.qk_head_dim=16",
    "model.qk_pos_emb_head_dim=8",
    "model.v_head_dim=16",
)


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("NEMORUN_HOME", "HF_HOME", "MPLCONFIGDIR"):
        env[var] = str(tmp / var.lower())
    env["OMP_NUM_THREADS"] = "1"  # two cores, up to four ranks: no thread oversubscription
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def resolved_config(root: Path, recipe: str) -> Path:
    """A catalog recipe resolved into root/<recipe>.yaml, as `recipes run` writes it for the ranks."""
    from recipes.registry import resolve

    _, cfg = resolve(recipe, [])
    return write_yaml(cfg, root / f"{recipe}.yaml")


@dataclass(frozen=True)
class Planned:
    """A run of `Runs.plan`: how many processes, and its overrides of BASE."""

    nproc: int
    overrides: tuple[str, ...] = ()


class Runs:
    """BASE with overrides, trained under torchrun once per name; `metrics` returns its records.

    Planned runs (`plan`, the CPU engine tests) train in groups: the first one asked for trains,
    in one launch of tests/smoke/run_many.py, with every other planned run of its process count
    not trained yet. Any other name (the GPU tests) trains alone, `-m training.entry` on the
    device its overrides name.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.planned: dict[str, Planned] = {}
        self.outcomes: dict[str, Outcome] = {}

    def write_config(self, name: str, overrides: Sequence[str] = ()) -> Path:
        """root/<name>.yaml: BASE with the overrides applied, run dir root/<name>/run."""
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        config = from_dict(TrainingConfig, {**BASE, "logging": {"run_dir": str(folder / "run")}})
        return write_yaml(apply_overrides(config, list(overrides)), self.root / f"{name}.yaml")

    def plan(self, planned: dict[str, Planned]) -> None:
        self.planned |= planned

    def metrics(
        self, name: str, nproc: int | None = None, overrides: Sequence[str] = ()
    ) -> list[dict[str, Any]]:
        """The records of `name`: a planned run (then nothing else is given), or one that trains
        alone on `nproc` processes with `overrides`."""
        if name not in self.outcomes:
            if name in self.planned:
                assert nproc is None and not overrides, f"{name} is planned: ask by name only"
                self._train_planned(self.planned[name].nproc)
            else:
                assert nproc is not None, f"{name} is not planned: give nproc"
                self.outcomes[name] = self._train_alone(name, nproc, overrides)
        outcome = self.outcomes[name]
        if outcome.error is not None:
            pytest.fail(outcome.failure(name))
        return read_metrics(outcome.run_dir)

    def _train_planned(self, nproc: int) -> None:
        names = [n for n, p in self.planned.items() if p.nproc == nproc and n not in self.outcomes]
        configs = [self.write_config(n, self.planned[n].overrides) for n in names]
        self.outcomes |= launch_many(configs, nproc, _env(self.root), self.root / "launches")

    def _train_alone(self, name: str, nproc: int, overrides: Sequence[str]) -> Outcome:
        config = self.write_config(name, overrides)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", str(nproc), "-m", "training.entry", "--config", str(config)]
        log = self.root / name / "torchrun.log"
        returncode, ended = run_logged(cmd, _env(self.root), log, timeout=600)
        error = None if returncode == 0 else f"{ended}, log {log}"
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        errors = [line for line in lines if "Error" in line]
        return Outcome(run_dir_of(config), "\n".join(errors[-20:]), error)


def assert_same_training(on: list[dict], off: list[dict], steps: int, rel: float = 1e-6) -> None:
    """Two runs' records agree step by step (loss and gradient norm), and the first trains."""
    assert [r["step"] for r in on] == [r["step"] for r in off] == list(range(1, steps + 1))
    for a, b in zip(on, off, strict=True):
        step = a["step"]
        assert a["loss"] == pytest.approx(b["loss"], rel=rel), f"loss at step {step}"
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=rel), f"grad norm at {step}"
    assert on[-1]["loss"] < on[0]["loss"]


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("smoke"))
