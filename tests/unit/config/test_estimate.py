"""Parameter counts, FLOPs and the memory estimate: worked by hand and calibrated on published runs.

Every published layout (tests/support/published_runs.py) ran on 80 GB H100s (79.2 GiB in
config/hardware.py), so the estimate must predict that each fits (test_estimate_published.py).
Architectures are written out here rather than taken from models/, so that these tests pin the
estimator alone. The published performance runs reduce
gradients in BF16 (NeMo / Megatron-Bridge performance configs set grad_reduce_in_fp32=False), and
so do these configs.
"""

from __future__ import annotations

import copy

import pytest

from config.cost.memory import (
    GIB,
    OVERHEAD_GIB,
    _in_flight,
    count_parameters,
    estimate_memory,
    model_flops_per_token,
)
from config.hardware import GPUS, Cluster
from config.rules import derive
from config.schema import (
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    TrainConfig,
    TrainingConfig,
    VisionConfig,
)
from config.tree import ConfigError

H100_GIB = GPUS["h100"].memory_gib


def config(
    model: ModelConfig, *, gbs: int, mbs: int = 1, precision: str = "bf16_mixed", **parallel
) -> TrainingConfig:
    parallel.setdefault("grad_reduce_in_fp32", False)
    return TrainingConfig(
        name="test",
        model=copy.deepcopy(model),  # tests change models in place
        parallel=ParallelConfig(**parallel),
        precision=precision,
        train=TrainConfig(global_batch_size=gbs, micro_batch_size=mbs),
    )


def estimate(cfg: TrainingConfig, gpus: int, gpu: str = "h100"):
    cluster = Cluster(num_nodes=max(1, gpus // 8), gpus_per_node=min(gpus, 8), gpu=gpu)
    return estimate_memory(cfg, cluster, derive(cfg, cluster))


def llama(layers: int, hidden: int, ffn: int, heads: int, seq: int = 8192) -> ModelConfig:
    return ModelConfig(
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=ffn,
        num_attention_heads=heads,
        num_query_groups=8,
        seq_length=seq,
        vocab_size=128256,
        rotary_base=500000,
    )


LLAMA3_8B = llama(32, 4096, 14336, 32)
LLAMA3_70B = llama(80, 8192, 28672, 64)
LLAMA31_405B = llama(126, 16384, 53248, 128)
QWEN3_30B_A3B = ModelConfig(
    num_layers=48,
    hidden_size=2048,
    ffn_hidden_size=6144,
    num_attention_heads=32,
    num_query_groups=4,
    kv_channels=128,
    seq_length=4096,
    vocab_size=151936,
    qk_layernorm=True,
    num_moe_experts=128,
    moe_router_topk=8,
    moe_ffn_hidden_size=768,
    moe_grouped_gemm=True,
)
DEEPSEEK_V3 = ModelConfig(
    num_layers=61,
    hidden_size=7168,
    ffn_hidden_size=18432,
    num_attention_heads=128,
    seq_length=4096,
    vocab_size=129280,
    multi_latent_attention=True,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_head_dim=128,
    qk_pos_emb_head_dim=64,
    v_head_dim=128,
    num_moe_experts=256,
    moe_router_topk=8,
    moe_ffn_hidden_size=2048,
    moe_shared_expert_intermediate_size=2048,
    moe_first_k_dense_layers=3,
    moe_router_score_function="sigmoid",
    mtp_num_layers=1,
    moe_grouped_gemm=True,
)

# name -> (config, GPUs). Layouts and precisions of the published runs.
PUBLISHED = {
    "llama31_8b": (config(LLAMA3_8B, gbs=128, context_parallel_size=2), 8),
    "llama3_70b": (
        config(
            LLAMA3_70B,
            gbs=256,
            precision="bf16_with_fp8_current_scaling_mixed",
            tensor_model_parallel_size=4,
            pipeline_model_parallel_size=8,
            virtual_pipeline_model_parallel_size=5,
            sequence_parallel=True,
        ),
        64,
    ),
    "llama31_405b": (
        config(
            LLAMA31_405B,
            gbs=1536,
            precision="bf16_with_fp8_current_scaling_mixed",
            tensor_model_parallel_size=8,
            pipeline_model_parallel_size=8,
            virtual_pipeline_model_parallel_size=8,
            context_parallel_size=2,
            sequence_parallel=True,
        ),
        1024,
    ),
    "qwen3_30b_a3b": (
        config(
            QWEN3_30B_A3B,
            gbs=1024,
            precision="bf16_with_fp8_current_scaling_mixed",
            expert_model_parallel_size=16,
        ),
        16,
    ),
    "deepseek_v3": (
        config(
            DEEPSEEK_V3,
            gbs=8192,
            precision="bf16_with_fp8_subchannel_scaling_mixed",
            tensor_model_parallel_size=2,
            pipeline_model_parallel_size=8,
            virtual_pipeline_model_parallel_size=4,
            expert_model_parallel_size=64,
            expert_tensor_parallel_size=1,
            sequence_parallel=True,
        ),
        1024,
    ),
}


# ---------------------------------------------------------------- parameter counts


@pytest.mark.parametrize(
    ("model", "published"),
    [(LLAMA3_8B, 8.03e9), (LLAMA3_70B, 70.6e9), (LLAMA31_405B, 405.9e9)],
)
def test_dense_parameter_counts_match_the_model_cards(model: ModelConfig, published: float) -> None:
    count = count_parameters(config(model, gbs=8))
    assert count.total == pytest.approx(published, rel=0.01)
    assert count.active_per_token == count.total


def test_llama3_8b_count_exactly() -> None:
    count = count_parameters(config(LLAMA3_8B, gbs=8))
    # q, o 4096^2 each; k, v 4096 x 1024 each; SwiGLU 3 x 4096 x 14336; two RMSNorms of 4096.
    assert count.dense_per_layer == 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert count.embedding == count.output == 128256 * 4096
    assert count.total == 8_030_261_248  # Meta's Llama-3.1-8B safetensors hold exactly this many


def test_qwen3_moe_total_and_active() -> None:
    count = count_parameters(config(QWEN3_30B_A3B, gbs=8))
    assert count.total == pytest.approx(30.5e9, rel=0.02)
    assert count.active_per_token == pytest.approx(3.3e9, rel=0.03)
    assert count.num_moe_layers == 48 and count.num_dense_layers == 0


def test_deepseek_v3_total_active_and_mtp() -> None:
    count = count_parameters(config(DEEPSEEK_V3, gbs=8))
    assert count.total - count.mtp == pytest.approx(671e9, rel=0.01)
    assert count.active_per_token == pytest.approx(37e9, rel=0.03)
    assert (count.num_dense_layers, count.num_moe_layers) == (3, 58)
    # The model card's ~14B MTP module carries its own copy of the embedding and output head
    # (2 x 0.93B); Megatron shares them with the main model, leaving one MoE layer + projection.
    assert count.mtp == pytest.approx(11.7e9, rel=0.02)
    assert count.mtp + 2 * 129280 * 7168 == pytest.approx(13.6e9, rel=0.02)


def test_tied_embeddings_count_once() -> None:
    tied = ModelConfig(
        num_layers=16,
        hidden_size=2048,
        ffn_hidden_size=8192,
        num_attention_heads=32,
        num_query_groups=8,
        seq_length=8192,
        vocab_size=128256,
        share_embeddings_and_output_weights=True,
    )
    count = count_parameters(config(tied, gbs=8))
    assert count.output == 0
    assert count.total == pytest.approx(1.24e9, rel=0.01)  # Llama 3.2 1B


def test_clip_vit_l_336_vision_encoder() -> None:
    vision = VisionConfig(
        num_layers=24, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16
    )
    with_vision = ModelConfig(
        arch="llava",
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=11008,
        num_attention_heads=32,
        seq_length=4096,
        vocab_size=32000,
        vision=vision,
    )
    count = count_parameters(config(with_vision, gbs=8))
    projector = 1024 * 4096 + 4096 + 4096 * 4096 + 4096  # two-layer MLP into the LM's hidden size
    assert (
        count.vision - projector == 303_507_456
    )  # HF CLIPVisionModel (openai/clip-vit-large-patch14-336)


# ---------------------------------------------------------------- FLOPs


def test_flops_llama3_8b_by_hand() -> None:
    # Matmul weights per layer: q, o 4096^2; k, v 4096 x 1024; SwiGLU 3 x 4096 x 14336.
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336  # 218,103,808
    matmul = 32 * per_layer + 128256 * 4096  # + output layer = 7,504,658,432 (~7.5B)
    attention = 6 * 32 * 4096 * 8192  # causal: half of 12 L h s
    flops = model_flops_per_token(config(LLAMA3_8B, gbs=8))
    assert flops == 6 * matmul + attention == 51_470_401_536


def test_8b_published_throughput_is_523_tflops() -> None:
    flops = model_flops_per_token(config(LLAMA3_8B, gbs=8))
    assert 10_150 * flops / 1e12 == pytest.approx(523, rel=0.05)  # published: ~523 causal


def test_flops_mla_attention_term() -> None:
    # Only the attention term grows with the sequence: 3 x (61 layers + 1 MTP) x 128 heads
    # x (q/k head dim 128 + 64 rope + v head dim 128) per token.
    short, long = config(DEEPSEEK_V3, gbs=8), config(DEEPSEEK_V3, gbs=8)
    long.model.seq_length = 8192
    growth = model_flops_per_token(long) - model_flops_per_token(short)
    assert growth == 3 * 62 * 128 * (192 + 128) * (8192 - 4096)


# tokens/s/GPU and model TFLOPS/GPU of the published layouts (causal formula).
THROUGHPUT = {
    "llama31_8b": (10_150, 523),
    "llama3_70b": (1_633, 734),
    "llama31_405b": (326, 822),
    "qwen3_30b_a3b": (8_960, 206),
    "deepseek_v3": (1_297, 338),
}


@pytest.mark.parametrize("name", list(THROUGHPUT))
def test_flops_reproduce_published_tflops(name: str) -> None:
    """tokens/s x FLOPs/token gives the published TFLOPS: dense, GQA, MoE top-k, MLA and MTP."""
    tokens_per_s, tflops = THROUGHPUT[name]
    flops = model_flops_per_token(PUBLISHED[name][0])
    assert tokens_per_s * flops / 1e12 == pytest.approx(tflops, rel=0.01)


# ---------------------------------------------------------------- memory by hand

TINY = ModelConfig(
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=256,
    num_attention_heads=4,
    seq_length=128,
    vocab_size=1000,
)


def test_memory_small_dense_model_by_hand() -> None:
    """2 layers, hidden 64, SwiGLU ffn 256, MHA 4 heads, seq 128, MBS 2, one GPU, FP32 grads.

    Vocab 1000 pads to 1024 (multiple of 128 x TP 1).
    Params: layer = attention 4 x 64^2 = 16384 + SwiGLU 3 x 64 x 256 = 49152 + 2 norms 128
            = 65664; 2 layers 131328 + embedding 65536 + output 65536 + final norm 64 = 262464.
    Weights 2 B = 524928; grads FP32 4 B = 1049856; Adam 12 B / DP 1 = 3149568.
    Activations per token per layer (bytes; TP 1, no dropout):
      norm inputs 2 x 128 + QKV input 128 + Q, K, V 3 x 128 + attention output 128
      + fc1 input 128 + SwiGLU input 2 x 2 x 256 = 1024 + fc2 input 2 x 256 = 512  = 2560 (40h:
      the 34h of Korthikanti's GELU layer, less 2h of dropout masks, plus 8h for the SwiGLU gate)
      tokens 128 x 2 = 256: per layer 655360, two layers 1310720, one microbatch in flight.
    Logits: 256 tokens x 1024 x (4 + 4 + 2) = 2621440 in Megatron-Core's fused loss on a GPU (two
    FP32 tensors beside the BF16 logits, as Megatron-LM measured: test_memory_measured.py); x 6 =
    1572864 in its unfused loss on the CPU (one FP32 copy); x 2 = 524288 in TE's fused loss on a
    GPU (model.cross_entropy_fusion_impl=te), which works on the BF16 logits in place.
    """
    cfg = config(TINY, gbs=4, mbs=2, grad_reduce_in_fp32=True)
    mem = estimate(cfg, gpus=1)
    assert mem is not None
    assert mem.params_per_gpu == 262464
    assert mem.weights_gib * GIB == pytest.approx(524928)
    assert mem.gradients_gib * GIB == pytest.approx(1049856)
    assert mem.optimizer_gib * GIB == pytest.approx(3149568)
    assert mem.activations_gib * GIB == pytest.approx(1310720)
    assert mem.logits_gib * GIB == pytest.approx(2621440)
    assert mem.microbatches_in_flight == 1 and mem.pipeline_rank == 0
    total = 524928 + 1049856 + 3149568 + 1310720 + 2621440
    assert mem.total_gib == pytest.approx(total / GIB + OVERHEAD_GIB)
    unfused = estimate(cfg, gpus=1, gpu="cpu")
    assert unfused is not None and unfused.logits_gib * GIB == pytest.approx(1572864)
    cfg.model.cross_entropy_fusion_impl = "te"
    te = estimate(cfg, gpus=1)
    assert te is not None and te.logits_gib * GIB == pytest.approx(524288)


def test_memory_pipeline_2_data_parallel_2_by_hand() -> None:
    """4 layers of TINY's shape on 4 GPUs: PP 2, DP 2, GBS 8, MBS 1 -> 4 microbatches, BF16 grads.

    Rank 0 holds E + 2 layers: 65536 + 2 x 65664 = 196864 params.
    Rank 1 holds 2 layers + final norm + L: 131328 + 64 + 65536 = 196928 params.
    Bytes per param: weights 2 + BF16 grads 2 + Adam 12 / DP 2 = 10.
    Activations: 128 tokens x 2560 B x 2 layers = 655360 per microbatch;
      rank 0 keeps min(PP - 0, 4) = 2 microbatches -> 1310720, rank 1 keeps 1 -> 655360,
      plus the logits on rank 1: 128 x 1024 x 6 = 786432 (train.device=cpu: the unfused loss).
    Rank 0: 1968640 + 1310720 = 3279360; rank 1: 1969280 + 655360 + 786432 = 3411072: rank 1 wins.
    """
    model = ModelConfig(
        num_layers=4,
        hidden_size=64,
        ffn_hidden_size=256,
        num_attention_heads=4,
        seq_length=128,
        vocab_size=1000,
    )
    cfg = config(model, gbs=8, pipeline_model_parallel_size=2)
    cfg.train.device = "cpu"
    mem = estimate(cfg, gpus=4)
    assert mem is not None
    assert mem.pipeline_rank == 1 and mem.params_per_gpu == 196928
    assert mem.microbatches_in_flight == 1
    assert (mem.weights_gib + mem.gradients_gib + mem.optimizer_gib) * GIB == pytest.approx(1969280)
    assert mem.activations_gib * GIB == pytest.approx(655360)
    assert mem.logits_gib * GIB == pytest.approx(786432)
    assert (mem.total_gib - OVERHEAD_GIB) * GIB == pytest.approx(3411072)
    assert mem.step_gib * GIB == pytest.approx(4 * 196928 / 2)  # below activations + logits


def test_memory_at_the_optimizer_step_by_hand() -> None:
    """TINY at seq 16 on one GPU, BF16 gradients: the step's FP32 gradient copies, 4 x 262464 =
    1049856 B, outweigh activations (2560 x 32 tokens x 2 layers = 163840) and logits (TE's loss:
    32 x 1024 x 2 = 65536), so the peak is 2 + 2 + 12 + 4 bytes a parameter. FP32 gradients
    are handed over as they are (no copy); Megatron-FSDP is left out (not measured)."""
    model = copy.deepcopy(TINY)
    model.seq_length, model.cross_entropy_fusion_impl = 16, "te"
    mem = estimate(config(model, gbs=4, mbs=2), gpus=1)
    assert mem is not None and mem.step_gib * GIB == pytest.approx(4 * 262464)
    assert (mem.activations_gib + mem.logits_gib) * GIB == pytest.approx(163840 + 65536)
    assert (mem.total_gib - OVERHEAD_GIB) * GIB == pytest.approx(20 * 262464)
    fp32 = estimate(config(model, gbs=4, mbs=2, grad_reduce_in_fp32=True), gpus=1)
    assert fp32 is not None and fp32.step_gib == 0
    assert (fp32.total_gib - OVERHEAD_GIB) * GIB == pytest.approx(18 * 262464 + 163840 + 65536)


def test_standard_gpt_layer_is_34_sbh() -> None:
    """Korthikanti's GPT layer (GELU, ffn 4h, MHA, dropout) saves 34 s b h bytes with SP, 10 + 24/TP without."""
    gpt = ModelConfig(
        num_layers=1,
        hidden_size=256,
        ffn_hidden_size=1024,
        num_attention_heads=4,
        seq_length=512,
        vocab_size=128,
        activation="gelu",
        normalization="LayerNorm",
        hidden_dropout=0.1,
    )
    for sp, per_token in ((True, 34 * 256 / 4), (False, (10 + 24 / 4) * 256)):
        mem = estimate(
            config(gpt, gbs=1, tensor_model_parallel_size=4, sequence_parallel=sp), gpus=4
        )
        assert mem.activations_gib * GIB == pytest.approx(512 * per_token)


def test_interleaved_first_rank_holds_korthikanti_microbatches() -> None:
    # PP x (1 + (PP - 1) / (PP x VPP)) = PP + (PP - 1) / VPP microbatches' worth on rank 0.
    for pp, vpp in ((4, 2), (8, 5), (8, 8)):
        assert sum(_in_flight(pp, vpp, 0, 64)) / vpp == pytest.approx(pp + (pp - 1) / vpp)
    assert _in_flight(4, 1, 1, 64) == [3] and _in_flight(4, 1, 0, 2) == [2]


def test_full_recompute_keeps_layer_inputs() -> None:
    plain = config(TINY, gbs=4, mbs=2)
    full = config(TINY, gbs=4, mbs=2)
    full.model.recompute_granularity, full.model.recompute_method = "full", "uniform"
    full.model.recompute_num_layers = 1
    # Each of the 2 layers keeps its 2h input (256 tokens x 128 B), plus one layer's 655360 B
    # rebuilt during its backward.
    assert estimate(full, 1).activations_gib * GIB == pytest.approx(2 * 256 * 128 + 655360)
    assert estimate(full, 1).activations_gib < estimate(plain, 1).activations_gib


def test_frozen_vision_needs_weights_only() -> None:
    vision = VisionConfig(
        num_layers=24, hidden_size=1024, ffn_hidden_size=4096, num_attention_heads=16
    )
    model = ModelConfig(
        arch="llava",
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=11008,
        num_attention_heads=32,
        seq_length=4096,
        vocab_size=32000,
        activation="swiglu",
        vision=vision,
    )
    cfg = config(model, gbs=8, tensor_model_parallel_size=2)
    # arch llava trains on Energon data (the checker wants it named); the estimate reads none of it.
    cfg.data.kind, cfg.data.path, cfg.data.tokenizer = "energon", "vlm", "tokenizer"
    frozen = estimate(cfg, 8)
    cfg.model.vision.freeze_vision = False
    trained = estimate(cfg, 8)
    assert frozen.params_per_gpu == trained.params_per_gpu
    assert (
        frozen.gradients_gib < trained.gradients_gib
        and frozen.activations_gib < trained.activations_gib
    )


def test_invalid_config_gives_no_estimate_and_cpu_gives_a_number() -> None:
    """The estimate takes a complete Derived: an invalid config derives none, and says why."""
    with pytest.raises(ConfigError, match="train.global_batch_size: 4 is not divisible"):
        estimate(config(TINY, gbs=4, mbs=2), gpus=3)  # 3 GPUs, GBS 4: DP 3 does not divide it
    mem = estimate(config(TINY, gbs=4, mbs=2), gpus=1, gpu="cpu")
    assert mem.total_gib > 0


def test_70b_on_one_node_without_model_parallel_does_not_fit() -> None:
    mem = estimate(config(LLAMA3_70B, gbs=128), gpus=8)
    assert mem is not None and mem.total_gib > 2 * H100_GIB
    assert mem.params_per_gpu == count_parameters(config(LLAMA3_70B, gbs=8)).total


def test_distributed_optimizer_saves_twelve_bytes_over_dp() -> None:
    cfg = config(LLAMA3_8B, gbs=128, context_parallel_size=2)
    sharded = estimate(cfg, 8)
    cfg.optimizer = OptimizerConfig(use_distributed_optimizer=False)
    whole = estimate(cfg, 8)
    params = sharded.params_per_gpu
    assert sharded.optimizer_gib * GIB == pytest.approx(12 * params / 8)  # DP 4 x CP 2
    assert whole.optimizer_gib * GIB == pytest.approx(12 * params)


def test_the_fp8_weight_copy_is_one_byte_only_where_fp8_gemms_take_any_layout() -> None:
    """TE caches each decoder weight's FP8 copy for the step: row- and column-wise on Hopper
    (its FP8 GEMMs are TN only), one copy for per-tensor scaling on Blackwell (TE's
    non_tn_fp8_gemm_supported: compute capability 10 and up); MXFP8 keeps both directions."""
    cfg = config(LLAMA3_8B, gbs=8, precision="bf16_with_fp8_current_scaling_mixed")
    mx = config(LLAMA3_8B, gbs=8, precision="bf16_with_mxfp8_mixed")
    hopper, blackwell = Cluster(1, 8, "h100"), Cluster(1, 8, "b200")

    def weights(c: TrainingConfig, cluster: Cluster) -> float:
        return estimate_memory(c, cluster, derive(c, cluster)).weights_gib

    decoder = LLAMA3_8B.num_layers * count_parameters(cfg).dense_per_layer / 2**30
    assert weights(cfg, hopper) - weights(cfg, blackwell) == pytest.approx(decoder)
    assert weights(mx, blackwell) - weights(cfg, blackwell) == pytest.approx(decoder * 17 / 16)
