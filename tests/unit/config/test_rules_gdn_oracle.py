"""The Gated DeltaNet rules (config/rules/linear_attention.py) against Megatron-Core itself.

Configs around each rule (Gated DeltaNet key and value heads against TP x CP, value heads against
key heads, linear_attention_freq, pipeline stages, sequence parallelism, the output gate with and
without multi-latent attention, dense and MoE MLPs) go through `config.rules.validate` and through
Megatron-Core 0.19.2: its TransformerConfig as models/gpt.py builds it, then every pipeline
stage's model built on the meta device (tests/support/megatron_build.py) with the layer spec the
CPU and LoRA runs build (Megatron-Core's GatedDeltaNet on its local layers, models/specs.py).
GatedDeltaNet refuses to build without flash-linear-attention, which only its forward needs: the
build here runs with its availability flag set and its kernel name bound (to Megatron-Core's torch
rule; nothing runs), and its initialisation's fork of the RNG tracker (which the engine seeds
before building) is a no-op. Context parallelism is judged by TransformerConfig
alone (its build needs Transformer Engine's attention). The verdicts must agree, except where the
checker is stricter on purpose (STRICTER).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from unittest import mock

import pytest

from config.hardware import Cluster
from config.rules import validate
from config.schema import TrainingConfig
from config.tree import apply_overrides
from tests.unit.config.test_validation import llama_like

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.ssm.gated_delta_net import common, gdn

    import models.gpt as gpt
    from config.finalize import finalize
    from tests.support.megatron_build import refuses

STRICTER = {
    "tp_without_sp": "TP without sequence parallel: Megatron-Core builds it, and then sums the "
    "gated output norm's gradient over TP only for sequence-parallel parameters",
    "freq_alone": "linear_attention_freq without the variant: models/gpt.py would not pass it, "
    "and no layer would be linear",
}

BASE = [
    "model.num_layers=8",
    "model.hidden_size=64",
    "model.ffn_hidden_size=128",
    "model.num_attention_heads=8",
    "model.num_query_groups=8",
    "model.kv_channels=16",
    "model.seq_length=64",
    "model.vocab_size=256",
    "model.qk_layernorm=true",
    "model.layernorm_zero_centered_gamma=true",
    "model.attention_output_gate=true",
    "model.experimental_attention_variant=gated_delta_net",
    "model.linear_attention_freq=4",
    "model.linear_key_head_dim=8",
    "model.linear_value_head_dim=8",
    "parallel.sequence_parallel=false",
    "parallel.tensor_model_parallel_size=1",
    "train.global_batch_size=64",
]


def _cfg(overrides: list[str]) -> TrainingConfig:
    cfg = llama_like()
    apply_overrides(cfg, BASE + overrides)
    return cfg


def _cluster(cfg: TrainingConfig) -> Cluster:
    return Cluster(num_nodes=2, gpus_per_node=8, gpu="h100")


def megatron_refuses(cfg: TrainingConfig, cluster: Cluster) -> str | None:
    d = finalize(cfg, cluster)
    try:
        with mock.patch.object(gpt, "have_transformer_engine", lambda: True):
            gpt.transformer_config(cfg, d, "cpu", torch.float32)
    except (ValueError, AssertionError, RuntimeError, TypeError, NotImplementedError) as err:
        return f"TransformerConfig: {err}"
    if cfg.parallel.context_parallel_size > 1:
        return None
    kernel = common.torch_chunk_gated_delta_rule
    with (
        mock.patch.object(common, "HAVE_FLA", True),
        mock.patch.object(gdn, "chunk_gated_delta_rule", kernel),
        mock.patch.object(common, "get_cuda_rng_tracker", _UnseededTracker),
    ):
        return refuses(cfg, cluster)


class _UnseededTracker:
    """The RNG tracker GatedDeltaNet forks for its initialisation, unseeded in the oracle."""

    def fork(self, *args: object) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


def _cases() -> list[tuple[list[str], str | None]]:
    out: list[tuple[list[str], str | None]] = []
    for tp, cp, keys, values in itertools.product((1, 2, 4), (1, 2), (2, 3, 4), (4, 6, 8)):
        out.append(
            (
                [
                    f"parallel.tensor_model_parallel_size={tp}",
                    f"parallel.context_parallel_size={cp}",
                    f"model.linear_num_key_heads={keys}",
                    f"model.linear_num_value_heads={values}",
                    f"parallel.sequence_parallel={'true' if tp > 1 else 'false'}",
                ],
                None,
            )
        )
    for freq, pp in itertools.product(("None", "1", "3", "4", "9"), (1, 2)):
        out.append(
            (
                [
                    f"model.linear_attention_freq={freq}",
                    f"parallel.pipeline_model_parallel_size={pp}",
                    "model.linear_num_key_heads=2",
                    "model.linear_num_value_heads=4",
                ],
                None,
            )
        )
    moe = ["model.num_moe_experts=4", "model.moe_router_topk=2"]
    for extra in (
        ["model.moe_shared_expert_intermediate_size=64", "model.moe_shared_expert_gate=true"],
        ["parallel.expert_model_parallel_size=2", "model.moe_token_dispatcher_type=allgather"],
    ):
        out.append((moe + extra + ["model.linear_num_key_heads=2"], None))
    out.append(
        (
            [
                "model.multi_latent_attention=true",
                "model.experimental_attention_variant=None",
                "model.linear_attention_freq=None",
                "model.linear_num_key_heads=2",
            ],
            None,
        )
    )
    out.append(
        (
            ["model.experimental_attention_variant=None", "model.linear_num_key_heads=2"],
            "freq_alone",
        )
    )
    out.append(
        (["parallel.tensor_model_parallel_size=2", "model.linear_num_key_heads=2"], "tp_without_sp")
    )
    return out


def test_checker_agrees_with_megatron_core() -> None:
    agree, disagree = 0, []
    for overrides, stricter in _cases():
        cfg = _cfg(overrides)
        cluster = _cluster(cfg)
        problems = validate(cfg, cluster)
        if stricter is not None:
            assert problems, (overrides, STRICTER[stricter])
            continue
        refused = megatron_refuses(cfg, cluster)
        if bool(problems) == (refused is not None):
            agree += 1
        else:
            disagree.append((overrides, [p.message for p in problems], refused))
    assert not disagree, "\n".join(map(str, disagree))
    assert agree >= 60


def test_both_verdicts_occur() -> None:
    verdicts = [megatron_refuses(c := _cfg(o), _cluster(c)) for o, s in _cases() if s is None]
    refused = [v for v in verdicts if v]
    assert len(refused) >= 15 and len(verdicts) - len(refused) >= 15
    for kind in ("linear_num_key_heads", "linear_num_value_heads", "linear_attention_freq"):
        assert any(kind in v for v in refused), kind
