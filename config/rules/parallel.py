"""The parallel layout: TP x PP x CP must divide the world; heads, groups and FFN over TP;
sequence and context parallel against the sequence length; the pipeline split of the layers."""

from __future__ import annotations

import math

from config import layout as layouts
from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem, choices, divisors
from config.schema import TrainingConfig, model_arch


def parallel(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    par, model = cfg.parallel, cfg.model
    tp, pp, cp = (
        par.tensor_model_parallel_size,
        par.pipeline_model_parallel_size,
        par.context_parallel_size,
    )
    out: list[Problem] = []
    if d.model_parallel_size is None or d.expert_tensor_parallel_size is None:
        return out  # a size out of its range: config/rules/ranges.py names it
    world = d.world_size
    if d.data_parallel_size is None and world >= 1:  # an empty world: the cluster rule
        # Name the size that cannot divide the world by itself; else the largest one.
        candidates = [
            ("parallel.context_parallel_size", cp),
            ("parallel.pipeline_model_parallel_size", pp),
            ("parallel.tensor_model_parallel_size", tp),
        ]
        field = next((f for f, v in candidates if v > 1 and world % v), None)
        field = field or max(candidates, key=lambda c: c[1])[0]
        fits = divisors(world)
        out.append(
            Problem(
                field,
                f"world size {world} ({cluster.num_nodes} node(s) x {cluster.gpus_per_node} GPUs) is not divisible "
                f"by TP x PP x CP = {tp} x {pp} x {cp} = {d.model_parallel_size}; the product must divide the "
                f"world size (one of {choices(fits)}), or change --nodes/--gpus-per-node",
            )
        )
    if model.num_attention_heads % tp:
        out.append(
            Problem(
                "parallel.tensor_model_parallel_size",
                f"model.num_attention_heads={model.num_attention_heads} is not divisible by TP={tp}; "
                f"use TP in {{{choices(divisors(model.num_attention_heads))}}}",
            )
        )
    groups = model.num_query_groups
    # Megatron-Core splits the KV heads over TP, or, with fewer groups than TP (TP a multiple of
    # them), replicates each over TP / groups ranks (megatron/core/transformer/attention.py).
    if groups is not None and groups >= 1 and not model.multi_latent_attention:
        if groups % tp and tp % groups:
            fits = sorted(set(divisors(groups)) | {groups * k for k in (2, 4, 8)})
            out.append(
                Problem(
                    "parallel.tensor_model_parallel_size",
                    f"TP={tp} neither divides model.num_query_groups={groups} nor is a multiple "
                    f"of it; every TP rank needs whole KV heads, or one head replicated over "
                    f"TP / groups ranks: use TP in {{{choices(fits)}}}",
                )
            )
    # Only dense layers split ffn_hidden_size over TP: none when every layer is MoE (the MoE
    # rules check the experts' widths; an MTP layer copies the last, MoE, layer).
    dense = not model.num_moe_experts or model.moe_first_k_dense_layers > 0
    if dense and model.ffn_hidden_size % tp:
        out.append(
            Problem(
                "parallel.tensor_model_parallel_size",
                f"model.ffn_hidden_size={model.ffn_hidden_size} is not divisible by TP={tp}",
            )
        )
    if par.sequence_parallel and tp == 1:
        out.append(
            Problem(
                "parallel.sequence_parallel",
                "sequence parallel splits activations over the TP group and needs TP > 1; "
                "set parallel.sequence_parallel=false or raise parallel.tensor_model_parallel_size",
            )
        )
    arch = model_arch(cfg)
    if arch is not None and arch.pads_sequence:
        return out  # the model pads its sequence to the SP / CP split itself
    # Context parallel gives each rank seq_length / CP tokens, which sequence parallel then splits
    # over TP (the pipeline's tensor shape and the scatter along the sequence both divide by TP).
    if par.sequence_parallel and tp > 1 and cp >= 1 and model.seq_length % (tp * cp):
        if cp > 1:
            why = (
                f"with sequence parallel and context parallel, each rank's seq_length / CP = "
                f"{model.seq_length} / {cp} tokens are split over TP={tp}, so seq_length must be "
                f"divisible by TP x CP = {tp * cp}"
            )
        else:
            why = f"must be divisible by TP={tp} with sequence parallel"
        step = tp * cp if cp <= 1 else _lcm(tp * cp, 2 * cp)
        out.append(
            Problem(
                "model.seq_length",
                f"seq_length={model.seq_length}: {why}; use a multiple of {step} "
                f"(e.g. {_round_up(model.seq_length, step)}) or set parallel.sequence_parallel=false",
            )
        )
    if cp > 1 and model.seq_length % (2 * cp):
        out.append(
            Problem(
                "parallel.context_parallel_size",
                f"model.seq_length={model.seq_length} must be divisible by 2 x CP = {2 * cp} (context "
                "parallel splits each sequence into 2 x CP chunks to balance causal attention)",
            )
        )
    return out


def pipeline(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    par, model = cfg.parallel, cfg.model
    pp, vpp = par.pipeline_model_parallel_size, par.virtual_pipeline_model_parallel_size
    out: list[Problem] = []
    if pp < 1 or (vpp is not None and vpp < 1) or model.num_layers < 1:
        return out  # config/rules/ranges.py names them
    if vpp is not None and vpp > 1 and pp == 1:
        out.append(
            Problem(
                "parallel.virtual_pipeline_model_parallel_size",
                f"virtual stages ({vpp}) interleave a pipeline and need pipeline_model_parallel_size > 1; "
                "set it to None or raise parallel.pipeline_model_parallel_size",
            )
        )
    if par.pipeline_model_parallel_layout:
        out += _layout_text(par.pipeline_model_parallel_layout)
        if d.pipeline_chunks is None:
            try:
                layouts.parse(par.pipeline_model_parallel_layout)
            except ValueError as err:
                out.append(Problem("parallel.pipeline_model_parallel_layout", str(err)))
            return out
        for reason in layouts.check(
            d.pipeline_chunks, model.num_layers, model.mtp_num_layers or 0, pp, vpp
        ):
            out.append(
                Problem(
                    "parallel.pipeline_model_parallel_layout",
                    f"'{par.pipeline_model_parallel_layout}' {reason}",
                )
            )
        out += _layout_chunks(cfg, d)
        return out
    if d.pipeline_chunks is None:
        chunks = pp * (vpp or 1)
        what = f"PP x VPP = {pp} x {vpp} = {chunks} chunks" if vpp else f"{pp} pipeline stages"
        options = [p for p in divisors(model.num_layers) if p <= 64]
        mtp = model.mtp_num_layers or 0
        if mtp >= 2:
            what += f" with its {mtp} MTP layers in one chunk"
        field = (
            "parallel.virtual_pipeline_model_parallel_size"
            if vpp and model.num_layers % pp == 0
            else "parallel.pipeline_model_parallel_size"
        )
        out.append(
            Problem(
                field,
                f"model.num_layers={model.num_layers} do not split over {what}, not even with the embedding "
                f"and loss counted as one layer each; use a PP x VPP that divides {model.num_layers} "
                f"({choices(options)}) or give parallel.pipeline_model_parallel_layout explicitly",
            )
        )
    return out


def _lcm(a: int, b: int) -> int:
    return a * b // math.gcd(a, b)


def _round_up(value: int, step: int) -> int:
    return max(step, -(-value // step) * step)


def _layout_text(layout: str) -> list[Problem]:
    """Megatron-Core reads the layout string as it is given (models/gpt.py hands it over): it drops
    commas but no whitespace, and refuses a space as an unknown layer character."""
    if not any(c.isspace() for c in layout):
        return []
    plain = "".join(layout.split())
    return [
        Problem(
            "parallel.pipeline_model_parallel_layout",
            f"'{layout}' contains whitespace, which Megatron-Core refuses as a layer character; "
            f"write it without: parallel.pipeline_model_parallel_layout='{plain}'",
        )
    ]


def _layout_chunks(cfg: TrainingConfig, d: Partial) -> list[Problem]:
    """An explicit layout with several chunks per pipeline rank makes the run interleaved whatever
    parallel.virtual_pipeline_model_parallel_size says (models/gpt.py counts the chunks)."""
    par, train = cfg.parallel, cfg.train
    pp, chunks = par.pipeline_model_parallel_size, d.pipeline_chunks
    if chunks is None or len(chunks) % pp or len(chunks) == pp:
        return []
    per_rank = len(chunks) // pp
    if pp == 1:
        return [
            Problem(
                "parallel.pipeline_model_parallel_layout",
                f"'{par.pipeline_model_parallel_layout}' has {per_rank} chunks on the only pipeline "
                "rank; virtual stages interleave a pipeline and need "
                "parallel.pipeline_model_parallel_size > 1: raise it, or join the chunks (one "
                "chunk, no '|')",
            )
        ]
    # With VPP set, config/rules/batch.py says this; unset, the layout alone makes it interleaved.
    m = d.num_microbatches
    if par.virtual_pipeline_model_parallel_size is not None or m is None or m % pp == 0:
        return []
    dp = d.data_parallel_size
    step = train.micro_batch_size * (dp or 1) * pp
    return [
        Problem(
            "train.global_batch_size",
            f"parallel.pipeline_model_parallel_layout gives {per_rank} chunks per pipeline rank, "
            f"so the interleaved schedule runs, and it needs the number of microbatches ({m} = "
            f"{train.global_batch_size} / ({train.micro_batch_size} x DP {dp})) to be a multiple "
            f"of PP={pp}: use a global batch that is a multiple of {step} "
            f"(e.g. {_round_up(train.global_batch_size, step)})",
        )
    ]
