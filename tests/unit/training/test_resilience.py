"""Resilience without a cluster: the straggler verdict, the hang watchdog's deadline and its exit,
the resilience section of the config, the sbatch script's requeue and ft_launcher. (Real ranks:
tests/smoke/test_resilience_cpu.py; a real Slurm: tests/slurm/test_slurm.py.)"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from config.tree import ConfigError, differences, to_dict
from launchers.profile import from_toml
from launchers.resume import check_resume
from launchers.sbatch import render
from launchers.slurm import SlurmJob, nemo_executor, sbatch_options, slurm_job
from recipes.registry import resolve
from tests.support import children
from tests.support.golden_sbatch import golden_script
from training.checkpoint import dirs
from training.resilience.straggler import find_straggler
from training.resilience.watchdog import HANG_EXIT_CODE, Watchdog

REPO = Path(__file__).parents[3]


# --- find_straggler ------------------------------------------------------------------------------
def test_the_slow_rank_among_equals_is_flagged() -> None:
    found = find_straggler([1.0, 1.02, 0.98, 1.9, 1.01, 0.99, 1.0, 1.0], [0] * 8, factor=1.5)
    assert found is not None and found.flagged
    assert found.rank == 3 and found.median == pytest.approx(1.0)
    assert found.ratio == pytest.approx(1.9)


def test_healthy_spread_is_reported_but_not_flagged() -> None:
    found = find_straggler([1.0, 1.1, 0.95, 1.05], [0] * 4, factor=1.5)
    assert found is not None and not found.flagged
    assert found.rank == 1 and found.ratio == pytest.approx(1.1 / 1.0)


def test_two_ranks_compare_with_each_other() -> None:
    # With a median over both, a rank could never be more than 2x it; against the other, 5x.
    found = find_straggler([0.2, 1.0], [0, 0], factor=3.0)
    assert found is not None and found.flagged and found.rank == 1
    assert found.ratio == pytest.approx(5.0)


def test_only_ranks_of_one_pipeline_stage_are_compared() -> None:
    # The last stage (the output layer and the loss) is legitimately slower than the first.
    seconds = [1.0, 1.0, 1.6, 1.6]
    assert not find_straggler(seconds, [0, 0, 1, 1], factor=1.5).flagged
    found = find_straggler([1.0, 1.0, 1.6, 3.2], [0, 0, 1, 1], factor=1.5)
    assert found.flagged and found.rank == 3 and found.ratio == pytest.approx(2.0)


def test_nothing_to_compare() -> None:
    assert find_straggler([1.0], [0], factor=1.5) is None
    assert find_straggler([1.0, 2.0], [0, 1], factor=1.5) is None  # one rank per stage


def test_zero_times_do_not_divide_by_zero() -> None:
    assert not find_straggler([0.0, 0.0, 0.0], [0, 0, 0], factor=1.5).flagged
    assert find_straggler([0.0, 0.0, 0.5], [0, 0, 0], factor=1.5).flagged


# --- the watchdog's deadline (a fake clock) ------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def dog(tmp_path: Path, clock: Clock) -> Watchdog:
    return Watchdog(0, tmp_path, min_seconds=10.0, factor=4.0, startup_seconds=100.0, clock=clock)


def test_start_up_has_its_own_allowance(tmp_path: Path) -> None:
    clock = Clock()
    w = dog(tmp_path, clock)
    clock.now += 99
    assert w.overdue(clock()) is None
    clock.now += 2
    why = w.overdue(clock())
    assert why is not None and "start-up" in why and "hang_startup_seconds=100" in why


def test_the_first_step_gets_the_generous_allowance(tmp_path: Path) -> None:
    clock = Clock()
    w = dog(tmp_path, clock)
    w.step_started()
    clock.now += 99  # compiling, warming up: far longer than any later step
    assert w.overdue(clock()) is None
    w.step_ended(99.0)
    assert list(w.recent) == []  # the warm-up step does not set later allowances


def test_a_step_may_take_factor_times_the_slowest_recent_one(tmp_path: Path) -> None:
    clock = Clock()
    w = dog(tmp_path, clock)
    for seconds in (50.0, 2.0, 5.0, 3.0):
        w.step_started()
        clock.now += seconds
        w.step_ended(seconds)
    assert w.step_allowance == pytest.approx(20.0)  # 4 x 5 s, above the 10 s floor
    w.step_started()
    clock.now += 19.5
    assert w.overdue(clock()) is None
    clock.now += 1
    why = w.overdue(clock())
    assert why is not None and "a training step" in why and "slowest recent step 5.00 s" in why


def test_the_floor_holds_for_fast_steps(tmp_path: Path) -> None:
    clock = Clock()
    w = dog(tmp_path, clock)
    for _ in range(3):
        w.step_started()
        w.step_ended(0.01)
    assert w.step_allowance == 10.0


def test_between_steps_has_the_start_up_allowance(tmp_path: Path) -> None:
    clock = Clock()
    w = dog(tmp_path, clock)
    for _ in range(3):
        w.step_started()
        w.step_ended(1.0)
    clock.now += 90  # a long checkpoint save
    assert w.overdue(clock()) is None
    clock.now += 20
    assert "between steps" in w.overdue(clock())


def test_the_thread_calls_on_hang_once(tmp_path: Path) -> None:
    seen: list[str] = []
    w = Watchdog(0, tmp_path, min_seconds=0.1, factor=1.0, startup_seconds=0.2, on_hang=seen.append)
    w.start()
    deadline = 50
    while not seen and deadline:
        time.sleep(0.1)
        deadline -= 1
    w.stop()
    assert len(seen) == 1 and "start-up" in seen[0]


# --- the watchdog in a real process: stacks, exit code, nothing left -----------------------------
HANGING = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from training.resilience.watchdog import Watchdog

    def stuck_in_a_collective():
        while True:
            time.sleep(3600)

    w = Watchdog(3, Path({run_dir!r}), min_seconds=0.5, factor=2.0, startup_seconds=0.5)
    w.start()
    for _ in range(3):
        w.step_started()
        time.sleep(0.05)
        w.step_ended(0.05)
    w.step_started()
    stuck_in_a_collective()
    """
)


def test_a_hung_process_dumps_its_stacks_and_exits(tmp_path: Path) -> None:
    script = HANGING.format(repo=str(REPO), run_dir=str(tmp_path))
    done = children.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    err = done.stderr
    assert done.returncode == HANG_EXIT_CODE, err
    assert "hang watchdog: rank 3: no progress in a training step" in err, err
    assert "stuck_in_a_collective" in err  # the main thread's stack, on stderr
    dumps = list((tmp_path / "hang").glob("*/rank3.txt"))
    assert len(dumps) == 1 and "stuck_in_a_collective" in dumps[0].read_text()


def test_a_peer_dump_makes_every_stuck_rank_dump(tmp_path: Path) -> None:
    seen: list[str] = []
    w = Watchdog(1, tmp_path, min_seconds=0.4, factor=10, startup_seconds=600, on_hang=seen.append)
    w.folder.mkdir(parents=True)
    (w.folder / "rank0.txt").write_text("rank 0's stacks")
    w.start()
    for _ in range(100):
        if seen:
            break
        time.sleep(0.1)
    w.stop()
    assert seen and "another rank's watchdog fired" in seen[0]


def test_a_rank_that_makes_progress_does_not_look_for_peer_dumps(tmp_path: Path) -> None:
    clock = Clock()
    w = Watchdog(1, tmp_path, min_seconds=10, factor=4, startup_seconds=100, clock=clock)
    w.step_started()
    clock.now += 4
    assert w.stuck_for(clock()) == 4 < w.min_seconds / 2  # no stat of the shared folder yet
    clock.now += 2
    assert w.stuck_for(clock()) == 6 > w.min_seconds / 2
    w.step_ended(6.0)
    assert w.stuck_for(clock()) == 0


def test_an_earlier_jobs_dump_is_not_a_peer(tmp_path: Path) -> None:
    w = Watchdog(1, tmp_path, min_seconds=600, factor=10, startup_seconds=600, on_hang=print)
    w.folder.mkdir(parents=True)
    old = w.folder / "rank0.txt"
    old.write_text("an earlier job's stacks")
    os.utime(old, (w._started - 3600, w._started - 3600))
    assert not w._peer_dumped()


# --- the config section ------------------------------------------------------------------------
def test_defaults_and_ranges() -> None:
    _, cfg = resolve("tiny_gpt_pretrain", [])
    res = cfg.resilience
    assert res.straggler_interval > 0 and res.hang_min_seconds and res.max_requeues > 0
    assert not res.ft_launcher
    _, off = resolve(
        "tiny_gpt_pretrain", ["resilience.hang_min_seconds=None", "resilience.straggler_interval=0"]
    )
    assert off.resilience.hang_min_seconds is None and off.resilience.straggler_interval == 0
    for bad, field in (
        ("resilience.straggler_factor=1", "resilience.straggler_factor"),
        ("resilience.max_requeues=-1", "resilience.max_requeues"),
        ("resilience.hang_timeout_factor=0.5", "resilience.hang_timeout_factor"),
    ):
        with pytest.raises(ConfigError, match=field):
            resolve("tiny_gpt_pretrain", [bad])


def test_resilience_fields_may_change_on_resume(tmp_path: Path) -> None:
    """Nothing of the section shapes a checkpoint: launchers/resume.py refuses none of it, for a
    checkpoint saved with other values and for one saved before the section existed."""
    _, cfg = resolve("tiny_gpt_pretrain", [])
    before = to_dict(cfg)
    older = {k: v for k, v in before.items() if k != "resilience"}
    new = [
        "resilience.straggler_interval=7",
        "resilience.max_requeues=0",
        "resilience.hang_min_seconds=None",
        "resilience.ft_launcher=true",
    ]
    _, changed = resolve("tiny_gpt_pretrain", new)
    assert {f.partition("=")[0] for f in new} <= set(differences(before, changed))
    for i, saved in enumerate((before, older)):
        folder = tmp_path / str(i) / "checkpoints" / dirs.iter_name(10)
        folder.mkdir(parents=True)
        (folder / dirs.STATE_FILE).write_text(json.dumps({"step": 10, "config": saved}))
        check_resume(changed, tmp_path / str(i))  # raises ConfigError on a refusal


# --- the sbatch script: requeue with a cap, ft_launcher ------------------------------------------
FAKE_SCONTROL = """#!/bin/bash
if [ "$1" = show ]; then echo node001; exit 0; fi
echo "$@" >> "$FAKE_OUT/scontrol.calls"
"""
FAKE_SRUN = """#!/bin/bash
echo "$@" > "$FAKE_OUT/srun.argv"
exit "${FAKE_SRUN_EXIT:-0}"
"""


def bare_job(tmp_path: Path, overrides: list[str]) -> SlurmJob:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "activate").write_text("true\n")
    profile = from_toml({"executor": "slurm-bare", "venv": str(venv), "time": "01:00:00"})
    _, cfg = resolve("tiny_gpt_pretrain", overrides)
    return slurm_job(
        cfg, profile, nodes=1, procs_per_node=2, run_dir=str(tmp_path / "run"), user_env={}
    )[1]


def run_job(tmp_path: Path, text: str, srun_exit: int, restarts: int | None) -> tuple[int, str]:
    """The script with stand-ins for srun (exiting `srun_exit`) and scontrol (recording calls);
    its exit status and output, and the scontrol calls in tmp_path/scontrol.calls."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "job.sbatch").write_text(text)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_OUT": str(tmp_path),
        "FAKE_SRUN_EXIT": str(srun_exit),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "node001",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_CPUS_ON_NODE": "2",
    }
    if restarts is not None:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    done = children.run(
        ["bash", "job.sbatch"], env=env, capture_output=True, text=True, cwd=tmp_path, timeout=30
    )
    return done.returncode, done.stdout + done.stderr


def scontrol_calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "scontrol.calls"
    return path.read_text().splitlines() if path.is_file() else []


def test_a_failed_job_requeues_itself_up_to_the_cap(tmp_path: Path) -> None:
    job = bare_job(tmp_path, ["resilience.max_requeues=2"])
    text = render(job)
    assert ("--requeue", None) in sbatch_options(job) and "#SBATCH --requeue\n" in text
    code, out = run_job(tmp_path, text, srun_exit=75, restarts=None)  # the first run
    assert code == 75 and scontrol_calls(tmp_path) == ["requeue 42"], out
    assert "requeueing job 42, requeue 1 of 2 (resilience.max_requeues)" in out
    code, out = run_job(tmp_path, text, srun_exit=1, restarts=1)
    assert scontrol_calls(tmp_path) == ["requeue 42", "requeue 42"], out
    code, out = run_job(tmp_path, text, srun_exit=1, restarts=2)  # the cap: no third requeue
    assert code == 1 and len(scontrol_calls(tmp_path)) == 2, out
    assert "after 2 requeue(s): resilience.max_requeues=2 reached, not requeueing" in out


def test_a_job_that_succeeds_or_stops_at_the_wall_time_is_not_requeued(tmp_path: Path) -> None:
    code, out = run_job(tmp_path, render(bare_job(tmp_path, [])), srun_exit=0, restarts=0)
    assert code == 0 and scontrol_calls(tmp_path) == [], out


def test_max_requeues_0_leaves_the_script_as_before(tmp_path: Path) -> None:
    job = bare_job(tmp_path, ["resilience.max_requeues=0"])
    text = render(job)
    assert ("--requeue", None) not in sbatch_options(job) and "scontrol requeue" not in text
    assert text.rstrip().endswith(
        "config.yaml"
    )  # srun is the last command: its status is the job's
    code, _ = run_job(tmp_path, text, srun_exit=3, restarts=0)
    assert code == 3 and scontrol_calls(tmp_path) == []


def fake_venv(tmp_path: Path, imports: bool, launcher: bool) -> Path:
    """A venv whose python 'imports' (exits 0) or fails as an import would, with or without
    bin/ft_launcher."""
    venv = tmp_path / ("venv-ok" if imports else "venv-bad")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("true\n")
    body = (
        "exit 0"
        if imports
        else "echo \"ModuleNotFoundError: No module named 'nvidia_resiliency_ext'\" >&2; exit 1"
    )
    (venv / "bin" / "python").write_text(f"#!/bin/bash\n{body}\n")
    (venv / "bin" / "python").chmod(0o755)
    if launcher:
        (venv / "bin" / "ft_launcher").write_text("#!/bin/bash\n")
    return venv


def ft_job(tmp_path: Path, venv: Path) -> SlurmJob:
    profile = from_toml({"executor": "slurm-bare", "venv": str(venv), "time": "01:00:00"})
    _, cfg = resolve("tiny_gpt_pretrain", ["resilience.ft_launcher=true"])
    return slurm_job(
        cfg, profile, nodes=1, procs_per_node=2, run_dir=str(tmp_path / "run"), user_env={}
    )[1]


def test_ft_launcher_replaces_torchrun_and_restarts_in_the_job(tmp_path: Path) -> None:
    job = ft_job(tmp_path, fake_venv(tmp_path, imports=True, launcher=True))
    code, out = run_job(tmp_path, render(job), srun_exit=0, restarts=0)
    argv = (tmp_path / "srun.argv").read_text().split()
    assert code == 0 and "ft_launcher" in argv and "torchrun" not in argv, out
    assert "--max-restarts=3" in argv  # resilience.max_requeues restarts within the job first
    assert argv[-4:-2] == ["-m", "training.entry"]


def test_ft_launcher_that_does_not_import_is_refused_before_launch(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        ft_job(tmp_path, fake_venv(tmp_path, imports=False, launcher=True))
    (field, message), *_ = err.value.problems
    assert field == "resilience.ft_launcher"
    assert "No module named 'nvidia_resiliency_ext'" in message
    assert "resilience.ft_launcher=false" in message and "NGC container" in message
    with pytest.raises(ConfigError, match="bin/ft_launcher does not exist"):
        ft_job(tmp_path / "b", fake_venv(tmp_path / "b", imports=True, launcher=False))


def test_ft_launcher_on_the_local_executor_is_refused_not_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from recipes.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["run", "tiny_gpt_pretrain", "resilience.ft_launcher=true", "--dryrun"])
    assert code == 2
    out = capsys.readouterr()
    assert "resilience.ft_launcher" in out.err + out.out and "--executor slurm" in out.err + out.out
    assert not (tmp_path / "runs").exists()


def test_ft_launcher_missing_in_the_image_stops_without_requeue(tmp_path: Path) -> None:
    text = golden_script(
        "slurm.toml", "tiny_gpt_pretrain", 1, False, ("resilience.ft_launcher=true",)
    )
    code, out = run_job(tmp_path, text, srun_exit=127, restarts=0)
    assert code == 127 and scontrol_calls(tmp_path) == [], out
    assert "resilience.ft_launcher=false" in out


def test_nemo_run_executor_uses_its_fault_tolerance_launcher(tmp_path: Path) -> None:
    profile = from_toml(
        {"executor": "slurm", "container_image": "img.sqsh", "mounts": [f"{tmp_path}:/data"]}
    )
    for overrides, launcher, retries in (
        (["resilience.ft_launcher=true", "resilience.max_requeues=2"], "FaultTolerance", 2),
        ([], "torchrun", 0),
    ):
        _, cfg = resolve("tiny_gpt_pretrain", overrides)
        _, job = slurm_job(
            cfg, profile, nodes=1, procs_per_node=2, run_dir=str(tmp_path / "r"), user_env={}
        )
        executor = nemo_executor(job)
        kind = executor.launcher if isinstance(executor.launcher, str) else None
        assert (kind or type(executor.launcher).__name__) == launcher
        assert executor.retries == retries
        if launcher == "FaultTolerance":
            assert executor.launcher.max_restarts == 2


# --- the timer of the waits ----------------------------------------------------------------------
def test_sync_timer_adds_up_waits_and_counts_a_nested_one_once() -> None:
    import torch

    from training.resilience.straggler import SyncTimer

    timer = SyncTimer(torch.device("cpu"))
    inner = timer.wrap(lambda: time.sleep(0.05))

    def outer_body() -> str:
        inner()
        time.sleep(0.05)
        return "done"

    outer = timer.wrap(outer_body)
    assert outer() == "done"
    inner()
    waited = timer.take()
    assert 0.15 <= waited < 0.3, waited  # 0.1 s outer (its inner call inside) + 0.05 s inner
    assert timer.take() == 0.0
