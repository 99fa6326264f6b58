"""Parameter counts, model FLOPs and a per-GPU memory estimate, in plain Python.

`recipes check` answers in well under a second on a login node, so nothing here imports torch,
Megatron-Core or NeMo-Run. The numbers model Megatron-Core with Transformer Engine (TE) on GPUs;
tests/unit/config/test_estimate.py calibrates them on the runs of /work/shared/PUBLISHED_LAYOUTS.md, which all
ran on 80 GB H100s and so must be predicted to fit.

Memory per GPU is worked out for every pipeline rank; the largest total is reported, because the
job runs out of memory on its most loaded rank.

- Parameters on a rank: the layers of its chunks (chunk index = vp_stage x PP + pp_rank), dense
  parameters / TP and routed experts / (EP x ETP); the embedding ('E') and output layer ('L') / TP
  on the ranks that build them. With tied embeddings and PP > 1 the last rank keeps its own copy
  of the embedding for the output (Megatron all-reduces the two gradients). A vision encoder and
  its projector sit with the embedding on the first rank.
- Weights 2 bytes (BF16/FP16), 4 with precision=fp32 (activations still counted as BF16's). FP8
  adds 2 bytes per decoder-layer parameter: TE casts each weight once per step and caches the FP8
  copy row- and column-wise for all microbatches (the backward GEMM needs the transpose).
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
  being recomputed. `_layer_activations` generalises the 34 to SwiGLU, other FFN widths, GQA, MLA
  and MoE (top-k experts of moe_ffn_hidden_size); with FP8, TE saves linear-layer inputs in 1 byte.
- Microbatches in flight on rank r: 1F1B holds min(PP - r, microbatches); the interleaved schedule
  its warm-up plus one (config/layout.py `warmup_forwards`, per virtual stage: chunks can differ):
  on rank 0, PP x (1 + (PP - 1)/(PP x VPP)) microbatches' worth, Korthikanti's figure. The MoE
  alltoall overlap (parallel.overlap_moe_expert_parallel_comm) runs one forward more ahead.
- Logits: the rank with 'L' holds s x b x padded_vocab / TP in FP32 (4 bytes) for the cross
  entropy plus the BF16 copy (2 bytes), once more per multi-token-prediction layer.
- Overhead: a constant, see OVERHEAD_GIB.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.finalize import Derived, padded_vocab_size
from config.hardware import Cluster
from config.layout import warmup_forwards
from config.precision import PrecisionPreset
from config.schema import ModelConfig, TrainingConfig, selective_modules
from config.tree import in_range

GIB = 2**30
# What no tensor accounts for: the CUDA context and kernels (~0.6 GiB on H100 with lazy loading),
# NCCL's buffers for the TP/PP/DP/CP/EP communicators (~1 GiB), cuBLAS/TE workspaces (~0.4 GiB)
# and the caching allocator's fragmentation (~1 GiB at the steady state of a long run).
OVERHEAD_GIB = 3.0


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


def _head_dim(m: ModelConfig) -> int:
    return m.kv_channels or m.hidden_size // m.num_attention_heads


def _norm(m: ModelConfig, width: int) -> int:
    return width * (2 if m.normalization == "LayerNorm" else 1)


def _attention(m: ModelConfig) -> tuple[int, int]:
    """(matmul weights, norms and biases) of one attention block, its input norm included."""
    h, heads = m.hidden_size, m.num_attention_heads
    other = _norm(m, h)
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        if m.q_lora_rank:  # queries through a low-rank bottleneck with its own norm
            mm = h * m.q_lora_rank + m.q_lora_rank * heads * qk
            other += _norm(m, m.q_lora_rank)
        else:
            mm = h * heads * qk
        mm += h * (m.kv_lora_rank + m.qk_pos_emb_head_dim)  # compressed KV + shared rope key
        mm += m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim) + heads * m.v_head_dim * h
        return mm, other + _norm(m, m.kv_lora_rank)
    d = _head_dim(m)
    hq, hkv = heads * d, (m.num_query_groups or heads) * d
    mm = h * (hq + 2 * hkv) + hq * h
    if m.add_bias_linear or m.add_qkv_bias:
        other += hq + 2 * hkv
    if m.add_bias_linear:
        other += h
    if m.qk_layernorm:
        other += 2 * _norm(m, d)
    return mm, other


def _mlp(m: ModelConfig, ffn: int) -> tuple[int, int]:
    """(matmul weights, biases) of an MLP of width ffn; SwiGLU has a gate and an up projection."""
    gated = m.activation == "swiglu"
    bias = ((2 if gated else 1) * ffn + m.hidden_size) if m.add_bias_linear else 0
    return (3 if gated else 2) * m.hidden_size * ffn, bias


def _vit(m: ModelConfig) -> tuple[ModelConfig, int]:
    """The vision encoder as a ModelConfig (CLIP-style: LayerNorm, GELU, biases) and its tokens."""
    v = m.vision
    assert v is not None
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


def _vision_params(m: ModelConfig) -> tuple[int, int]:
    """(encoder, projector) parameters: patch conv, class token, positions, pre/post norms, layers."""
    vit, tokens = _vit(m)
    v, hv = m.vision, vit.hidden_size
    layer = sum(_attention(vit)) + _norm(vit, hv) + sum(_mlp(vit, vit.ffn_hidden_size))
    encoder = 3 * v.patch_size**2 * hv + hv * int(v.class_token) + tokens * hv + 2 * _norm(vit, hv)
    ph = v.projector_hidden_size or m.hidden_size
    return encoder + v.num_layers * layer, hv * ph + ph + ph * m.hidden_size + m.hidden_size


def _vocab(cfg: TrainingConfig) -> int:
    m, tp = cfg.model, cfg.parallel.tensor_model_parallel_size
    if not in_range(cfg.parallel, "tensor_model_parallel_size"):
        return m.vocab_size  # `recipes check` names the TP, and still reports the FLOPs
    return padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)


def _num_dense_layers(m: ModelConfig) -> int:
    return min(m.moe_first_k_dense_layers, m.num_layers) if m.num_moe_experts else m.num_layers


def count_parameters(cfg: TrainingConfig) -> ParamCount:
    m = cfg.model
    h = m.hidden_size
    vocab = _vocab(cfg)
    positions = m.seq_length * h if m.position_embedding_type == "learned_absolute" else 0
    embedding = vocab * h + positions
    output = 0 if m.share_embeddings_and_output_weights else vocab * h
    attention = sum(_attention(m)) + _norm(m, h)  # + the norm in front of the MLP
    dense = attention + sum(_mlp(m, m.ffn_hidden_size))
    n_dense = _num_dense_layers(m)
    n_moe = m.num_layers - n_dense
    experts = moe_shared = per_expert = 0
    if m.num_moe_experts:
        per_expert = sum(_mlp(m, m.moe_ffn_hidden_size or m.ffn_hidden_size))
        experts = m.num_moe_experts * per_expert
        shared = m.moe_shared_expert_intermediate_size
        moe_shared = h * m.num_moe_experts + (sum(_mlp(m, shared)) if shared else 0)
    moe_layer = attention + moe_shared + experts
    # An MTP layer: norms of embedding and hidden state, their 2h -> h projection, one layer of
    # the decoder's kind (MoE in DeepSeek-V3) and a final norm; embedding and output are shared.
    mtp = (m.mtp_num_layers or 0) * ((moe_layer if n_moe else dense) + 2 * h * h + 3 * _norm(m, h))
    vision = sum(_vision_params(m)) if m.vision else 0
    final_norm = _norm(m, h)
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
      + 3 x (L + MTP layers) x s x heads x (d_qk + d_v)

    The second term is the causal half of the 12 L h s attention FLOPs (QK^T and the value
    product, 2 FLOPs per multiply-add, x3 for forward and backward): 6 x L x h_attn x s when
    d_qk = d_v (h_attn = heads x head_dim); MLA scores with qk_head_dim + qk_pos_emb_head_dim and
    multiplies values of v_head_dim. The vision encoder is left out: how many images a sequence
    carries is a property of the data, not of the config.
    """
    m = cfg.model
    h = m.hidden_size
    vocab = _vocab(cfg)
    attention = _attention(m)[0]
    dense = moe = attention + _mlp(m, m.ffn_hidden_size)[0]
    if m.num_moe_experts:
        fe, fs = m.moe_ffn_hidden_size or m.ffn_hidden_size, m.moe_shared_expert_intermediate_size
        experts = m.moe_router_topk * _mlp(m, fe)[0] + (_mlp(m, fs)[0] if fs else 0)
        moe = attention + h * m.num_moe_experts + experts  # router + top-k and shared experts
    n_dense, mtp = _num_dense_layers(m), m.mtp_num_layers or 0
    n_moe = m.num_layers - n_dense
    matmul = n_dense * dense + n_moe * moe + mtp * ((moe if n_moe else dense) + 2 * h * h)
    matmul += (1 + mtp) * vocab * h
    if m.multi_latent_attention:
        d_qk, d_v = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
    else:
        d_qk = d_v = _head_dim(m)
    scores_and_values = m.seq_length * m.num_attention_heads * (d_qk + d_v)
    # LoRA: frozen weights get no weight gradient, so 4 FLOPs per weight and token, not 6 (the
    # adapters' own, rank x width, are left out; attention's backward is whole either way).
    per_weight = 4.0 if cfg.peft.scheme == "lora" else 6.0
    return per_weight * matmul + 3.0 * (m.num_layers + mtp) * scores_and_values


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


def lora_parameters(cfg: TrainingConfig, moe: bool) -> float:
    """Adapter parameters of one layer on one TP rank (peft.scheme=lora, training/lora.py).

    A column-parallel layer keeps A [rank, in] whole and splits B [out / TP, rank]; a row-parallel
    one splits A [rank, in / TP] and keeps B [out, rank] whole. The MLP's layers exist in a MoE
    layer only as its shared expert (routed experts are not adapted).
    """
    from config.rules.peft import targets

    m, tp, rank = cfg.model, cfg.parallel.tensor_model_parallel_size, cfg.peft.rank
    d = _head_dim(m)
    hq = m.num_attention_heads * d
    qkv = hq + 2 * (m.num_query_groups or m.num_attention_heads) * d
    ffn = m.moe_shared_expert_intermediate_size if moe else m.ffn_hidden_size
    gated = 2 if m.activation == "swiglu" else 1
    h = m.hidden_size
    column = {"linear_qkv": (h, qkv), "linear_fc1": (h, gated * (ffn or 0))}
    row = {"linear_proj": (hq, h), "linear_fc2": (ffn or 0, h)}
    total = 0.0
    for name in targets(cfg.peft.target_modules):
        if name in column and column[name][1]:
            fan_in, fan_out = column[name]
            total += rank * fan_in + fan_out / tp * rank
        elif name in row and row[name][0]:
            fan_in, fan_out = row[name]
            total += rank * fan_in / tp + fan_out * rank
    return total


def _layer_activations(m: ModelConfig, moe: bool, lin: int) -> tuple[int, int]:
    """Bytes per token one layer saves for its backward: (outside, inside) the TP regions.

    Without sequence parallel the outside part is replicated on every TP rank, with it everything
    is split. `lin` is the bytes of a saved linear-layer input (2, or 1 when TE runs it in FP8).
    Korthikanti's standard GPT (GELU, ffn 4h, MHA, dropout, BF16) gives outside 10h, inside 24h:
      outside: norm inputs 2 x 2h + dropout masks 2 x h + QKV input 2h + fc1 input 2h = 10h
      inside:  Q, K, V 3 x 2h + attention output 2h + GELU input 8h + fc2 input 8h = 24h
    """
    h = m.hidden_size
    outside = 4 * h + (2 * h if m.hidden_dropout > 0 else 0)  # norm inputs; 1-byte dropout masks
    heads = m.num_attention_heads
    # The attention kernel keeps its BF16 output for its own backward; the output projection
    # saves that same tensor in BF16, but its own FP8 copy under FP8.
    out = 2 if lin == 2 else 2 + lin
    if m.multi_latent_attention:
        ql, kvl, rope = m.q_lora_rank or 0, m.kv_lora_rank, m.qk_pos_emb_head_dim
        # Down projections' input; q and kv latents (norm inputs and up projections' inputs).
        outside += lin * h + (2 + lin) * ql + 2 * (kvl + rope) + lin * kvl
        qk = m.qk_head_dim + rope
        inside = 2 * heads * (2 * qk + m.v_head_dim) + out * heads * m.v_head_dim
    else:
        d = _head_dim(m)
        hq, hkv = heads * d, (m.num_query_groups or heads) * d
        outside += lin * h
        inside = 2 * (hq + 2 * hkv) + out * hq + (2 * (hq + hkv) if m.qk_layernorm else 0)
    act = 2 if m.activation == "swiglu" else 1  # the fc1 output the activation saves
    if moe:
        topk, fe = m.moe_router_topk, m.moe_ffn_hidden_size or m.ffn_hidden_size
        outside += 2 * h + 4 * m.num_moe_experts  # router input (BF16) and FP32 routing scores
        inside += topk * (lin * h + 2 * act * fe + lin * fe)  # each token visits top-k experts
        fs = m.moe_shared_expert_intermediate_size or 0
        inside += 2 * act * fs + lin * fs
    else:
        outside += lin * h
        inside += 2 * act * m.ffn_hidden_size + lin * m.ffn_hidden_size
    return outside, inside


def _discarded(m: ModelConfig, moe: bool, lin: int) -> tuple[int, int]:
    """Bytes per token of a layer's saved activations that selective recompute frees and rebuilds
    in the backward: (outside, inside) the TP regions, as _layer_activations counts them.

    core_attn frees nothing here (the fused attention kernel saves no score matrix to begin with);
    mla_up_proj the up-projected queries, keys and values and the up projections' inputs;
    layernorm the outputs of the norms that stand alone (Transformer Engine fuses the others into
    the next linear layer, and Megatron-Core has nothing to recompute there): MLA's input norm
    (the down projections' input) and an MoE layer's pre-MLP norm (the router's input);
    mlp a dense layer's FC1 output and FC2 input (the checkpoint keeps its BF16 input in place of
    FC1's); moe_act the experts' FC2 input; shared_experts theirs; moe the whole expert part and
    the routing scores."""
    modules = selective_modules(m)
    h, act = m.hidden_size, 2 if m.activation == "swiglu" else 1
    outside = inside = 0
    if "mla_up_proj" in modules and m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        inside += 2 * m.num_attention_heads * (2 * qk + m.v_head_dim)
        outside += lin * ((m.q_lora_rank or 0) + m.kv_lora_rank)
    if "layernorm" in modules:
        outside += (lin * h if m.multi_latent_attention else 0) + (2 * h if moe else 0)
    if not moe:
        if "mlp" in modules:
            f = m.ffn_hidden_size
            inside += 2 * act * f + lin * f
            outside += lin * h - 2 * h
        return outside, inside
    topk, fe = m.moe_router_topk, m.moe_ffn_hidden_size or m.ffn_hidden_size
    fs = m.moe_shared_expert_intermediate_size or 0
    if "moe" in modules:
        return outside + 4 * m.num_moe_experts, inside + topk * (
            lin * h + 2 * act * fe + lin * fe
        ) + (2 * act * fs + lin * fs)
    if "moe_act" in modules:
        inside += topk * lin * fe
    if "shared_experts" in modules:
        inside += 2 * act * fs + lin * fs
    return outside, inside


def bytes_per_parameter(
    cfg: TrainingConfig, preset: PrecisionPreset | None
) -> tuple[int, int, int, int]:
    """(weight, FP8 cache, gradient, optimizer state) bytes of one trained parameter: the weight
    in the preset's dtype, TE's FP8 copy of a decoder weight (0 without FP8), the gradient buffer,
    and the FP32 master plus Adam's two moments (SGD: one)."""
    weight = 4 if preset is not None and preset.params_dtype == "fp32" else 2
    fp8 = 2 if preset is not None and preset.fp8_recipe is not None else 0
    grad = 4 if cfg.parallel.grad_reduce_in_fp32 else 2
    return weight, fp8, grad, 8 if cfg.optimizer.optimizer == "sgd" else 12


def _in_flight(pp: int, vpp: int, rank: int, microbatches: int, extra: int = 0) -> list[int]:
    """Microbatches whose activations a rank holds at its peak, per virtual stage (+ `extra`)."""
    if vpp == 1:
        return [min(pp - rank + extra, microbatches)]
    forwards = min(warmup_forwards(pp, vpp, rank, microbatches) + extra, microbatches * vpp)
    # Megatron sends forward k to stage (k // PP) % VPP: whole rounds of PP x VPP forwards give
    # every stage PP; the rest fills the stages in order.
    rounds, rest = divmod(forwards, pp * vpp)
    return [rounds * pp + min(max(rest - stage * pp, 0), pp) for stage in range(vpp)]


def estimate_memory(
    cfg: TrainingConfig, cluster: Cluster, derived: Derived
) -> MemoryEstimate | None:
    """Predicted memory per GPU on the most loaded pipeline rank; None for an invalid config.

    The cluster only enters through `derived`; on the CPU (memory_gib inf) the estimate is the same.
    """
    m, par, chunks = cfg.model, cfg.parallel, derived.pipeline_chunks
    pp, tp = par.pipeline_model_parallel_size, par.tensor_model_parallel_size
    dp, mbs = derived.data_parallel_size, derived.num_microbatches
    edp = derived.expert_data_parallel_size
    needed = (chunks, dp, mbs, edp if m.num_moe_experts else 0)
    if any(x is None for x in needed) or pp < 1 or len(chunks) % pp:
        return None
    vpp, count, h = len(chunks) // pp, count_parameters(cfg), m.hidden_size
    fp8 = derived.preset is not None and derived.preset.fp8_recipe is not None
    lin = 1 if fp8 else 2
    sp_div = tp if par.sequence_parallel and tp > 1 else 1  # what splits the outside part
    tokens = m.seq_length // par.context_parallel_size * cfg.train.micro_batch_size

    def act(model: ModelConfig, moe: bool, n_tokens: int, split: int) -> float:
        outside, inside = _layer_activations(model, moe, lin)
        return n_tokens * (outside / split + inside / tp)

    kinds = (False, bool(m.num_moe_experts))
    freed = {moe: _discarded(m, moe, lin) for moe in kinds}  # by selective recompute
    rebuilt = {moe: tokens * (freed[moe][0] / sp_div + freed[moe][1] / tp) for moe in kinds}
    layer_act = {moe: act(m, moe, tokens, sp_div) - rebuilt[moe] for moe in kinds}
    kept_input = 2 * h * tokens / sp_div  # what a fully recomputed layer keeps
    group = m.recompute_num_layers or 1  # layers rebuilt together by full recompute
    vision_enc, vision_proj, vision_act = 0, 0, 0.0
    if m.vision:  # the projector always trains; a frozen encoder saves nothing for backward
        vision_enc, vision_proj = _vision_params(m)
        vit, patches = _vit(m)
        ph, n = m.vision.projector_hidden_size or h, patches * cfg.train.micro_batch_size
        vision_act = n * (lin * vit.hidden_size + 2 * ph + lin * ph) / tp
        if not m.vision.freeze_vision:  # Megatron runs the ViT without sequence parallel
            vision_act += vit.num_layers * act(vit, False, n, 1)
    lora = cfg.peft.scheme == "lora"  # the base frozen: weights only; the adapters train
    frozen_lm = lora or (m.vision is not None and m.vision.freeze_language)
    lm = "frozen" if frozen_lm else "dense"  # where LM params go
    adapters = {moe: lora_parameters(cfg, moe) for moe in (False, True)} if lora else None
    # Per rank: dense (optimizer over DP x CP), expert (over expert DP), frozen (weights only),
    # decoder (layer params, which FP8 caches), working (full recompute's rebuilt layers), logits.
    keys = ("dense", "expert", "frozen", "decoder", "working", "logits")
    ranks = [dict.fromkeys(keys, 0.0) for _ in range(pp)]
    acts = [[0.0] * vpp for _ in range(pp)]
    layer, e_rank = 0, next(i % pp for i, c in enumerate(chunks) if "E" in c)
    first_moe = count.num_dense_layers if m.num_moe_experts else m.num_layers + 1  # MTP: index L
    experts = count.experts_per_layer / (
        par.expert_model_parallel_size * derived.expert_tensor_parallel_size
    )
    moe_dense = count.attention_per_layer + count.moe_shared_per_layer
    for index, chunk in enumerate(chunks):
        rank, stage, in_chunk = index % pp, index // pp, 0
        r = ranks[rank]
        for c in chunk:
            if c in "tm":
                moe = (layer if c == "t" else m.num_layers) >= first_moe
                layer += c == "t"
                dense = moe_dense if moe else count.dense_per_layer
                dense += 2 * h * h + 3 * _norm(m, h) if c == "m" else 0  # MTP projection and norms
                r[lm] += dense / tp
                r["expert" if lm == "dense" else lm] += experts if moe else 0.0
                r["dense"] += adapters[moe] if adapters else 0.0
                r["decoder"] += dense / tp + (experts if moe else 0.0)
                # Block recompute covers the first recompute_num_layers of each chunk, uniform all.
                recomputed = m.recompute_granularity == "full" and (
                    m.recompute_method != "block" or in_chunk < group
                )
                in_chunk += 1
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
                r["logits"] = 6.0 * tokens * derived.padded_vocab_size / tp * heads
    weight_bytes, _, grad_bytes, opt_bytes = bytes_per_parameter(cfg, derived.preset)
    sharded = cfg.optimizer.use_distributed_optimizer
    dense_group, expert_group = (dp * par.context_parallel_size, edp or 1) if sharded else (1, 1)
    fsdp = par.use_megatron_fsdp  # sharded as the optimizer state, plus what is gathered
    root = (count.embedding + count.output + count.final_norm) / tp
    unit = max(count.dense_per_layer / tp, (moe_dense / tp + experts) if m.num_moe_experts else 0)
    best: MemoryEstimate | None = None
    for rank, r in enumerate(ranks):
        counts = _in_flight(pp, vpp, rank, mbs, int(par.overlap_moe_expert_parallel_comm))
        params = r["dense"] + r["expert"] + r["frozen"]
        weights = weight_bytes * params + (2 * r["decoder"] if fp8 else 0)
        grads = grad_bytes * (r["dense"] + r["expert"])
        if fsdp:
            shard = r["dense"] / dense_group + r["expert"] / expert_group
            weights = weight_bytes * (shard + r["frozen"] / dense_group + root + 2 * unit)
            weights, grads = weights + (4 * unit if fp8 else 0), grad_bytes * (shard + root + unit)
        optimizer = opt_bytes * (r["dense"] / dense_group + r["expert"] / expert_group)
        activations = sum(n * a for n, a in zip(counts, acts[rank], strict=True)) + r["working"]
        parts = [x / GIB for x in (weights, grads, optimizer, activations, r["logits"])]
        estimate = MemoryEstimate(
            *parts, OVERHEAD_GIB, sum(parts) + OVERHEAD_GIB, round(params), sum(counts) / vpp, rank
        )
        if best is None or estimate.total_gib > best.total_gib:
            best = estimate
    return best
