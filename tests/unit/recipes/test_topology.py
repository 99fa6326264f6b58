"""`recipes check` warns when a TP, CP or expert alltoall group leaves its NVLink domain.

The seeds' first failure mode: tensor parallelism across nodes. The run is valid, so the exit code
stays; the warning names the field, the domain, the bandwidth it falls to, and a valid layout that
keeps TP inside a domain.
"""

from __future__ import annotations

import json

import pytest

from config.hardware import Cluster
from recipes.advice.check import check
from recipes.cli import main
from recipes.registry import resolve

TP8 = ["parallel.tensor_model_parallel_size=8", "parallel.context_parallel_size=1"]


def warnings_of(recipe: str, overrides: list[str], cluster: Cluster) -> list[str]:
    _, cfg = resolve(recipe, overrides)
    report = check(cfg, cluster)
    assert report.valid, report.problems
    return [w.field for w in report.warnings]


def test_tp_across_two_nodes_warns_with_a_layout_that_keeps_it_inside(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["check", "llama3_8b_pretrain", *TP8, "--nodes", "2", "--gpus-per-node", "4"]
    assert main([*args, "--json"]) == 0  # valid: a warning does not change the exit code
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] and [w["field"] for w in report["warnings"]] == [
        "parallel.tensor_model_parallel_size"
    ]
    message = report["warnings"][0]["message"]
    assert "TP=8 spans NVLink domains of 4 GPUs" in message
    # its rings leave each node through the 4 members' NICs (collectives.ring), not through one
    assert (
        "200 GB/s per GPU through the 4 NICs of its members in each domain against NVLink's 450, 2x less"
        in message
    )
    fix = message.split("Keep TP within a domain: ", 1)[1].split(" fits (", 1)[0].split()
    _, cfg = resolve("llama3_8b_pretrain", [*TP8, *fix])
    report = check(cfg, Cluster(2, 4, "h100"))  # the suggestion is valid, fits, keeps TP inside
    assert report.exit_code == 0 and not report.warnings, fix


def test_tp_inside_a_node_or_an_nvl72_rack_does_not_warn() -> None:
    assert warnings_of("llama3_8b_pretrain", TP8, Cluster(1, 8, "h100")) == []
    assert warnings_of("llama3_8b_pretrain", TP8, Cluster(2, 4, "gb200")) == []  # NVL72
    # A profile (or --nvlink-domain) that says GB200 nodes are not joined: the same run warns.
    assert warnings_of("llama3_8b_pretrain", TP8, Cluster(2, 4, "gb200", nvlink_domain=4)) == [
        "parallel.tensor_model_parallel_size"
    ]


def test_context_parallel_and_expert_alltoall_across_nodes_warn() -> None:
    # Llama 3.1 405B's published layout: TP 8 x CP 2 over two 8-GPU nodes.
    assert warnings_of("llama31_405b_pretrain", [], Cluster(128, 8, "h100")) == [
        "parallel.context_parallel_size"
    ]
    assert warnings_of("qwen3_30b_a3b_pretrain", [], Cluster(2, 8, "h100")) == [
        "parallel.expert_model_parallel_size"
    ]
    inside = ["parallel.expert_model_parallel_size=8"]
    assert warnings_of("qwen3_30b_a3b_pretrain", inside, Cluster(2, 8, "h100")) == []


def test_a_domain_below_one_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "llama3_8b_pretrain", "--nvlink-domain", "0"]) == 2
    assert "cluster.nvlink_domain" in capsys.readouterr().out
