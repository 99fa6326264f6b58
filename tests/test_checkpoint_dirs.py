"""The checkpoint folder protocol (training/checkpoint_dirs.py) and the exit-signal flag, in-process.

The multi-process behaviour (saves, resumes, kills mid-save) is in tests/smoke/test_checkpoint.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from training import checkpoint_dirs as dirs


def fake_checkpoint(save_dir: Path, step: int, *, suffix: str = "", state: bool = True) -> Path:
    folder = save_dir / (dirs.iter_name(step) + suffix)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"shard")
    if state:
        dirs.write_state(folder, {"step": step})
    return folder


def test_names_and_steps(tmp_path: Path) -> None:
    assert dirs.iter_name(20) == "iter_0000020"
    assert dirs.step_of(tmp_path / "iter_0000020") == 20
    assert dirs.step_of(tmp_path / "iter_0000020.tmp") is None
    assert dirs.step_of(tmp_path / "latest") is None


def test_a_tmp_folder_is_never_the_latest(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, 10)
    fake_checkpoint(tmp_path, 20, suffix=dirs.TMP_SUFFIX)  # fully written, never renamed
    fake_checkpoint(tmp_path, 30, state=False)  # renamed by hand, without train_state.json
    assert dirs.latest_checkpoint(tmp_path) == tmp_path / "iter_0000010"
    assert dirs.complete_checkpoints(tmp_path) == [tmp_path / "iter_0000010"]


def test_latest_pointer_wins_and_falls_back(tmp_path: Path) -> None:
    assert dirs.latest_checkpoint(tmp_path / "missing") is None
    assert dirs.latest_checkpoint(tmp_path) is None
    for step in (10, 20):
        fake_checkpoint(tmp_path, step)
    # No pointer (a crash between the rename and its update): the newest complete one.
    assert dirs.latest_checkpoint(tmp_path) == tmp_path / "iter_0000020"
    # A pointer rolled back by hand wins over a newer folder.
    (tmp_path / dirs.LATEST_FILE).write_text("iter_0000010\n")
    assert dirs.latest_checkpoint(tmp_path) == tmp_path / "iter_0000010"
    # A pointer at something incomplete or gone is ignored.
    (tmp_path / dirs.LATEST_FILE).write_text("iter_0000099\n")
    assert dirs.latest_checkpoint(tmp_path) == tmp_path / "iter_0000020"


def test_publish_renames_then_points_latest(tmp_path: Path) -> None:
    tmp = fake_checkpoint(tmp_path, 5, suffix=dirs.TMP_SUFFIX)
    final = dirs.publish(tmp)
    assert final == tmp_path / "iter_0000005" and not tmp.exists()
    assert (tmp_path / dirs.LATEST_FILE).read_text() == "iter_0000005\n"
    assert dirs.latest_checkpoint(tmp_path) == final
    # No temporary file of the atomic write is left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000005", dirs.LATEST_FILE]


def test_publish_refuses_an_unfinished_folder(tmp_path: Path) -> None:
    tmp = fake_checkpoint(tmp_path, 5, suffix=dirs.TMP_SUFFIX, state=False)
    with pytest.raises(ValueError, match="not a fully written checkpoint"):
        dirs.publish(tmp)
    assert dirs.latest_checkpoint(tmp_path) is None


def test_publish_replaces_a_newer_orphan(tmp_path: Path) -> None:
    """iter_N renamed but `latest` not yet moved when the job died; the resumed run saves N again."""
    fake_checkpoint(tmp_path, 5)
    (tmp_path / dirs.LATEST_FILE).write_text("iter_0000005\n")
    orphan = fake_checkpoint(tmp_path, 8)
    (orphan / "stale").write_text("from the dead job")
    final = dirs.publish(fake_checkpoint(tmp_path, 8, suffix=dirs.TMP_SUFFIX))
    assert not (final / "stale").exists()
    assert dirs.latest_checkpoint(tmp_path) == final


def test_prune_keeps_the_newest_and_the_latest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        fake_checkpoint(tmp_path, step)
    assert dirs.prune(tmp_path, 0) == []  # 0 keeps all
    (tmp_path / dirs.LATEST_FILE).write_text("iter_0000001\n")  # rolled back by a user
    removed = dirs.prune(tmp_path, 2)
    assert [p.name for p in removed] == ["iter_0000002"]
    assert [p.name for p in dirs.complete_checkpoints(tmp_path)] == [
        "iter_0000001",
        "iter_0000003",
        "iter_0000004",
    ]
    assert not any(p.name.endswith(dirs.DEL_SUFFIX) for p in tmp_path.iterdir())


def test_clean_stale_removes_tmp_and_del_only(tmp_path: Path) -> None:
    keep = fake_checkpoint(tmp_path, 1)
    fake_checkpoint(tmp_path, 2, suffix=dirs.TMP_SUFFIX)
    fake_checkpoint(tmp_path, 3, suffix=dirs.DEL_SUFFIX)
    (tmp_path / ".latest.123.tmp").write_text("iter_0000002")  # an interrupted atomic write
    assert len(dirs.clean_stale(tmp_path)) == 3
    assert sorted(tmp_path.iterdir()) == [keep]


def test_exit_signals_set_a_flag_and_restore() -> None:
    from training.stop import ExitSignals

    before = signal.getsignal(signal.SIGUSR1)
    for signum in (signal.SIGUSR1, signal.SIGTERM):
        flags = ExitSignals()
        assert flags.received is None
        os.kill(os.getpid(), signum)  # handled at once, in this (main) thread
        assert flags.received == signum
        flags.restore()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_a_repeated_signal_is_the_same_request() -> None:
    """Slurm's SIGTERM reaches a rank twice (directly and forwarded by torchrun): keep saving."""
    from training.stop import ExitSignals

    flags = ExitSignals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # within the repeat window: not fatal
        assert flags.received == signal.SIGTERM
    finally:
        flags.restore()
