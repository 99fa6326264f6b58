"""A run folder a queued Slurm job will start in (launchers/sbatch.py `queued`), as the launch
check (launchers/resume.py `check_resume`) sees it: the job ids of the folder's launch record, and
what squeue says of each. squeue here is a stand-in script on PATH that answers as Slurm's does
(`squeue -h -o "%i %T" -j ID`: the job's line while Slurm holds it, "Invalid job id specified" and
exit 1 once it is purged); tests/slurm/test_slurm.py holds a real queued job."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from config import paths
from config.tree import ConfigError
from launchers.resume import check_resume
from launchers.sbatch import queued
from recipes.registry import resolve

FAKE_SQUEUE = """#!/bin/sh
# squeue -h -o "%i %T" -j ID: the line of a job Slurm still holds (states: $FAKE_JOBS, "id:STATE ...")
for entry in $FAKE_JOBS; do
    if [ "${entry%%:*}" = "$5" ]; then echo "$5 ${entry#*:}"; exit 0; fi
done
echo "slurm_load_jobs error: Invalid job id specified" >&2
exit 1
"""


@pytest.fixture
def squeue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "squeue"
    script.write_text(FAKE_SQUEUE)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return script


def _submitted(run_dir: Path, *ids: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"executor": "slurm-bare", "job_ids": list(ids), "state": "SUBMITTED"}
    (run_dir / paths.LAUNCH_RECORD).write_text(json.dumps(record))


def test_the_jobs_slurm_still_holds_are_queued(
    squeue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    assert queued(run_dir) == []  # no launch record: never submitted
    _submitted(run_dir, "41", "42", "43")
    monkeypatch.setenv("FAKE_JOBS", "42:PENDING 43:COMPLETING")
    assert queued(run_dir) == ["42 (PENDING)"]  # 41 purged; 43 ending, it reads nothing more
    monkeypatch.setenv("FAKE_JOBS", "41:RUNNING 42:PENDING")
    assert queued(run_dir) == ["41 (RUNNING)", "42 (PENDING)"]
    monkeypatch.setenv("FAKE_JOBS", "")
    assert queued(run_dir) == []  # all ended
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert queued(run_dir) == []  # no Slurm on this machine: nothing queued from here


def test_a_launch_into_a_folder_with_a_queued_job_is_refused(
    squeue: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    _, cfg = resolve("tiny_gpt_pretrain", [f"logging.run_dir={run_dir}"])
    _submitted(run_dir, "7", "8")
    monkeypatch.setenv("FAKE_JOBS", "7:RUNNING 8:PENDING")
    with pytest.raises(ConfigError) as err:
        check_resume(cfg, run_dir)
    ((field, message),) = err.value.problems
    assert field == "logging.run_dir"
    assert "7 (RUNNING), 8 (PENDING)" in message and "scancel 7 8" in message
    assert "its own logging.run_dir" in message
    monkeypatch.setenv("FAKE_JOBS", "")
    check_resume(cfg, run_dir)  # once they have ended, the folder takes a new launch
