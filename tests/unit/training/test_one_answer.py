"""One answer per question: the launcher and the ranks ask the same functions. A layout change
refused alike before launch and on every rank, a run folder a live run holds, the folders a run
logs and checkpoints into, and the peak its MFU is measured against (the planner's). The engine
runs in this process on test_engine.py's one-rank gloo group."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from typing import Any

import pytest

from config.hardware import Cluster
from config.rules import derive
from config.tree import apply_overrides
from tests.unit.training.test_engine import (  # noqa: F401 (one_rank: the module's process group)
    ONE_CPU,
    checkpointer_for,
    losses,
    one_rank,
    tiny,
    trainer_for,
)

pytestmark = pytest.mark.usefixtures("one_rank")


def test_a_layout_change_is_refused_alike_before_launch_and_on_every_rank(tmp_path: Path) -> None:
    """A checkpoint saved by the engine, resumed with another CP or ETP: launchers/resume.py's
    check and the ranks' resume (training/checkpoint/store.py) both refuse it, with the same message."""
    from config.tree import ConfigError
    from launchers.resume import check_resume
    from training.entry import pretrain

    saved = tiny(tmp_path, max_steps=2)  # saves at its end: iter_0000002
    pretrain(saved)
    for change in (
        "parallel.context_parallel_size=2",
        "parallel.expert_tensor_parallel_size=2",
        "parallel.tensor_model_parallel_size=2",
    ):
        field = change.split("=")[0]
        cfg = apply_overrides(tiny(tmp_path, max_steps=4), [change])
        with pytest.raises(ConfigError) as before_launch:
            check_resume(cfg, tmp_path)
        trainer = trainer_for(tiny(tmp_path, max_steps=4))  # the weights' shapes: the saved run's
        ckpt = checkpointer_for(trainer, tmp_path, cfg)
        try:
            with pytest.raises(ConfigError) as on_the_ranks:
                ckpt.resume()
        finally:
            ckpt.close()
            trainer.close()
        assert dict(on_the_ranks.value.problems) == dict(before_launch.value.problems)
        assert list(dict(before_launch.value.problems)) == [field], change
    # The same layout resumes (and a train.max_steps beyond the checkpoint is all that changed).
    check_resume(tiny(tmp_path, max_steps=4), tmp_path)


# A run in a child process that stops inside its step 2 until a line comes on its stdin.
STOPS_AT_STEP_2 = """
import sys
from pathlib import Path
from tests.unit.training.test_engine import tiny
from training.entry import pretrain

class Wait:
    def after_step(self, trainer, stopping):
        if trainer.step == 2:
            print("at step 2", flush=True)
            sys.stdin.readline()

    def at_end(self, trainer):
        pass

cfg = tiny(Path(sys.argv[1]), max_steps=4)
cfg.checkpoint.save_dir = sys.argv[2]
pretrain(cfg, hooks=[Wait()])
"""


def test_a_run_folder_a_live_run_holds_is_refused_before_launch_and_on_the_ranks(
    tmp_path: Path,
) -> None:
    """Two runs with one logging.run_dir and a checkpoint.save_dir each: while the first trains
    (another process), the second is refused by the launcher's check and by its ranks with the same
    message (the folder, the first's host and pid, the fix), before it writes into the folder.
    Once the first is dead (killed: its lock file stays behind) a new run takes the folder over,
    and a run resumed there after that one ended carries on."""
    import socket
    import subprocess
    import sys

    from config.tree import ConfigError
    from launchers.resume import check_resume
    from tests.support import children
    from training.checkpoint.dirs import LOCK_FILE, FolderInUse
    from training.entry import pretrain

    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    args = [sys.executable, "-c", STOPS_AT_STEP_2, str(run_dir), str(tmp_path / "first")]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    with children.started(args, env=env, **pipes) as first:
        for line in first.stdout:
            if line.strip() == "at step 2":
                break
        else:
            pytest.fail(f"the first run ended before its step 2 (exit {first.wait()})")
        written = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
        assert [json.loads(r)["step"] for r in written["metrics.jsonl"].splitlines()] == [1, 2]
        second = tiny(run_dir, max_steps=6)
        second.checkpoint.save_dir = str(tmp_path / "second")
        with pytest.raises(ConfigError) as before_launch:
            check_resume(second, run_dir)
        with pytest.raises(FolderInUse) as on_the_ranks:
            pretrain(second)
        problems = dict(before_launch.value.problems)
        assert list(problems) == ["logging.run_dir"]
        assert str(on_the_ranks.value) == f"logging.run_dir: {problems['logging.run_dir']}"
        for part in (
            f"{run_dir} is in use by another run",
            f'"pid": {first.pid}',
            f'"host": "{socket.gethostname()}"',
            "wait for it to end, or give this run its own logging.run_dir",
        ):
            assert part in problems["logging.run_dir"]
        # The first's config.yaml and metrics are as it wrote them.
        assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()} == written
        first.kill()  # dies holding the folder: the kernel drops its lock, the file stays
        first.wait()
    assert (run_dir / LOCK_FILE).is_file()
    check_resume(second, run_dir)
    pretrain(second)  # takes the folder over: no checkpoint of its own, from step 0
    second.train.max_steps = 8
    pretrain(second)  # the same run again, after it ended: resumes at step 6
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "event" not in r] == list(range(1, 9))


@pytest.mark.parametrize(
    ("save_dir", "run_dir"),
    [("~/ckpt", "~/run"), ("rel/ckpt", "rel/run"), (None, "~/run")],
    ids=["home", "relative", "unset"],
)
def test_the_launcher_and_the_ranks_use_the_same_folders(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    save_dir: str | None,
    run_dir: str,
) -> None:
    """`recipes run` (its torchrun replaced by training.entry in this process): the run directory
    it prints is where the ranks log; the config.yaml it writes is the one the ranks write back,
    byte for byte; the checkpoint lands where the launcher's resume check and `recipes runs`
    look. `~` is the user's home, never a folder named "~"."""
    from config.paths import CONFIG_FILE
    from launchers import local
    from launchers.resume import latest_state
    from recipes.cli import main
    from recipes.runs import summarize
    from training import entry
    from training.checkpoint import dirs

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    launched = {}

    def ranks(executor: Any, script: str, name: str, nemo_home: Path, folder: Path) -> int:
        launched["config"] = (folder / CONFIG_FILE).read_bytes()
        entry.run(entry.load_config(script, []))  # what every rank runs, here as one rank
        return 0

    monkeypatch.setattr(local, "local_executor", lambda procs, env: None)
    monkeypatch.setattr(local, "entry_script", lambda config_arg: config_arg)
    monkeypatch.setattr(local, "run_local", ranks)
    overrides = [
        f"logging.run_dir={run_dir}",
        "parallel.tensor_model_parallel_size=1",
        "train.max_steps=1",
        "scheduler.warmup_steps=0",
        "logging.tensorboard=false",
    ]
    overrides += [f"checkpoint.save_dir={save_dir}"] if save_dir else []
    assert main(["run", "tiny_gpt_pretrain", "--gpus-per-node", "1", *overrides]) == 0
    base = home if run_dir.startswith("~") else work
    folder = base / run_dir.removeprefix("~/")
    ckpts = {"~/ckpt": home / "ckpt", "rel/ckpt": work / "rel/ckpt"}.get(
        save_dir, folder / "checkpoints"
    )
    saved = ckpts / dirs.iter_name(1)
    assert (folder / CONFIG_FILE).read_bytes() == launched["config"]
    assert len(losses(folder)) == 1  # the ranks logged into the folder the launcher chose
    assert dirs.latest_checkpoint(ckpts) == saved
    found = latest_state(entry.load_config(str(folder / CONFIG_FILE), []), folder)
    assert found is not None and found[0] == saved  # what a relaunch checks before resuming
    assert summarize(folder)["checkpoint"] == str(saved)  # what `recipes runs` shows
    assert not (work / "~").exists()


def test_mfu_is_measured_against_the_peak_the_planner_predicts_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every GPU kind and precision preset: the peak `training.pretrain` hands the Trainer for its
    MFU is the one behind config/cost/steptime.py's predicted MFU, also where a kind lacks the preset's
    number format (the checker refuses those runs; stubbed here to reach the Trainer). The Trainer
    gets the values `config.rules.derive` gives the planner."""
    from config.cost.steptime import predict
    from config.hardware import GPUS
    from config.precision import PRESETS
    from training import engine, entry

    class Built(Exception):
        """The Trainer was reached: what the engine measures MFU against is known."""

    handed: dict[str, Any] = {}

    def trainer(cfg: Any, derived: Any, device: str, run_dir: Path, peak: float | None) -> None:
        handed["peak"], handed["derived"] = peak, derived
        raise Built

    monkeypatch.setattr(engine, "Trainer", trainer)
    monkeypatch.setattr("config.rules.validate", lambda *args: [])
    checked = 0
    for gpu in GPUS:
        cluster = Cluster(num_nodes=1, gpus_per_node=1, gpu=gpu)
        monkeypatch.setattr(entry, "cluster_from_env", lambda device, c=cluster: c)
        for precision in PRESETS:
            cfg = tiny(tmp_path)
            cfg.precision = precision
            with pytest.raises(Built):
                entry.pretrain(cfg)
            assert gc.get_freeze_count() == 0  # a run that raised unfreezes too
            derived = derive(cfg, cluster)
            planned = predict(cfg, cluster, derived)
            assert handed["derived"] == derived
            assert handed["peak"] == pytest.approx(planned.tflops_per_gpu / planned.mfu), (
                gpu,
                precision,
            )
            checked += 1
    assert checked == len(GPUS) * len(PRESETS)
    # The CPU has no peak: no MFU, and the planner predicts nothing there.
    monkeypatch.setattr(entry, "cluster_from_env", lambda device: ONE_CPU)
    with pytest.raises(Built):
        entry.pretrain(tiny(tmp_path))
    assert (
        handed["peak"] is None
        and predict(tiny(tmp_path), ONE_CPU, derive(tiny(tmp_path), ONE_CPU)) is None
    )
