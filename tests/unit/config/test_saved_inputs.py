"""What a linear layer saves of its input for the weight gradient, by precision (config/cost/layers.py
`saved_input_bytes`): the memory estimate and the step-time model's memory traffic read one answer.

Transformer Engine keeps only the quantized copy its wgrad GEMM reads: FP8 data (1 byte) with one
FP32 scale per tensor (current or delayed scaling), an E8M0 byte per 32 elements (MXFP8), an FP32
per 128 (blockwise); NVFP4's recipe runs the wgrad GEMM in NVFP4 as well (NVFP4BlockScaling's
backward_override defaults to None), so it keeps E2M1 data (4 bits) with an E4M3 scale per 16."""

from __future__ import annotations

import pytest

from config.cost import layers
from config.cost.memory import layer_saved_bytes
from config.hardware import Cluster
from config.rules import derive
from config.tree import apply_overrides
from tests.unit.config.test_validation import llama_like

B200x8 = Cluster(num_nodes=1, gpus_per_node=8, gpu="b200")  # every preset's tensor cores
PRESETS = {
    "bf16_mixed": 2.0,
    "bf16_with_fp8_delayed_scaling_mixed": 1.0,
    "bf16_with_fp8_current_scaling_mixed": 1.0,
    "bf16_with_fp8_subchannel_scaling_mixed": 1 + 4 / 128,
    "bf16_with_mxfp8_mixed": 1 + 1 / 32,
    "bf16_with_nvfp4_mixed": 0.5 + 1 / 16,
}


@pytest.mark.parametrize(("precision", "size"), PRESETS.items(), ids=list(PRESETS))
def test_each_preset_saves_its_linear_inputs_as_transformer_engine_stores_them(
    precision: str, size: float
) -> None:
    """A dense layer's saved bytes move with the precision by exactly its four linear inputs (QKV
    and FC1 read the hidden size, the output projection the attention width, FC2 the FFN width),
    per token and split by TP as sequence parallel splits them; nothing else changes."""
    bf16 = apply_overrides(llama_like(), ["precision=bf16_mixed"])
    cfg = apply_overrides(llama_like(), [f"precision={precision}"])
    derived = derive(cfg, B200x8)
    assert layers.saved_input_bytes(derived.preset.fp8_recipe) == size
    m, tp = cfg.model, cfg.parallel.tensor_model_parallel_size
    tokens = m.seq_length * cfg.train.micro_batch_size
    inputs = 2 * m.hidden_size + m.num_attention_heads * layers.head_dim(m) + m.ffn_hidden_size
    moved = layer_saved_bytes(bf16, derive(bf16, B200x8), False) - layer_saved_bytes(
        cfg, derived, False
    )
    # BF16's output projection reuses the attention kernel's BF16 output; FP8 adds its own copy.
    extra = 0 if size == 2.0 else 2 * m.num_attention_heads * layers.head_dim(m)
    assert moved == pytest.approx(tokens * ((2 - size) * inputs - extra) / tp)
