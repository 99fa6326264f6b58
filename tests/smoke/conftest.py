"""Launch real multi-process training runs on the CPU: torchrun + `python -m training.entry`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("NEMORUN_HOME", "HF_HOME", "MPLCONFIGDIR"):
        env[var] = str(tmp / var.lower())
    env["OMP_NUM_THREADS"] = "1"  # two cores, up to four ranks: no thread oversubscription
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def resolved_config(root: Path, recipe: str) -> Path:
    """A catalog recipe resolved into root/<recipe>.yaml, as `recipes run` writes it for the ranks."""
    from config.tree import write_yaml
    from recipes.registry import resolve

    _, cfg = resolve(recipe, [])
    return write_yaml(cfg, root / f"{recipe}.yaml")


class Runs:
    """Runs a config under torchrun once per name and returns its metrics.jsonl records."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[str, list[dict[str, Any]]] = {}

    def write_config(self, name: str) -> Path:
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        config = {**BASE, "logging": {"run_dir": str(folder / "run")}}
        path = folder / "config.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path

    def launch(self, name: str, nproc: int, overrides: list[str]) -> subprocess.CompletedProcess:
        config = self.write_config(name)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", str(nproc), "-m", "training.entry", "--config", str(config)]
        return subprocess.run(
            cmd + overrides,
            cwd=REPO,
            env=_env(self.root),
            capture_output=True,
            text=True,
            timeout=600,
        )

    def metrics(self, name: str, nproc: int, overrides: list[str]) -> list[dict[str, Any]]:
        if name not in self.cache:
            proc = self.launch(name, nproc, overrides)
            log = self.root / name / "torchrun.log"
            log.write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr, encoding="utf-8")
            if proc.returncode != 0:
                errors = [line for line in proc.stderr.splitlines() if "Error" in line]
                pytest.fail(
                    f"{name} failed (exit {proc.returncode}), log {log}:\n"
                    + "\n".join(errors[-20:])
                )
            path = self.root / name / "run" / "metrics.jsonl"
            self.cache[name] = [json.loads(line) for line in path.read_text().splitlines()]
        return self.cache[name]


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("smoke"))
