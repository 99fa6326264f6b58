"""data.stage_dir: node-local copies of an indexed blend (data/stage.py), and the profile key
`stage_data` that sets it in a Slurm job. The oracle of the copies is Megatron's own dataset
builder: the staged blend must give the same samples as the blend read in place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from config.blend import staged_prefix
from config.hardware import Cluster
from config.rules import validate
from config.schema import DataConfig
from config.tree import ConfigError
from data.pretrain import build_pretrain_datasets
from data.stage import StageError, copy_prefixes
from data.tokenizer import build_tokenizer
from launchers.profile import Profile, check_profile
from launchers.slurm import slurm_job
from recipes.registry import get
from tests.unit.data.test_data import _cfg, corpus, process_group  # noqa: F401 (fixtures)


@pytest.fixture
def shared(corpus: dict, tmp_path: Path) -> str:  # noqa: F811
    """The corpus's prefix copied into this test's "shared filesystem", with its mtimes."""
    prefix = tmp_path / "shared" / "docs"
    prefix.parent.mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy2(f"{corpus['prefix']}{ext}", f"{prefix}{ext}")
    return str(prefix)


def test_a_staged_blend_gives_the_samples_read_in_place(
    corpus: dict,  # noqa: F811
    shared: str,
    tmp_path: Path,
    process_group: None,  # noqa: F811
) -> None:
    data = DataConfig(
        kind="indexed", path=f"0.6 {shared} 0.4 {shared}", tokenizer=str(corpus["tok"])
    )
    cfg = _cfg(data)
    tok = build_tokenizer(cfg)
    in_place, _, _ = build_pretrain_datasets(cfg, tok, 24, 2)
    cfg.data.stage_dir = str(tmp_path / "node-local")
    staged, _, _ = build_pretrain_datasets(cfg, tok, 24, 2)
    for i in range(len(in_place)):
        assert staged[i]["tokens"].tolist() == in_place[i]["tokens"].tolist(), i
    copy = staged_prefix(shared, cfg.data.stage_dir)
    for ext in (".bin", ".idx"):  # the copies keep the mtime that keys Megatron's caches
        assert os.stat(copy + ext).st_mtime == os.stat(shared + ext).st_mtime
    # The caches stay with the shared data, where every node finds them; none on the node.
    assert list(Path(shared, "cache").glob("GPTDataset_indices-*"))
    assert sorted(p.name for p in Path(cfg.data.stage_dir).iterdir()) == sorted(
        Path(copy + ext).name for ext in (".bin", ".idx")
    )


def test_a_current_copy_is_kept_and_a_stale_one_replaced(shared: str, tmp_path: Path) -> None:
    stage = str(tmp_path / "node")
    (copy,) = copy_prefixes([shared], stage)
    first = os.stat(copy + ".bin").st_ino
    copy_prefixes([shared], stage)
    assert os.stat(copy + ".bin").st_ino == first  # the next job of a chain: nothing copied
    os.utime(shared + ".bin", (1, 1))  # the shared data was written again
    copy_prefixes([shared], stage)
    assert os.stat(copy + ".bin").st_ino != first and os.stat(copy + ".bin").st_mtime == 1


def test_a_stopped_copy_leaves_nothing_that_looks_complete(
    shared: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def half(src: str, dst: str) -> None:
        Path(dst).write_bytes(Path(src).read_bytes()[:10])
        raise KeyboardInterrupt  # the job was stopped in the middle of the copy

    monkeypatch.setattr(shutil, "copy2", half)
    stage = tmp_path / "node"
    with pytest.raises(KeyboardInterrupt):
        copy_prefixes([shared], str(stage))
    assert list(stage.iterdir()) == []


def test_too_little_room_is_refused_before_copying(
    shared: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda _: shutil._ntuple_diskusage(1, 1, 100))
    with pytest.raises(StageError, match=r"data.stage_dir=.* 0.00 GiB free.*unset data.stage_dir"):
        copy_prefixes([shared], str(tmp_path / "node"))
    assert list((tmp_path / "node").iterdir()) == []


@pytest.mark.parametrize(
    "data, message",
    [
        (DataConfig(kind="indexed", path="/d/x", stage_dir="node"), "not an absolute path"),
        (DataConfig(kind="sft", path="/d/x.jsonl", stage_dir="/dev/shm/d"), "read in place"),
    ],
)
def test_the_checker_names_a_stage_dir_it_cannot_use(data: DataConfig, message: str) -> None:
    cfg = _cfg(data)
    found = [p for p in validate(cfg, Cluster(num_nodes=1, gpus_per_node=8, gpu="h100"))]
    assert any(p.field == "data.stage_dir" and message in p.message for p in found), found


def test_a_profile_stages_an_indexed_blend_of_its_jobs() -> None:
    profile = Profile(executor="slurm-bare", venv="/v", stage_data="/dev/shm/me")
    mock = get("tiny_gpt_pretrain").config()
    indexed = get("tiny_gpt_pretrain").config()
    indexed.data = DataConfig(kind="indexed", path="/d/x", tokenizer="/d/tok.json")
    job = {"nodes": 1, "procs_per_node": 2, "run_dir": "/r/a", "user_env": {}}
    assert slurm_job(indexed, profile, **job)[0].data.stage_dir == "/dev/shm/me"
    assert slurm_job(mock, profile, **job)[0].data.stage_dir is None  # nothing to copy
    indexed.data.stage_dir = "/local/mine"  # the run's own choice wins
    assert slurm_job(indexed, profile, **job)[0].data.stage_dir == "/local/mine"
    with pytest.raises(ConfigError, match="stage_data.*not an absolute path"):
        check_profile(Profile(executor="slurm-bare", venv="/v", stage_data="shm"))
