"""Values outside a field's range: what the checker fuzzer found (tests/unit/config/test_checker_fuzz.py
draws the rest). Each crashed `recipes check` (ZeroDivisionError, OverflowError), or passed it and
then crashed, or silently misbehaved, on the ranks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from config.finalize import finalize
from config.hardware import Cluster
from config.rules import validate
from config.tree import ConfigError, apply_overrides, get_path, write_yaml
from tests.unit.config.test_validation import INVALID, MOE_INVALID, H100x8, fields, llama_like

OUT_OF_RANGE = [
    ("model.num_attention_heads", "0", "[1, 65536]"),
    ("model.make_vocab_size_divisible_by", "0", "[1, 65536]"),
    ("parallel.tensor_model_parallel_size", "0", "[1, 1048576]"),
    ("model.num_layers", str(2**63), "[1, 10000]"),
    ("model.num_layers", str(2**31), "[1, 10000]"),
    ("model.seq_length", "0", "[1, 16777216]"),
    ("optimizer.lr", "nan", "> 0"),
    ("optimizer.clip_grad", "nan", ">= 0"),
    ("train.seed", "-1", "[0, 2147483647]"),
    ("data.seed", str(2**32), "[0, 2147483647]"),
    ("model.hidden_dropout", "-0.1", "[0, 1)"),
    ("model.attention_dropout", "1", "[0, 1)"),
    ("optimizer.adam_beta1", "-0.9", "[0, 1)"),
    ("optimizer.adam_beta2", "1", "[0, 1)"),
    ("optimizer.adam_eps", "0", "[1e-30, 1]"),
    ("train.micro_batch_size", "0", "[1, 16777216]"),
    ("train.eval_iters", "0", "[1, 1000000000]"),
    ("train.eval_interval", "-1", "[0, 1000000000]"),
    ("train.max_steps", "0", "[1, 1000000000]"),
    ("optimizer.lr", "0", "> 0"),
    ("checkpoint.save_interval", "0", "[1, 1000000000]"),
    ("checkpoint.keep_last", "-1", "[0, 1000000000]"),
    ("parallel.virtual_pipeline_model_parallel_size", "0", "[1, 10000]"),
]


@pytest.mark.parametrize(("field", "value", "valid"), OUT_OF_RANGE)
def test_value_outside_its_range_is_refused_naming_field_value_and_range(
    field: str, value: str, valid: str
) -> None:
    """Refused by the override itself; set in Python, the checker says the same, and `recipes
    check` exits 2 instead of crashing."""
    from recipes.cli import main

    with pytest.raises(ConfigError) as err:
        apply_overrides(llama_like(), [f"{field}={value}"])
    ((named, message),) = err.value.problems
    assert named == field and valid in message
    assert f"got {value}" in message or f"got {float(value)}" in message
    cfg = llama_like()
    section, _, name = field.rpartition(".")
    node = get_path(cfg, section)
    setattr(node, name, float(value) if isinstance(getattr(node, name), float) else int(value))
    assert [(p.field, p.message) for p in validate(cfg, H100x8)] == [(field, message)]
    assert main(["check", "tiny_gpt_pretrain", f"{field}={value}"]) == 2


@pytest.mark.parametrize("split", ["nan,1,1", "1,inf,0", "1e308,1e308,0", "-1,2,0"])
def test_data_split_weights_are_finite_non_negative_and_sum_above_zero(split: str) -> None:
    cfg = apply_overrides(llama_like(), [f"data.split={split}"])
    assert "data.split" in fields(cfg)


def test_blend_weights_are_finite() -> None:
    cfg = apply_overrides(
        llama_like(),
        ["data.kind=indexed", "data.path=nan /d/a 1 /d/b", "data.tokenizer=/t.json"],
    )
    assert "data.path" in fields(cfg)


def test_a_layout_that_expands_past_any_model_is_refused_without_expanding() -> None:
    cfg = apply_overrides(
        llama_like(),
        [
            "parallel.pipeline_model_parallel_size=2",
            "parallel.pipeline_model_parallel_layout=E(t|)*99999999999999L",
        ],
    )
    assert finalize(cfg, H100x8).pipeline_chunks is None
    assert "parallel.pipeline_model_parallel_layout" in fields(cfg)


def test_a_job_of_absurd_size_is_refused_at_once() -> None:
    problems = validate(llama_like(), Cluster(num_nodes=10**18, gpus_per_node=8))
    assert [p.field for p in problems] == ["cluster"]


def test_config_yaml_is_replaced_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash while config.yaml is written (here: the disk fails at fsync) leaves the old file,
    and no temporary file behind; a write that succeeds replaces it whole."""
    path = tmp_path / "config.yaml"
    write_yaml(llama_like(), path)
    old = path.read_text()
    changed = apply_overrides(llama_like(), ["train.max_steps=7"])

    def disk_fails(fd: int) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", disk_fails)
        with pytest.raises(OSError):
            write_yaml(changed, path)
    assert path.read_text() == old
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
    write_yaml(changed, path)
    assert "max_steps: 7" in path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_invalid_table_is_large_enough() -> None:
    assert len(INVALID) + len(MOE_INVALID) + len(OUT_OF_RANGE) >= 30
