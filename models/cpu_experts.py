"""Distinct MoE experts on the CPU, the same ones whatever the expert-parallel layout.

On the CPU the engine builds weights with `use_cpu_initialization` (models/gpt.py), so that a TP
split slices the same full weights as one rank holds. Megatron-Core's CPU path draws every weight
from the default generator, which has no expert-parallel stream: each EP rank builds its local
experts from the same generator state, so expert 2 of 4 on EP rank 1 is a copy of expert 0 on EP
rank 0, and EP=2 trains another model than EP=1. (On the GPU the tracker's expert-parallel stream,
seeded per EP rank, keeps them apart.)

The experts' draws also moved every later layer's: a rank with 2 experts draws the next layer's
weights from another generator state than a rank with 4. `build_with_distinct_experts` builds the
model with SequentialMLP drawing on a fork of the default generator, so that every other weight is
drawn as at any other EP, then draws each expert's full weights again from a seed of the run's
seed, the MoE layer and the expert's global index, and keeps this rank's expert-TP slice as
Megatron-Core's CPU path does: every expert differs, and EP=1, EP=2 and any ETP start from the
same model.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import _initialize_affine_weight_cpu
from megatron.core.transformer.moe.experts import SequentialMLP
from megatron.core.transformer.moe.moe_layer import MoELayer


def build_with_distinct_experts(
    build: Callable[[], list[torch.nn.Module]], seed: int
) -> list[torch.nn.Module]:
    """`build()`'s model chunks, its experts drawn apart (see the module's docstring)."""
    original = SequentialMLP.__init__

    def forked(self: SequentialMLP, *args: Any, **kwargs: Any) -> None:
        with torch.random.fork_rng(devices=[]):
            original(self, *args, **kwargs)

    SequentialMLP.__init__ = forked
    try:
        chunks = build()
    finally:
        SequentialMLP.__init__ = original
    reinit_cpu_experts(chunks, seed)
    return chunks


def reinit_cpu_experts(chunks: list[torch.nn.Module], seed: int) -> None:
    """Draw every local expert's weights again from its own seed."""
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    etp_rank = parallel_state.get_expert_tensor_parallel_rank()
    etp = parallel_state.get_expert_tensor_parallel_world_size()
    for chunk in chunks:
        for name, layer in chunk.named_modules():
            if not isinstance(layer, MoELayer) or not isinstance(layer.experts, SequentialMLP):
                continue
            # MTP layers number their layers apart from the decoder's: name them apart too.
            where = f"{'mtp' if name.startswith('mtp') else 'decoder'}.{layer.layer_number}"
            local = layer.experts.local_experts
            for index, expert in enumerate(local):
                number = ep_rank * len(local) + index
                for part, linear, init in (
                    ("fc1", expert.linear_fc1, expert.config.init_method),
                    ("fc2", expert.linear_fc2, expert.config.output_layer_init_method),
                ):
                    _redraw(linear, init, f"{seed}:{where}:{number}:{part}", etp_rank, etp)


def _redraw(
    linear: torch.nn.Module, init: Callable[[torch.Tensor], Any], key: str, rank: int, world: int
) -> None:
    """The weight of one expert linear layer, drawn whole from `key`'s seed, this rank's slice."""
    # A Parameter with Megatron-Core's tensor-parallel attributes (partition_dim, ...), which
    # torch's types do not declare.
    weight: Any = linear.weight
    dim, stride = weight.partition_dim, weight.partition_stride
    rows, cols = weight.shape
    full = (rows * world, cols) if dim == 0 else (rows, cols * world)
    with torch.random.fork_rng(devices=[]):  # the run's own generator is left as it was
        torch.manual_seed(zlib.crc32(key.encode()))
        _initialize_affine_weight_cpu(
            weight,
            *full,
            weight.shape[dim],
            dim,
            init,
            stride=stride,
            params_dtype=weight.dtype,
            rank=rank,
            world_size=world,
            skip_set_tensor_parallel_attributes=True,
        )
