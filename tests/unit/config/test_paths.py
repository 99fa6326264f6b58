"""config/paths.py: the run directory and the checkpoint folder, one answer for every caller.

The end-to-end check (a `recipes run` whose ranks train in this process) is in tests/unit/training/test_engine.py;
these are the rules themselves, and the callers that need no torch: the launcher's resume check,
`recipes runs` and the Slurm launcher's config for the ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from config import paths
from launchers.profile import Profile
from launchers.resume import latest_state
from launchers.slurm import slurm_job
from recipes.registry import resolve
from recipes.runs import summarize
from training.checkpoint import dirs


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home and a working directory of the test's own."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    return tmp_path / "home"


def test_the_run_directory(home: Path) -> None:
    _, cfg = resolve("tiny_gpt_pretrain", ["logging.run_dir=~/runs/a"])
    assert paths.run_dir_for(cfg, "x") == home / "runs/a"
    cfg.logging.run_dir = "rel/a"
    assert paths.run_dir_for(cfg, "x") == Path.cwd() / "rel/a"
    cfg.logging.run_dir = None
    assert paths.run_dir_for(cfg, "job7") == Path.cwd() / "runs/tiny_gpt_pretrain-job7"
    assert paths.run_dir_for(cfg, "t", "~/r") == home / "r/tiny_gpt_pretrain-t"
    # The launcher's new folder never lands in an old one; the ranks' is the same on every rank.
    (Path.cwd() / "runs/tiny_gpt_pretrain-t").mkdir(parents=True)
    assert paths.run_dir_for(cfg, "t", fresh=True) == Path.cwd() / "runs/tiny_gpt_pretrain-t-2"
    assert paths.run_dir_for(cfg, "t") == Path.cwd() / "runs/tiny_gpt_pretrain-t"


@pytest.mark.parametrize(
    "save_dir", ["~/ckpt", "rel/ckpt", None], ids=["home", "relative", "unset"]
)
def test_every_caller_finds_the_same_checkpoint_folder(home: Path, save_dir: str | None) -> None:
    """The folder checkpoint_dir names is where the launcher's resume check, `recipes runs` and
    the Slurm launcher's config for the ranks (slurm-bare: no container mapping) all look."""
    run_dir = Path.cwd() / "runs/a"
    overrides = [f"checkpoint.save_dir={save_dir}"] if save_dir else []
    _, cfg = resolve("tiny_gpt_pretrain", overrides)
    folder = paths.checkpoint_dir(cfg.checkpoint.save_dir, run_dir)
    expected = {"~/ckpt": home / "ckpt", "rel/ckpt": Path.cwd() / "rel/ckpt"}
    assert folder == expected.get(save_dir, run_dir / "checkpoints")
    saved = folder / dirs.iter_name(3)
    saved.mkdir(parents=True)
    dirs.write_state(saved, {"step": 3})
    paths.write_run_config(cfg, run_dir)
    assert latest_state(cfg, run_dir)[0] == saved
    assert summarize(run_dir)["checkpoint"] == str(saved)
    # slurm-bare's ranks start in the profile's workdir: they get the folder as an absolute path.
    bare = Profile(executor="slurm-bare", venv="/v", workdir="/elsewhere")
    ranks_cfg, _ = slurm_job(
        cfg, bare, nodes=1, procs_per_node=2, run_dir=str(run_dir), user_env={}
    )
    ranks_save = ranks_cfg.checkpoint.save_dir
    assert ranks_save is None or Path(ranks_save).is_absolute()
    assert paths.checkpoint_dir(ranks_save, ranks_cfg.logging.run_dir) == folder
