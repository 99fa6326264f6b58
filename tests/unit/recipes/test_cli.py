"""The `recipes` command through a subprocess, as a user runs it: output, exit codes, --json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from recipes.registry import all_recipes
from tests.support import children


def recipes(*args: str) -> subprocess.CompletedProcess:
    return children.run(
        [sys.executable, "-m", "recipes", *args], capture_output=True, text=True, timeout=60
    )


def test_list_shows_every_recipe() -> None:
    out = recipes("list")
    assert out.returncode == 0, out.stderr
    for name in all_recipes():
        assert name in out.stdout


def test_list_json() -> None:
    rows = json.loads(recipes("list", "--json").stdout)
    assert {r["name"] for r in rows} == set(all_recipes())
    assert all(r["source"] for r in rows)


def test_show_applies_overrides() -> None:
    out = recipes("show", "llama3_8b_pretrain", "train.max_steps=17", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["train"]["max_steps"] == 17


def test_check_published_recipe_is_valid() -> None:
    out = recipes("check", "llama3_70b_pretrain")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "fits" in out.stdout and "GiB" in out.stdout


def test_check_json_fields() -> None:
    out = recipes("check", "llama3_8b_pretrain", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 0
    for key in (
        "valid",
        "errors",
        "world_size",
        "data_parallel_size",
        "memory_gib_per_gpu",
        "gpu_memory_gib",
        "model_tflops_per_token",
    ):
        assert key in report
    assert report["valid"] is True and report["errors"] == []
    assert report["memory_gib_per_gpu"] < report["gpu_memory_gib"]


def test_context_parallel_on_one_gpu() -> None:
    out = recipes(
        "check",
        "llama3_8b_pretrain",
        "parallel.context_parallel_size=2",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
    )
    assert out.returncode == 2
    assert "parallel.context_parallel_size" in out.stdout and "world size 1" in out.stdout


def test_70b_over_three_pipeline_stages() -> None:
    out = recipes(
        "check",
        "llama3_70b_pretrain",
        "parallel.pipeline_model_parallel_size=3",
        "--nodes",
        "12",
        "--json",
    )
    assert out.returncode == 2
    errors = json.loads(out.stdout)["errors"]
    layer_errors = [
        e
        for e in errors
        if e["field"] == "parallel.pipeline_model_parallel_size" and "num_layers=80" in e["message"]
    ]
    assert layer_errors, errors


def test_fp8_on_a100() -> None:
    out = recipes(
        "check",
        "llama3_8b_pretrain",
        "--gpu",
        "a100",
        "precision=bf16_with_fp8_current_scaling_mixed",
    )
    assert out.returncode == 2
    assert "precision" in out.stdout and "A100" in out.stdout and "FP8" in out.stdout


def test_misspelled_field_gets_a_suggestion() -> None:
    out = recipes("check", "llama3_8b_pretrain", "parallel.tensor_parallel_size=2")
    assert out.returncode == 2
    assert (
        "parallel.tensor_parallel_size" in out.stderr and "tensor_model_parallel_size" in out.stderr
    )


def test_misspelled_field_json() -> None:
    out = recipes("check", "llama3_8b_pretrain", "parallel.tensor_parallel_size=2", "--json")
    report = json.loads(out.stdout)
    assert out.returncode == 2 and report["valid"] is False
    assert report["errors"][0]["field"] == "parallel.tensor_parallel_size"


NO_MODEL_PARALLEL = [
    "parallel.tensor_model_parallel_size=1",
    "parallel.pipeline_model_parallel_size=1",
    "parallel.virtual_pipeline_model_parallel_size=None",
    "parallel.sequence_parallel=false",
]


def test_70b_on_8_gpus_does_not_fit() -> None:
    out = recipes(
        "check", "llama3_70b_pretrain", "--nodes", "1", "--gpus-per-node", "8", *NO_MODEL_PARALLEL
    )
    assert out.returncode == 3, out.stdout + out.stderr
    assert "DOES NOT FIT" in out.stdout and "GiB" in out.stdout
    assert "predicted to fit with:" in out.stdout  # what would make it fit


def test_70b_on_8_gpus_json() -> None:
    out = recipes(
        "check",
        "llama3_70b_pretrain",
        "--nodes",
        "1",
        "--gpus-per-node",
        "8",
        *NO_MODEL_PARALLEL,
        "--json",
    )
    report = json.loads(out.stdout)
    assert out.returncode == 3
    assert report["valid"] is True and report["fits"] is False
    assert report["memory_gib_per_gpu"] > report["gpu_memory_gib"]
    assert report["fixes"]


def test_unknown_recipe() -> None:
    out = recipes("check", "llama3_8b_pretrian")
    assert out.returncode == 2 and "llama3_8b_pretrain" in out.stderr


def test_unsupported_gpu_kind_exits_2() -> None:
    out = recipes("check", "llama3_8b_pretrain", "--gpu", "mi250x")
    assert out.returncode == 2
    assert "--gpu: 'mi250x' is not a GPU kind" in out.stderr
    assert "gh200" in out.stderr and "a100-64g" in out.stderr and "ROCm" in out.stderr


def test_every_gpu_entry_refuses_alike(tmp_path, capsys) -> None:
    """`--gpu` on check, plan and run, a profile's `gpu`, and a Cluster the checker judges all give
    config.hardware.gpu_kind_problem's message, each under its own field."""
    from config.hardware import Cluster, gpu_kind_problem
    from config.rules import validate
    from recipes.cli import main
    from recipes.registry import resolve

    expected = gpu_kind_problem("mi250x")
    assert expected is not None
    profile = tmp_path / "lumi.toml"
    profile.write_text('executor = "local"\ngpu = "mi250x"\n')
    for argv, field in (
        (["check", "llama3_8b_pretrain", "--gpu", "mi250x", "--json"], "--gpu"),
        (["plan", "llama3_8b_pretrain", "--gpu", "mi250x", "--json"], "--gpu"),
        (["run", "llama3_8b_pretrain", "--gpu", "mi250x", "--dryrun"], "--gpu"),
        (["check", "llama3_8b_pretrain", "--profile", str(profile), "--json"], "gpu"),
    ):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        if "--json" in argv:
            (error,) = json.loads(captured.out)["errors"]
            assert error["field"] == field and error["message"].endswith(expected), argv
        else:
            assert f"{field}: {expected}" in captured.err, argv
    main(["check", "llama3_8b_pretrain", "--profile", str(profile)])
    assert "gpu = 'mi250x' in lumi.toml" in capsys.readouterr().err
    _, cfg = resolve("llama3_8b_pretrain", [])
    problems = validate(cfg, Cluster(gpu="mi250x"))
    assert ("cluster.gpu", expected) in [(p.field, p.message) for p in problems]


@pytest.mark.parametrize("gpu", ["gh200", "gh200-144g", "a100-64g"])
def test_check_and_plan_on_hpc_kinds(gpu: str, capsys) -> None:
    """The memory estimate and the planner answer for the HPC sites' 4-GPU nodes."""
    from recipes.cli import main

    size = ["--nodes", "2", "--gpus-per-node", "4", "--gpu", gpu, "--json"]
    assert main(["check", "llama3_8b_pretrain", *size]) in (0, 3)
    report = json.loads(capsys.readouterr().out)
    assert report["gpu_memory_gib"] > 0 and report["memory_gib_per_gpu"] > 0
    assert main(["plan", "llama3_8b_pretrain", *size, "--top", "1"]) == 0
    (best,) = json.loads(capsys.readouterr().out)
    assert best["tokens_per_s_per_gpu"] > 0


@pytest.mark.parametrize(
    ("gpu", "precision", "code"),
    [
        ("a100-64g", "bf16_with_fp8_current_scaling_mixed", 2),
        ("gh200", "bf16_with_fp8_current_scaling_mixed", 0),
        ("gh200", "bf16_with_mxfp8_mixed", 2),
    ],
)
def test_precision_on_hpc_kinds(gpu: str, precision: str, code: int, capsys) -> None:
    from recipes.cli import main

    argv = ["check", "llama3_8b_pretrain", "--nodes", "2", "--gpus-per-node", "4", "--gpu", gpu]
    assert main([*argv, f"precision={precision}", "parallel.tensor_model_parallel_size=4"]) == code
    assert ("precision:" in capsys.readouterr().out) == (code == 2)
