"""Resuming with changed settings, decided before launch (launchers/resume.py): what cannot change
is refused naming the field, the checkpoint's value and the new one, and nothing is written; what
can change (the LR schedule, a longer train.max_steps) follows the new config.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config.tree import ConfigError, differences, to_dict
from launchers.resume import check_resume
from recipes.cli import main
from recipes.registry import resolve
from tests.support import children
from training.checkpoint import dirs


def saved_run(tmp_path: Path, step: int, overrides: list[str]) -> Path:
    """A run folder whose checkpoints/ holds a complete checkpoint of `overrides` at `step`."""
    _, cfg = resolve("tiny_gpt_pretrain", overrides)
    folder = tmp_path / "run" / "checkpoints" / dirs.iter_name(step)
    folder.mkdir(parents=True)
    state = {"step": step, "config": to_dict(cfg)}
    (folder / dirs.STATE_FILE).write_text(json.dumps(state))
    return tmp_path / "run"


def problems(run_dir: Path, overrides: list[str]) -> dict[str, str]:
    _, cfg = resolve("tiny_gpt_pretrain", overrides)
    try:
        check_resume(cfg, run_dir)
    except ConfigError as err:
        return dict(err.problems)
    return {}


def test_changes_that_cannot_take_effect_are_refused_naming_both_values(tmp_path: Path) -> None:
    run_dir = saved_run(tmp_path, 10, [])
    found = problems(run_dir, ["optimizer.lr=5e-4", "model.num_layers=6"])
    assert set(found) == {"optimizer.lr", "model.num_layers"}
    assert "0.0005" in found["optimizer.lr"] and "0.001" in found["optimizer.lr"]
    assert "checkpoint.pretrained_dir=" in found["model.num_layers"]


def test_max_steps_at_or_below_the_checkpoint_says_so(tmp_path: Path) -> None:
    run_dir = saved_run(tmp_path, 10, [])
    assert "at step 10" in problems(run_dir, ["train.max_steps=10"])["train.max_steps"]
    assert problems(run_dir, ["train.max_steps=11"]) == {}


def test_the_schedule_and_a_longer_run_may_change(tmp_path: Path) -> None:
    run_dir = saved_run(tmp_path, 10, [])
    changed = ["train.max_steps=80", "scheduler.warmup_steps=2", "scheduler.decay_style=linear"]
    assert problems(run_dir, changed) == {}
    _, cfg = resolve("tiny_gpt_pretrain", changed)
    saved = json.loads((run_dir / "checkpoints/iter_0000010" / dirs.STATE_FILE).read_text())
    assert set(differences(saved["config"], cfg)) == {
        "train.max_steps",
        "scheduler.warmup_steps",
        "scheduler.decay_style",
    }


def test_a_refused_resume_launches_nothing_and_leaves_config_yaml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = saved_run(tmp_path, 10, [])
    (run_dir / "config.yaml").write_text("the run's own config\n")
    code = main(["run", "tiny_gpt_pretrain", f"logging.run_dir={run_dir}", "optimizer.lr=5e-4"])
    assert code == 2
    assert "optimizer.lr" in capsys.readouterr().err
    assert (run_dir / "config.yaml").read_text() == "the run's own config\n"


def test_the_scheduler_follows_the_new_config_on_resume() -> None:
    """Megatron-Core's OptimizerParamScheduler, as training/build.py makes it: the checkpoint gives
    the step, the config the schedule (a longer max_steps stretches the decay)."""
    torch = pytest.importorskip("torch")
    from training.build import build_scheduler

    _, short = resolve("tiny_gpt_pretrain", ["train.max_steps=40"])
    _, longer = resolve("tiny_gpt_pretrain", ["train.max_steps=400"])
    param = torch.nn.Parameter(torch.zeros(1))

    def optimizer() -> torch.optim.Optimizer:
        opt = torch.optim.SGD([param], lr=0.0)
        opt.param_groups[0].update(max_lr=short.optimizer.lr, min_lr=short.optimizer.min_lr)
        return opt

    first = build_scheduler(short, optimizer())
    first.step(20)
    resumed = build_scheduler(longer, optimizer())
    resumed.load_state_dict(first.state_dict())
    assert resumed.num_steps == 20 and resumed.lr_decay_steps == 400
    assert resumed.get_lr(resumed.optimizer.param_groups[0]) > first.get_lr(
        first.optimizer.param_groups[0]
    )


def test_another_layout_is_refused_with_a_dp_reshardable_optimizer(tmp_path: Path) -> None:
    run_dir = saved_run(tmp_path, 10, [])
    found = problems(run_dir, ["parallel.tensor_model_parallel_size=1"])
    assert "dp_reshardable" in found["parallel.tensor_model_parallel_size"]


@pytest.mark.parametrize("damage", [b"", b'{"step": ', b"[4]"], ids=["empty", "cut", "a list"])
def test_a_newest_train_state_that_cannot_be_read_falls_back_to_the_older_one(
    tmp_path: Path, damage: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the ranks' resume passes over a damaged checkpoint for an older intact one, so does the
    check before launch: the older one's step is what train.max_steps is judged against."""
    run_dir = saved_run(tmp_path, 10, [])
    newest = saved_run(tmp_path, 20, []) / "checkpoints" / dirs.iter_name(20)
    (newest / dirs.STATE_FILE).write_bytes(damage)
    assert problems(run_dir, ["train.max_steps=15"]) == {}
    err = capsys.readouterr().err
    assert f"{newest / dirs.STATE_FILE} is " in err and "iter_0000010" in err
    assert "at step 10" in problems(run_dir, ["train.max_steps=10"])["train.max_steps"]
    (run_dir / "checkpoints" / dirs.iter_name(10) / dirs.STATE_FILE).write_bytes(b"")
    found = problems(run_dir, [])["checkpoint.save_dir"]
    assert f"no checkpoint in {run_dir / 'checkpoints'} can be resumed from" in found
    assert str(newest) in found and "iter_0000010" in found and "move them away" in found


def test_another_recipe_in_the_folder_is_refused(tmp_path: Path) -> None:
    run_dir = saved_run(tmp_path, 10, [])
    _, cfg = resolve("tiny_moe_pretrain", [])
    with pytest.raises(ConfigError) as err:
        check_resume(cfg, run_dir)
    assert "tiny_gpt_pretrain" in dict(err.value.problems)["checkpoint.save_dir"]


def test_a_live_run_holds_its_folder_and_a_dead_one_does_not(tmp_path: Path) -> None:
    import subprocess
    import sys

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    code = (
        "import sys, time; from pathlib import Path; from training.checkpoint.dirs import RunLock\n"
        f"lock = RunLock(Path({str(folder)!r}))\n"
        "assert lock.acquire({'host': 'h', 'pid': 1, 'recipe': 'r'}) is None\n"
        "print('locked', flush=True); time.sleep(60)\n"
    )
    with children.started(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdout.readline().strip() == "locked"
        _, cfg = resolve("tiny_gpt_pretrain", [])
        with pytest.raises(ConfigError) as err:
            check_resume(cfg, tmp_path / "run")
        assert "in use by another run" in dict(err.value.problems)["checkpoint.save_dir"]
        assert '"recipe": "r"' in dict(err.value.problems)["checkpoint.save_dir"]
        holder.kill()  # dies without releasing: the kernel drops its lock
    check_resume(cfg, tmp_path / "run")


def test_the_layout_answer_is_the_same_before_launch_and_on_the_ranks(tmp_path: Path) -> None:
    """config/layout.py decides for both launchers/resume.py and training/checkpoint/state.py
    (what every rank's resume calls): each layout field, changed alone, is refused by both or by
    neither, with the same message; fully_reshardable lets all but Megatron-FSDP change."""
    pytest.importorskip("torch")
    from config.layout import LAYOUT_FIELDS
    from training.checkpoint.state import FORMAT_VERSION, check_compatible

    changes = {
        "parallel.tensor_model_parallel_size": 1,
        "parallel.pipeline_model_parallel_size": 2,
        "parallel.virtual_pipeline_model_parallel_size": 2,
        "parallel.pipeline_model_parallel_layout": "Et|tt|tt|tL",
        "parallel.context_parallel_size": 2,
        "parallel.expert_model_parallel_size": 2,
        "parallel.expert_tensor_parallel_size": 1,
        "optimizer.use_distributed_optimizer": False,
        "parallel.use_megatron_fsdp": True,
    }
    assert set(changes) == set(LAYOUT_FIELDS)
    for sharding in ("dp_reshardable", "fully_reshardable"):
        run_dir = saved_run(
            tmp_path / sharding, 10, [f"checkpoint.dist_optimizer_sharding={sharding}"]
        )
        path = run_dir / "checkpoints" / dirs.iter_name(10)
        state = json.loads((path / dirs.STATE_FILE).read_text())
        state |= {"format_version": FORMAT_VERSION, "dist_optimizer_sharding": sharding}
        (path / dirs.STATE_FILE).write_text(json.dumps(state))
        for field, value in changes.items():
            overrides = [f"checkpoint.dist_optimizer_sharding={sharding}", f"{field}={value}"]
            _, cfg = resolve("tiny_gpt_pretrain", overrides)
            before_launch = {k: v for k, v in problems(run_dir, overrides).items() if k == field}
            try:
                check_compatible(cfg, path, state)
                on_the_ranks = {}
            except ConfigError as err:
                on_the_ranks = dict(err.problems)
            assert on_the_ranks == before_launch, (sharding, field)
            refused = sharding == "dp_reshardable" or field == "parallel.use_megatron_fsdp"
            assert bool(on_the_ranks) == refused, (sharding, field)


def test_an_older_checkpoint_is_compared_on_the_layout_it_recorded(tmp_path: Path) -> None:
    """A train_state.json without the whole config, whose "layout" record has no CP, ETP or
    pipeline layout: those are not compared; what it records is, on both paths."""
    pytest.importorskip("torch")
    from training.checkpoint.state import FORMAT_VERSION, check_compatible

    _, cfg = resolve("tiny_gpt_pretrain", [])
    folder = tmp_path / "run" / "checkpoints" / dirs.iter_name(10)
    folder.mkdir(parents=True)
    par = cfg.parallel
    state = {
        "format_version": FORMAT_VERSION,
        "step": 10,
        "dist_optimizer_sharding": "dp_reshardable",
        "layout": {
            "tensor_model_parallel_size": par.tensor_model_parallel_size,
            "pipeline_model_parallel_size": par.pipeline_model_parallel_size,
            "virtual_pipeline_model_parallel_size": par.virtual_pipeline_model_parallel_size,
            "expert_model_parallel_size": par.expert_model_parallel_size,
            "use_distributed_optimizer": cfg.optimizer.use_distributed_optimizer,
            "use_megatron_fsdp": par.use_megatron_fsdp,
        },
    }
    (folder / dirs.STATE_FILE).write_text(json.dumps(state))
    cp = ["parallel.context_parallel_size=2"]
    assert problems(tmp_path / "run", cp) == {}
    check_compatible(resolve("tiny_gpt_pretrain", cp)[1], folder, state)
    tp = ["parallel.tensor_model_parallel_size=1"]
    before_launch = problems(tmp_path / "run", tp)
    with pytest.raises(ConfigError) as on_the_ranks:
        check_compatible(resolve("tiny_gpt_pretrain", tp)[1], folder, state)
    assert dict(on_the_ranks.value.problems) == before_launch
    assert list(before_launch) == ["parallel.tensor_model_parallel_size"]
