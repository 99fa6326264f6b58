"""launchers/inputs.py: a missing data file, tokenizer or checkpoint stops `recipes run` before
anything is launched or queued; what this machine cannot see is left to the job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from config.tree import ConfigError, apply_overrides
from launchers.inputs import check_inputs, input_paths
from launchers.profile import Profile
from recipes.registry import get

LOCAL = Profile(executor="local")


def cfg_with(*overrides: str):
    cfg = get("tiny_gpt_pretrain").config()
    apply_overrides(cfg, list(overrides))
    return cfg


def problems(cfg, profile: Profile, cwd: Path) -> list[tuple[str, str]]:
    try:
        check_inputs(cfg, profile, cwd)
    except ConfigError as err:
        return err.problems
    return []


def test_what_each_data_kind_reads() -> None:
    cfg = cfg_with("data.kind=indexed", "data.path=0.7 /d/a 0.3 s3://bucket/b", "data.tokenizer=/t")
    assert input_paths(cfg) == [
        ("data.tokenizer", "/t"),
        ("data.path", "/d/a.bin"),
        ("data.path", "/d/a.idx"),
    ]
    cfg = cfg_with("data.kind=sft", "data.path=x.jsonl", "checkpoint.pretrained_dir=/ck")
    assert input_paths(cfg) == [("data.path", "x.jsonl"), ("checkpoint.pretrained_dir", "/ck")]
    assert input_paths(cfg_with()) == []  # mock data reads nothing


def test_local_paths_are_looked_up_from_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "tok.json").write_text("{}")
    (tmp_path / "train.jsonl").write_text("")
    cfg = cfg_with("data.kind=sft", "data.path=train.jsonl", "data.tokenizer=tok.json")
    assert problems(cfg, LOCAL, tmp_path) == []
    cfg = cfg_with("data.kind=sft", "data.path=trian.jsonl", "data.tokenizer=tok.json")
    [(field, message)] = problems(cfg, LOCAL, tmp_path)
    assert field == "data.path" and f"on this machine {tmp_path / 'trian.jsonl'}" in message
    bare = Profile(executor="slurm-bare", workdir=str(tmp_path))
    assert (
        problems(
            cfg_with("data.kind=sft", "data.path=train.jsonl", "data.tokenizer=tok.json"),
            bare,
            Path("/"),
        )
        == []
    )


def test_indexed_prefix_needs_both_files(tmp_path: Path) -> None:
    (tmp_path / "web.bin").write_bytes(b"")
    cfg = cfg_with(
        "data.kind=indexed", f"data.path={tmp_path / 'web'}", f"data.tokenizer={tmp_path}"
    )
    [(field, message)] = problems(cfg, LOCAL, tmp_path)
    assert field == "data.path" and "web.idx does not exist" in message


def test_containers_are_looked_into_through_the_mounts(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    profile = Profile(
        executor="slurm", container_image="img.sqsh", mounts=[f"{tmp_path}:/lustre/llm"]
    )
    ok = cfg_with("checkpoint.pretrained_dir=/lustre/llm/ckpt")
    assert problems(ok, profile, Path("/")) == []
    typo = cfg_with("checkpoint.pretrained_dir=/lustre/llm/ckpts")
    [(field, message)] = problems(typo, profile, Path("/"))
    assert field == "checkpoint.pretrained_dir" and str(tmp_path / "ckpts") in message
    inside_the_image = cfg_with("checkpoint.pretrained_dir=/workspace/ckpt")
    assert problems(inside_the_image, profile, Path("/")) == []
    # load_dir is a host path: the launcher maps it into the container itself.
    (tmp_path / "host" / "ckpt").mkdir(parents=True)
    profile = Profile(
        executor="slurm", container_image="i.sqsh", mounts=[f"{tmp_path}/host:{tmp_path}/ctr"]
    )
    host_path = cfg_with(f"checkpoint.load_dir={tmp_path}/host/ckpt")
    assert problems(host_path, profile, Path("/")) == []
    container_path = cfg_with(f"checkpoint.load_dir={tmp_path}/ctr/ckpt")
    assert [f for f, _ in problems(container_path, profile, Path("/"))] == ["checkpoint.load_dir"]


def test_a_filesystem_this_machine_lacks_is_left_to_the_job(tmp_path: Path) -> None:
    cfg = cfg_with("checkpoint.load_dir=/no-such-fs-here/runs/x/checkpoints")
    assert problems(cfg, LOCAL, tmp_path) == []


@pytest.mark.parametrize("dryrun", [True, False])
def test_run_refuses_a_missing_input_before_launching(tmp_path: Path, dryrun: bool) -> None:
    cmd = [sys.executable, "-m", "recipes", "run", "tiny_gpt_pretrain", "--device", "cpu"]
    cmd += [
        "data.kind=sft",
        f"data.path={tmp_path / 'missing.jsonl'}",
        f"data.tokenizer={tmp_path}",
    ]
    cmd += [f"logging.run_dir={tmp_path / 'run'}"] + (["--dryrun"] if dryrun else [])
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "data.path" in out.stdout + out.stderr and "missing.jsonl" in out.stdout + out.stderr
    assert not (tmp_path / "run").exists()  # nothing written, nothing launched
