"""Every rule a config must pass before it may take a GPU hour.

Each problem names the dotted field, the values involved and a fix. The rules mirror what
Megatron-Core would assert minutes into a job (or what would silently degrade it), so they run on a
login node in milliseconds. The engine calls the same `validate` on every rank at start-up.
"""

from __future__ import annotations

from training import layout as layouts
from training.config import TrainingConfig, split_weights
from training.finalize import Derived, finalize
from training.hardware import GPUS, Cluster
from training.precision import PRESETS, gpu_runs
from training.problems import Problem, choices, divisors
from training.validation_vlm import multimodal


def validate(
    cfg: TrainingConfig, cluster: Cluster, derived: Derived | None = None
) -> list[Problem]:
    """All problems of `cfg` on `cluster`; an empty list means it can run."""
    derived = derived or finalize(cfg, cluster)
    problems: list[Problem] = []
    rules = (_cluster, _parallel, _pipeline, _batch, _moe, _model, multimodal, _precision, _cpu)
    for rule in (*rules, _rest):
        problems += rule(cfg, cluster, derived)
    return problems


def _cluster(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    out = []
    if cluster.gpu != "cpu" and cluster.gpu not in GPUS:
        out.append(
            Problem(
                "cluster.gpu", f"unknown GPU kind '{cluster.gpu}'; choose one of {', '.join(GPUS)}"
            )
        )
    if cluster.num_nodes < 1 or cluster.gpus_per_node < 1:
        out.append(
            Problem(
                "cluster",
                f"needs at least one node and one GPU per node, got {cluster.num_nodes} x {cluster.gpus_per_node}",
            )
        )
    return out


def _parallel(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    par, model = cfg.parallel, cfg.model
    tp, pp, cp = (
        par.tensor_model_parallel_size,
        par.pipeline_model_parallel_size,
        par.context_parallel_size,
    )
    sizes = {
        "parallel.tensor_model_parallel_size": tp,
        "parallel.pipeline_model_parallel_size": pp,
        "parallel.context_parallel_size": cp,
        "parallel.expert_model_parallel_size": par.expert_model_parallel_size,
        "parallel.expert_tensor_parallel_size": d.expert_tensor_parallel_size,
    }
    out = [Problem(f, f"must be at least 1, got {v}") for f, v in sizes.items() if v < 1]
    if out:
        return out
    world = d.world_size
    if d.data_parallel_size is None:
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
    if groups is not None and not model.multi_latent_attention and groups % tp:
        out.append(
            Problem(
                "parallel.tensor_model_parallel_size",
                f"model.num_query_groups={groups} is not divisible by TP={tp}; every TP rank needs whole "
                f"KV heads: use TP in {{{choices(divisors(groups))}}}",
            )
        )
    if model.ffn_hidden_size % tp:
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
    if par.sequence_parallel and model.seq_length % tp:
        out.append(
            Problem(
                "model.seq_length",
                f"seq_length={model.seq_length} must be divisible by TP={tp} with sequence parallel",
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


def _pipeline(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    par, model = cfg.parallel, cfg.model
    pp, vpp = par.pipeline_model_parallel_size, par.virtual_pipeline_model_parallel_size
    if pp < 1:
        return []
    out = []
    if vpp is not None and vpp < 1:
        return [
            Problem(
                "parallel.virtual_pipeline_model_parallel_size", f"must be None or >= 1, got {vpp}"
            )
        ]
    if vpp is not None and vpp > 1 and pp == 1:
        out.append(
            Problem(
                "parallel.virtual_pipeline_model_parallel_size",
                f"virtual stages ({vpp}) interleave a pipeline and need pipeline_model_parallel_size > 1; "
                "set it to None or raise parallel.pipeline_model_parallel_size",
            )
        )
    if par.pipeline_model_parallel_layout:
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
        return out
    if d.pipeline_chunks is None:
        chunks = pp * (vpp or 1)
        what = f"PP x VPP = {pp} x {vpp} = {chunks} chunks" if vpp else f"{pp} pipeline stages"
        options = [p for p in divisors(model.num_layers) if p <= 64]
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


def _batch(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    train = cfg.train
    out = []
    if train.micro_batch_size < 1:
        return [
            Problem("train.micro_batch_size", f"must be at least 1, got {train.micro_batch_size}")
        ]
    if train.global_batch_size < 1:
        return [
            Problem("train.global_batch_size", f"must be at least 1, got {train.global_batch_size}")
        ]
    dp = d.data_parallel_size
    if dp is None:
        return out
    if train.global_batch_size % (train.micro_batch_size * dp):
        step = train.micro_batch_size * dp
        lower = train.global_batch_size // step * step
        out.append(
            Problem(
                "train.global_batch_size",
                f"{train.global_batch_size} is not divisible by micro_batch_size x data_parallel_size = "
                f"{train.micro_batch_size} x {dp} = {step}; use a multiple of {step} "
                f"(e.g. {max(lower, step)} or {lower + step})",
            )
        )
    pp, vpp = (
        cfg.parallel.pipeline_model_parallel_size,
        cfg.parallel.virtual_pipeline_model_parallel_size,
    )
    if d.num_microbatches is not None and vpp and vpp > 1 and d.num_microbatches % pp:
        out.append(
            Problem(
                "train.global_batch_size",
                f"the interleaved schedule needs the number of microbatches ({d.num_microbatches} = "
                f"{train.global_batch_size} / ({train.micro_batch_size} x DP {dp})) to be a multiple of PP={pp}",
            )
        )
    return out


def _moe(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    par, model = cfg.parallel, cfg.model
    ep = par.expert_model_parallel_size
    experts = model.num_moe_experts
    out = []
    if experts is None:
        if ep > 1:
            out.append(
                Problem(
                    "parallel.expert_model_parallel_size",
                    f"is {ep} but the model has no experts (model.num_moe_experts is None); set it to 1",
                )
            )
        return out
    if ep < 1:
        return out
    if experts % ep:
        out.append(
            Problem(
                "parallel.expert_model_parallel_size",
                f"model.num_moe_experts={experts} is not divisible by EP={ep}; use EP in {{{choices(divisors(experts))}}}",
            )
        )
    if not 1 <= model.moe_router_topk <= experts:
        out.append(
            Problem("model.moe_router_topk", f"must be between 1 and num_moe_experts={experts}")
        )
    pp = par.pipeline_model_parallel_size
    ranks_per_stage = d.world_size // pp if pp > 0 and d.world_size % pp == 0 else None
    etp = d.expert_tensor_parallel_size
    if ranks_per_stage is not None and ranks_per_stage % (ep * etp):
        out.append(
            Problem(
                "parallel.expert_model_parallel_size",
                f"EP x ETP = {ep} x {etp} = {ep * etp} must divide the {ranks_per_stage} ranks of each "
                f"pipeline stage (world {d.world_size} / PP {pp})",
            )
        )
    dispatchers = ("alltoall", "allgather", "flex")
    if model.moe_token_dispatcher_type not in dispatchers:
        out.append(
            Problem("model.moe_token_dispatcher_type", f"must be one of {', '.join(dispatchers)}")
        )
    return out


def _model(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    model = cfg.model
    out = []
    if model.num_layers < 1:
        out.append(Problem("model.num_layers", f"must be at least 1, got {model.num_layers}"))
    if (
        model.kv_channels is None
        and not model.multi_latent_attention
        and model.hidden_size % model.num_attention_heads
    ):
        out.append(
            Problem(
                "model.num_attention_heads",
                f"hidden_size={model.hidden_size} is not divisible by num_attention_heads={model.num_attention_heads}; "
                "set model.kv_channels to the head dimension",
            )
        )
    groups = model.num_query_groups
    if groups is not None and (groups < 1 or model.num_attention_heads % groups):
        out.append(
            Problem(
                "model.num_query_groups",
                f"{groups} must divide num_attention_heads={model.num_attention_heads}",
            )
        )
    choices = {
        "model.normalization": (model.normalization, ("RMSNorm", "LayerNorm")),
        "model.activation": (model.activation, ("swiglu", "gelu")),
        "model.position_embedding_type": (
            model.position_embedding_type,
            ("rope", "learned_absolute", "none"),
        ),
        "model.recompute_granularity": (model.recompute_granularity, (None, "selective", "full")),
        "model.arch": (model.arch, ("gpt", "llava")),
    }
    for field, (value, allowed) in choices.items():
        if value not in allowed:
            out.append(
                Problem(field, f"'{value}' is not one of {', '.join(str(a) for a in allowed)}")
            )
    if model.recompute_granularity == "full" and model.recompute_method not in ("uniform", "block"):
        out.append(Problem("model.recompute_method", "full recompute needs 'uniform' or 'block'"))
    if model.arch == "llava" and model.vision is None:
        out.append(Problem("model.vision", "arch 'llava' needs a vision section"))
    return out


def _precision(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    preset = d.preset
    if preset is None:
        names = ", ".join(PRESETS)
        return [Problem("precision", f"unknown preset '{cfg.precision}'; choose one of {names}")]
    if cluster.gpu in GPUS and not gpu_runs(GPUS[cluster.gpu], preset):
        able = [g for g, spec in GPUS.items() if gpu_runs(spec, preset)]
        runs_here = [n for n, p in PRESETS.items() if gpu_runs(GPUS[cluster.gpu], p)]
        return [
            Problem(
                "precision",
                f"{cfg.precision} needs {preset.needs.upper()} tensor cores, which {cluster.gpu.upper()} does not have "
                f"(it runs {', '.join(sorted(set(p.split('_with')[0] + '_mixed' if '_with' in p else p for p in runs_here)))}). "
                f"Use precision=bf16_mixed here, or a GPU in {', '.join(able)}",
            )
        ]
    return []


def _cpu(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    """What the CPU smoke mode cannot run (Megatron-Core needs CUDA for these)."""
    if cluster.gpu != "cpu" and cfg.train.device != "cpu":
        return []
    par, out = cfg.parallel, []
    why = "needs a GPU; the CPU smoke mode runs TP, PP (with virtual stages), DP and EP over gloo"
    if par.context_parallel_size > 1:
        out.append(Problem("parallel.context_parallel_size", f"context parallel {why}"))
    if par.sequence_parallel:
        out.append(Problem("parallel.sequence_parallel", f"sequence parallel {why}"))
    if cfg.model.num_moe_experts and cfg.model.moe_token_dispatcher_type != "allgather":
        out.append(
            Problem(
                "model.moe_token_dispatcher_type",
                f"'{cfg.model.moe_token_dispatcher_type}' {why}; use allgather",
            )
        )
    if d.preset is not None and d.preset.fp8_recipe is not None:
        out.append(Problem("precision", f"{cfg.precision} {why}; use bf16_mixed"))
    return out


def _rest(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    opt, sched, train, data, ckpt, log = (
        cfg.optimizer,
        cfg.scheduler,
        cfg.train,
        cfg.data,
        cfg.checkpoint,
        cfg.logging,
    )
    out = []
    enums = {
        "optimizer.optimizer": (opt.optimizer, ("adam", "sgd")),
        "scheduler.decay_style": (sched.decay_style, ("cosine", "linear", "constant", "wsd")),
        "scheduler.wsd_decay_style": (sched.wsd_decay_style, ("linear", "cosine", "exponential")),
        "data.kind": (data.kind, ("mock", "indexed", "sft", "energon")),
        "train.device": (train.device, ("auto", "cuda", "cpu")),
        "checkpoint.dist_optimizer_sharding": (
            ckpt.dist_optimizer_sharding,
            ("dp_reshardable", "fully_reshardable"),
        ),
        "logging.wandb_mode": (log.wandb_mode, ("online", "offline", "disabled")),
    }
    for field, (value, allowed) in enums.items():
        if value not in allowed:
            out.append(Problem(field, f"'{value}' is not one of {', '.join(allowed)}"))
    if opt.lr <= 0:
        out.append(Problem("optimizer.lr", f"must be positive, got {opt.lr}"))
    if opt.min_lr > opt.lr:
        out.append(Problem("optimizer.min_lr", f"{opt.min_lr} is above optimizer.lr={opt.lr}"))
    if train.max_steps < 1:
        out.append(Problem("train.max_steps", f"must be at least 1, got {train.max_steps}"))
    decay_steps = sched.decay_steps or train.max_steps
    if sched.decay_style != "constant" and sched.warmup_steps >= decay_steps:
        out.append(
            Problem(
                "scheduler.warmup_steps",
                f"{sched.warmup_steps} warmup steps leave no decay within {decay_steps} steps "
                "(scheduler.decay_steps or train.max_steps); lower it",
            )
        )
    if sched.decay_style == "wsd" and not sched.wsd_decay_steps:
        out.append(
            Problem(
                "scheduler.wsd_decay_steps",
                "the 'wsd' schedule needs the length of its decay phase",
            )
        )
    if data.kind in ("indexed", "sft", "energon") and not data.path:
        out.append(Problem("data.path", f"data.kind='{data.kind}' needs a path to the dataset"))
    if data.kind in ("indexed", "sft") and not data.tokenizer:
        out.append(
            Problem(
                "data.tokenizer", f"data.kind='{data.kind}' needs a local tokenizer file or folder"
            )
        )
    out += _evaluation(cfg)
    if data.kind in ("mock", "indexed") and data.sequence_packing:
        out.append(
            Problem(
                "data.sequence_packing",
                f"packs SFT pairs or Energon samples; data.kind='{data.kind}' already fills every "
                "row with documents end to end. Set data.sequence_packing=false",
            )
        )
    if data.kind == "sft" and data.sequence_packing and cfg.parallel.context_parallel_size > 1:
        out.append(
            Problem(
                "data.sequence_packing",
                "packed SFT rows keep their samples apart with an explicit attention mask, which "
                f"has no context-parallel form here (parallel.context_parallel_size="
                f"{cfg.parallel.context_parallel_size}); set data.sequence_packing=false or "
                "parallel.context_parallel_size=1",
            )
        )
    if ckpt.save_interval < 1:
        out.append(
            Problem("checkpoint.save_interval", f"must be at least 1, got {ckpt.save_interval}")
        )
    if ckpt.keep_last < 0:
        out.append(Problem("checkpoint.keep_last", "must be 0 (keep all) or more"))
    return out


def _evaluation(cfg: TrainingConfig) -> list[Problem]:
    """data.split's weights, and train.eval_interval's validation batches."""
    train, data, out = cfg.train, cfg.data, []
    try:
        weights = split_weights(data.split)
    except ValueError:
        out.append(
            Problem(
                "data.split",
                f"'{data.split}' is not up to three non-negative weights for train, validation "
                "and test, e.g. data.split=969,30,1",
            )
        )
        weights = [1.0, 0.0, 0.0]
    if train.eval_interval < 0:
        out.append(
            Problem("train.eval_interval", f"must be 0 (never) or more, got {train.eval_interval}")
        )
    if train.eval_interval <= 0:
        return out
    if train.eval_iters < 1:
        out.append(Problem("train.eval_iters", f"must be at least 1, got {train.eval_iters}"))
    if data.kind == "energon":
        out.append(
            Problem(
                "train.eval_interval",
                "evaluation reads the validation split of mock, indexed or sft data; Energon "
                "data has no validation loader here yet. Set train.eval_interval=0",
            )
        )
    elif data.kind in ("indexed", "sft") and weights[1] == 0:
        out.append(
            Problem(
                "data.split",
                f"'{data.split}' gives the validation split no weight, but train.eval_interval="
                f"{train.eval_interval} evaluates on it; e.g. data.split=969,30,1",
            )
        )
    return out
