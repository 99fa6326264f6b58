"""Nothing wrong is loaded: damaged checkpoints are found by the manifest and passed over for an
older intact one, and a checkpoint crafted to run code runs none. In-process, one gloo rank.

One run saves iter_0000002 and iter_0000004 (module fixture); each case copies that folder, damages
the newest checkpoint one way, and resumes a fresh trainer from the copy.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support import children
from tests.support.full_disk import FULL_DISK
from tests.unit.training.test_engine import (  # noqa: F401 (one_rank: a fixture)
    checkpointer_for,
    one_rank,
    tiny,
    trainer_for,
)
from training.checkpoint import dirs


def checkpointer(run_dir: Path, save_dir: Path, max_steps: int = 4) -> tuple[Any, Any]:
    cfg = tiny(run_dir, max_steps=max_steps)
    cfg.checkpoint.save_dir, cfg.checkpoint.save_interval = str(save_dir), 2
    trainer = trainer_for(cfg)
    return trainer, checkpointer_for(trainer, run_dir)


@pytest.fixture(scope="module")
def saved(one_rank: None, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    root = tmp_path_factory.mktemp("saved")
    trainer, ckpt = checkpointer(root / "run", root / "ckpt")
    try:
        trainer.train([ckpt])
    finally:
        trainer.close()
    assert [p.name for p in dirs.complete_checkpoints(root / "ckpt")] == [
        "iter_0000002",
        "iter_0000004",
    ]
    return root / "ckpt"


def resume(save_dir: Path, run_dir: Path) -> tuple[Any, Any]:
    """A fresh trainer resumed from save_dir; (its checkpointer, the resumed folder)."""
    trainer, ckpt = checkpointer(run_dir, save_dir)
    try:
        return ckpt, ckpt.resume()
    finally:
        trainer.close()


class Payload:
    """Unpickling this runs `touch <marker>`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def flip_a_byte(folder: Path) -> str:
    shard = folder / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    return "__0_0.distcp does not match its SHA-256"


def truncate_a_shard(folder: Path) -> str:
    shard = folder / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    return "__0_0.distcp has 100 bytes"


def remove_the_metadata(folder: Path) -> str:
    (folder / ".metadata").unlink()
    return ".metadata is missing"


def empty_the_train_state(folder: Path) -> str:
    (folder / dirs.STATE_FILE).write_text("")
    return f"{dirs.STATE_FILE} has 0 bytes"


def empty_the_train_state_and_its_manifest_entry(folder: Path) -> str:
    """A 0-byte train_state.json that the manifest agrees with: its hashes cannot tell."""
    (folder / dirs.STATE_FILE).write_bytes(b"")
    rewrite_manifest(folder)
    return f"{dirs.STATE_FILE} is empty"


def truncate_the_rng_file(folder: Path) -> str:
    rng = folder / "rng" / "rank_00000.pt"
    rng.write_bytes(rng.read_bytes()[:50])
    return "rank_00000.pt has 50 bytes"


def remove_the_manifest(folder: Path) -> str:
    (folder / dirs.MANIFEST_FILE).unlink()
    return "manifest.json is missing"


DAMAGE: dict[str, Callable[[Path], str]] = {
    f.__name__: f
    for f in (
        flip_a_byte,
        truncate_a_shard,
        remove_the_metadata,
        empty_the_train_state,
        empty_the_train_state_and_its_manifest_entry,
        truncate_the_rng_file,
        remove_the_manifest,
    )
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_newest_checkpoint_is_named_and_the_older_one_resumed(
    saved: Path, tmp_path: Path, damage: str, capsys: pytest.CaptureFixture
) -> None:
    save_dir = tmp_path / "ckpt"
    shutil.copytree(saved, save_dir)
    newest = save_dir / "iter_0000004"
    expected = DAMAGE[damage](newest)
    ckpt, path = resume(save_dir, tmp_path / "run")
    assert path == save_dir / "iter_0000002" and ckpt.step == 2
    out = capsys.readouterr().out
    assert f"checkpoint: {newest} cannot be resumed from: " in out and expected in out
    assert f"resumed from {save_dir / 'iter_0000002'} at step 2" in out
    (rejected,) = ckpt.resumed["rejected"]
    assert rejected["checkpoint"] == str(newest) and expected in rejected["problem"]


def test_a_garbled_latest_is_reported_and_ignored(
    saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    save_dir = tmp_path / "ckpt"
    shutil.copytree(saved, save_dir)
    (save_dir / dirs.LATEST_FILE).write_bytes(b"\xff\xfe")
    ckpt, path = resume(save_dir, tmp_path / "run")
    assert path == save_dir / "iter_0000004" and ckpt.resumed["rejected"] == []
    assert f"{save_dir / dirs.LATEST_FILE} cannot be read" in capsys.readouterr().out


def test_with_every_checkpoint_damaged_the_run_stops_and_names_each(
    saved: Path, tmp_path: Path
) -> None:
    save_dir = tmp_path / "ckpt"
    shutil.copytree(saved, save_dir)
    flip_a_byte(save_dir / "iter_0000004")
    remove_the_metadata(save_dir / "iter_0000002")
    with pytest.raises(RuntimeError) as err:
        resume(save_dir, tmp_path / "run")
    text = str(err.value)
    assert f"no checkpoint in {save_dir} can be resumed from" in text
    assert str(save_dir / "iter_0000004") in text and str(save_dir / "iter_0000002") in text
    assert "move them away to start afresh" in text


def rewrite_manifest(folder: Path) -> None:
    """What someone crafting a checkpoint would do: a manifest that matches the files."""
    dirs.write_manifest(folder, dirs.file_digests(folder, dirs.checkpoint_files(folder)))


def _text(value: str) -> bytes:
    data = value.encode()
    return pickle.SHORT_BINUNICODE + bytes([len(data)]) + data


def calling(module: str, name: str, *args: str | list[str]) -> bytes:
    """A protocol-4 pickle that calls module's `name` with `args`, written opcode by opcode:
    STACK_GLOBAL resolves a dotted name attribute by attribute, from the module on."""
    out = pickle.PROTO + b"\x04" + _text(module) + _text(name) + pickle.STACK_GLOBAL + pickle.MARK
    for arg in args:
        if isinstance(arg, list):
            out += pickle.EMPTY_LIST + pickle.MARK + b"".join(map(_text, arg)) + pickle.APPENDS
        else:
            out += _text(arg)
    return out + pickle.TUPLE + pickle.REDUCE + pickle.STOP


def in_a_torch_file(path: Path, pickled: bytes) -> None:
    """`pickled` as the object of the torch.save file at `path` (its zip's data.pkl)."""
    import zipfile

    with zipfile.ZipFile(path) as old:
        entries = {info.filename: old.read(info) for info in old.infolist()}
    (record,) = [name for name in entries if name.endswith("/data.pkl")]
    entries[record] = pickled
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as new:
        for name, data in entries.items():
            new.writestr(name, data)


def craft_rng(folder: Path, marker: Path) -> str:
    torch.save({"python": Payload(marker)}, folder / "rng" / "rank_00000.pt")
    return "system"


def craft_metadata(folder: Path, marker: Path) -> str:
    (folder / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    return "refusing to load posix.system"


def craft_metadata_eval(folder: Path, marker: Path) -> str:
    code = f"__import__('os').system('touch {marker}')"
    (folder / ".metadata").write_bytes(calling("builtins", "eval", code))
    return "refusing to load builtins.eval"


# The name walks from an allowed module's attributes to subprocess.Popen, a class.
WALK = ("torch.distributed.checkpoint.metadata", "torch.ctypes.util.subprocess.Popen")


def craft_metadata_attribute_walk(folder: Path, marker: Path) -> str:
    import ctypes.util  # noqa: F401  (imports subprocess: the walk's last steps)

    (folder / ".metadata").write_bytes(calling(*WALK, ["touch", str(marker)]))
    return f"refusing to load {'.'.join(WALK)}"


def craft_rng_attribute_walk(folder: Path, marker: Path) -> str:
    in_a_torch_file(folder / "rng" / "rank_00000.pt", calling(*WALK, ["touch", str(marker)]))
    return "Unsupported operand"  # torch's weights-only reader has no STACK_GLOBAL at all


def craft_data_position(folder: Path, marker: Path) -> str:
    torch.save({"consumed_samples": Payload(marker)}, folder / "data" / "rank_00000.pt")
    return "system"


CRAFTS = [
    craft_rng,
    craft_rng_attribute_walk,
    craft_metadata,
    craft_metadata_eval,
    craft_metadata_attribute_walk,
    craft_data_position,
]


@pytest.mark.parametrize("craft", CRAFTS)
def test_a_crafted_checkpoint_runs_no_code(
    saved: Path, tmp_path: Path, craft: Callable[[Path, Path], str]
) -> None:
    """checkpoint.load_dir pointed at someone else's folder: its files are refused, not run."""
    load_dir = tmp_path / "theirs"
    shutil.copytree(saved, load_dir)
    marker = tmp_path / "pwned"
    for folder in dirs.complete_checkpoints(load_dir):
        refused = craft(folder, marker)
        rewrite_manifest(folder)
    cfg = tiny(tmp_path / "run", max_steps=4)
    cfg.checkpoint.load_dir = str(load_dir)
    trainer = trainer_for(cfg)
    try:
        ckpt = checkpointer_for(trainer, tmp_path / "run")
        with pytest.raises(RuntimeError, match="can be resumed from") as err:
            ckpt.resume()
    finally:
        trainer.close()
    assert not marker.exists(), "loading the checkpoint ran a command"
    assert refused in str(err.value)  # the refused global is named


@pytest.mark.parametrize(
    ("module", "name"),
    [
        WALK,
        ("torch.distributed.checkpoint.metadata", "torch"),  # a module, not a class
        ("torch.distributed.checkpoint.metadata", "Enum"),  # a class it imports, not its own
        ("torch.distributed.checkpoint.metadata", "Metadata.__class__"),  # a walk to `type`
        ("torch", "load"),
    ],
)
def test_the_metadata_allowlist_takes_exact_names_only(
    tmp_path: Path, module: str, name: str
) -> None:
    from training.checkpoint.safe_load import check_metadata

    (tmp_path / ".metadata").write_bytes(calling(module, name))
    with pytest.raises(ValueError, match=f"refusing to load {module}.{name}"):
        check_metadata(tmp_path)


def test_the_resume_is_recorded_in_the_metrics(saved: Path, tmp_path: Path) -> None:
    """Through the entry point: the metrics say where the run resumed and what it passed over."""
    from training.entry import pretrain

    save_dir = tmp_path / "ckpt"
    shutil.copytree(saved, save_dir)
    flip_a_byte(save_dir / "iter_0000004")
    cfg = tiny(tmp_path / "run", max_steps=3)
    cfg.checkpoint.save_dir = str(save_dir)
    pretrain(cfg)
    lines = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    event, step = lines
    assert event["event"] == "resumed" and event["step"] == 2 and event["resumed_step"] == 2
    assert event["checkpoint"] == str(save_dir / "iter_0000002")
    assert event["rejected"][0]["checkpoint"] == str(save_dir / "iter_0000004")
    assert step["step"] == 3 and "event" not in step


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """A 2.5 MB tmpfs: room for one checkpoint of the tiny model (1.6 MB), not two."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = children.run(
        ["mount", "-t", "tmpfs", "-o", "size=2500k", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    children.run(["umount", "-l", str(mount)], check=False)


def train_into_a_full_disk(run_dir: Path, save_dir: Path) -> None:
    """Train to step 4, whose save finds the disk full: the error names it, and the step-2
    checkpoint stays the newest complete one."""
    trainer, ckpt = checkpointer(run_dir, save_dir)
    try:
        with pytest.raises(OSError) as err:
            trainer.train([ckpt])
    finally:
        trainer.close()
    text = str(err.value)
    assert "No space left on device saving step 4 into checkpoint.save_dir=" in text
    assert f"the newest complete checkpoint is still {save_dir / 'iter_0000002'}" in text
    assert dirs.latest_checkpoint(save_dir) == save_dir / "iter_0000002"


def test_a_full_disk_is_named_and_the_last_checkpoint_stays(
    one_rank: None,  # noqa: F811
    small_disk: Path,
    tmp_path: Path,
) -> None:
    save_dir = small_disk / "ckpt"
    train_into_a_full_disk(tmp_path / "run", save_dir)


@pytest.mark.parametrize("error", ["oserror", "torch"])
def test_a_full_disk_as_the_writers_report_it_is_named_and_the_last_checkpoint_stays(
    one_rank: None,  # noqa: F811
    tmp_path: Path,
    error: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The disk fills up while step 4 is saved: an OSError, or the RuntimeError torch.save raises
    for its short write. The same answer as `recipes import` and `export` give for the same
    errors (training/checkpoint/dirs.py `disk_full`; tests/unit/training/test_hf_convert.py)."""
    real = torch.save

    def save(obj: Any, path: Any, *args: Any, **kwargs: Any) -> None:
        if "iter_0000004" in str(path):
            raise FULL_DISK[error]()
        real(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    save_dir = tmp_path / "ckpt"
    train_into_a_full_disk(tmp_path / "run", save_dir)


def test_a_run_that_finished_is_not_failed_by_its_last_write(
    one_rank: None,  # noqa: F811
    small_disk: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """The disk fills up after the last step: the plot cannot be written, the run still ends."""

    class FillTheDisk:
        def after_step(self, trainer: Any, stopping: bool) -> None:
            pass

        def at_end(self, trainer: Any) -> None:
            with open(small_disk / "filler", "wb") as f, pytest.raises(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()

    trainer = trainer_for(tiny(small_disk / "run", max_steps=2))
    try:
        trainer.train([FillTheDisk()])
    finally:
        trainer.close()  # must not raise
    err = capsys.readouterr().err
    assert f"metrics: could not finish {small_disk / 'run' / 'training.png'}" in err
    assert "No space left on device" in err
