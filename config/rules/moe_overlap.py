"""parallel.overlap_moe_expert_parallel_comm: Megatron-Core's combined 1F1B schedule, which runs one
microbatch's MoE token alltoall while another microbatch computes. What Megatron-Core 0.19.2's
TransformerConfig asserts of it (tests/unit/config/test_rules_moe_oracle.py holds these against that code), and
that the schedule runs GPTModel's schedule plan (models/gpt.py `forward`)."""

from __future__ import annotations

from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import ModelConfig, TrainingConfig, selective_modules

FIELD = "parallel.overlap_moe_expert_parallel_comm"


def layout_obstacles(m: ModelConfig, ep: int, pp: int, chunks_per_rank: int) -> list[str]:
    """What of the layout and the recompute keeps the overlap from running (`recipes plan` turns
    it off where this is not empty)."""
    why: list[str] = []
    if not m.num_moe_experts or ep < 2:
        why.append(f"it needs expert parallelism (EP > 1), here EP={ep}")
    if pp > 1 and chunks_per_rank < 2:
        why.append(
            f"with PP={pp} it needs virtual pipeline stages (set "
            "parallel.virtual_pipeline_model_parallel_size to 2 or more)"
        )
    if m.recompute_granularity == "full":
        why.append("it cannot run with full recompute (use selective recompute)")
    elif m.recompute_method is not None or m.recompute_num_layers is not None:
        why.append(
            "Megatron-Core refuses it with model.recompute_method or model.recompute_num_layers "
            f"set (here {m.recompute_method} and {m.recompute_num_layers}, unused without full "
            "recompute): unset both (model.recompute_method=None model.recompute_num_layers=None)"
        )
    if "moe" in selective_modules(m):
        why.append(
            "it cannot recompute the whole MoE layer (drop 'moe' from model.recompute_modules)"
        )
    return why


def moe_overlap(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    par, m = cfg.parallel, cfg.model
    if not par.overlap_moe_expert_parallel_comm:
        return []
    pp, chunks = par.pipeline_model_parallel_size, d.pipeline_chunks
    per_rank = len(chunks) // pp if chunks is not None else 2  # no layout: pipeline rules say so
    why = layout_obstacles(m, par.expert_model_parallel_size, pp, per_rank)
    if m.moe_token_dispatcher_type not in ("alltoall", "flex"):
        why.append(
            f"it needs model.moe_token_dispatcher_type alltoall or flex, not "
            f"{m.moe_token_dispatcher_type!r}"
        )
    if d.preset is not None and d.preset.params_dtype == "fp32":
        why.append(f"it needs BF16 or FP16 weights, not precision={cfg.precision}")
    if m.arch != "gpt":  # the schedule runs GPTModel's schedule plan (models/gpt.py forward)
        why.append(f"it runs GPT models only (GPTModel.build_schedule_plan), not {m.arch!r}")
    if m.moe_shared_expert_overlap:
        why.append(
            "Megatron-Core refuses it with model.moe_shared_expert_overlap (set that false: "
            "this overlap hides the exchange behind a whole microbatch instead)"
        )
    if (m.mtp_num_layers or 0) > 1:
        why.append(
            f"it supports at most one MTP layer, here model.mtp_num_layers={m.mtp_num_layers}"
        )
    return [Problem(FIELD, f"is true but {reason}; or set it false") for reason in why]
