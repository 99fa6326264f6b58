"""parallel.cp_comm_type, how context-parallel ranks exchange attention inputs: what the checker
accepts of each exchange, what the engine hands Megatron-Core, how the step time prices it and how
the planner picks one.

Transformer Engine refuses a combination in the first forward step, which this machine (no TE; the
CPU build's SDPA core attention has no CP at all) cannot reach: the checker is held to TE's own
assertions instead, `te_refuses` below, transcribed from
transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py at
NVIDIA/TransformerEngine d0067d0da: `attn_forward_func_with_cp` and `AttnFuncWithCPAndQKVOA2A`.
tests/gpu/test_gpu.py runs each exchange at CP 2 against one GPU."""

from __future__ import annotations

import pytest

from config.cost.steptime import predict
from config.hardware import Cluster
from config.rules import derive, validate
from config.schema import TrainingConfig
from config.tree import apply_overrides
from recipes.advice.plan import plan
from tests.unit.config.test_validation import H100x8, llama_like

KINDS = ("p2p", "a2a", "all_gather")


def te_refuses(window: int | None, softmax_type: str, kind: str, heads: int, groups: int, cp: int):
    """Whether Transformer Engine asserts, for one TP rank's query `heads` and key-value `groups`:

    sliding_window_attn = window_size is not None and window_size != (-1, 0) ...
    assert not sliding_window_attn or cp_comm_type in ["a2a", "all_gather"]
    assert softmax_type == "vanilla" or cp_comm_type == "a2a"
    # AttnFuncWithCPAndQKVOA2A.forward:
    assert q.shape[-2] % cp_size == 0 and k.shape[-2] % cp_size == 0
    """
    if cp == 1:
        return False  # no context-parallel attention at all
    if window is not None and kind not in ("a2a", "all_gather"):
        return True
    if softmax_type != "vanilla" and kind != "a2a":
        return True
    return kind == "a2a" and bool(heads % cp or groups % cp)


def _cfg(kind: str, cp: int, *extra: str) -> TrainingConfig:
    return apply_overrides(
        llama_like(),
        [f"parallel.context_parallel_size={cp}", f"parallel.cp_comm_type={kind}", *extra],
    )


MODELS = {
    "llama": [],
    "window": ["model.window_size=127"],
    "sinks": ["model.softmax_type=learnable"],
    "window and sinks": ["model.window_size=127", "model.softmax_type=learnable"],
    "one group per TP rank": ["model.num_query_groups=2"],
}


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("model", MODELS)
def test_the_checker_refuses_what_transformer_engine_asserts(
    model: str, kind: str, cp: int
) -> None:
    cfg = _cfg(kind, cp, *MODELS[model])
    m, tp = cfg.model, cfg.parallel.tensor_model_parallel_size
    groups = m.num_query_groups or m.num_attention_heads
    refused = te_refuses(
        m.window_size, m.softmax_type, kind, m.num_attention_heads // tp, groups // tp, cp
    )
    problems = [p for p in validate(cfg, H100x8) if p.field == "parallel.cp_comm_type"]
    assert bool(problems) == refused, problems
    if refused:  # the message names an exchange that runs, where one does
        message = problems[0].message
        assert f"is '{kind}'" in message and "use " in message


def test_the_fix_each_refusal_names_passes() -> None:
    """Every refusal names a fix: the exchange it names, set, passes the checker."""
    for model, extra in MODELS.items():
        for kind in KINDS:
            cfg = _cfg(kind, 2, *extra)
            problems = [p for p in validate(cfg, H100x8) if p.field == "parallel.cp_comm_type"]
            if not problems or "parallel.cp_comm_type=" not in problems[0].message:
                continue
            fix = problems[0].message.split("use parallel.cp_comm_type=")[1]
            assert validate(_cfg(fix, 2, *extra), H100x8) == [], (model, kind, fix)


def test_the_engine_hands_megatron_core_the_exchange() -> None:
    """Megatron-Core's TransformerConfig as models/gpt.py builds it (Transformer Engine taken to
    import), whose TransformerLayer passes cp_comm_type on to TE's core attention."""
    pytest.importorskip("megatron.core")
    from tests.unit.config.test_fused_cross_entropy import _transformer_config

    for kind in KINDS:
        config, _ = _transformer_config(_cfg(kind, 2), H100x8)
        assert config.cp_comm_type == kind


def _step(kind: str, *extra: str, cluster: Cluster = H100x8):
    cfg = _cfg(kind, 2, *extra)
    step = predict(cfg, cluster, derive(cfg, cluster))
    assert step is not None
    return step


def test_step_time_prices_each_exchange() -> None:
    """The ring hides behind attention; the alltoalls (Q, K, V and the output: more bytes than the
    ring's K and V with grouped queries) and the all-gather do not."""
    ring, a2a, gather = (_step(kind).terms["cp"] for kind in KINDS)
    assert a2a > gather > ring >= 0.0
    # Without grouped queries the alltoall moves what the ring moves and more.
    mha = ["model.num_query_groups=null"]
    assert _step("a2a", *mha).terms["cp"] > _step("p2p", *mha).terms["cp"]


def test_the_planner_runs_windowed_models_on_an_exchange_that_runs_them() -> None:
    """With CP pinned, a windowed model's plans take the alltoall (the ring cannot run a window),
    and every plan passes the checker; a model without windows keeps the ring."""
    for extra, wanted in ((["model.window_size=127"], "a2a"), ([], "p2p")):
        cfg = _cfg("p2p", 2, *extra)
        plans, _ = plan(cfg, H100x8, top=3, pinned={"parallel.context_parallel_size": 2})
        assert plans
        for p in plans:
            assert p.field("parallel.cp_comm_type") == wanted
            assert validate(apply_overrides(_cfg("p2p", 2, *extra), p.overrides), H100x8) == []


def test_plan_names_a_pinned_exchange_that_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    """With the exchange pinned to one TE cannot run the model with, no layout passes: `recipes
    plan` names the pinned field and its fix, not a lack of memory."""
    from recipes.advice.check import EXIT_INVALID
    from recipes.cli import main

    pins = ["parallel.context_parallel_size=2", "parallel.cp_comm_type=p2p"]
    assert main(["plan", "gemma3_12b_sft", *pins]) == EXIT_INVALID
    out = capsys.readouterr().out
    assert "parallel.cp_comm_type: is 'p2p'" in out and "use parallel.cp_comm_type=a2a" in out
    assert "no layout fits" not in out
