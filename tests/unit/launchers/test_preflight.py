"""launchers/preflight.py: the job's per-node input check, run as srun's task runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from config.tree import apply_overrides, write_yaml
from recipes.registry import get
from tests.support import children

REPO = Path(__file__).resolve().parents[3]


def _preflight(config: Path, cwd: Path) -> subprocess.CompletedProcess:
    return children.run(
        [sys.executable, "-m", "launchers.preflight", "--config", str(config)],
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_path_only_the_node_lacks_stops_the_job_before_torchrun(tmp_path: Path) -> None:
    cfg = apply_overrides(
        get("tiny_gpt_pretrain").config(),
        ["data.kind=sft", "data.path=/raid/local/train.jsonl", f"logging.run_dir={tmp_path}"],
    )
    config = write_yaml(cfg, tmp_path / "config.yaml")
    out = _preflight(config, tmp_path)
    assert out.returncode == 2, out.stderr
    assert "preflight on " in out.stderr
    assert "data.path" in out.stderr and "/raid/local/train.jsonl does not exist" in out.stderr
    # The node's working directory is where relative paths resolve, as for the ranks.
    (tmp_path / "train.jsonl").write_text('{"prompt": "q", "response": "a"}\n')
    cfg.data.path = "train.jsonl"
    out = _preflight(write_yaml(cfg, tmp_path / "config.yaml"), tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_preflight_imports_no_torch(tmp_path: Path) -> None:
    cfg = apply_overrides(get("tiny_gpt_pretrain").config(), [f"logging.run_dir={tmp_path}"])
    config = write_yaml(cfg, tmp_path / "config.yaml")
    probe = (
        "import sys, runpy; sys.argv = ['x', '--config', sys.argv[1]]\n"
        "try:\n    runpy.run_module('launchers.preflight', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = children.run(
        [sys.executable, "-c", probe, str(config)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr


def test_the_job_runs_preflight_on_each_node_before_torchrun(tmp_path: Path) -> None:
    """The node wrapper of the sbatch script (launchers/slurm.py), run as srun's task runs it, with
    a stand-in torchrun: a refused input stops the node before torchrun starts."""
    from launchers.sbatch import shell_join
    from launchers.slurm import NODE_WRAPPER, PREFLIGHT_EXIT

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    marker = tmp_path / "torchrun-started"
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(f'#!/bin/sh\necho "$@" > {marker}\n')
    torchrun.chmod(0o755)
    cfg = apply_overrides(
        get("tiny_gpt_pretrain").config(),
        ["data.kind=sft", "data.path=/raid/local/train.jsonl", f"logging.run_dir={tmp_path}"],
    )
    config = write_yaml(cfg, tmp_path / "config.yaml")
    line = shell_join([(NODE_WRAPPER, "torchrun"), "--nnodes=1", ("-m", "training.entry")])
    line += f" --config {config}"
    # The stand-in torchrun first; python is the venv's, as in the job's activated venv or image.
    env = {
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHONPATH": str(REPO),
    }

    def node() -> subprocess.CompletedProcess:
        return children.run(
            ["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    out = node()
    assert out.returncode == PREFLIGHT_EXIT and not marker.exists(), out.stderr
    assert "/raid/local/train.jsonl does not exist" in out.stderr
    cfg.data.kind, cfg.data.path = "mock", None
    write_yaml(cfg, config)
    out = node()
    assert out.returncode == 0, out.stderr
    assert marker.read_text().split()[-2:] == ["--config", str(config)]
