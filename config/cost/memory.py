"""Parameter counts, model FLOPs and a per-GPU memory estimate, in plain Python.

`recipes check` answers in well under a second on a login node, so nothing here imports torch,
Megatron-Core or NeMo-Run. The numbers model Megatron-Core with Transformer Engine (TE) on GPUs;
tests/unit/config/test_memory_measured.py holds them to the peaks Megatron-LM measured on its own
functional tests, tests/unit/config/test_estimate.py to NVIDIA's published H100 layouts (fit).

Memory per GPU is worked out for every pipeline rank; the largest total is reported, because the
job runs out of memory on its most loaded rank.

- Parameters on a rank: the layers of its chunks (chunk index = vp_stage x PP + pp_rank), dense
  parameters / TP and routed experts / (EP x ETP); the embedding ('E') and output layer ('L') / TP
  on the ranks that build them. With tied embeddings and PP > 1 the last rank keeps its own copy
  of the embedding for the output (Megatron all-reduces the two gradients). A vision encoder and
  its projector sit with the embedding on the first rank.
- Weights 2 bytes (BF16/FP16), 4 with precision=fp32 (activations still counted as BF16's). FP8
  adds TE's cached copy of each decoder-layer weight, cast once per step for all microbatches
  (`fp8_weight_bytes`): row- and column-wise (2 bytes) where the backward GEMM needs the
  transpose, as Hopper's FP8 GEMMs (TN only) do; one byte for per-tensor scaling on Blackwell,
  whose FP8 GEMMs take any layout (TE's non_tn_fp8_gemm_supported(): compute capability 10 and
  up); MXFP8 and blockwise scale along the rows for one use and the columns for the other, so
  both copies stay (MXFP8 with an E8M0 scale per 32), NVFP4 both at 4 bits with an FP8 scale
  per 16; no BF16 weight beside it where FP8 weights stand alone (config/backend.py).
- Gradients 4 bytes with parallel.grad_reduce_in_fp32, else 2: Megatron's DDP keeps one full-size
  gradient buffer even with the distributed optimizer, which reduce-scatters out of it.
- Optimizer: FP32 master 4 + Adam moments 8 = 12 bytes (SGD: master 4 + momentum 4), divided with
  the distributed optimizer by the group it shards over: DP x CP for dense parameters (Megatron's
  data-parallel group spans CP), the expert-data-parallel group for experts. Hence DESIGN's
  6 + 12/DP bytes per parameter, 18 without. Frozen parameters (vision.freeze_*) hold weights only.
- Megatron-FSDP (parallel.use_megatron_fsdp) shards weights and gradients as the optimizer state.
  Gathered at a time: the root module's (embedding, output layer, final norm), two layers'
  weights (this one, the next prefetched; FP8 copies cast per layer), one layer's gradients.
- Activations per layer and microbatch after Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models": 34 s b h bytes / TP with sequence parallel, (10 +
  24/TP) s b h without, for s = seq_length / CP. Megatron-Core always runs a flash/fused attention
  kernel on GPUs (TE or SDPA), so the 5 a s^2 b score term never appears, recompute or not. Full
  recompute keeps each layer's 2 s b h input (/TP with SP) plus the working set of the layers
  being recomputed. `config.cost.layers.layer_activations` generalises the 34 to SwiGLU, other FFN widths, GQA, MLA
  and MoE (top-k experts of moe_ffn_hidden_size); with FP8, TE saves linear-layer inputs in 1 byte.
- Microbatches in flight on rank r: 1F1B holds min(PP - r, microbatches); the interleaved schedule
  its warm-up plus one (config/layout.py `warmup_forwards`, per virtual stage: chunks can differ):
  on rank 0, PP x (1 + (PP - 1)/(PP x VPP)) microbatches' worth, Korthikanti's figure. The MoE
  alltoall overlap (parallel.overlap_moe_expert_parallel_comm) runs one forward more ahead: a
  whole model chunk in the interleaved schedule's warm-up (schedules.py adds one warm-up
  microbatch), one layer without a pipeline, where combined_1f1b pairs each layer's forward of
  the next microbatch with the backward of the last layer left of the previous one and frees
  that layer's state (model_chunk_schedule_plan.py), so the two microbatches together hold one
  microbatch's layers and the pair's.
- CPU activation offloading (model.cpu_offloading_num_layers = n): the first n decoder layers'
  activations leave for host memory as soon as each layer's forward ends; the GPU holds the
  other layers' and one offloaded layer's on its way out or back (config/cost/offload.py).
- Logits: the rank with 'L' holds s x b x padded_vocab / TP x `logit_bytes` (the loss's BF16
  logits and its FP32 tensors), once more per multi-token-prediction layer.
- The optimizer step (activations and logits freed): with 16-bit gradients, each FP32 master gets
  an FP32 copy of its gradient (Megatron-Core's `.float()`), 4 bytes per parameter of the shard;
  the peak is the larger of the two (measured on an H200, BENCHMARKS.md).
- Overhead: a constant, see OVERHEAD_GIB.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.backend import fp8_weights, te_layers
from config.cost import layers
from config.finalize import Derived, padded_vocab_size
from config.hardware import Cluster, GpuSpec
from config.layout import warmup_forwards
from config.precision import PrecisionPreset
from config.schema import ModelConfig, TrainingConfig, VisionConfig
from config.tree import in_range

GIB = 2**30
# What no tensor accounts for: the CUDA context and kernels (~0.6 GiB on H100 with lazy loading),
# NCCL's buffers for the TP/PP/DP/CP/EP communicators (~1 GiB), cuBLAS/TE workspaces (~0.4 GiB)
# and the caching allocator's fragmentation (~1 GiB at the steady state of a long run).
OVERHEAD_GIB = 3.0
# The share of GPU memory a config must leave free to be predicted to fit: the estimate's error on
# measured runs and the allocator's fragmentation late in a run. Of the published H100 layouts of
# tests/unit/config/test_estimate.py all but DeepSeek-V3's (76.2 GiB) fit within it, 12 of
# bench/data/published_perf.csv's 202 configurations do not (7 within the whole GPU). `check`
# (so `run`) and `plan` judge fit by `fits` alone.
MEMORY_MARGIN = 0.08
# The share of a node's memory per GPU that offloaded activations may pin. Megatron-Bridge's
# offloading recipes (bench/published_table.py OFFLOAD_SETTINGS) pin up to 73% of it by this
# estimate (Llama 3.1 405B, 95 layers on 128 GB200s: 163 of 223.5 GiB), Llama 3 70B on GB200 65%.
HOST_SHARE = 0.8


def logit_bytes(cfg: TrainingConfig, cluster: Cluster, peak: bool = True) -> float:
    """Bytes per logit (a token's vocabulary entry) the loss holds at its peak. With TE's layers
    it is fused (models/gpt.py): TE's (model.cross_entropy_fusion_impl=te) in place on the BF16
    logits, 2; Megatron-Core's 10, an FP32 tensor more than the unfused loss the CPU runs (6: the
    logits and an FP32 copy made the softmax in place), as Megatron-LM measured (test_memory_measured).
    `peak=False`: the logits' copies a pass of the loss moves (the step time's unit), 6 and 2."""
    if not te_layers(cfg, cluster):
        return 6.0
    if cfg.model.cross_entropy_fusion_impl == "te":
        return 2.0
    return 10.0 if peak else 6.0


def memory_limit_gib(gpu_memory_gib: float, margin: float = MEMORY_MARGIN) -> float:
    """The most a config may be predicted to use per GPU: its memory less the margin."""
    return gpu_memory_gib * (1 - margin)


def fits(total_gib: float, gpu_memory_gib: float, margin: float = MEMORY_MARGIN) -> bool:
    """Whether a predicted peak of `total_gib` per GPU fits a GPU of `gpu_memory_gib`."""
    return total_gib <= memory_limit_gib(gpu_memory_gib, margin)


def host_limit_gib(spec: GpuSpec) -> float:
    """The most pinned host memory per GPU that CPU activation offloading may take: HOST_SHARE of
    the node's memory per GPU (the rest for the OS, the data loader and checkpoint buffers)."""
    return spec.host_memory_gib * HOST_SHARE


def fits_memory(memory: MemoryEstimate, spec: GpuSpec, margin: float = MEMORY_MARGIN) -> bool:
    """Whether a config's predicted memory fits its GPU (keeping `margin` free) and what it
    offloads fits its host memory: what `recipes check` and `recipes plan` judge fit by."""
    on_host = memory.host_gib <= host_limit_gib(spec)
    return fits(memory.total_gib, spec.memory_gib, margin) and on_host


def limit_text(gpu_memory_gib: float, margin: float = MEMORY_MARGIN) -> str:
    """The limit as `check` and `plan` print it: "at most 36.2 of 39.4 GiB, keeping 8% free"."""
    return (
        f"at most {memory_limit_gib(gpu_memory_gib, margin):.1f} of {gpu_memory_gib:.1f} GiB, "
        f"keeping {margin * 100:g}% free"
    )


@dataclass(frozen=True, slots=True)
class ParamCount:
    """Parameters of the full (unsharded) model, vocabulary padded as Megatron pads it."""

    embedding: int  # input embedding (padded vocab x hidden), plus learned positions if any
    output: int  # output layer (0 when tied to the embedding)
    dense_per_layer: int  # attention + norms + dense MLP: a dense layer
    attention_per_layer: int  # attention + both norms: an MoE layer without its MLP
    moe_shared_per_layer: int  # router + shared expert of one MoE layer (sharded like dense ones)
    experts_per_layer: int  # all routed experts of one MoE layer
    num_dense_layers: int
    num_moe_layers: int
    mtp: int  # multi-token prediction: its layers, input projections and norms (embedding shared)
    vision: int  # vision encoder + projector (0 without model.vision)
    final_norm: int
    total: int
    # Embedding + decoder with top-k experts + output: the published "activated" figure (MTP and
    # the vision encoder left out, as in the model cards).
    active_per_token: int


def shard_params(count: ParamCount, tp: int, experts_split: int) -> dict[str, float]:
    """Parameters per GPU of each kind of layer: dense ones / TP, experts / (EP x ETP)."""
    return {
        "dense": count.dense_per_layer / tp,
        "moe": (count.attention_per_layer + count.moe_shared_per_layer) / tp,
        "experts": count.experts_per_layer / experts_split,
        "embedding": count.embedding / tp,
        "output": (count.output or count.embedding) / tp,
    }


def rank_params(p: dict[str, float], load: tuple[float, ...]) -> tuple[float, float]:
    """(dense, expert) parameters a pipeline rank holds: p from shard_params, load one of
    config/cost/layers.py rank_loads' slot counts."""
    dense, moe, dense_rc, moe_rc, mtp, emb, out, *_ = load
    moe_layers = moe + moe_rc
    held = (dense + dense_rc) * p["dense"] + moe_layers * p["moe"]
    held += emb * p["embedding"] + out * p["output"]
    return held, moe_layers * p["experts"]


def _vit(v: VisionConfig) -> tuple[ModelConfig, int]:
    """The vision encoder as a ModelConfig (CLIP-style: LayerNorm, GELU, biases) and its tokens."""
    tokens = (v.image_size // v.patch_size) ** 2 + int(v.class_token)
    vit = ModelConfig(
        num_layers=v.num_layers,
        hidden_size=v.hidden_size,
        ffn_hidden_size=v.ffn_hidden_size,
        num_attention_heads=v.num_attention_heads,
        seq_length=tokens,
        vocab_size=1,
        normalization="LayerNorm",
        activation="gelu",
        add_bias_linear=True,
    )
    return vit, tokens


def _vision_params(m: ModelConfig, v: VisionConfig) -> tuple[int, int]:
    """(encoder, projector) parameters: patch conv, class token, positions, pre/post norms, layers."""
    vit, tokens = _vit(v)
    hv = vit.hidden_size
    layer = (
        sum(layers.attention(vit))
        + layers.norm(vit, hv)
        + sum(layers.mlp(vit, vit.ffn_hidden_size))
    )
    encoder = (
        3 * v.patch_size**2 * hv + hv * int(v.class_token) + tokens * hv + 2 * layers.norm(vit, hv)
    )
    ph = v.projector_hidden_size or m.hidden_size
    return encoder + v.num_layers * layer, hv * ph + ph + ph * m.hidden_size + m.hidden_size


def _vocab(cfg: TrainingConfig) -> int:
    m, tp = cfg.model, cfg.parallel.tensor_model_parallel_size
    if not in_range(cfg.parallel, "tensor_model_parallel_size"):
        return m.vocab_size  # `recipes check` names the TP, and still reports the FLOPs
    return padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)


def count_parameters(cfg: TrainingConfig) -> ParamCount:
    m = cfg.model
    h = m.hidden_size
    vocab = _vocab(cfg)
    positions = m.seq_length * h if m.position_embedding_type == "learned_absolute" else 0
    embedding = vocab * h + positions
    output = 0 if m.share_embeddings_and_output_weights else vocab * h
    attention = sum(layers.attention(m)) + layers.norm(m, h)  # + the norm in front of the MLP
    dense = attention + sum(layers.mlp(m, m.ffn_hidden_size))
    n_dense = layers.num_dense_layers(m)
    n_moe = m.num_layers - n_dense
    experts = moe_shared = per_expert = 0
    if m.num_moe_experts:
        per_expert = sum(layers.mlp(m, m.moe_ffn_hidden_size or m.ffn_hidden_size))
        experts = m.num_moe_experts * per_expert
        shared = m.moe_shared_expert_intermediate_size
        moe_shared = h * m.num_moe_experts + (sum(layers.mlp(m, shared)) if shared else 0)
        moe_shared += h if shared and m.moe_shared_expert_gate else 0  # the gate's projection
    moe_layer = attention + moe_shared + experts
    # An MTP layer: norms of embedding and hidden state, their 2h -> h projection, one layer of
    # the decoder's kind (MoE in DeepSeek-V3) and a final norm; embedding and output are shared.
    mtp = (m.mtp_num_layers or 0) * (
        (moe_layer if n_moe else dense) + 2 * h * h + 3 * layers.norm(m, h)
    )
    vision = sum(_vision_params(m, m.vision)) if m.vision else 0
    final_norm = layers.norm(m, h)
    main = embedding + output + n_dense * dense + n_moe * moe_layer + final_norm
    inactive = n_moe * ((m.num_moe_experts or 0) - m.moe_router_topk) * per_expert  # unrouted
    return ParamCount(
        embedding=embedding,
        output=output,
        dense_per_layer=dense,
        attention_per_layer=attention,
        moe_shared_per_layer=moe_shared,
        experts_per_layer=experts,
        num_dense_layers=n_dense,
        num_moe_layers=n_moe,
        mtp=mtp,
        vision=vision,
        final_norm=final_norm,
        total=main + mtp + vision,
        active_per_token=main - inactive,
    )


def model_flops_per_token(cfg: TrainingConfig) -> float:
    """Training FLOPs per token (forward + backward), by the causal formula of Megatron-Core >= 0.12.

        6 x (matmul weights a token passes through: attention, dense MLP or router + top-k experts
             + shared expert, MTP layers and their 2h x h projection, and the output layer once
             for the main head and once per MTP layer; not the input embedding lookup, not norms)
      + 3 x (L x attention_share + MTP layers) x s x heads x (d_qk + d_v)

    The second term is the causal half of the 12 L h s attention FLOPs (QK^T and the value
    product, 2 FLOPs per multiply-add, x3 for forward and backward): 6 x L x h_attn x s when
    d_qk = d_v (h_attn = heads x head_dim); MLA scores with qk_head_dim + qk_pos_emb_head_dim and
    multiplies values of v_head_dim. The vision encoder is left out: how many images a sequence
    carries is a property of the data, not of the config.
    """
    m = cfg.model
    h = m.hidden_size
    vocab = _vocab(cfg)
    attention = layers.attention(m)[0]
    dense = moe = attention + layers.mlp(m, m.ffn_hidden_size)[0]
    if m.num_moe_experts:
        fe, fs = m.moe_ffn_hidden_size or m.ffn_hidden_size, m.moe_shared_expert_intermediate_size
        experts = m.moe_router_topk * layers.mlp(m, fe)[0] + (layers.mlp(m, fs)[0] if fs else 0)
        moe = attention + h * m.num_moe_experts + experts  # router + top-k and shared experts
    n_dense, mtp = layers.num_dense_layers(m), m.mtp_num_layers or 0
    n_moe = m.num_layers - n_dense
    matmul = n_dense * dense + n_moe * moe + mtp * ((moe if n_moe else dense) + 2 * h * h)
    matmul += (1 + mtp) * vocab * h
    if m.multi_latent_attention:
        d_qk, d_v = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
    else:
        d_qk = d_v = layers.head_dim(m)
    scores_and_values = m.seq_length * m.num_attention_heads * (d_qk + d_v)
    # LoRA: frozen weights get no weight gradient, so 4 FLOPs per weight and token, not 6 (the
    # adapters' own, rank x width, are left out; attention's backward is whole either way).
    per_weight = 4.0 if cfg.peft.scheme == "lora" else 6.0
    # Gated DeltaNet layers add no quadratic term, a windowed layer its window's keys only
    # (layers.attention_share; Megatron-LM's formula counts all keys: MFUs above 100% at 128K).
    quadratic_layers = m.num_layers * layers.attention_share(m) + mtp
    return per_weight * matmul + 3.0 * quadratic_layers * scores_and_values


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float
    logits_gib: float
    overhead_gib: float
    total_gib: float
    params_per_gpu: int  # on the most loaded pipeline rank
    microbatches_in_flight: float
    pipeline_rank: int  # which rank is the most loaded one
    host_gib: float = 0.0  # pinned host memory per GPU: CPU activation offloading's copies
    step_gib: float = 0.0  # the optimizer step's FP32 gradient copies (peak: this or acts + logits)


def fp8_weight_bytes(preset: PrecisionPreset | None, spec: GpuSpec) -> float:
    """Bytes of TE's cached low-precision copy of one decoder weight (module docstring)."""
    recipe = preset.fp8_recipe if preset is not None else None
    if recipe is None:
        return 0.0
    if recipe in ("delayed", "tensorwise"):
        return 1.0 if spec.mxfp8 else 2.0  # the GPUs with MXFP8 tensor cores: Blackwell
    if recipe == "mxfp8":
        return 2 * (1 + 1 / 32)
    if recipe == "nvfp4":
        return 2 * (0.5 + 1 / 16)
    return 2.0  # blockwise: 1x128 and 128x128 scales, both directions


def bytes_per_parameter(
    cfg: TrainingConfig, preset: PrecisionPreset | None, spec: GpuSpec
) -> tuple[int, float, int, int]:
    """(weight, FP8 cache, gradient, optimizer state) bytes of one trained parameter: the weight
    in the preset's dtype, TE's FP8 copy of a decoder weight (0 without FP8), the gradient buffer,
    and the FP32 master plus Adam's two moments (SGD: one)."""
    weight = 4 if preset is not None and preset.params_dtype == "fp32" else 2
    grad = 4 if cfg.parallel.grad_reduce_in_fp32 else 2
    opt = 8 if cfg.optimizer.optimizer == "sgd" else 12
    return weight, fp8_weight_bytes(preset, spec), grad, opt


def _in_flight(pp: int, vpp: int, rank: int, microbatches: int, extra: int = 0) -> list[int]:
    """Microbatches whose activations a rank holds at its peak, per virtual stage (+ `extra`)."""
    if vpp == 1:
        return [min(pp - rank + extra, microbatches)]
    forwards = min(warmup_forwards(pp, vpp, rank, microbatches) + extra, microbatches * vpp)
    # Megatron sends forward k to stage (k // PP) % VPP: whole rounds of PP x VPP forwards give
    # every stage PP; the rest fills the stages in order.
    rounds, rest = divmod(forwards, pp * vpp)
    return [rounds * pp + min(max(rest - stage * pp, 0), pp) for stage in range(vpp)]


def layer_saved_bytes(cfg: TrainingConfig, derived: Derived, moe: bool) -> float:
    """Bytes a decoder layer saves for its backward, per microbatch on one GPU, before any
    recompute: what a microbatch in flight holds of it, and what offloading copies to the host."""
    m, par = cfg.model, cfg.parallel
    tp = par.tensor_model_parallel_size
    sp_div = tp if par.sequence_parallel and tp > 1 else 1  # what splits the outside part
    tokens = m.seq_length // par.context_parallel_size * cfg.train.micro_batch_size
    lin = layers.saved_input_bytes(derived.preset.fp8_recipe)
    outside, inside = layers.layer_activations(m, moe, lin)
    return tokens * (outside / sp_div + inside / tp)


def estimate_memory(
    cfg: TrainingConfig, cluster: Cluster, derived: Derived, on_rank: int | None = None
) -> MemoryEstimate:
    """Predicted memory per GPU on the most loaded pipeline rank, or on pipeline rank `on_rank`.

    The cluster enters through `derived` and its GPU kind's FP8 weight copies (fp8_weight_bytes);
    on the CPU (memory_gib inf) as on Hopper.
    """
    m, par, chunks = cfg.model, cfg.parallel, derived.pipeline_chunks
    pp, tp = par.pipeline_model_parallel_size, par.tensor_model_parallel_size
    dp, mbs = derived.data_parallel_size, derived.num_microbatches
    edp = derived.expert_data_parallel_size
    vpp, count, h = len(chunks) // pp, count_parameters(cfg), m.hidden_size
    lin = layers.saved_input_bytes(derived.preset.fp8_recipe)
    sp_div = tp if par.sequence_parallel and tp > 1 else 1  # what splits the outside part
    tokens = m.seq_length // par.context_parallel_size * cfg.train.micro_batch_size

    def act(model: ModelConfig, moe: bool, n_tokens: int, split: int) -> float:
        outside, inside = layers.layer_activations(model, moe, lin)
        return n_tokens * (outside / split + inside / tp)

    kinds = (False, bool(m.num_moe_experts))
    freed = {moe: layers.discarded(m, moe, lin) for moe in kinds}  # by selective recompute
    rebuilt = {moe: tokens * (freed[moe][0] / sp_div + freed[moe][1] / tp) for moe in kinds}
    layer_act = {moe: layer_saved_bytes(cfg, derived, moe) - rebuilt[moe] for moe in kinds}
    offload = m.cpu_offloading_num_layers  # the first this many decoder layers' go to the host
    kept_input = 2 * h * tokens / sp_div  # what a fully recomputed layer keeps
    group = m.recompute_num_layers or 1  # layers rebuilt together by full recompute
    vision_enc, vision_proj, vision_act = 0, 0, 0.0
    if m.vision:  # the projector always trains; a frozen encoder saves nothing for backward
        vision_enc, vision_proj = _vision_params(m, m.vision)
        vit, patches = _vit(m.vision)
        ph, n = m.vision.projector_hidden_size or h, patches * cfg.train.micro_batch_size
        vision_act = n * (lin * vit.hidden_size + 2 * ph + lin * ph) / tp
        if not m.vision.freeze_vision:  # Megatron runs the ViT without sequence parallel
            vision_act += vit.num_layers * act(vit, False, n, 1)
    lora = cfg.peft.scheme == "lora"  # the base frozen: weights only; the adapters train
    frozen_lm = lora or (m.vision is not None and m.vision.freeze_language)
    lm = "frozen" if frozen_lm else "dense"  # where LM params go
    adapters = {moe: layers.lora_parameters(cfg, moe) for moe in (False, True)} if lora else None
    # Per rank: dense (optimizer over DP x CP), expert (over expert DP), frozen (weights only),
    # decoder (layer params, which FP8 caches), working (full recompute's rebuilt layers, or the
    # offloaded layer in transit), logits, host (the offloaded layers' activations, pinned).
    keys = ("dense", "expert", "frozen", "decoder", "working", "logits", "host")
    ranks = [dict.fromkeys(keys, 0.0) for _ in range(pp)]
    acts = [[0.0] * vpp for _ in range(pp)]
    e_rank = next(i % pp for i, c in enumerate(chunks) if "E" in c)
    experts = count.experts_per_layer / (
        par.expert_model_parallel_size * derived.expert_tensor_parallel_size
    )
    moe_dense = count.attention_per_layer + count.moe_shared_per_layer
    recompute = (m.recompute_granularity, m.recompute_method, group)
    slots = layers.walk(chunks, pp, layers.first_moe_layer(m), m.num_layers, recompute)
    for rank, stage, c, moe, recomputed in slots:
        r = ranks[rank]
        if c in "tm":
            dense = moe_dense if moe else count.dense_per_layer
            dense += 2 * h * h + 3 * layers.norm(m, h) if c == "m" else 0  # MTP projection, norms
            r[lm] += dense / tp
            r["expert" if lm == "dense" else lm] += experts if moe else 0.0
            r["dense"] += adapters[moe] if adapters else 0.0
            r["decoder"] += dense / tp + (experts if moe else 0.0)
            if c == "t" and offload > 0:  # on the host but one on its way: in "working"
                offload -= 1
                r["working"] = max(r["working"], layer_act[moe])
                r["host"] += layer_act[moe]
                continue
            acts[rank][stage] += kept_input if recomputed else layer_act[moe]
            acts[rank][stage] += 8 * h * tokens / sp_div if c == "m" else 0  # MTP norms, concat
            if recomputed:
                working = layer_act[moe] * (1 if m.recompute_method == "block" else group)
                r["working"] = max(r["working"], working)
            r["working"] = max(r["working"], rebuilt[moe])  # one layer's, in its backward
        elif c == "E":
            r[lm] += count.embedding / tp
            r["frozen" if m.vision and m.vision.freeze_vision else "dense"] += vision_enc / tp
            r["dense"] += vision_proj / tp
            acts[rank][stage] += vision_act
        elif c == "L":
            tied_copy = count.embedding if count.output == 0 and rank != e_rank else 0
            r[lm] += (count.output + tied_copy + count.final_norm) / tp
            heads = 1 + (m.mtp_num_layers or 0)  # each MTP layer has its own logits
            per_token = logit_bytes(cfg, cluster) * derived.padded_vocab_size / tp
            r["logits"] = per_token * tokens * heads
    weight_bytes, fp8_bytes, grad_bytes, opt_bytes = bytes_per_parameter(
        cfg, derived.preset, cluster.spec
    )
    sharded, fp8_only = cfg.optimizer.use_distributed_optimizer, fp8_weights(cfg, derived.preset)
    dense_group, expert_group = (dp * par.context_parallel_size, edp) if sharded else (1, 1)
    fsdp = par.use_megatron_fsdp  # sharded as the optimizer state, plus what is gathered
    root = (count.embedding + count.output + count.final_norm) / tp
    unit = max(count.dense_per_layer / tp, (moe_dense / tp + experts) if m.num_moe_experts else 0)
    estimates = []
    overlap = par.overlap_moe_expert_parallel_comm
    for rank, r in enumerate(ranks):
        counts = _in_flight(pp, vpp, rank, mbs, int(overlap and vpp > 1))
        params = r["dense"] + r["expert"] + r["frozen"]
        held = r["dense"] / dense_group + r["expert"] / expert_group  # the optimizer's shard
        weights = weight_bytes * (params - fp8_only * r["decoder"]) + fp8_bytes * r["decoder"]
        grads = grad_bytes * (r["dense"] + r["expert"])
        if fsdp:
            weights = weight_bytes * (held + r["frozen"] / dense_group + root + 2 * unit)
            weights, grads = weights + 2 * fp8_bytes * unit, grad_bytes * (held + root + unit)
        activations = sum(n * a for n, a in zip(counts, acts[rank], strict=True)) + r["working"]
        activations += max(layer_act.values()) if overlap and vpp == 1 else 0.0  # the pair's
        step = 4 * held / GIB if weight_bytes == grad_bytes == 2 and not fsdp else 0.0
        w, g, o, a, lg = (
            x / GIB for x in (weights, grads, opt_bytes * held, activations, r["logits"])
        )
        total = w + g + o + max(a + lg, step) + OVERHEAD_GIB
        shape = (round(params), sum(counts) / vpp, rank, r["host"] / GIB, step)
        estimates.append(MemoryEstimate(w, g, o, a, lg, OVERHEAD_GIB, total, *shape))
    if on_rank is not None:
        return estimates[on_rank]
    return max(estimates, key=lambda e: e.total_gib)  # the first of the most loaded ranks
