"""The models NVIDIA published pretraining throughputs of (bench/data/published_perf.csv), as the
catalog recipes bench/published_table.py prices them with: a recipe whose preset is the model, or
one with the model's published architecture written out as overrides; and what some of the
software ran that the recipes do not say (the loss's fusion, Megatron-LM's of 2021)."""

from __future__ import annotations

import re

# The model names NVIDIA prints -> the catalog recipe whose model is that preset.
RECIPES = {
    "Llama 3 8B": "llama3_8b_pretrain",
    "Llama 3.1 8B": "llama3_8b_pretrain",
    "Llama 3 70B": "llama3_70b_pretrain",
    "Llama 3.1 70B": "llama3_70b_pretrain",
    "Llama 3.1 405B": "llama31_405b_pretrain",
    "DeepSeek-V3": "deepseek_v3_pretrain",
    "Qwen3 30B-A3B": "qwen3_30b_a3b_pretrain",
    "GPT-OSS 120B": "gpt_oss_120b_pretrain",
    "Mixtral 8x7B": "mixtral_8x7b_pretrain",
    "Qwen3 235B-A22B": "qwen3_30b_a3b_pretrain",  # with ARCHITECTURES' overrides
    # The models below too: each priced as this recipe with ARCHITECTURES' overrides.
    "Llama 2 7B": "llama3_8b_pretrain",
    "Llama 2 13B": "llama3_8b_pretrain",
    "Llama 2 70B": "llama3_8b_pretrain",
    "Nemotron-4 15B": "llama3_8b_pretrain",
    "Nemotron-4 340B": "llama3_8b_pretrain",
    "GPT-3 175B": "llama3_8b_pretrain",
    "Grok-1 314B": "mixtral_8x7b_pretrain",
}

# Megatron-LM's weak-scaling GPT models of April 2021 on A100s (NVIDIA/Megatron-LM README.md
# images/cases_april2021.png @ 50a4b5fa02, examples/sc21/run_table_1.sh @ 6985e58938): name ->
# (layers, hidden, heads); GPT-2's architecture (GELU 4x, LayerNorm, learned positions, biases,
# tied embeddings) with a vocabulary of 51,200.
GPT_2021 = {
    "GPT 1.7B": (24, 2304, 24), "GPT 3.6B": (30, 3072, 32), "GPT 7.5B": (36, 4096, 32),
    "GPT 18B": (40, 6144, 48), "GPT 39B": (48, 8192, 64), "GPT 76B": (60, 10240, 80),
    "GPT 145B": (80, 12288, 96), "GPT 310B": (96, 16384, 128), "GPT 530B": (105, 20480, 128),
    "GPT 1T": (128, 25600, 160),
}  # fmt: skip
RECIPES.update(dict.fromkeys(GPT_2021, "llama3_8b_pretrain"))

# The GPT models of JSC's Megatron-LM benchmark on JUWELS Booster (FZJ-JSC/jubench-megatron-lm
# DESCRIPTION.md and benchmark/jube/nlp_benchmark.yaml @ d79ae122f7): name -> (layers, hidden,
# heads); GPT-2's architecture and vocabulary (50,257) with rotary positions, an MLP of 4x.
GPT_JUBE = {"GPT 13B": (40, 5120, 32), "GPT 175B": (96, 12288, 96)}
RECIPES.update(dict.fromkeys(GPT_JUBE, "llama3_8b_pretrain"))

# What Megatron-LM of April 2021 ran in those runs (CONFIG.sh, run_table_1.sh: --fp16, full
# recompute of every layer, Megatron's unfused attention, its default dropout of 0.1), and what
# it did not have yet: sequence parallelism, the distributed optimizer.
MEGATRON_LM_2021 = [
    "parallel.sequence_parallel=false", "optimizer.use_distributed_optimizer=false",
    "model.recompute_granularity=full", "model.recompute_method=uniform",
    "model.recompute_num_layers=1", "model.attention_backend=unfused",
    "model.attention_dropout=0.1", "model.hidden_dropout=0.1",
]  # fmt: skip


# What Megatron-LM of October 2023 ran in JSC's JUBE benchmark (FZJ-JSC/jubench-megatron-lm
# benchmark/jube/nlp_benchmark.yaml @ d79ae122f7, Megatron-LM f772743329): flash attention,
# sequence parallelism, the distributed optimizer, selective recompute of the core attention; that
# release's defaults: gradients reduced and parameters gathered after the step's compute, not
# behind it (--overlap-grad-reduce, --overlap-param-gather unset), dropout 0.1.
MEGATRON_LM_2023 = [
    "optimizer.use_distributed_optimizer=true", "model.recompute_granularity=selective",
    "model.recompute_modules=core_attn", "parallel.overlap_grad_reduce=false",
    "parallel.overlap_param_gather=false", "model.attention_dropout=0.1",
    "model.hidden_dropout=0.1",
]  # fmt: skip


def megatron_lm_settings(software: str, notes: str) -> list[str]:
    """What the row's Megatron-LM ran: MEGATRON_LM_2023 for JSC's runs of 2023; for NVIDIA's of
    2021 MEGATRON_LM_2021 and the row's DDP: PyTorch's overlaps the gradients' all-reduce with the
    backward, Megatron's "local" one all-reduces them after it."""
    if software.startswith("Megatron-LM 23."):
        return list(MEGATRON_LM_2023)
    overlap = "--DDP-impl torch" in notes
    return [*MEGATRON_LM_2021, f"parallel.overlap_grad_reduce={str(overlap).lower()}"]


def _llama2(layers: int, hidden: int, ffn: int, heads: int, groups: int) -> list[str]:
    return [f"model.num_layers={layers}", f"model.hidden_size={hidden}",
            f"model.ffn_hidden_size={ffn}", f"model.num_attention_heads={heads}",
            f"model.num_query_groups={groups}", f"model.kv_channels={hidden // heads}",
            "model.vocab_size=32000"]  # fmt: skip


def _nemotron4(layers: int, hidden: int, heads: int) -> list[str]:
    return [f"model.num_layers={layers}", f"model.hidden_size={hidden}",
            f"model.ffn_hidden_size={4 * hidden}", f"model.num_attention_heads={heads}",
            "model.num_query_groups=8", f"model.kv_channels={hidden // heads}",
            "model.vocab_size=256000", "model.activation=gelu",
            "model.normalization=LayerNorm"]  # fmt: skip


# Models without a catalog recipe, priced as another recipe with their published architecture
# as overrides. Qwen3 235B-A22B: Qwen/Qwen3-235B-A22B config.json (hidden 4096, 94 layers, 64
# query heads of 128, 4 KV heads, 128 experts of moe_intermediate_size 1536, top-8), otherwise
# Qwen3 30B-A3B's (the same vocabulary, norms, router and RoPE base).
ARCHITECTURES = {
    "Qwen3 235B-A22B": [
        "model.num_layers=94",
        "model.hidden_size=4096",
        "model.ffn_hidden_size=12288",
        "model.num_attention_heads=64",
        "model.num_query_groups=4",
        "model.kv_channels=128",
        "model.moe_ffn_hidden_size=1536",
    ],
    # meta-llama/Llama-2-{7b,13b,70b}-hf config.json: RMSNorm, SwiGLU, RoPE, vocabulary 32,000.
    "Llama 2 7B": [*_llama2(32, 4096, 11008, 32, 32)],
    "Llama 2 13B": [*_llama2(40, 5120, 13824, 40, 40)],
    "Llama 2 70B": [*_llama2(80, 8192, 28672, 64, 8)],
    # Nemotron-4 15B (arXiv 2402.16819) and 340B (arXiv 2406.11704): squared-ReLU MLP of 4x
    # width, not gated, priced as GELU (the same GEMMs and saved tensors), LayerNorm, RoPE, GQA
    # with 8 KV heads, vocabulary 256,000, untied embeddings.
    "Nemotron-4 15B": [*_nemotron4(32, 6144, 48)],
    "Nemotron-4 340B": [*_nemotron4(96, 18432, 96)],
    # GPT-3 175B (Brown et al. 2020, Megatron-LM's gpt3 175B example): 96 layers of 12,288, 96
    # heads, GELU 4x, LayerNorm, learned positions, biases, GPT-2's vocabulary, tied embeddings.
    "GPT-3 175B": [
        "model.num_layers=96",
        "model.hidden_size=12288",
        "model.ffn_hidden_size=49152",
        "model.num_attention_heads=96",
        "model.num_query_groups=null",
        "model.kv_channels=128",
        "model.vocab_size=50257",
        "model.activation=gelu",
        "model.normalization=LayerNorm",
        "model.position_embedding_type=learned_absolute",
        "model.add_bias_linear=true",
        "model.share_embeddings_and_output_weights=true",
    ],  # fmt: skip
    # xai-org/grok-1 model.py: 64 layers of 6,144, 48 query and 8 KV heads of 128, 8 experts
    # of 32,768 (gated GELU), top 2, vocabulary 131,072.
    "Grok-1 314B": [
        "model.num_layers=64",
        "model.hidden_size=6144",
        "model.ffn_hidden_size=32768",
        "model.moe_ffn_hidden_size=32768",
        "model.num_attention_heads=48",
        "model.num_query_groups=8",
        "model.kv_channels=128",
        "model.vocab_size=131072",
        "model.activation=geglu",
    ],  # fmt: skip
}


def _gpt(layers: int, h: int, heads: int, *more: str) -> list[str]:
    """GPT-3 175B's architecture at these widths (an MLP of 4x), then the overrides `more`."""
    return [*ARCHITECTURES["GPT-3 175B"], f"model.num_layers={layers}", f"model.hidden_size={h}",
            f"model.ffn_hidden_size={4 * h}", f"model.num_attention_heads={heads}",
            f"model.kv_channels={h // heads}", *more]  # fmt: skip


ARCHITECTURES.update(
    {name: _gpt(*size, "model.vocab_size=51200") for name, size in GPT_2021.items()}
)
ARCHITECTURES.update(
    {name: _gpt(*size, "model.position_embedding_type=rope") for name, size in GPT_JUBE.items()}
)


def loss_settings(model: str, software: str) -> list[str]:
    """Transformer Engine's fused cross entropy where the run's performance scripts set it, else
    nothing (Megatron-Core's fused loss, the engine's default and NeMo 2's):
    - Megatron-Bridge, every release and model of this table: the 25.09 YAMLs
      (cross_entropy_fusion_impl: "te", r0.1.0 684a686165 scripts/performance/configs/), utils/
      helpers.py at v0.2.0 7af9601c9d, utils/overrides.py from v0.3.0 21b02e0cfb, perf_recipes/
      _common.py `_benchmark_common` (default "te") at v0.6.0 51885cf132;
    - NeMo from 25.07: scripts/performance/helpers.py `set_primary_perf_configs` (NVIDIA/NeMo
      96578928a7, first in v2.4.0; not in v2.3.0-v2.3.2, NeMo 25.04);
    - DeepSeek-V3 from NeMo 25.04: scripts/performance/llm/pretrain_deepseek_v3.py sets it in
      v2.3.0, and dgxc-benchmarking v25.05.05 runs that script (deepseek_v3/pretraining/launch.sh)."""
    nemo = re.search(r"NeMo (\d\d\.\d\d)", software)
    version = float(nemo[1]) if nemo else 0.0
    te = (
        software.startswith("Megatron-Bridge")
        or version >= 25.07
        or (model == "DeepSeek-V3" and version >= 25.04)
    )
    return ["model.cross_entropy_fusion_impl=te"] if te else []


def notes_overrides(notes: str) -> list[str]:
    """What the row's Megatron-Bridge performance recipe sets that the model prices."""
    out = []
    m = re.search(r"recompute_modules=\[([^\]]*)\]", notes)
    modules = [x.strip(" '\"") for x in m.group(1).split(",") if x.strip()] if m else []
    if modules:
        out.append("model.recompute_granularity=selective")
        out.append(f"model.recompute_modules={','.join(modules)}")
    if "dispatcher='flex'" in notes:
        out.append("model.moe_token_dispatcher_type=flex")
        backend = "hybridep" if "hybridep" in notes.lower() else "deepep"
        out.append(f"model.moe_flex_dispatcher_backend={backend}")
    if "overlap_moe_expert_parallel_comm=True" in notes:
        out.append("parallel.overlap_moe_expert_parallel_comm=true")
    if "overlap_grad_reduce=False" in notes:  # the gradients reduced after the backward
        out.append("parallel.overlap_grad_reduce=false")
    return out
