"""Predicted step time of a training config on a cluster: an analytic model in plain Python.

`recipes plan` ranks thousands of layouts with it and `recipes check` prices a warning with it, on a
login node, so nothing here imports torch. A step on the slowest pipeline rank is

    microbatches x (that rank's time per microbatch)          compute and exposed communication
  + (PP - 1) / VPP x (a mean rank's time per microbatch)      the pipeline bubble
  + pipeline sends and a cost per model chunk (chunk_wait_s on the dropless alltoall) + data-
    parallel traffic not hidden + the optimizer step + the wait for the slowest GPU (below) + what
    the layers' compute does not hide of CPU activation offloading's host copies (offload.py)

and a rank's time per microbatch is the sum over its layers (forward and backward) of:

- gemm: the layer's matmul FLOPs / TP (routed experts: top-k of them) at the GEMM rate of the run's
  precision, `peak x efficiency / (1 + d0/M + d0/N + d0/K)`: small GEMMs (a TP shard, the tokens one
  expert receives) run further from the peak; an expert's own width takes expert_half_dim. The
  output layer and attention stay in BF16. Blackwell has its own efficiencies (BF16, FP8, MXFP8,
  NVFP4, attention, experts, fused experts) and tile width, fitted on published runs
  (bench/data/published_perf.csv), Ultra a clock factor; the output layer, one GEMM larger than
  any of a layer's, reaches gemm_bf16's fraction of the BF16 peak on every GPU.
- attention: the causal score and value FLOPs (config/cost/memory.py) at the flash-attention rate,
  less what windowed layers skip and Gated DeltaNet layers lack (`layers.attention_share`);
  unfused (model.attention_backend), every score at the BF16 GEMM rate and through memory.
- memory: memory-bound work (norms, activations, RoPE, dropout, MoE permutation, FP8 casts) as
  passes over the bytes a layer saves for its backward (config/cost/layers.py), at HBM bandwidth;
  the loss likewise over its logits' BF16 and FP32 copies (`logit_bytes(peak=False)`: 6 bytes in
  Megatron-Core's cross entropy, 2 in TE's).
- tp: 8 collectives of the layer's activations (4 forward, 4 backward) across TP, a share exposed.
- cp: parallel.cp_comm_type's exchange across CP: the ring of keys and values (and gradients),
  less what attention hides; the alltoalls of Q, K, V and the output (a2a: attention then runs on
  whole sequences); the all-gather of K and V (all_gather). Neither of the two hides.
- ep: the MoE token alltoall (dispatch and combine, forward and backward) in BF16; the part that
  leaves the NVLink domain goes at network speed. The alltoall dispatcher sends each of a token's
  top-k copies; the flex one (DeepEP, HybridEP) sends it once to each other domain and each other
  GPU holding one of its experts (DeepEP's is_token_in_rank; fewer with group-limited routing:
  `layers.remote_domains`). Exposed whole, unless parallel.overlap_moe_expert_parallel_comm hides
  the forward's alltoalls behind another microbatch's backward and the backward's behind a forward
  (what overlaps slows that compute by overlap_contention), except in the schedule's warm-up
  forwards and cool-down backwards, which have no partner.
- recompute: full recompute runs the layer's forward again (a third of its compute, half its TP and
  EP traffic); selective, the forward of each of its model.recompute_modules again.
- LoRA (peft.scheme=lora): frozen weights skip their weight-gradient GEMMs, 2/3 of the GEMM time.

A group (TP, TP x CP, EP x ETP, the data-parallel ranks) talks over NVLink when its block of
consecutive ranks stays inside a domain, else over the network (config/hardware.py); a ring (TP's,
CP's all-gather, data parallelism's) that spans domains leaves each through all its members' NICs
there (`ring`), and each collective pays NCCL's latency per ring step (`ring_latency`). Megatron
DDP's last gradient bucket and first parameter bucket stay exposed however long the backward and
forward that hide the others: they grow with the data-parallel size (config/layout.py). Host
overhead is one fixed cost per layer and microbatch. Identical GPUs run a little apart (power
management, manufacturing): every step waits for the slowest of the job's, whose compute (GEMMs,
attention, memory-bound work) takes gpu_speed_sigma x `slowest_of(GPUs)` longer than a mean
GPU's (the `straggler` term). Not modelled: network jitter and failing nodes, load imbalance between
experts (the published MoE runs force-balance them), CUDA graphs, LoRA's adapter GEMMs, the vision
encoder's compute, and communication contending with compute for SMs and memory bandwidth (except
where it overlaps every microbatch, Megatron-FSDP's and the MoE alltoall's: overlap_contention).

The constants live in one table, config/cost/constants.py's CONSTANTS, with their sources;
tests/unit/config/test_plan_calibration.py reports the error on every published run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from math import sumprod

from config.cost import dataparallel, layers, offload
from config.cost.collectives import ring, slowest_of
from config.cost.constants import CONSTANTS, KERNELS_PER_LAYER, VALUES
from config.cost.memory import (
    ParamCount,
    count_parameters,
    logit_bytes,
    model_flops_per_token,
    rank_params,
    shard_params,
)
from config.finalize import Derived
from config.hardware import Cluster, GpuSpec
from config.layout import warmup_forwards
from config.schema import TrainingConfig, is_gated, selective_modules


@dataclass(frozen=True, slots=True)
class StepTime:
    seconds: float
    terms: dict[str, float]  # seconds of the step spent on each term (they add up to `seconds`)
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float  # model FLOPs by the causal formula
    mfu: float  # against the dense peak of the precision the GEMMs run in

    @property
    def bottleneck(self) -> tuple[str, float]:
        """The largest term beyond the GEMMs and attention (the useful work) and the wait for the
        slowest GPU (a share of all work, which no layout avoids), with its share."""
        name = max(
            (t for t in self.terms if t not in ("gemm", "attention", "straggler")),
            key=self.terms.__getitem__,
        )
        return name, self.terms[name] / self.seconds


@dataclass(frozen=True, slots=True)
class LayerCosts:
    """Seconds per microbatch (forward + backward) on one GPU, by layer kind and term."""

    dense: dict[str, float]
    moe: dict[str, float]
    mtp_extra: dict[str, float]  # an MTP layer's projection, on top of its decoder layer
    embedding: dict[str, float]
    output: dict[str, float]  # the output layer and cross entropy (once more per MTP layer)
    params: dict[str, float]  # parameters per GPU of each kind, sharded as Megatron shards them
    flops_per_token: float  # model FLOPs, causal formula (config/cost/memory.py)
    # Selective recompute: per module, what it adds to a (dense, MoE) layer, by term.
    selective: dict[str, tuple[dict[str, float], dict[str, float]]] = dataclasses.field(
        default_factory=dict
    )
    # Seconds one unit of each layers.rank_loads slot adds (all terms): a rank's time is a dot
    # product (rank_seconds). The last two, selective recompute's, depend on the modules.
    per_slot: tuple[float, ...] = ()
    per_slot_compute: tuple[float, ...] = ()  # the same, of the COMPUTE terms only
    # What the alltoall overlap hides of an MoE layer's exchange, per microbatch: exposed again
    # where the schedule has no other microbatch to pair it with (warm-up, cool-down).
    ep_unpaired: float = 0.0


TERMS = ("gemm", "attention", "memory", "tp", "cp", "ep", "overhead")
COMPUTE = ("gemm", "attention", "memory")  # what a GPU's own speed sets (gpu_speed_sigma)


def gemm_peak(cfg: TrainingConfig, cluster: Cluster, derived: Derived) -> tuple[float, str]:
    """Dense TFLOPS of the precision the decoder's GEMMs run in, and that precision's name."""
    spec, recipe = cluster.spec, derived.preset.fp8_recipe
    if recipe == "nvfp4" and spec.fp4_tflops:
        return spec.fp4_tflops, "fp4"
    if recipe == "mxfp8" and spec.mxfp8 and spec.fp8_tflops:
        return spec.fp8_tflops, "mxfp8"
    if recipe and spec.fp8_tflops:
        return spec.fp8_tflops, "fp8"
    return spec.bf16_tflops, "bf16"


def constant(name: str, spec: GpuSpec) -> str:
    """The CONSTANTS entry for `name` on this GPU: Blackwell's own (`name_blackwell`: the GPUs
    with MXFP8 tensor cores) where one was fitted apart on its published runs, else `name`."""
    own = f"{name}_blackwell"
    return own if spec.mxfp8 and own in CONSTANTS else name


def large_gemm_tflops(kind: str, spec: GpuSpec, peak: float, k: dict[str, float] = VALUES) -> float:
    """What large GEMMs of `kind` (gemm_peak's) reach of `peak`: the kind's fitted fraction, and
    Blackwell Ultra's higher clocks, but for NVFP4, whose data-sheet peak is already 1.5x B200's."""
    ultra = k["blackwell_ultra"] if spec.blackwell_ultra and kind != "fp4" else 1.0
    return peak * k[constant("gemm_fp8" if kind == "mxfp8" else f"gemm_{kind}", spec)] * ultra


def gemm_rate(
    rate: float, rows: float, cols: float, depth: float, half: float, own: float
) -> float:
    """The TFLOPS a GEMM of rows x cols x depth reaches at its precision's `rate` (peak x
    efficiency): each dimension narrower than a few tiles wastes them, `half` the one at which a
    dimension alone halves the rate, `own` that of `cols` where it is an expert's width."""
    return rate / (1 + half / rows + own / cols + half / depth)


def layer_costs(
    cfg: TrainingConfig,
    cluster: Cluster,
    derived: Derived,
    k: dict[str, float] = VALUES,
    count: ParamCount | None = None,
) -> LayerCosts:
    m, par, spec = cfg.model, cfg.parallel, cluster.spec
    moe = bool(m.num_moe_experts)
    t, c = par.tensor_model_parallel_size, par.context_parallel_size
    e = par.expert_model_parallel_size if moe else 1
    et = derived.expert_tensor_parallel_size if moe else 1
    s, h = m.seq_length, m.hidden_size
    tokens = s * cfg.train.micro_batch_size / c  # one GPU's tokens per microbatch
    peak, kind = gemm_peak(cfg, cluster, derived)
    lin = layers.saved_input_bytes(None if kind == "bf16" else derived.preset.fp8_recipe)
    half = k[constant("gemm_half_dim", spec)]

    def gemm(flops: float, rows: float, cols: float, depth: float, rate: float, own=half) -> float:
        """Seconds of a GEMM; `own`: the half-rate dimension of `cols` (an expert's width)."""
        return flops / gemm_rate(rate * 1e12, rows, cols, depth, half, own)

    rate = large_gemm_tflops(kind, spec, peak, k)
    bf16 = large_gemm_tflops("bf16", spec, spec.bf16_tflops, k)
    ultra = k["blackwell_ultra"] if spec.blackwell_ultra else 1.0
    # The output layer: Megatron-Core's plain (not Transformer Engine) BF16 GEMM of tokens x hidden
    # x vocabulary / TP, whatever the recipe, runs as large GEMMs do: gemm_bf16's fraction of the
    # peak on every GPU, not Blackwell's whole-layer gemm_bf16_blackwell (constants.py).
    large = spec.bf16_tflops * k["gemm_bf16"] * ultra
    net = cluster.network * 1e9 * k["network"]

    def nvl(group: int) -> float:
        """Bytes/s per GPU of a collective among `group` GPUs inside an NVLink domain."""
        return cluster.nvlink(group) * 1e9 * k["nvlink"]

    def link(block: int, group: int) -> float:
        return net if cluster.crosses(block) else nvl(group)

    hbm = spec.hbm_gb_s * 1e9
    sp = t if par.sequence_parallel and t > 1 else 1
    att_mm = layers.attention(m)[0]
    if m.multi_latent_attention:
        d_qk, d_v = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
        kv_width = m.num_attention_heads * (d_qk + d_v) / t  # MLA with CP exchanges full K and V
    else:
        d_qk = d_v = layers.head_dim(m)
        kv_width = 2 * (m.num_query_groups or m.num_attention_heads) * d_qk / max(1, t)
    share = layers.attention_share(m, kernel=True)
    attention = 3 * tokens * s * m.num_attention_heads / t * (d_qk + d_v) * share
    if m.attention_backend == "unfused":  # batched GEMMs at the layers' BF16 rate, and every
        # score through memory as layers.score_bytes counts (a GEMM over a head's 64-192 channels
        # is bound by writing its scores: those bytes, not its shape, price it)
        scores = tokens * layers.scored_keys(m) * m.num_attention_heads / t
        attention = attention / (bf16 * 1e12) + scores * layers.score_bytes(m)[0] / hbm
    else:
        attention /= (
            spec.bf16_tflops
            * 1e12
            * k[constant("attention", spec)]
            / (1 + k["attention_half_len"] * (c if par.cp_comm_type != "a2a" else 1) / s)
        )
    tp = 16 * tokens * h * (t - 1) / t / ring(cluster, t, 1, k) * k["tp_exposed"] if t > 1 else 0.0
    cp = 0.0
    if c > 1 and par.cp_comm_type == "a2a":  # heads for sequence: an alltoall among the CP
        # ranks of Q, K, V and the output forward, of their gradients backward; nothing hides it
        width = m.num_attention_heads * (d_qk + d_v) / t + kv_width
        cp = 2 * tokens * width * 2 * (c - 1) / c / link(t * c, c)
    elif c > 1 and par.cp_comm_type == "all_gather":  # whole K and V gathered forward and
        # again backward, their gradients reduce-scattered: before the attention, not behind it
        cp = 3 * (c - 1) * tokens * kv_width * 2 / ring(cluster, c, t, k)
    elif c > 1:  # the ring: each step a send to the next peer (one pair link), behind attention
        cp = max(0.0, 3 * (c - 1) * tokens * kv_width * 2 / link(t * c, 2) - attention)

    def memory(is_moe: bool) -> float:
        outside, inside = layers.layer_activations(m, is_moe, lin)
        inside -= layers.saved_scores(m)  # unfused attention's passes are the attention term's
        passes = k["memory_passes"] * tokens * (outside / sp + inside / t)
        if kind != "bf16":  # FP8 casts of every linear layer's input (the bytes at 1 per element)
            o0, i0 = layers.layer_activations(m, is_moe, 0)
            passes += k["fp8_cast_bytes"] * tokens * ((outside - o0) / sp + (inside - i0) / t)
        return passes / hbm

    attn_gemm = gemm(6 * tokens * att_mm / t, tokens, h / t, h, rate)
    ffn = m.ffn_hidden_size
    mlp_gemm = gemm(6 * tokens * layers.mlp(m, ffn)[0] / t, tokens, ffn / t, h, rate)
    dense = {
        "gemm": attn_gemm + mlp_gemm,
        "attention": attention,
        "memory": memory(False),
        "tp": tp,
        "cp": cp,
        "ep": 0.0,
        "overhead": k["layer_overhead_s"],
    }
    count = count or count_parameters(cfg)
    layer = dense
    # Selective recompute, per module: its forward again, (dense layer, MoE layer).
    again: dict[str, tuple[dict[str, float], dict[str, float]]] = {
        "core_attn": ({"attention": attention / 3}, {"attention": attention / 3}),
        # Both norms' forward: read and write the hidden states (BF16).
        "layernorm": ({"memory": 8 * tokens * h / sp / hbm},) * 2,
        # The dense MLP: a third of its GEMMs, 2 of the layer's 8 TP collectives.
        "mlp": ({"gemm": mlp_gemm / 3, "tp": tp / 4}, {}),
    }
    if m.multi_latent_attention:  # the query and key-value up projections, forward
        heads, rope = m.num_attention_heads, m.qk_pos_emb_head_dim
        q_in, kv_in = m.q_lora_rank or h, m.kv_lora_rank
        q_out, kv_out = heads * (m.qk_head_dim + rope), heads * (m.qk_head_dim + m.v_head_dim)
        up = gemm(2 * tokens * q_in * q_out / t, tokens, q_out / t, q_in, rate)
        up += gemm(2 * tokens * kv_in * kv_out / t, tokens, kv_out / t, kv_in, rate)
        again["mla_up_proj"] = ({"gemm": up}, {"gemm": up})
    unpaired = 0.0  # seconds of the MoE exchange the alltoall overlap hides, per layer
    if m.num_moe_experts:
        E, topk, held = m.num_moe_experts, m.moe_router_topk, layers.local_experts(m, par)
        fe, fs = m.moe_ffn_hidden_size or m.ffn_hidden_size, m.moe_shared_expert_intermediate_size
        routed = tokens * topk * layers.expert_share(m)  # token copies the experts compute
        per_expert = routed * et * e / (t * E)  # rows of one local expert's GEMM
        flops = 6 * routed * layers.mlp(m, fe)[0] / t
        narrow = "expert_half_dim_fused" if m.moe_fused_grouped_mlp else "expert_half_dim"
        experts = gemm(flops, per_expert, fe / et, h, rate, k[constant(narrow, spec)])
        shared = gemm(6 * tokens * layers.mlp(m, fs)[0] / t, tokens, fs / t, h, rate) if fs else 0.0
        router = gemm(6 * tokens * h * E / t, tokens, E, h, bf16)
        ep = 0.0
        if e > 1:  # each alltoall moves the rank's tokens x top-k hidden vectors in BF16
            volume = 4 * routed / sp * h * 2
            inside = max(1, min(e * et, cluster.domain) // et)  # EP peers on this domain
            if m.moe_token_dispatcher_type == "flex":  # once per remote domain, then NVLink
                groups = (m.moe_router_num_groups or 1, m.moe_router_group_topk or 1)
                remote = layers.remote_domains(E, topk, *groups, -(-e // inside))
                local = max(0.0, layers.remote_domains(E, topk, *groups, e) - remote)  # GPUs
                ep = max(volume * remote / topk / net, volume * local / topk / nvl(inside))
            else:
                ep = max(volume * (e - inside) / e / net, volume * (inside - 1) / e / nvl(inside))
            if par.overlap_moe_expert_parallel_comm:  # behind another microbatch's compute:
                # the forward's alltoalls behind a backward (2/3 of the work) and the backward's
                # behind a forward (1/3), less the SMs and bandwidth they take from it
                work = attn_gemm + experts + shared + router + attention
                hidden = min(ep / 2, 2 * work / 3) + min(ep / 2, work / 3)
                unpaired = (1 - k["overlap_contention"]) * hidden
                ep -= unpaired
            elif m.moe_shared_expert_overlap and fs:  # the shared experts on a side stream,
                # behind this microbatch's own dispatch and combine, forward and backward
                ep -= (1 - k["overlap_contention"]) * min(ep, shared)
        # Transformer Engine's grouped GEMM launches one cuBLAS GEMM per local expert (its
        # multi-stream path, nvte_multi_tensor_gemm), six a layer: FC1 and FC2 forward, their data
        # and weight gradients; the fused grouped MLP one kernel for all the experts.
        launches = 0 if m.moe_fused_grouped_mlp else 6 * held
        launch = k["layer_overhead_s"] / KERNELS_PER_LAYER
        layer = {
            **dense,
            "gemm": attn_gemm + experts + shared + router,
            "memory": memory(True),
            "ep": ep,
            "overhead": k["layer_overhead_s"]
            + launches * launch
            + (k["alltoall_sync_s"] * held if layers.host_waits(m) else 0.0),
        }
        # The experts' activation: read the FC1 output, write the FC2 input (BF16).
        act = 2 if is_gated(m) else 1
        again["moe_act"] = ({}, {"memory": routed / t * (2 * act * fe + 2 * fe) / hbm})
        again["shared_experts"] = ({}, {"gemm": shared / 3})
        again["moe"] = (
            {},
            {
                "gemm": (experts + shared + router) / 3,
                "ep": ep / 2,
                "overhead": launches * launch / 3,
            },
        )
    vocab = derived.padded_vocab_size
    output = {
        "gemm": gemm(6 * tokens * vocab * h / t, tokens, vocab / t, h, large),
        "memory": k["memory_passes"] * tokens * vocab / t * logit_bytes(cfg, cluster, False) / hbm,
    }
    if cfg.peft.scheme == "lora":  # frozen weights: no weight-gradient GEMMs, 4 of the 6 FLOPs
        for part in {id(p): p for p in (dense, layer, output)}.values():  # layer is dense's
            part["gemm"] *= 2 / 3
    costs = LayerCosts(
        dense=dense,
        moe=layer,
        mtp_extra={"gemm": gemm(6 * tokens * 2 * h * h / t, tokens, h / t, 2 * h, rate)},
        embedding={"memory": k["memory_passes"] * tokens * h * 2 / sp / hbm},
        output=output,
        params=shard_params(count, t, e * et),
        flops_per_token=model_flops_per_token(cfg),
        selective=again,
        ep_unpaired=unpaired,
    )
    return dataclasses.replace(
        costs, per_slot=_per_slot(costs), per_slot_compute=_per_slot(costs, COMPUTE)
    )


# Full recompute runs a layer's forward again: a third of its compute, half its traffic.
AGAIN = {"tp": 0.5, "ep": 0.5, "overhead": 0.5, "cp": 0.0}


def _per_slot(costs: LayerCosts, names: tuple[str, ...] = TERMS) -> tuple[float, ...]:
    """A rank's seconds per unit of each rank_loads slot but the selective ones, in `names`."""

    def total(part: dict[str, float], again: bool = False) -> float:
        if again:
            return sum(AGAIN.get(name, 1 / 3) * v for name, v in part.items() if name in names)
        return sum(v for name, v in part.items() if name in names)

    dense, moe = total(costs.dense), total(costs.moe)
    again_dense, again_moe = total(costs.dense, again=True), total(costs.moe, again=True)
    output = total(costs.output)
    return (
        dense,
        moe,
        dense + again_dense,
        moe + again_moe,
        total(costs.mtp_extra) + output,
        total(costs.embedding),
        output,
    )


def selective_terms(costs: LayerCosts, modules: list[str]) -> tuple[dict, dict]:
    """What selective recompute of `modules` adds to a (dense, MoE) layer, by term. Recomputing
    the whole MoE layer covers its activation and shared experts."""
    if "moe" in modules:
        modules = [n for n in modules if n not in ("moe_act", "shared_experts")]
    out: tuple[dict[str, float], dict[str, float]] = ({}, {})
    for name in modules:
        for kind, terms in zip(out, costs.selective.get(name, ({}, {})), strict=True):
            for term, value in terms.items():
                kind[term] = kind.get(term, 0.0) + value
    return out


def _rank_terms(
    costs: LayerCosts, load: tuple[float, ...], selective: tuple[dict, dict]
) -> dict[str, float]:
    dense, moe, dense_rc, moe_rc, mtp, emb, out, dense_sel, moe_sel = load
    again_dense, again_moe = selective
    terms = dict.fromkeys(TERMS, 0.0)
    for name in TERMS:
        d, x = costs.dense[name], costs.moe[name]
        terms[name] = (dense + dense_rc) * d + (moe + moe_rc) * x
        terms[name] += AGAIN.get(name, 1 / 3) * (dense_rc * d + moe_rc * x)
        terms[name] += mtp * costs.mtp_extra.get(name, 0.0)
        terms[name] += emb * costs.embedding.get(name, 0.0)
        terms[name] += (out + mtp) * costs.output.get(name, 0.0)
        terms[name] += dense_sel * again_dense.get(name, 0.0) + moe_sel * again_moe.get(name, 0.0)
    return terms


def rank_seconds(costs: LayerCosts, loads: tuple, selective: tuple[dict, dict]) -> dict:
    """Each distinct pipeline rank load's seconds per microbatch, its layers alone: a step is
    never under microbatches x the largest (the planner's search orders layouts by it first)."""
    weights = (*costs.per_slot, *(sum(t.values()) for t in selective))
    return {load: sumprod(load, weights) for load in set(loads)}


def predict(
    cfg: TrainingConfig,
    cluster: Cluster,
    derived: Derived,
    k: dict[str, float] = VALUES,
    costs: LayerCosts | None = None,
    loads: tuple[tuple[float, ...], ...] | None = None,
    detail: bool = True,
) -> StepTime | None:
    """The step time of a config; None on the CPU (no peak to price against).

    Without `detail` the layers' terms are one, "layers" (the planner's first pass prices
    thousands of layouts and needs only the total)."""
    m, par, spec = cfg.model, cfg.parallel, cluster.spec
    chunks = derived.pipeline_chunks
    microbatches = derived.num_microbatches
    if not spec.bf16_tflops:
        return None
    costs = costs or layer_costs(cfg, cluster, derived, k)
    pp = par.pipeline_model_parallel_size
    vpp = len(chunks) // pp
    if loads is None:
        recompute = (m.recompute_granularity, m.recompute_method, m.recompute_num_layers)
        loads = layers.model_rank_loads(m, chunks, pp, recompute)
    selective = selective_terms(costs, selective_modules(m))
    totals = rank_seconds(costs, loads, selective)
    slowest = max(totals, key=totals.__getitem__)  # the rank that gates every microbatch
    mean = sum(map(totals.__getitem__, loads)) / pp
    if detail:
        terms = _rank_terms(costs, slowest, selective)
        step = {name: microbatches * value for name, value in terms.items()}
    else:
        step = {"layers": microbatches * totals[slowest]}
    if costs.ep_unpaired:  # the alltoall overlap pairs no warm-up forward, no cool-down backward
        rank = loads.index(slowest)
        warm = 1 if pp == 1 else warmup_forwards(pp, vpp, rank, microbatches)
        unpaired = warm / vpp * (slowest[1] + slowest[3]) * costs.ep_unpaired  # its MoE layers
        step["ep" if detail else "layers"] += unpaired
    step["bubble"] = (pp - 1) / vpp * mean if pp > 1 else 0.0
    # The slowest GPU gates each step: its compute (not its traffic) is slower by sigma x slowest_of
    compute = (*costs.per_slot_compute, *(sum(t.get(n, 0.0) for n in COMPUTE) for t in selective))
    work = microbatches * sumprod(slowest, compute)
    step["straggler"] = k["gpu_speed_sigma"] * slowest_of(cluster.world_size) * work
    if m.cpu_offloading_num_layers > 0:  # per_slot[:2]: a dense and an MoE layer's seconds
        exposed = offload.exposed_seconds(cfg, cluster, derived, costs.per_slot[:2], k["host_link"])
        step["offload"] = microbatches * exposed

    # Pipeline sends: each chunk boundary's activations and gradients, to one peer (a pair link).
    t, c = par.tensor_model_parallel_size, par.context_parallel_size
    tokens = m.seq_length * cfg.train.micro_batch_size / c
    sp = t if par.sequence_parallel and t > 1 else 1
    nvl, net = cluster.nvlink(2) * 1e9 * k["nvlink"], cluster.network * 1e9 * k["network"]
    send = tokens * m.hidden_size * 2 / sp / (net if cluster.crosses(cluster.world_size) else nvl)
    step["p2p"] = microbatches * 2 * vpp * send * k["p2p_exposed"] if pp > 1 else 0.0
    # Each model chunk costs every microbatch a fixed time beyond its layers' (two sends and
    # receives to post, the schedule's host work): one layer per virtual stage is no free lunch.
    step["p2p"] += microbatches * vpp * k["stage_overhead_s"] if pp > 1 else 0.0
    if layers.host_waits(m) and vpp > 1:  # the interleaved schedule's chunks wait on the host
        wait = k["chunk_wait_s"] * layers.local_experts(m, par)
        wait -= k["chunk_wait_hidden"] * costs.moe["gemm"]  # what the layer's GEMMs hide
        step["p2p"] += microbatches * vpp * max(0.0, wait)
    step["dp"], step["optimizer"] = dataparallel.seconds(
        cfg, cluster, derived, k, rank_params(costs.params, slowest), vpp, totals[slowest]
    )

    seconds = sum(step.values())
    tokens_per_gpu = cfg.train.global_batch_size * m.seq_length / seconds / cluster.world_size
    tflops = tokens_per_gpu * costs.flops_per_token / 1e12
    peak, _ = gemm_peak(cfg, cluster, derived)
    return StepTime(seconds, step, tokens_per_gpu, tflops, tflops / peak)
