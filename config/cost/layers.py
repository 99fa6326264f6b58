"""The shape of one transformer layer, and the walk over the layers each pipeline rank holds.

The memory estimate (config/cost/memory.py) and the step-time model (config/cost/steptime.py) price the same
layers: the same weights, the same saved activations, the same assignment of layers to pipeline
ranks and of full recompute to layers. Both read them here, so that a layer the estimate counts is
a layer the step-time model times. Plain Python: `recipes check` and `recipes plan` import it on a
login node.

- `attention`, `mlp`, `norm`, `head_dim`: parameters of one block, from the model's widths.
- `layer_activations`, `discarded`: bytes per token one layer saves for its backward, and what
  selective recompute frees of them (Korthikanti et al. 2022, generalised; see the docstrings);
  `saved_input_bytes`: what a linear layer's saved input takes per element, by precision.
- `walk`: every slot of a pipeline layout (embedding, decoder layer, MTP layer, output layer) with
  its pipeline rank, virtual stage, whether it is an MoE layer and whether full recompute covers it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from itertools import combinations
from math import comb

from config.lora import targets
from config.schema import ModelConfig, ParallelConfig, TrainingConfig, is_gated, selective_modules


def head_dim(m: ModelConfig) -> int:
    return m.kv_channels or m.hidden_size // m.num_attention_heads


def norm(m: ModelConfig, width: int) -> int:
    """Parameters of one norm over `width` features (LayerNorm has a bias, RMSNorm none)."""
    return width * (2 if m.normalization == "LayerNorm" else 1)


def attention(m: ModelConfig) -> tuple[int, int]:
    """(matmul weights, norms and biases) of one attention block, its input norm included.

    With Gated DeltaNet in most layers (experimental_attention_variant), the average over the
    layers of the two kinds (exact in the whole model's count up to rounding down)."""
    if m.experimental_attention_variant is None:
        return softmax_attention(m)
    full = m.num_layers // (m.linear_attention_freq or m.num_layers + 1)
    linear = m.num_layers - full
    pairs = (softmax_attention(m), gated_delta_net(m))
    mm, other = ((full * a + linear * b) // m.num_layers for a, b in zip(*pairs, strict=True))
    return mm, other


def attention_share(m: ModelConfig, kernel: bool = False) -> float:
    """The decoder's score and value work, on average per layer, over causal softmax attention
    across the whole sequence in every layer. Gated DeltaNet layers have none that grows with the
    sequence (every linear_attention_freq-th layer, from 1, keeps softmax attention). A windowed
    layer (Megatron-Core's is_layer_window_attention: every layer unless its number is a multiple
    of window_attn_skip_freq) lets each token see itself and the window_size tokens before it,
    and flash attention's kernels skip the key blocks beyond that. With `kernel`, what the kernel
    computes: unfused attention (model.attention_backend) scores every query against every key,
    then masks: s keys per query in each softmax layer."""
    s = m.seq_length
    causal = (s + 1) / 2  # keys per query, on average, without a window
    w = min(m.window_size + 1, s) if m.window_size is not None else s
    windowed = (w * (w + 1) / 2 + (s - w) * w) / s / causal
    full = 1.0
    if kernel and m.attention_backend == "unfused":
        windowed = full = s / causal
    freq, skip = m.linear_attention_freq, m.window_attn_skip_freq
    total = 0.0
    for number in range(1, m.num_layers + 1):
        if m.experimental_attention_variant is not None and number % (freq or number + 1):
            continue  # a Gated DeltaNet layer
        total += windowed if m.window_size is not None and number % (skip or number + 1) else full
    return total / m.num_layers


def score_bytes(m: ModelConfig) -> tuple[float, float]:
    """Unfused attention's bytes per score (one query and one key of one head), 2-byte elements:
    (read and written in a layer's forward and backward, saved for the backward). Forward: the
    QK GEMM writes the scores, the scale-mask-softmax kernel reads them and writes the
    probabilities, the PV GEMM reads them (8); backward: the probabilities' gradient written, the
    probabilities read for the values' gradient, both read and the scores' gradient written by the
    softmax backward, which the Q and K gradients' GEMMs read (14). Attention dropout reads the
    probabilities and writes them dropped with a 1-byte mask, and backward reads and writes the
    gradient with the mask (5 each way). Saved: the softmax output, and with dropout its mask and
    dropped output (Korthikanti et al. 2022, arXiv 2205.05198 section 4.1: 5as^2b per layer).
    The passes of the fused scale-mask-softmax kernel that Transformer Engine's unfused attention
    and Megatron-LM's ran; without it (torch's ops, the softmax in FP32) they multiply: Megatron-
    Core's local attention without TE or Apex took 65.5 ms a layer on an H200 at the Llama 3 8B
    proxy's shape (BENCHMARKS.md, GPU figures), where these bytes price 14.6 ms."""
    dropout = m.attention_dropout > 0
    return (32.0, 5.0) if dropout else (22.0, 2.0)


def scored_keys(m: ModelConfig) -> float:
    """Keys each query of each head scores, on average over the layers, as the configured kernel
    computes them (`attention_share` with `kernel`): s in an unfused softmax layer."""
    return (m.seq_length + 1) / 2 * attention_share(m, kernel=True)


def saved_scores(m: ModelConfig) -> float:
    """Bytes per token a layer's unfused attention saves for its backward (inside the TP region,
    averaged over the layers: Gated DeltaNet layers have none); 0 for flash and fused kernels."""
    if m.attention_backend != "unfused":
        return 0.0
    return score_bytes(m)[1] * m.num_attention_heads * scored_keys(m)


def gated_delta_net(m: ModelConfig) -> tuple[int, int]:
    """(matmul weights, the rest) of one Gated DeltaNet block, its input norm included: in_proj
    (q, k, v, the output gate z, beta and alpha per value head), out_proj; the causal
    convolution over q, k and v, A_log, dt_bias and the gated output norm."""
    h = m.hidden_size
    qk = m.linear_key_head_dim * m.linear_num_key_heads
    v = m.linear_value_head_dim * m.linear_num_value_heads
    mm = h * (2 * qk + 2 * v + 2 * m.linear_num_value_heads) + v * h
    conv = (2 * qk + v) * m.linear_conv_kernel_dim
    other = norm(m, h) + conv + 2 * m.linear_num_value_heads + m.linear_value_head_dim
    return mm, other


def softmax_attention(m: ModelConfig) -> tuple[int, int]:
    """(matmul weights, norms and biases) of one softmax attention block, its input norm
    included; the output gate (attention_output_gate) adds a gate per query channel."""
    h, heads = m.hidden_size, m.num_attention_heads
    other = norm(m, h)
    if m.multi_latent_attention:
        qk = m.qk_head_dim + m.qk_pos_emb_head_dim
        if m.q_lora_rank:  # queries through a low-rank bottleneck with its own norm
            mm = h * m.q_lora_rank + m.q_lora_rank * heads * qk
            other += norm(m, m.q_lora_rank)
        else:
            mm = h * heads * qk
        mm += h * (m.kv_lora_rank + m.qk_pos_emb_head_dim)  # compressed KV + shared rope key
        mm += m.kv_lora_rank * heads * (m.qk_head_dim + m.v_head_dim) + heads * m.v_head_dim * h
        return mm, other + norm(m, m.kv_lora_rank)
    d = head_dim(m)
    hq, hkv = heads * d, (m.num_query_groups or heads) * d
    mm = h * (hq + 2 * hkv) + hq * h + (h * hq if m.attention_output_gate else 0)
    if m.add_bias_linear or m.add_qkv_bias:
        other += hq + 2 * hkv
    if m.add_bias_linear:
        other += h
    if m.qk_layernorm:
        other += 2 * norm(m, d)
    return mm, other


def mlp(m: ModelConfig, ffn: int) -> tuple[int, int]:
    """(matmul weights, biases) of an MLP of width ffn; SwiGLU has a gate and an up projection."""
    gated = is_gated(m)
    bias = ((2 if gated else 1) * ffn + m.hidden_size) if m.add_bias_linear else 0
    return (3 if gated else 2) * m.hidden_size * ffn, bias


def num_dense_layers(m: ModelConfig) -> int:
    """Decoder layers with a dense MLP: all of them, or an MoE model's first k."""
    return min(m.moe_first_k_dense_layers, m.num_layers) if m.num_moe_experts else m.num_layers


def first_moe_layer(m: ModelConfig) -> int:
    """Index of the first MoE decoder layer (past the last layer for a dense model). An MTP layer
    counts as layer `num_layers`: it is of the decoder's last kind."""
    return num_dense_layers(m) if m.num_moe_experts else m.num_layers + 1


def saved_input_bytes(fp8_recipe: str | None) -> float:
    """Bytes per element of the input a linear layer saves for its weight gradient: BF16 without
    FP8; with it, Transformer Engine keeps only the quantized copy its wgrad GEMM reads: one byte
    per element (per-tensor scaling), plus a scale per block (MXFP8: an E8M0 byte per 32;
    blockwise: an FP32 per 128); NVFP4's wgrad GEMM runs in NVFP4 too (TE's NVFP4BlockScaling,
    backward_override None): 4 bits plus an E4M3 scale per 16."""
    if fp8_recipe is None:
        return 2.0
    return {"mxfp8": 1 + 1 / 32, "blockwise": 1 + 4 / 128, "nvfp4": 0.5 + 1 / 16}.get(
        fp8_recipe, 1.0
    )


def layer_activations(m: ModelConfig, moe: bool, lin: float) -> tuple[float, float]:
    """Bytes per token one layer saves for its backward: (outside, inside) the TP regions.

    Without sequence parallel the outside part is replicated on every TP rank, with it everything
    is split. `lin` is the bytes of a saved linear-layer input element (saved_input_bytes).
    Korthikanti's standard GPT (GELU, ffn 4h, MHA, dropout, BF16) gives outside 10h, inside 24h:
      outside: norm inputs 2 x 2h + dropout masks 2 x h + QKV input 2h + fc1 input 2h = 10h
      inside:  Q, K, V 3 x 2h + attention output 2h + GELU input 8h + fc2 input 8h = 24h
    """
    h = m.hidden_size
    # norm inputs; 1-byte dropout masks
    outside: float = 4 * h + (2 * h if m.hidden_dropout > 0 else 0)
    heads = m.num_attention_heads
    # The attention kernel keeps its BF16 output for its own backward; the output projection
    # saves that same tensor in BF16, but its own FP8 copy under FP8.
    out = 2 if lin == 2 else 2 + lin
    if m.multi_latent_attention:
        ql, kvl, rope = m.q_lora_rank or 0, m.kv_lora_rank, m.qk_pos_emb_head_dim
        # Down projections' input; q and kv latents (norm inputs and up projections' inputs).
        outside += lin * h + (2 + lin) * ql + 2 * (kvl + rope) + lin * kvl
        qk = m.qk_head_dim + rope
        inside: float = 2 * heads * (2 * qk + m.v_head_dim) + out * heads * m.v_head_dim
    else:
        d = head_dim(m)
        hq, hkv = heads * d, (m.num_query_groups or heads) * d
        outside += lin * h
        inside = 2 * (hq + 2 * hkv) + out * hq + (2 * (hq + hkv) if m.qk_layernorm else 0)
    inside += saved_scores(m)
    act = 2 if is_gated(m) else 1  # the fc1 output the activation saves
    if moe:
        topk, fe = m.moe_router_topk, m.moe_ffn_hidden_size or m.ffn_hidden_size
        outside += 2 * h + 4 * (
            m.num_moe_experts or 0
        )  # router input (BF16) and FP32 routing scores
        # each token visits top-k experts (what token dropping pads or drops: expert_share)
        inside += topk * expert_share(m) * (lin * h + 2 * act * fe + lin * fe)
        fs = m.moe_shared_expert_intermediate_size or 0
        inside += 2 * act * fs + lin * fs
    else:
        outside += lin * h
        inside += 2 * act * m.ffn_hidden_size + lin * m.ffn_hidden_size
    return outside, inside


def expert_share(m: ModelConfig) -> float:
    """The rows the experts compute, as a share of a microbatch's top-k token copies: token
    dropping pads every expert to its capacity (factor x its even share) or drops what exceeds it,
    which the published runs' even routing (moe_router_force_load_balancing) never reaches."""
    factor = m.moe_expert_capacity_factor
    if factor is None:
        return 1.0
    return factor if m.moe_pad_expert_input_to_capacity else min(1.0, factor)


def discarded(m: ModelConfig, moe: bool, lin: float) -> tuple[float, float]:
    """Bytes per token of a layer's saved activations that selective recompute frees and rebuilds
    in the backward: (outside, inside) the TP regions, as layer_activations counts them.

    core_attn frees the unfused attention's saved scores (the fused kernels save none);
    mla_up_proj the up-projected queries, keys and values and the up projections' inputs;
    layernorm the outputs of the norms that stand alone (Transformer Engine fuses the others into
    the next linear layer, and Megatron-Core has nothing to recompute there): MLA's input norm
    (the down projections' input) and an MoE layer's pre-MLP norm (the router's input);
    mlp a dense layer's FC1 output and FC2 input (the checkpoint keeps its BF16 input in place of
    FC1's); moe_act the experts' FC2 input; shared_experts theirs; moe the whole expert part and
    the routing scores."""
    modules = selective_modules(m)
    h, act = m.hidden_size, 2 if is_gated(m) else 1
    outside = 0.0
    inside = saved_scores(m) if "core_attn" in modules else 0.0
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
        return outside + 4 * (m.num_moe_experts or 0), inside + topk * (
            lin * h + 2 * act * fe + lin * fe
        ) + (2 * act * fs + lin * fs)
    if "moe_act" in modules:
        inside += topk * lin * fe
    if "shared_experts" in modules:
        inside += 2 * act * fs + lin * fs
    return outside, inside


def walk(
    chunks: Sequence[Sequence[str]],
    pp: int,
    first_moe: int,
    num_layers: int,
    recompute: tuple[str | None, str | None, int],
) -> Iterator[tuple[int, int, str, bool, bool]]:
    """(pipeline rank, virtual stage, slot, MoE, fully recomputed) of every slot of the layout.

    Chunk i is virtual stage i // PP of rank i % PP (Megatron-Core's vp_stage x PP + pp_rank).
    A slot is "E", "L", "t" or "m" (config/layout.py); MoE and recompute are False for "E" and
    "L". `first_moe` is first_moe_layer's index; `recompute` is (granularity, method, layers):
    block recompute covers the first `layers` layers of each chunk, uniform every layer. Plain
    tuples: the planner walks layouts by the thousand.
    """
    granularity, method, group = recompute
    full = granularity == "full"
    block = method == "block"
    layer = 0
    for index, chunk in enumerate(chunks):
        rank, stage, in_chunk = index % pp, index // pp, 0
        for c in chunk:
            if c == "E" or c == "L":
                yield rank, stage, c, False, False
                continue
            moe = (layer if c == "t" else num_layers) >= first_moe
            layer += c == "t"
            recomputed = full and (not block or in_chunk < group)
            in_chunk += 1
            yield rank, stage, c, moe, recomputed


@lru_cache(maxsize=4096)
def rank_loads(
    chunks: tuple[tuple[str, ...], ...],
    pp: int,
    first_moe: int,
    num_layers: int,
    recompute: tuple[str | None, str | None, int],
) -> tuple[tuple[float, ...], ...]:
    """Per pipeline rank: (dense, moe, dense recomputed, moe recomputed, mtp, embedding, output,
    dense selective, moe selective) layer counts, from the chunks and the recompute fields."""
    loads = [[0.0] * 9 for _ in range(pp)]
    selective = recompute[0] == "selective"
    for rank, _, c, is_moe, full in walk(chunks, pp, first_moe, num_layers, recompute):
        load = loads[rank]
        if c == "E":
            load[5] += 1
        elif c == "L":
            load[6] += 1
        else:
            load[(1 if is_moe else 0) + (2 if full else 0)] += 1
            load[4] += c == "m"
            load[8 if is_moe else 7] += selective
    return tuple(tuple(load) for load in loads)


def model_rank_loads(
    model: ModelConfig, chunks: Sequence[Sequence[str]], pp: int, recompute: tuple
) -> tuple[tuple[float, ...], ...]:
    """rank_loads for `model` split into `chunks` over `pp` ranks, with `recompute` its
    (granularity, method, number of layers) fields as the config holds them (None layers: 1)."""
    granularity, method, count = recompute
    steps = (granularity, method, count or 1)
    walked = tuple(map(tuple, chunks))
    return rank_loads(walked, pp, first_moe_layer(model), model.num_layers, steps)


@lru_cache(maxsize=256)
def remote_domains(experts: int, topk: int, groups: int, group_topk: int, domains: int) -> float:
    """How many NVLink domains besides its own one token's top-k experts lie in, on average:
    DeepEP and HybridEP (the flex dispatcher) send a token over the network once per such domain
    and fan it out over NVLink there. The EP group's experts fill `domains` domains in order.
    Megatron-Core's group-limited routing (DeepSeek-V3's node-limited one) picks `group_topk` of
    `groups` contiguous expert groups by their best scores, then the top k experts among theirs:
    taken here as any groups alike, the best expert of each picked group among the k, the other
    k - group_topk alike among the groups' rest (tests/unit/config/test_moe_overlap.py holds this against
    Megatron-Core's router on random scores, what moe_router_force_load_balancing routes by)."""
    if domains <= 1:
        return 0.0
    size, span = experts // groups, experts // domains

    def overlap(g: int, d: int) -> int:
        return max(0, min((g + 1) * size, (d + 1) * span) - max(g * size, d * span))

    picks = list(combinations(range(groups), group_topk))
    rest, more = group_topk * (size - 1), max(0, topk - group_topk)  # after each group's best
    touched = 0.0
    for chosen in picks:
        for d in range(domains):
            missed = 1.0  # no group's best lies in d, and none of the others
            for g in chosen:
                missed *= 1 - overlap(g, d) / size
            if missed:
                inside = sum(overlap(g, d) for g in chosen)
                missed *= comb(rest - inside, more) / comb(rest, more)
            touched += 1 - missed
    return touched / len(picks) * (domains - 1) / domains


def lora_parameters(cfg: TrainingConfig, moe: bool) -> float:
    """Adapter parameters of one layer on one TP rank (peft.scheme=lora, training/lora.py).

    A column-parallel layer keeps A [rank, in] whole and splits B [out / TP, rank]; a row-parallel
    one splits A [rank, in / TP] and keeps B [out, rank] whole. The MLP's layers exist in a MoE
    layer only as its shared expert (routed experts are not adapted).
    """
    m, tp, rank = cfg.model, cfg.parallel.tensor_model_parallel_size, cfg.peft.rank
    d = head_dim(m)
    hq = m.num_attention_heads * d
    qkv = hq + 2 * (m.num_query_groups or m.num_attention_heads) * d
    ffn = m.moe_shared_expert_intermediate_size if moe else m.ffn_hidden_size
    gated = 2 if is_gated(m) else 1
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


def local_experts(m: ModelConfig, par: ParallelConfig) -> int:
    """The experts of each MoE layer one GPU holds: num_moe_experts over EP (0 without experts).
    The one count of them the step-time model prices launches and host waits by."""
    return (m.num_moe_experts or 0) // par.expert_model_parallel_size


def host_waits(m: ModelConfig) -> bool:
    """Whether the MoE layers wait on the host for their token counts: Megatron-Core's dropless
    alltoall dispatcher syncs before its exchange (token_dispatcher.py, cuda_sync_point
    before_ep_alltoall); padded token dropping knows every shape on the host."""
    alltoall = m.moe_token_dispatcher_type == "alltoall"
    return bool(m.num_moe_experts) and alltoall and not m.moe_pad_expert_input_to_capacity
