"""The models NVIDIA published pretraining throughputs of (bench/data/published_perf.csv), as the
catalog recipes bench/published_table.py prices them with: a recipe whose preset is the model, or
one with the model's published architecture written out as overrides."""

from __future__ import annotations

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
