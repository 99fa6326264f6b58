"""Mixture of experts: experts over EP, the router's top-k, EP x ETP within a pipeline stage, and
what Megatron-Core 0.19.2 asserts of an MoE model in its TransformerConfig, its MoE layer, experts,
router and token dispatcher (the first training step at the latest). tests/unit/config/test_rules_moe_oracle.py
holds these rules against Megatron-Core's own code."""

from __future__ import annotations

from config.backend import local_reason, run_device
from config.finalize import Partial
from config.hardware import GPUS, Cluster
from config.problems import Problem, choices, divisors
from config.schema import TrainingConfig, selective_modules


def moe(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    par, model = cfg.parallel, cfg.model
    ep, etp = par.expert_model_parallel_size, d.expert_tensor_parallel_size
    experts = model.num_moe_experts
    if etp is None or ep < 1:
        return []  # config/rules/ranges.py names them
    # Megatron-Core lays out the expert groups at start-up whether or not the model has experts.
    out = _expert_grid(cfg, d, ep, etp) + _fused_grouped_mlp(cfg, cluster, etp)
    if experts is None:
        if ep > 1:
            out.append(
                Problem(
                    "parallel.expert_model_parallel_size",
                    f"is {ep} but the model has no experts (model.num_moe_experts is None); set it to 1",
                )
            )
        return out
    if experts % ep:
        out.append(
            Problem(
                "parallel.expert_model_parallel_size",
                f"model.num_moe_experts={experts} is not divisible by EP={ep}; use EP in {{{choices(divisors(experts))}}}",
            )
        )
    if not 1 <= model.moe_router_topk <= experts:
        # TopKRouter's torch.topk over the experts' scores fails in the first step.
        out.append(
            Problem(
                "model.moe_router_topk",
                f"is {model.moe_router_topk}, but each token picks its top k of "
                f"model.num_moe_experts={experts} experts; use a top k from 1 to {experts}",
            )
        )
    out += _layers(cfg) + _widths(cfg, etp) + _router(cfg) + _dispatcher(cfg, ep, etp)
    out += _capacity(cfg)
    return out + _shared_overlap(cfg)


def _layers(cfg: TrainingConfig) -> list[Problem]:
    """Dense layers first, the rest MoE; and MoE layers want sequence parallel under TP."""
    model, par = cfg.model, cfg.parallel
    tp, out = par.tensor_model_parallel_size, []
    if model.moe_first_k_dense_layers >= model.num_layers:
        # Above num_layers, Megatron-Core's layer specs assert len(moe_layer_freq) == num_layers.
        # At num_layers, stricter than Megatron-Core, which builds a dense model and ignores every
        # MoE field; the MoE rules here would judge layers that do not exist.
        why = (
            "every layer would be dense and no layer would use the experts"
            if model.moe_first_k_dense_layers == model.num_layers
            else "more dense layers than the model has"
        )
        out.append(
            Problem(
                "model.moe_first_k_dense_layers",
                f"is {model.moe_first_k_dense_layers} with model.num_layers={model.num_layers}: "
                f"{why}; use at most {model.num_layers - 1}, or unset model.num_moe_experts "
                "for a dense model",
            )
        )
    if tp > 1 and not par.sequence_parallel:
        # MoELayer.forward raises in training when the TP group has >1 rank and SP is off.
        out.append(
            Problem(
                "parallel.sequence_parallel",
                f"is off with TP={tp} in an MoE model (model.num_moe_experts="
                f"{model.num_moe_experts}); Megatron-Core's MoE layer refuses to train that way: "
                "set parallel.sequence_parallel=true, or parallel.tensor_model_parallel_size=1",
            )
        )
    return out


def _widths(cfg: TrainingConfig, etp: int) -> list[Problem]:
    """Each expert's FFN is split over ETP, the shared experts' over TP (their linear layers)."""
    model, tp, out = cfg.model, cfg.parallel.tensor_model_parallel_size, []
    expert = model.moe_ffn_hidden_size or model.ffn_hidden_size
    if expert % etp:
        field = (
            "model.moe_ffn_hidden_size" if model.moe_ffn_hidden_size else "model.ffn_hidden_size"
        )
        name = "expert tensor-parallel size" + (
            "" if cfg.parallel.expert_tensor_parallel_size else ", which defaults to TP"
        )
        out.append(
            Problem(
                field,
                f"={expert}, each expert's FFN width, is not divisible by ETP={etp} (the {name}); "
                f"use a width divisible by {etp}, or parallel.expert_tensor_parallel_size in "
                f"{{{choices(divisors(expert))}}}",
            )
        )
    shared = model.moe_shared_expert_intermediate_size
    if shared is not None and shared % tp:
        out.append(
            Problem(
                "model.moe_shared_expert_intermediate_size",
                f"={shared} is not divisible by TP={tp}: the shared experts split their FFN over "
                f"the tensor-parallel group; use a multiple of {tp}, or TP in "
                f"{{{choices(divisors(shared))}}}",
            )
        )
    if model.add_bias_linear and etp != 1:
        # TransformerConfig: "Bias in Moe is only supported when ETP==1".
        out.append(
            Problem(
                "model.add_bias_linear",
                f"is true in an MoE model with ETP={etp}; Megatron-Core supports expert biases only "
                "with parallel.expert_tensor_parallel_size=1 (or set model.add_bias_linear=false)",
            )
        )
    if model.add_bias_linear and shared:
        # SharedExpertMLP.__init__ asserts add_bias_linear is False.
        out.append(
            Problem(
                "model.add_bias_linear",
                f"is true with shared experts (model.moe_shared_expert_intermediate_size={shared}), "
                "and Megatron-Core's shared experts have no biases (it refuses to build them); set "
                "model.add_bias_linear=false, or unset model.moe_shared_expert_intermediate_size",
            )
        )
    return out


def _router(cfg: TrainingConfig) -> list[Problem]:
    """What TransformerConfig and the router assert of the routing fields."""
    model, out = cfg.model, []
    experts, topk = model.num_moe_experts or 0, model.moe_router_topk
    score, balance = model.moe_router_score_function, model.moe_router_load_balancing_type
    if (
        topk == 1
        and score == "softmax"
        and not model.moe_router_pre_softmax
        and balance != "sinkhorn"
    ):
        # A softmax over the single chosen logit is 1 everywhere: the router would get no gradient.
        out.append(
            Problem(
                "model.moe_router_pre_softmax",
                "is false with model.moe_router_topk=1 and softmax scores; a softmax over one "
                "logit has zero gradient, so Megatron-Core refuses it: set "
                "model.moe_router_pre_softmax=true (or use topk > 1, or sigmoid scores)",
            )
        )
    if model.moe_router_enable_expert_bias and score != "sigmoid":
        out.append(
            Problem(
                "model.moe_router_enable_expert_bias",
                f"needs sigmoid scores in Megatron-Core, but model.moe_router_score_function="
                f"'{score}'; set it to sigmoid or unset the expert bias",
            )
        )
    if balance == "sinkhorn" and model.moe_aux_loss_coeff != 0:
        # The router asserts moe_aux_loss_coeff == 0 in its first forward step.
        out.append(
            Problem(
                "model.moe_aux_loss_coeff",
                f"is {model.moe_aux_loss_coeff} with sinkhorn load balancing, which has no "
                "auxiliary loss; set model.moe_aux_loss_coeff=0",
            )
        )
    groups, group_topk = model.moe_router_num_groups, model.moe_router_group_topk
    if group_topk:
        if not groups:
            out.append(
                Problem(
                    "model.moe_router_num_groups",
                    f"is unset but model.moe_router_group_topk={group_topk} asks for group-limited "
                    "routing; set the number of expert groups (e.g. the EP size)",
                )
            )
        elif experts % groups:
            out.append(
                Problem(
                    "model.moe_router_num_groups",
                    f"={groups} does not divide model.num_moe_experts={experts}; use one of "
                    f"{{{choices(divisors(experts))}}}",
                )
            )
        elif group_topk > groups:
            out.append(
                Problem(
                    "model.moe_router_group_topk",
                    f"={group_topk} exceeds model.moe_router_num_groups={groups}; use at most {groups}",
                )
            )
        else:
            out += _group_limited(experts, topk, groups, group_topk)
    return out


def _group_limited(experts: int, topk: int, groups: int, group_topk: int) -> list[Problem]:
    """Group-limited routing takes the top k experts from the `group_topk` best groups, scoring
    each group by its top topk // group_topk experts (Megatron-Core's group_limited_topk)."""
    per_group = experts // groups
    if topk <= group_topk * per_group:
        return []
    if topk // group_topk > per_group:
        why = (
            f"each group is scored by its top topk // group_topk = {topk // group_topk} experts, "
            f"more than the {per_group} it has (Megatron-Core fails in the first step)"
        )
    else:
        why = (
            f"the {group_topk} groups chosen hold only {group_topk * per_group} experts, so the "
            "others would come from groups the router masked out (NaN or zero routing weights)"
        )
    least = -(-topk // per_group)  # the fewest groups that hold topk experts
    fix = (
        f"use model.moe_router_group_topk >= {least}"
        if least <= groups
        else "use fewer, larger groups (model.moe_router_num_groups)"
    )
    return [
        Problem(
            "model.moe_router_group_topk",
            f"={group_topk} with model.moe_router_topk={topk} and model.moe_router_num_groups="
            f"{groups} groups of {per_group} experts (model.num_moe_experts={experts}): {why}; "
            f"{fix}, or a lower model.moe_router_topk",
        )
    ]


def _fused_grouped_mlp(cfg: TrainingConfig, cluster: Cluster, etp: int) -> list[Problem]:
    """model.moe_fused_grouped_mlp as Megatron-Core 0.19.2 builds it: TEGroupedMLP asserts
    `_is_fused_impl_supported` (transformer/moe/experts.py) when the model is built, which wants
    Transformer Engine's GroupedLinear (grouped GEMMs, TE layers), no expert tensor parallelism and
    a gated SiLU or quick GELU; Transformer Engine's CuTe DSL kernel wants Blackwell (sm100+)."""
    m, field = cfg.model, "model.moe_fused_grouped_mlp"
    if not m.moe_fused_grouped_mlp:
        return []
    if not m.num_moe_experts:
        none = "this model has no experts (model.num_moe_experts is unset)"
        return [Problem(field, f"is true, but {none}; set it false")]
    why: list[str] = []
    if not m.moe_grouped_gemm:
        why.append("needs the experts' grouped GEMMs: set model.moe_grouped_gemm=true")
    if etp > 1:
        why.append(
            f"runs without expert tensor parallelism (it is {etp}): set "
            "parallel.expert_tensor_parallel_size=1"
        )
    if m.activation not in ("swiglu", "quick_geglu"):
        why.append(
            f"fuses a gated SiLU or quick GELU, and model.activation={m.activation!r}: use "
            "swiglu or quick_geglu"
        )
    local = local_reason(cfg, cluster)
    if local:
        why.append(f"is Transformer Engine's op, and {local}")
    gpu = GPUS.get(cluster.gpu)
    if gpu is not None and run_device(cfg, cluster) == "cuda" and not gpu.mxfp8:
        able = ", ".join(g for g, spec in GPUS.items() if spec.mxfp8)
        why.append(
            f"is a CuTe DSL kernel for Blackwell (sm100+) tensor cores, which "
            f"{cluster.gpu.upper()} does not have: use a GPU in {able}"
        )
    return [Problem(field, f"is true, but the fused op {w}; or set it false") for w in why]


def _dispatcher(cfg: TrainingConfig, ep: int, etp: int) -> list[Problem]:
    """The flex dispatcher's DeepEP backend exchanges tokens over the expert TP x EP group and
    asserts that it has more than one rank (HybridEP does not)."""
    m = cfg.model
    if m.moe_token_dispatcher_type != "flex" or m.moe_flex_dispatcher_backend != "deepep":
        return []
    if ep * etp > 1:
        return []
    return [
        Problem(
            "model.moe_token_dispatcher_type",
            "'flex' with DeepEP (model.moe_flex_dispatcher_backend=deepep) needs expert TP x EP "
            "> 1, here ETP x EP = 1 x 1; use alltoall, raise "
            "parallel.expert_model_parallel_size, or the hybridep backend",
        )
    ]


def _capacity(cfg: TrainingConfig) -> list[Problem]:
    """Token dropping: what TransformerConfig refuses of the capacity factor and its padding."""
    m, out = cfg.model, []
    factor, pad = m.moe_expert_capacity_factor, m.moe_pad_expert_input_to_capacity
    balance = m.moe_router_load_balancing_type
    if factor is not None and balance == "sinkhorn":
        out.append(
            Problem(
                "model.moe_expert_capacity_factor",
                f"is {factor} with sinkhorn load balancing; Megatron-Core drops tokens only with "
                "aux_loss, seq_aux_loss, global_aux_loss or none: use one, or unset the factor",
            )
        )
    if pad and factor is None:
        out.append(
            Problem(
                "model.moe_pad_expert_input_to_capacity",
                "is true but model.moe_expert_capacity_factor is unset (dropless): padding fills "
                "each expert up to its capacity; set a factor (1.0: each expert's even share), "
                "or set this false",
            )
        )
    deepep = m.moe_token_dispatcher_type == "flex" and m.moe_flex_dispatcher_backend == "deepep"
    if pad and deepep:
        out.append(
            Problem(
                "model.moe_pad_expert_input_to_capacity",
                "is true with the flex dispatcher's DeepEP backend, which does not pad: use "
                "model.moe_flex_dispatcher_backend=hybridep or the alltoall dispatcher, or set "
                "this false",
            )
        )
    return out


def _shared_overlap(cfg: TrainingConfig) -> list[Problem]:
    """model.moe_shared_expert_overlap hides the shared experts behind the alltoall or flex
    exchange, and TransformerConfig refuses it with another dispatcher or with the shared experts
    recomputed. (Without shared experts Megatron-Core ignores it.)"""
    m = cfg.model
    if not m.moe_shared_expert_overlap or not m.moe_shared_expert_intermediate_size:
        return []
    field = "model.moe_shared_expert_overlap"
    out = []
    if m.moe_token_dispatcher_type not in ("alltoall", "flex"):
        out.append(
            Problem(
                field,
                f"is true with model.moe_token_dispatcher_type={m.moe_token_dispatcher_type!r}: "
                "the shared experts overlap the alltoall or flex dispatcher's exchange only; use "
                "one of those, or set it false",
            )
        )
    if "shared_experts" in selective_modules(m):
        out.append(
            Problem(
                field,
                "is true while model.recompute_modules recomputes 'shared_experts', which "
                "Megatron-Core refuses; drop 'shared_experts' from it, or set this false",
            )
        )
    return out


def _expert_grid(cfg: TrainingConfig, d: Partial, ep: int, etp: int) -> list[Problem]:
    """EP x ETP must divide the ranks of a pipeline stage. The problem names the size that cannot
    stay as it is: one that does not divide the ranks by itself; else ETP where it was set apart
    from TP (its default), EP otherwise. The message gives the choices for each."""
    par = cfg.parallel
    pp, ranks = par.pipeline_model_parallel_size, None
    if pp > 0 and d.world_size % pp == 0:
        ranks = d.world_size // pp
    if ranks is None or ranks % (ep * etp) == 0:
        return []
    ep_field, etp_field = (
        "parallel.expert_model_parallel_size",
        "parallel.expert_tensor_parallel_size",
    )
    etp_given = par.expert_tensor_parallel_size is not None
    etp_name = f"{etp_field}={etp}" if etp_given else f"{etp_field} (TP's {etp}, unset)"
    if ranks % ep:
        field = ep_field
    elif ranks % etp or etp != par.tensor_model_parallel_size:
        field = etp_field
    else:
        field = ep_field
    fixes = []
    if ranks % etp == 0:
        eps = divisors(ranks // etp)
        if cfg.model.num_moe_experts:
            eps = [e for e in eps if cfg.model.num_moe_experts % e == 0]
        if eps:
            fixes.append(f"EP in {{{choices(eps)}}} with this ETP")
    if ranks % ep == 0:
        fixes.append(f"ETP in {{{choices(divisors(ranks // ep))}}} with this EP")
    fix = " or ".join(fixes) if fixes else f"EP and ETP whose product divides {ranks}"
    return [
        Problem(
            field,
            f"EP x ETP = {ep} x {etp} = {ep * etp} ({ep_field}={ep} x {etp_name}) must divide "
            f"the {ranks} ranks of each pipeline stage (world {d.world_size} / PP {pp}); use "
            f"{fix}",
        )
    ]
