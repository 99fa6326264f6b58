"""`recipes runs` lists past runs from their run directories, and the `nemo experiment` commands
printed after a local run work as printed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from config.tree import write_yaml
from launchers.local import experiment_commands, write_record
from recipes.cli import main
from recipes.registry import get
from recipes.runs import how_to_follow, run_dirs, summarize
from tests.support import children


def make_run(root: Path, name: str, steps: int, max_steps: int = 6, **launch: object) -> Path:
    run_dir = root / name
    cfg = get("tiny_gpt_pretrain").config()
    cfg.train.max_steps = max_steps
    write_yaml(cfg, run_dir / "config.yaml")
    rows = [{"step": s, "loss": 7.0 - s / 10} for s in range(1, steps + 1)]
    lines = [json.dumps(r) for r in rows] + ['{"step": 2, "event": "resumed"}', '{"step": 9, "lo']
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if launch:
        write_record(run_dir, **launch)
    return run_dir


def test_states_steps_and_losses(tmp_path: Path) -> None:
    make_run(tmp_path, "a-finished", 6, experiment_id="a_1", nemorun_home="/h", state="SUCCEEDED")
    make_run(tmp_path, "b-stopped", 3)
    make_run(tmp_path, "c-interrupted", 2, state="INTERRUPTED")
    make_run(tmp_path, "d-failed", 1, state="AppState.FAILED")
    make_run(tmp_path, "e-submitted", 0, executor="slurm", job_ids=["41", "42"], state="SUBMITTED")
    (tmp_path / "not-a-run").mkdir()
    runs = {d.name: summarize(d) for d in run_dirs([tmp_path, tmp_path / "missing"])}
    assert {name: r["state"] for name, r in runs.items()} == {
        "a-finished": "finished",
        "b-stopped": "stopped",
        "c-interrupted": "interrupted",
        "d-failed": "failed",
        "e-submitted": "submitted",
    }
    a = runs["a-finished"]
    assert (a["step"], a["max_steps"], a["recipe"]) == (6, 6, "tiny_gpt_pretrain")
    assert a["last_loss"] == pytest.approx(6.4) and a["launch"]["experiment_id"] == "a_1"
    assert runs["e-submitted"]["step"] is None


def test_a_run_holding_its_checkpoint_lock_is_running(tmp_path: Path) -> None:
    run_dir = make_run(
        tmp_path, "live", 2, executor="local", pid=4242, host="node1", state="RUNNING"
    )
    folder = run_dir / "checkpoints"
    folder.mkdir()
    lock = folder / ".run.lock"
    lock.write_text("{}\n")
    holder = [  # record locks are per process: another process holds it
        sys.executable,
        "-c",
        "import fcntl, sys, time\n"
        f"f = open({str(lock)!r}, 'a+'); fcntl.lockf(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True); time.sleep(60)",
    ]
    with children.started(holder, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout.readline().strip() == "held"
        assert summarize(run_dir)["state"] == "running"
        assert how_to_follow(summarize(run_dir)["launch"], "running") == [
            "stop (saves, then exits): kill -TERM 4242 on node1"
        ]
    assert summarize(run_dir)["state"] == "stopped" and lock.read_text() == "{}\n"


def test_runs_command_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_run(tmp_path, "a", 6, experiment_id="tiny_1", nemorun_home=str(tmp_path / "h"))
    assert main(["runs", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"finished    tiny_gpt_pretrain  step 6/6  loss 6.4000  {tmp_path}/a" in out
    assert f"NEMORUN_HOME={tmp_path}/h nemo experiment logs tiny_1 0" in out
    assert main(["runs", "--json", "--root", str(tmp_path)]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["state"] == "finished" and row["run_dir"] == str(tmp_path / "a")


def test_experiment_commands_carry_the_records_home(tmp_path: Path) -> None:
    home = tmp_path / "run" / "nemo_run"
    home.mkdir(parents=True)
    status, logs = experiment_commands("x_1", home, {})
    assert status == f"NEMORUN_HOME={home} nemo experiment status x_1"
    assert logs == f"NEMORUN_HOME={home} nemo experiment logs x_1 0"
    assert experiment_commands("x_1", home, {"NEMORUN_HOME": str(home)})[0] == (
        "nemo experiment status x_1"
    )


@pytest.mark.smoke
def test_printed_nemo_experiment_commands_work(tmp_path: Path) -> None:
    """A real local run (2 CPU ranks): `nemo experiment status <id>` as printed finds it, and
    `recipes runs` lists it finished."""
    env = {k: v for k, v in os.environ.items() if k != "NEMORUN_HOME"}
    env |= {"OMP_NUM_THREADS": "1", "MPLCONFIGDIR": str(tmp_path), "HF_HOME": str(tmp_path)}
    argv = [sys.executable, "-m", "recipes", "run", "tiny_gpt_pretrain", "--device", "cpu"]
    argv += ["train.max_steps=6", "logging.tensorboard=false"]
    out = children.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    status = next(line.strip() for line in out.stdout.splitlines() if "experiment status" in line)
    assert status.startswith(f"NEMORUN_HOME={tmp_path}/runs/tiny_gpt_pretrain-")
    words = shlex.split(status)
    shown = children.run(
        [str(Path(sys.executable).parent / "nemo"), *words[2:]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env | {"NEMORUN_HOME": words[0].split("=", 1)[1], "COLUMNS": "200"},
    )
    assert shown.returncode == 0 and "SUCCEEDED" in shown.stdout, shown.stdout + shown.stderr
    logs = next(line.strip() for line in out.stdout.splitlines() if "experiment logs" in line)
    shown = children.run(
        [str(Path(sys.executable).parent / "nemo"), *shlex.split(logs)[2:]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env | {"NEMORUN_HOME": words[0].split("=", 1)[1], "COLUMNS": "200"},
    )
    assert shown.returncode == 0 and "step 6/6" in shown.stdout + shown.stderr  # logs: stderr
    listed = children.run(
        [sys.executable, "-m", "recipes", "runs", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env=env,
    )
    (row,) = json.loads(listed.stdout)
    assert (row["state"], row["step"]) == ("finished", 6)
    assert row["launch"]["state"] == "SUCCEEDED" and row["launch"]["experiment_id"] in status
