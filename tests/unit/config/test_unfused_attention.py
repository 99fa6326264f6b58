"""model.attention_backend=unfused: every head's seq x seq scores through memory. What the engine
asks of Megatron-Core and torch, what the checker refuses, and what the step-time and memory
models price, held against Megatron-Core's own unfused attention (DotProductAttention, the
reference its fused kernels replace) for the bytes it saves."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from unittest import mock

import pytest

from config.cost import layers
from config.cost.memory import estimate_memory, model_flops_per_token
from config.cost.steptime import predict
from config.rules import derive, validate
from config.tree import apply_overrides
from tests.unit.config.test_validation import H100x8, llama_like

torch = pytest.importorskip("torch")


def saved_score_tensors(dropout: float) -> list[int]:
    """Bytes of each score-shaped tensor Megatron-Core's DotProductAttention saves for its backward
    (one layer, BF16, the softmax in BF16 as its fused kernel stores it), on the CPU: its memory
    buffer and RNG tracker stood in for, the causal mask passed in (its default is made on CUDA)."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    heads, s, d = 4, 32, 16
    config = TransformerConfig(
        num_layers=1,
        hidden_size=heads * d,
        num_attention_heads=heads,
        attention_dropout=dropout,
        attention_softmax_in_fp32=False,
        masked_softmax_fusion=False,
        bf16=True,
        params_dtype=torch.bfloat16,
    )
    tp = SimpleNamespace(tp=SimpleNamespace(size=lambda: 1, rank=lambda: 0))
    attention = DotProductAttention(config, 1, AttnMaskType.causal, "self", pg_collection=tp)
    buffer = SimpleNamespace(get_tensor=lambda shape, dtype, name: torch.empty(shape, dtype=dtype))
    tracker = SimpleNamespace(fork=contextlib.nullcontext)
    q, k, v = (torch.randn(s, 1, heads, d, dtype=torch.bfloat16, requires_grad=True) for _ in "qkv")
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        if t.numel() == heads * s * s:
            saved[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with (
        mock.patch.object(parallel_state, "get_global_memory_buffer", lambda: buffer),
        mock.patch.object(tensor_parallel, "get_cuda_rng_tracker", lambda: tracker),
        torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t),
    ):
        attention.train()(q, k, v, torch.triu(torch.ones(s, s), diagonal=1).bool()[None, None])
    return [n // (heads * s * s) for n in saved.values()]


def test_megatron_cores_unfused_attention_saves_what_the_estimate_counts() -> None:
    """2 bytes a score without attention dropout (the softmax output), 5 with it: the softmax
    output, the dropped probabilities and the mask, a byte on GPUs (torch's CUDA dropout keeps a
    bool mask; on the CPU it keeps it in the input's dtype): Korthikanti et al.'s 5as^2b."""
    m = llama_like().model
    assert saved_score_tensors(0.0) == [2] and layers.score_bytes(m)[1] == 2
    kept = saved_score_tensors(0.1)
    assert len(kept) == 3 and sorted(kept) == [2, 2, 2]  # the mask counts 1 of its 2 here
    m.attention_dropout = 0.1
    assert layers.score_bytes(m)[1] == 2 + 2 + 1


def test_unfused_attention_is_priced_by_its_scores() -> None:
    """Per token, unfused attention's time and saved bytes grow with the sequence (every score
    computed, written and read, the causal half too); the model's FLOPs, which MFU counts, do not
    change with the kernel."""
    per_token = {}
    for backend in ("auto", "unfused"):
        for seq in (2048, 4096):
            cfg = apply_overrides(
                llama_like(),
                [
                    f"model.attention_backend={backend}",
                    f"model.seq_length={seq}",
                    "model.recompute_granularity=full",
                    "model.recompute_method=uniform",
                    "model.recompute_num_layers=1",
                ],  # fmt: skip
            )
            assert not validate(cfg, H100x8)
            d = derive(cfg, H100x8)
            step = predict(cfg, H100x8, d)
            tokens = cfg.train.global_batch_size * seq / H100x8.world_size
            per_token[backend, seq] = (
                step.terms["attention"] / tokens,
                estimate_memory(cfg, H100x8, d).activations_gib,
                model_flops_per_token(cfg),
            )
    flash, unfused = per_token["auto", 4096], per_token["unfused", 4096]
    assert unfused[0] > 2 * flash[0]  # twice the GEMM work, and the scores through memory
    assert unfused[0] / per_token["unfused", 2048][0] == pytest.approx(2, rel=0.02)
    assert unfused[1] > flash[1] and unfused[2] == flash[2]
    # Without dropout, 2 bytes a score: heads x seq of them per token in every layer.
    m = apply_overrides(llama_like(), ["model.attention_backend=unfused"]).model
    assert layers.saved_scores(m) == pytest.approx(2 * m.num_attention_heads * m.seq_length)


def test_unfused_attention_with_context_parallelism_is_refused() -> None:
    cfg = apply_overrides(
        llama_like(), ["model.attention_backend=unfused", "parallel.context_parallel_size=2"]
    )
    (problem,) = [p for p in validate(cfg, H100x8) if p.field == "model.attention_backend"]
    assert "context_parallel_size=2" in problem.message and "use auto" in problem.message


def test_the_engine_asks_for_the_backend() -> None:
    """Megatron-Core's TransformerConfig takes it (it sets Transformer Engine's NVTE_*_ATTN from
    it at model build); where torch's SDPA runs the attention, "unfused" is its math kernel."""
    from megatron.core.transformer.enums import AttnBackend, AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from models import gpt
    from models.sdpa import SdpaAttention

    flags: list[tuple[bool, bool]] = []  # SDPA's flash and math kernels allowed, at each call
    real = torch.nn.functional.scaled_dot_product_attention

    def sdpa(*args, **kwargs):
        enabled = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()
        flags.append(enabled)
        return real(*args, **kwargs)

    for backend in ("auto", "unfused"):
        cfg = apply_overrides(llama_like(), [f"model.attention_backend={backend}"])
        config = gpt.transformer_config(cfg, derive(cfg, H100x8), "cpu", torch.float32)
        assert config.attention_backend == AttnBackend[backend]
        small = TransformerConfig(
            num_layers=1,
            hidden_size=32,
            num_attention_heads=4,
            attention_backend=AttnBackend[backend],
        )
        attention = SdpaAttention(small, 1, AttnMaskType.causal, "self").eval()
        q = k = v = torch.randn(6, 1, 4, 8)
        flags.clear()
        with mock.patch("models.sdpa.F.scaled_dot_product_attention", sdpa):
            attention(q, k, v, None)
        assert flags == [(backend != "unfused", True)]
