"""parallel.overlap_moe_expert_parallel_comm: Megatron-Core's combined 1F1B schedule, which runs one
microbatch's MoE token alltoall while another microbatch computes. What Megatron-Core 0.19.2's
TransformerConfig asserts of it (tests/test_rules_moe_oracle.py holds these against that code), and
that the schedule runs GPTModel's schedule plan (models/gpt.py `forward`)."""

from __future__ import annotations

from config.finalize import Derived
from config.hardware import Cluster
from config.problems import Problem
from config.schema import TrainingConfig, selective_modules

FIELD = "parallel.overlap_moe_expert_parallel_comm"


def moe_overlap(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    par, m = cfg.parallel, cfg.model
    if not par.overlap_moe_expert_parallel_comm:
        return []
    ep, pp = par.expert_model_parallel_size, par.pipeline_model_parallel_size
    why: list[str] = []
    if not m.num_moe_experts or ep < 2:
        why.append(f"it needs expert parallelism (EP > 1), here EP={ep}")
    if m.moe_token_dispatcher_type not in ("alltoall", "flex"):
        why.append(
            f"it needs model.moe_token_dispatcher_type alltoall or flex, not "
            f"{m.moe_token_dispatcher_type!r}"
        )
    chunks = d.pipeline_chunks
    if pp > 1 and chunks is not None and len(chunks) // pp < 2:
        why.append(
            f"with PP={pp} it needs virtual pipeline stages (set "
            "parallel.virtual_pipeline_model_parallel_size to 2 or more)"
        )
    if m.recompute_granularity == "full":
        why.append("it cannot run with full recompute (use selective recompute)")
    if "moe" in selective_modules(m):
        why.append(
            "it cannot recompute the whole MoE layer (drop 'moe' from model.recompute_modules)"
        )
    if d.preset is not None and d.preset.params_dtype == "fp32":
        why.append(f"it needs BF16 or FP16 weights, not precision={cfg.precision}")
    if m.arch != "gpt":  # the schedule runs GPTModel's schedule plan (models/gpt.py forward)
        why.append(f"it runs GPT models only (GPTModel.build_schedule_plan), not {m.arch!r}")
    if (m.mtp_num_layers or 0) > 1:
        why.append(
            f"it supports at most one MTP layer, here model.mtp_num_layers={m.mtp_num_layers}"
        )
    return [Problem(FIELD, f"is true but {reason}; or set it false") for reason in why]
