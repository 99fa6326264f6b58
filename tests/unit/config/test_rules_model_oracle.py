"""The checker against Megatron-Core itself, for the dense model and parallel rules.

Seeded near-valid configs around each rule (recompute fields, TP / CP / SP / sequence length, KV
groups, pipeline layouts with MTP and whitespace, VPP, FP8 with BF16 ends) go through
`config.rules.validate` and through Megatron-Core 0.19.2: `TransformerConfig` as models/gpt.py
builds it (its __post_init__ validates the layout with PipelineParallelLayerLayout), plus the
first-step rules that need a process group, emulated from Megatron-Core's source:

- sequence parallel after context parallel: each rank's seq_length / CP tokens are split over TP
  (pipeline_parallel/schedules.py divides the tensor shape by CP, then TP; the scatter along the
  sequence asserts divisibility), and CP needs seq_length % (2 x CP) (its load-balanced split);
- the global batch is a whole number of micro batches x DP (num_microbatches_calculator.py);
- the interleaved schedule (more than one model chunk per rank) needs the number of microbatches to
  be a multiple of PP (schedules.py: microbatch_group_size_per_vp_stage defaults to PP, and the
  remainder must be 0 or >= PP).

The verdicts must agree, except where the checker is stricter on purpose (STRICTER below).
"""

from __future__ import annotations

import random
import warnings
from unittest import mock

import pytest

from config import layout as layouts
from config.finalize import finalize
from config.hardware import Cluster
from config.rules import validate
from config.schema import TrainingConfig
from config.tree import apply_overrides
from tests.unit.config.test_validation import H100x8, llama_like

torch = pytest.importorskip("torch")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

    import models.gpt as gpt

SEED = 9

# Rules where the checker refuses what TransformerConfig accepts, and why.
STRICTER = {
    "pp1_chunks": "an explicit layout with several chunks and PP=1: TransformerConfig sets VPP from "
    "the layout, but models/gpt.py builds one chunk when PP=1, so the later chunks' layers would "
    "never be built",
    "vpp_conflict": "parallel.virtual_pipeline_model_parallel_size that contradicts the layout's "
    "chunk count: models/gpt.py hands Megatron-Core the layout's VPP, so the user's value would be "
    "ignored without a word",
    "modules_ignored": "model.recompute_modules without recompute_granularity=selective: "
    "TransformerConfig accepts it and recomputes none of them",
    "rope_scaling": "RoPE scaling Megatron-Core would not apply (llama3 inside multi-latent "
    "attention or without RoPE, an unrounded YaRN range inside it): it accepts the config and "
    "ignores the field (test_rope_scaling_that_megatron_would_ignore_is_refused)",
}


def _cluster(cfg: TrainingConfig) -> Cluster:
    par = cfg.parallel
    mp = (
        par.tensor_model_parallel_size
        * par.pipeline_model_parallel_size
        * par.context_parallel_size
    )
    return Cluster(num_nodes=max(1, mp // 8), gpus_per_node=8, gpu="h100")


def megatron_refuses(cfg: TrainingConfig, cluster: Cluster) -> str | None:
    """Why Megatron-Core refuses `cfg` (its constructor's message, or an emulated first-step
    rule), or None when it runs."""
    d = finalize(cfg, cluster)
    par, m = cfg.parallel, cfg.model
    tp, pp, cp = (
        par.tensor_model_parallel_size,
        par.pipeline_model_parallel_size,
        par.context_parallel_size,
    )
    try:
        with mock.patch.object(gpt, "have_transformer_engine", lambda: True):
            config = gpt.transformer_config(cfg, d, "cpu", torch.float32)
    except (ValueError, AssertionError, RuntimeError, TypeError) as err:
        return f"TransformerConfig: {err}"
    if cp > 1 and m.seq_length % (2 * cp):
        return "CP: seq_length % (2 x CP)"
    if par.sequence_parallel and (m.seq_length // cp) % tp:
        return "SP: (seq_length / CP) % TP"
    dp, mbs = d.data_parallel_size, cfg.train.micro_batch_size
    if dp and cfg.train.global_batch_size % (mbs * dp):  # num_microbatches_calculator.py asserts
        return "batch: global_batch_size % (micro_batch_size x DP)"
    vpp = config.virtual_pipeline_model_parallel_size
    if pp > 1 and vpp and vpp > 1 and d.num_microbatches and d.num_microbatches % pp:
        return "interleaved schedule: microbatches % PP"
    return None


def _cfg(overrides: list[str]) -> TrainingConfig:
    cfg = llama_like()
    apply_overrides(cfg, overrides)
    return cfg


def _recompute_cases() -> list[tuple[list[str], str | None]]:
    out = []
    for granularity in (None, "full", "selective"):
        for method in (None, "uniform", "block"):
            for layers in (None, 1, 4):
                out.append(
                    (
                        [
                            f"model.recompute_granularity={granularity}",
                            f"model.recompute_method={method}",
                            f"model.recompute_num_layers={layers}",
                        ],
                        None,
                    )
                )
    return out


def _offload_cases() -> list[tuple[list[str], str | None]]:
    """CPU activation offloading: layer counts around the model's 32, with and without PP and
    recompute."""
    recomputes = (
        [],
        ["model.recompute_granularity=full", "model.recompute_method=uniform",
         "model.recompute_num_layers=1"],
        ["model.recompute_granularity=selective"],
    )  # fmt: skip
    out = []
    for n in (0, 1, 16, 31, 32, 40):
        for pp in (1, 2):
            for recompute in recomputes:
                overrides = [
                    f"model.cpu_offloading_num_layers={n}",
                    f"parallel.pipeline_model_parallel_size={pp}",
                    *recompute,
                ]
                out.append((overrides, None))
    return out


def _recompute_module_cases() -> list[tuple[list[str], str | None]]:
    """model.recompute_modules against each granularity, with and without MLA and grouped GEMMs."""
    out = []
    for granularity in (None, "full", "selective"):
        for modules in (
            None,
            "core_attn",
            "mla_up_proj",
            "layernorm,mlp",
            "mlpp",
            "moe_act",
            "moe,shared_experts",
            "mla_up_proj,core_attn",
        ):
            for mla, grouped in ((False, False), (True, False), (False, True)):
                rest = ["model.recompute_method=uniform", "model.recompute_num_layers=1"]
                overrides = [
                    f"model.recompute_granularity={granularity}",
                    *(rest if granularity == "full" else []),
                    f"model.recompute_modules={modules}",
                    f"model.multi_latent_attention={mla}",
                    f"model.moe_grouped_gemm={grouped}",
                ]
                ignored = modules is not None and granularity != "selective"
                out.append((overrides, "modules_ignored" if ignored else None))
    return out


def _parallel_cases(rng: random.Random) -> list[tuple[list[str], str | None]]:
    out = []
    for _ in range(40):
        tp, cp = rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4))
        seq = rng.choice((8192, 4096, 4100, 6144, 8200, 2056, 1544, 12288))
        sp = tp > 1 and rng.random() < 0.8
        out.append(
            (
                [
                    f"parallel.tensor_model_parallel_size={tp}",
                    f"parallel.context_parallel_size={cp}",
                    f"parallel.sequence_parallel={sp}",
                    f"model.seq_length={seq}",
                ],
                None,
            )
        )
    for groups in (1, 2, 4, 8, 16, 32):
        for tp in (1, 2, 4, 8):
            out.append(
                (
                    [
                        f"model.num_query_groups={groups}",
                        f"parallel.tensor_model_parallel_size={tp}",
                        f"parallel.sequence_parallel={tp > 1}",
                    ],
                    None,
                )
            )
    for groups in (3, 6, 12, 24):  # 24 heads: groups that are neither divisors nor multiples
        for tp in (2, 4, 8):
            out.append(
                (
                    [
                        "model.num_attention_heads=24",
                        "model.kv_channels=128",
                        f"model.num_query_groups={groups}",
                        f"parallel.tensor_model_parallel_size={tp}",
                    ],
                    None,
                )
            )
    return out


def _random_layout(rng: random.Random, num_layers: int, mtp: int, chunks: int) -> list[list[str]]:
    """The sequence E t..t m..m L cut into `chunks` pieces, sometimes with an MTP layer moved."""
    sequence = ["E"] + ["t"] * num_layers + ["m"] * mtp + ["L"]
    if mtp and rng.random() < 0.25:  # an 'm' among the decoder layers
        sequence.remove("m")
        sequence.insert(rng.randrange(2, num_layers + 1), "m")
    cuts = sorted(rng.choices(range(1, len(sequence)), k=chunks - 1))  # empty chunks too
    return [sequence[a:b] for a, b in zip([0, *cuts], [*cuts, len(sequence)], strict=True)]


def _layout_cases(rng: random.Random) -> list[tuple[list[str], str | None]]:
    out = []
    for _ in range(60):
        pp = rng.choice((1, 2, 4))
        per_rank = rng.choice((1, 1, 2, 3))
        num_layers = rng.choice((8, 12, 16))
        mtp = rng.choice((0, 0, 1, 2, 3))
        chunks = _random_layout(rng, num_layers, mtp, pp * per_rank)
        text = "|".join("".join(chunk) for chunk in chunks)
        if rng.random() < 0.15:
            at = rng.randrange(len(text) + 1)
            text = text[:at] + " " + text[at:]
        vpp = rng.choice((None, None, per_rank, per_rank + 1)) if pp > 1 else None
        gbs = rng.choice((128, 126, 130, 120))
        overrides = [
            f"model.num_layers={num_layers}",
            f"model.mtp_num_layers={mtp or None}",
            f"parallel.pipeline_model_parallel_size={pp}",
            f"parallel.virtual_pipeline_model_parallel_size={vpp}",
            f"parallel.pipeline_model_parallel_layout={text}",
            f"train.global_batch_size={gbs}",
        ]
        stricter = None
        if pp == 1 and per_rank > 1:
            stricter = "pp1_chunks"
        elif vpp is not None and vpp != per_rank:
            stricter = "vpp_conflict"
        out.append((overrides, stricter))
    # FP8 with BF16 ends, with and without a layer for every pipeline stage.
    for layers, layout in ((2, "E|t|t|L"), (4, "E|tt|tt|L"), (4, "Et|t|t|tL"), (3, "Et|tt||L")):
        out.append(
            (
                [
                    f"model.num_layers={layers}",
                    "parallel.pipeline_model_parallel_size=4",
                    f"parallel.pipeline_model_parallel_layout={layout}",
                    "precision=bf16_with_fp8_current_scaling_mixed",
                ],
                None,
            )
        )
    return out


def _cases() -> list[tuple[list[str], str | None]]:
    rng = random.Random(SEED)
    return (
        _recompute_cases()
        + _recompute_module_cases()
        + _offload_cases()
        + _parallel_cases(rng)
        + _layout_cases(rng)
    )


def test_checker_agrees_with_megatron_core() -> None:
    agree, disagree, stricter_seen = 0, [], 0
    for overrides, stricter in _cases():
        cfg = _cfg(overrides)
        cluster = _cluster(cfg)
        problems = validate(cfg, cluster)
        refused = megatron_refuses(cfg, cluster)
        if stricter is not None:
            assert problems, (overrides, STRICTER[stricter])
            stricter_seen += 1
            continue
        if bool(problems) == (refused is not None):
            agree += 1
        else:
            disagree.append((overrides, [p.message for p in problems], refused))
    assert not disagree, "\n".join(map(str, disagree))
    assert agree >= 150 and stricter_seen
    print(f"agreement: {agree} configs; {stricter_seen} refused on purpose (STRICTER)")


def test_both_verdicts_occur() -> None:
    """The seeded set exercises both sides of every rule: refused and accepted configs alike."""
    verdicts = [megatron_refuses(c := _cfg(o), _cluster(c)) for o, s in _cases() if s is None]
    refused = [v for v in verdicts if v]
    assert len(refused) >= 30 and len(verdicts) - len(refused) >= 30
    for kind in (
        "recompute",
        "MTP",
        "layer character",
        "SP:",
        "interleaved",
        "bf16",
        "num_query_groups",
        "CPU offloading",
        "Pipeline parallelism with CPU offloading",
        "CPU offloading does not work when activation recomputation",
    ):
        assert any(kind in v for v in refused), kind


@pytest.mark.parametrize(
    "num_layers,mtp,pp,vpp",
    [
        (n, k, p, v)
        for n in range(5, 20)
        for k in (2, 3)
        for p in (2, 4)
        for v in (None, 2, 3)
        if n % (p * (v or 1)) and (n + k + 2) % (p * (v or 1)) == 0  # an uneven, balanced split
    ],
)
def test_derived_layouts_keep_mtp_in_one_chunk(
    num_layers: int, mtp: int, pp: int, vpp: int | None
) -> None:
    """The balanced layout the checker derives for an uneven split passes Megatron-Core's own
    layout validation, or the checker refuses the split (it would spread the MTP layers)."""
    cfg = _cfg(
        [
            f"model.num_layers={num_layers}",
            f"model.mtp_num_layers={mtp}",
            f"parallel.pipeline_model_parallel_size={pp}",
            f"parallel.virtual_pipeline_model_parallel_size={vpp}",
        ]
    )
    cluster = _cluster(cfg)
    d = finalize(cfg, cluster)
    problems = validate(cfg, cluster)
    if d.pipeline_layout is not None:
        PipelineParallelLayerLayout(d.pipeline_layout, pp).validate_layer_layout(num_layers, mtp)
    chunks = pp * (vpp or 1)
    units = num_layers + mtp + 2
    if num_layers % chunks and units % chunks == 0:  # a balanced split exists, MTP aside
        per = units // chunks
        seq = ["E"] + ["t"] * num_layers + ["m"] * mtp + ["L"]
        naive = layouts.render([seq[i * per : (i + 1) * per] for i in range(chunks)])
        try:
            PipelineParallelLayerLayout(naive, pp).validate_layer_layout(num_layers, mtp)
            megatron_ok = True
        except AssertionError:
            megatron_ok = False
        assert (d.pipeline_layout is not None) == megatron_ok, naive
        assert bool(problems) == (not megatron_ok), [p.message for p in problems]


MLA = [
    "model.multi_latent_attention=true",
    "model.q_lora_rank=1536",
    "model.kv_lora_rank=512",
    "model.qk_head_dim=128",
    "model.qk_pos_emb_head_dim=64",
    "model.v_head_dim=128",
]


@pytest.mark.parametrize(
    "overrides, field, says",
    [
        (
            [*MLA, "model.rope_scaling=llama3"],
            "model.rope_scaling",
            "use model.rope_scaling=yarn",
        ),
        (
            ["model.rope_scaling=llama3", "model.position_embedding_type=learned_absolute"],
            "model.rope_scaling",
            "unset",
        ),
        (
            [*MLA, "model.rope_scaling=yarn", "model.rope_correction_range_round_to_int=false"],
            "model.rope_correction_range_round_to_int",
            "always rounds",
        ),
    ],
)
def test_rope_scaling_that_megatron_would_ignore_is_refused(
    overrides: list[str], field: str, says: str
) -> None:
    cfg = apply_overrides(llama_like(), overrides)
    problems = validate(cfg, H100x8)
    assert [p.field for p in problems] == [field] and says in problems[0].message
    assert megatron_refuses(cfg, H100x8) is None  # Megatron-Core accepts it and ignores the field


@pytest.mark.parametrize("mla", [False, True], ids=["gpt_model_yarn", "mla_yarn"])
def test_yarn_is_applied_with_and_without_multi_latent_attention(mla: bool) -> None:
    """YaRN builds in both places Megatron-Core applies it: MLATransformerConfig's, and GPTModel's
    YaRN embedding (position_embedding_type yarn), whose fields models/gpt.py declares."""
    cfg = apply_overrides(llama_like(), [*(MLA if mla else []), "model.rope_scaling=yarn"])
    assert validate(cfg, H100x8) == []
    config = gpt.transformer_config(cfg, finalize(cfg, H100x8), "cpu", torch.float32)
    factor = config.rotary_scaling_factor if mla else config.yarn_rotary_scaling_factor
    assert factor == cfg.model.rope_scaling_factor
