"""The torch norms of Megatron-Core's local layer spec (no Transformer Engine, the CPU, LoRA),
as models/specs.py and models/gemma_layers.py build them: sequence parallelism and Gemma's
(1 + weight) norms, which Megatron-Core's own torch norm (`WrappedTorchNorm`) refuses."""

from __future__ import annotations

import copy
from typing import Any, cast

import torch
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig


class ZeroCenteredNorm(torch.nn.Module):
    """RMSNorm / LayerNorm scaling by (1 + weight), computed in FP32 and cast back (Hugging Face's
    Gemma3RMSNorm; Transformer Engine's norms with zero_centered_gamma). Megatron-Core's torch
    norm refuses layernorm_zero_centered_gamma."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.rms = config.normalization == "RMSNorm"
        self.eps = eps
        device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
        options: dict[str, Any] = {"device": device, "dtype": config.params_dtype}
        self.weight = torch.nn.Parameter(torch.zeros(hidden_size, **options))
        if not self.rms:
            self.bias = torch.nn.Parameter(torch.zeros(hidden_size, **options))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 1.0 + self.weight.float()
        if self.rms:
            h = x.float()
            out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * scale
        else:
            shape = (x.size(-1),)
            out = torch.nn.functional.layer_norm(
                x.float(), shape, scale, self.bias.float(), self.eps
            )
        return out.type_as(x)


class SequenceParallelTorchNorm:
    """Megatron-Core's torch norm (`WrappedTorchNorm`) that also runs under sequence parallelism,
    and scales by (1 + weight) under layernorm_zero_centered_gamma (Gemma's norms), which
    `WrappedTorchNorm` refuses (models/gemma_layers.py `ZeroCenteredNorm`).

    Under SP each TP rank normalises its own shard of the sequence, so its weight gradient is a
    partial sum over the TP group. Megatron-Core's apex and Transformer Engine norms mark their
    parameters `sequence_parallel`, and `finalize_model_grads` sums the marked gradients over the
    TP group; `WrappedTorchNorm` asserts SP is off instead. This builds the same torch norm and
    marks its parameters the same way. tests/smoke/test_sp_cpu.py holds SP to TP without SP.
    """

    # A builder as Megatron-Core's own WrappedTorchNorm is: constructing it gives the torch norm.
    def __new__(  # type: ignore[misc]
        cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **kwargs: Any
    ) -> torch.nn.Module:
        if config.layernorm_zero_centered_gamma:
            norm: torch.nn.Module = ZeroCenteredNorm(config, hidden_size, eps)
        elif not config.sequence_parallel:
            return cast(torch.nn.Module, WrappedTorchNorm(config, hidden_size, eps, **kwargs))
        else:
            unsharded = copy.copy(config)
            unsharded.sequence_parallel = False  # only WrappedTorchNorm's assertion reads it
            norm = cast(torch.nn.Module, WrappedTorchNorm(unsharded, hidden_size, eps, **kwargs))
        if not config.sequence_parallel:
            return norm
        for param in norm.parameters():
            param.sequence_parallel = True  # type: ignore[attr-defined]  # read by finalize_model_grads
        return norm
