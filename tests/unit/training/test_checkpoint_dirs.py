"""The checkpoint folder protocol (training/checkpoint/dirs.py) and the exit-signal flag, in-process.

The multi-process behaviour (saves, resumes, kills mid-save) is in tests/smoke/test_checkpoint.py.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from training.checkpoint import dirs


def fake_checkpoint(save_dir: Path, step: int, *, suffix: str = "", state: bool = True) -> Path:
    folder = save_dir / (dirs.iter_name(step) + suffix)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"shard")
    if state:
        dirs.write_state(folder, {"step": step})
        dirs.write_manifest(folder, dirs.file_digests(folder, dirs.checkpoint_files(folder)))
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


def test_latest_is_confined_to_its_folder_and_a_garbled_one_is_reported(tmp_path: Path) -> None:
    for step in (10, 20):
        fake_checkpoint(tmp_path / "run", step)
    outside = fake_checkpoint(tmp_path / "elsewhere", 30)
    pointer = tmp_path / "run" / dirs.LATEST_FILE
    for text in (f"../elsewhere/{outside.name}", str(outside), "iter_0000010/../../elsewhere"):
        pointer.write_text(text)
        candidates, notes = dirs.resume_candidates(tmp_path / "run")
        assert [p.name for p in candidates] == ["iter_0000020", "iter_0000010"]
        assert notes and "not a complete checkpoint folder" in notes[0] and str(pointer) in notes[0]
    pointer.write_bytes(b"\xff\xfeiter_0000010")  # not UTF-8
    candidates, notes = dirs.resume_candidates(tmp_path / "run")
    assert [p.name for p in candidates] == ["iter_0000020", "iter_0000010"]
    assert "cannot be read" in notes[0]


def test_candidates_fall_back_from_latest_to_older_ones_only(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        fake_checkpoint(tmp_path, step)
    (tmp_path / dirs.LATEST_FILE).write_text("iter_0000020\n")  # rolled back by hand
    candidates, notes = dirs.resume_candidates(tmp_path)
    assert [p.name for p in candidates] == ["iter_0000020", "iter_0000010"] and notes == []


def test_the_manifest_finds_changed_missing_and_truncated_files(tmp_path: Path) -> None:
    folder = fake_checkpoint(tmp_path, 1)
    (folder / "rng").mkdir()
    (folder / "rng" / "rank_00000.pt").write_bytes(b"0123456789")
    dirs.write_manifest(folder, dirs.file_digests(folder, dirs.checkpoint_files(folder)))
    files = dirs.read_manifest(folder)
    assert sorted(files) == ["__0_0.distcp", "rng/rank_00000.pt", dirs.STATE_FILE]
    assert dirs.verify_files(folder, files, sorted(files)) == []
    (folder / "__0_0.distcp").write_bytes(b"shaRd")  # one flipped byte, same size
    (folder / "rng" / "rank_00000.pt").write_bytes(b"01234")  # truncated
    (folder / dirs.STATE_FILE).unlink()
    problems = dirs.verify_files(folder, files, sorted(files))
    assert problems == [
        f"{folder / '__0_0.distcp'} does not match its SHA-256 in the manifest (changed bytes)",
        f"{folder / 'rng/rank_00000.pt'} has 5 bytes, the manifest says 10",
        f"{folder / dirs.STATE_FILE} is missing",
    ]
    (folder / dirs.MANIFEST_FILE).write_text('{"files": ')
    with pytest.raises(ValueError, match=r"manifest.json is unreadable"):
        dirs.read_manifest(folder)
    (folder / dirs.MANIFEST_FILE).unlink()
    with pytest.raises(ValueError, match=r"manifest.json is missing"):
        dirs.read_manifest(folder)


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
    from training.resilience.stop import ExitSignals

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
    from training.resilience.stop import ExitSignals

    flags = ExitSignals()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)  # within the repeat window: not fatal
        assert flags.received == signal.SIGTERM
    finally:
        flags.restore()


def test_a_run_whose_checkpoint_folder_is_its_run_directory_holds_one_lock(tmp_path: Path) -> None:
    """Two handles on one lock file in one process: closing either would drop the lock."""
    run = tmp_path / "run"
    assert list(dirs.RunFolders(run, run / "checkpoints").locks) == [
        "logging.run_dir",
        "checkpoint.save_dir",
    ]
    folders = dirs.RunFolders(run, tmp_path / "." / "run")
    assert list(folders.locks) == ["logging.run_dir"]
    assert folders.acquire({"pid": 1}) == []
    folders.release()
