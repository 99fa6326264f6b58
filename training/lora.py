"""LoRA on Megatron-Core's tensor-parallel linear layers (peft.scheme=lora).

Megatron-Core has no adapters, and Megatron-Bridge's would bring its own model provider and
training loop, so this is the glue: each targeted ColumnParallelLinear / RowParallelLinear gets
two low-rank factors and a forward that adds (alpha / rank) B A dropout(x) to its output. The
factors follow the layer's tensor-parallel split, so that the adapter needs no collective of its
own in the forward or backward pass:

- column-parallel (linear_qkv, linear_fc1): A [rank, in] is whole on
  every TP rank, B [out / TP, rank] is split like the weight's rows. The layer's one input
  collective (sequence parallel: all-gather forward, reduce-scatter backward; else identity
  forward, all-reduce backward) moves here, in front of both the weight and the adapter, so the
  input gradient of both is reduced together.
- row-parallel (linear_proj, linear_fc2): A [rank, in / TP] is split like the weight's columns,
  B [out, rank] is whole. The adapter's partial output joins the weight's partial output before
  the layer's one output reduction (all-reduce, or reduce-scatter with sequence parallel).

The whole factor's gradient is then a partial sum on each TP rank (A for column, B for row): it is
summed over TP once per step, as Megatron-Core sums the norm weights' gradients under sequence
parallelism (they are marked the same way; without sequence parallel, `finalize_with_adapters`
does it). The base layer keeps its class and state-dict names, so Hugging Face folders and
checkpoints load into an adapted model unchanged: the instance's class is swapped for a subclass
that adds the factors.

Initialisation as peft's: A Kaiming-uniform, B zero (the adapted model starts as the base). A is
drawn whole from a generator seeded by train.seed and the layer's global name, then sliced, so that
every layout starts from the same adapters.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    gather_from_sequence_parallel_region,
    reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region,
)
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from config.lora import is_adapter, targets
from config.schema import TrainingConfig


class LoRAMixin:
    """The adapter half of an adapted linear layer (see the module docstring)."""

    lora_A: torch.nn.Parameter
    lora_B: torch.nn.Parameter
    # The Megatron-Core layer's, which comes after this mixin in the adapted class (_adapted_class).
    weight: torch.nn.Parameter
    training: bool
    sequence_parallel: bool
    tp_group: torch.distributed.ProcessGroup | None
    state_dict: Callable[..., dict[str, Any]]

    def init_lora(self, rank: int, alpha: float, dropout: float, seed: int, name: str) -> None:
        self.lora_column = isinstance(self, ColumnParallelLinear)
        self.lora_scale = alpha / rank
        self.lora_dropout = dropout
        tp = parallel_state.get_tensor_model_parallel_world_size()
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        weight = self.weight  # [out / TP, in] (column) or [out, in / TP] (row)
        out_local, in_local = weight.shape
        full_in = in_local if self.lora_column else in_local * tp
        generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
        a = torch.empty(rank, full_in)
        bound = 1 / math.sqrt(full_in)  # kaiming_uniform_(a=sqrt(5)), as nn.Linear and peft
        a.uniform_(-bound, bound, generator=generator)
        if not self.lora_column:
            a = a[:, tp_rank * in_local : (tp_rank + 1) * in_local]
        b_rows = out_local
        options: dict[str, Any] = {"dtype": weight.dtype, "device": weight.device}
        self.lora_A = torch.nn.Parameter(a.to(**options).contiguous())
        self.lora_B = torch.nn.Parameter(torch.zeros(b_rows, rank, **options))
        split, whole = (
            (self.lora_B, self.lora_A) if self.lora_column else (self.lora_A, self.lora_B)
        )
        tensor_parallel.set_tensor_model_parallel_attributes(
            split, is_parallel=True, dim=0 if self.lora_column else 1, stride=1
        )
        tensor_parallel.set_tensor_model_parallel_attributes(
            whole, is_parallel=False, dim=-1, stride=1
        )
        # Flags on the tensor (torch declares no such attributes), read by finalize_with_adapters
        # and Megatron-Core: its gradient is a partial sum over TP, which Megatron-Core sums under
        # sequence parallelism.
        whole.lora_tp_partial = True  # type: ignore[attr-defined]
        whole.sequence_parallel = True  # type: ignore[attr-defined]
        # The layer's own collective moves into forward() below.
        self.explicit_expert_comm = True

    def _adapter(self, x: torch.Tensor) -> torch.Tensor:
        if self.lora_dropout and self.training:
            x = F.dropout(x, self.lora_dropout)
        return F.linear(F.linear(x, self.lora_A), self.lora_B) * self.lora_scale

    def _base_forward(self, input_: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """The Megatron-Core layer's own forward (the next class in the MRO, unseen by mypy)."""
        return cast(Any, super()).forward(input_, *args, **kwargs)

    def forward(self, input_: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        tp_group = self.tp_group
        tp = tp_group.size() if tp_group is not None else 1
        if self.lora_column:
            if tp > 1:
                if self.sequence_parallel:
                    input_ = gather_from_sequence_parallel_region(input_, group=tp_group)
                else:
                    input_ = copy_to_tensor_model_parallel_region(input_, group=tp_group)
            output, bias = self._base_forward(input_, *args, **kwargs)
            return output + self._adapter(input_), bias
        # Row-parallel: the base returns its partial output, unreduced, and the bias apart
        # (skip_bias_add; explicit_expert_comm asserts it).
        partial, bias = self._base_forward(input_, *args, **kwargs)
        partial = partial + self._adapter(input_)
        if tp > 1:
            if self.sequence_parallel:
                partial = reduce_scatter_to_sequence_parallel_region(partial, group=tp_group)
            else:
                partial = reduce_from_tensor_model_parallel_region(partial, group=tp_group)
        return partial, bias

    def sharded_state_dict(
        self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None
    ) -> dict[str, Any]:
        axes = (
            {"weight": 0, "bias": 0, "lora_B": 0}
            if self.lora_column
            else {"weight": 1, "lora_A": 1}
        )
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True),
            prefix,
            axes,
            sharded_offsets,
            tp_group=self.tp_group,
            dp_cp_group=(metadata or {}).get("dp_cp_group"),
        )


_CLASSES: dict[type, type] = {}


def _adapted_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"LoRA{cls.__name__}", (LoRAMixin, cls), {})
    return _CLASSES[cls]


def adapt(chunks: list[torch.nn.Module], cfg: TrainingConfig) -> int:
    """Give every targeted linear layer of the chunks its adapter and freeze everything else;
    returns how many layers were adapted (every rank calls this after building its chunks)."""
    p = cfg.peft
    wanted = set(targets(p.target_modules))
    count = 0
    for chunk in chunks:
        global_names = _global_names(chunk)
        for name, module in list(chunk.named_modules()):
            leaf = name.rsplit(".", 1)[-1]
            if leaf not in wanted or ".experts." in name:
                continue
            if not isinstance(module, ColumnParallelLinear | RowParallelLinear):
                raise TypeError(
                    f"{name} is a {type(module).__name__}; LoRA adapts Megatron-Core's "
                    "ColumnParallelLinear and RowParallelLinear (the local layers)"
                )
            module.__class__ = _adapted_class(type(module))
            key = global_names.get(id(module), name)
            module.init_lora(p.rank, p.alpha, p.dropout, cfg.train.seed, key)
            count += 1
        for name, param in chunk.named_parameters():
            param.requires_grad = is_adapter(name)
    return count


def _global_names(chunk: torch.nn.Module) -> dict[int, str]:
    """Each linear layer's name as the whole model knows it: the global number of its transformer
    layer and its path inside it (chunks number their layers from 0 again), or the MTP block's."""
    names: dict[int, str] = {}
    for path, layer in chunk.named_modules():
        number = getattr(layer, "layer_number", None)
        if number is None or not hasattr(layer, "self_attention"):
            continue
        block = "mtp" if ".mtp." in f".{path}." else "decoder"
        for sub_path, sub in layer.named_modules():
            if isinstance(sub, ColumnParallelLinear | RowParallelLinear):
                names[id(sub)] = f"{block}.{number}.{sub_path}"
    return names


def finalize_with_adapters(finalize: Any, config: Any) -> Any:
    """Megatron-Core's finalize_model_grads, then the TP sum of the whole factors' gradients when
    sequence parallelism is off (with it on, Megatron-Core sums them itself)."""

    def run(model: list[Any], *args: Any, **kwargs: Any) -> Any:
        result = finalize(model, *args, **kwargs)
        group = parallel_state.get_tensor_model_parallel_group()
        if config.sequence_parallel or group.size() == 1:
            return result
        grads = [
            getattr(p, "main_grad", p.grad)
            for chunk in model
            for p in chunk.parameters()
            if getattr(p, "lora_tp_partial", False) and p.requires_grad
        ]
        grads = [g for g in grads if g is not None]
        if grads:
            flat = torch._utils._flatten_dense_tensors(grads)
            torch.distributed.all_reduce(flat, group=group)
            for grad, summed in zip(
                grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True
            ):
                grad.copy_(summed)
        return result

    return run
