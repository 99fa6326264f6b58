"""The CPU smoke mode: Megatron-Core's CUDA calls, redirected to the CPU in one place.

Megatron-Core (0.19.2, read from its installed sources) has no CPU mode. It reaches for CUDA in a
handful of ways, and each is redirected here, only for the modules that do it and only when
`enable()` is called (the engine calls it when train.device resolves to the CPU; nothing changes
on GPUs):

1. `torch.cuda.current_device()`, `device="cuda"`, `torch.cuda.synchronize()`,
   `torch.cuda.Stream()` and `torch.cuda.{get,set}_rng_state/manual_seed` written inside
   functions. Each module listed in `_MODULES` gets, as its module attribute `torch`, a thin
   proxy of torch whose factories (`torch.zeros(..., device="cuda")` ...) place tensors on the
   CPU and whose `torch.cuda` answers with the CPU (device, RNG) or does nothing (synchronize,
   streams). Every other attribute is torch's own, so the rest of those modules runs unchanged.
2. The RNG tracker (tensor-model-parallel, expert and data-parallel streams) forks "the CUDA
   generator"; on the CPU the CPU generator plays that role (`_CpuRNGStatesTracker`).
3. Type checks against the strings 'torch.cuda.FloatTensor' / 'torch.cuda.BFloat16Tensor'
   (optimizer parameter grouping, gradient clipping): while those functions run, CPU tensors
   report their type with the '.cuda' the checks expect (`_cuda_type_names`).

What still needs a GPU (see training/validation.py `_cpu`): sequence parallel, context parallel,
the alltoall MoE dispatcher and FP8. Measured here: TP, PP (with virtual stages), DP with the
distributed optimizer and EP with the allgather dispatcher train over gloo.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Megatron-Core modules whose functions call CUDA, with the call sites that made each one a member.
_MODULES: dict[str, str] = {
    "megatron.core.tensor_parallel.random": "cuda RNG state get/set/seed of the RNG tracker",
    "megatron.core.tensor_parallel.layers": "weight/buffer allocation on current_device()",
    "megatron.core.tensor_parallel.mappings": "gather/scatter output buffers on current_device()",
    "megatron.core.tensor_parallel.utils": "split/gather buffers on current_device()",
    "megatron.core.tensor_parallel.cross_entropy": "vocab-parallel cross entropy buffers",
    "megatron.core.pipeline_parallel.schedules": 'total_num_tokens = zeros(device="cuda")',
    "megatron.core.pipeline_parallel.p2p_communication": "receive buffers, synchronize()",
    "megatron.core.pipeline_parallel.utils": "stream helpers of the schedules",
    "megatron.core.distributed.param_and_grad_buffer": "param/grad buffers on current_device()",
    "megatron.core.distributed.distributed_data_parallel": "synchronize(), communication streams",
    "megatron.core.distributed.finalize_model_grads": "embedding/norm grad all-reduce buffers",
    "megatron.core.optimizer.optimizer": 'found_inf / scale tensors on "cuda"',
    "megatron.core.optimizer.distrib_optimizer": "shard buffers on current_device()",
    "megatron.core.optimizer.clip_grads": 'norm accumulators on "cuda"',
    "megatron.core.optimizer.grad_scaler": 'loss scale tensors on "cuda" (fp16)',
    "megatron.core.transformer.module": "Float16Module and embedding-group buffers",
    "megatron.core.transformer.attention": "inference/rotary buffers on current_device()",
    "megatron.core.transformer.transformer_layer": "layer buffers on current_device()",
    "megatron.core.transformer.utils": 'attention masks on "cuda"',
    "megatron.core.transformer.multi_token_prediction": "MTP loss trackers on current_device()",
    "megatron.core.transformer.moe.router": "router weights and aux-loss tensors",
    "megatron.core.transformer.moe.moe_utils": "aux-loss tracker tensors",
    "megatron.core.transformer.moe.moe_layer": "delayed-wgrad stream",
    "megatron.core.transformer.moe.token_dispatcher": "over-budget flags on 'cuda'",
    "megatron.core.models.gpt.gpt_model": "MTP/logit buffers on current_device()",
    "megatron.core.models.common.embeddings.rotary_pos_embedding": "inv_freq on current_device()",
    "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding": "yarn tables",
    "megatron.core.models.common.language_module.language_module": "tied-embedding all-reduce",
    "megatron.core.rerun_state_machine": "result-validation tensors",
    "megatron.core.utils": "misc helpers (norms, hashes) on 'cuda'",
    # Checkpoints (training/checkpoint.py): the synchronous torch_dist save.
    "megatron.core.dist_checkpointing.strategies.filesystem_async": "synchronize() before "
    "staging tensors for writing",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver": "save-failure flag "
    "broadcast on current_device()",
}

_CPU = torch.device("cpu")
_FACTORIES = frozenset(
    "tensor as_tensor zeros ones empty full arange rand randn randint randperm "
    "zeros_like ones_like empty_like full_like rand_like randn_like".split()
)


def _on_cpu(device: Any) -> Any:
    """A CUDA device (index, string or torch.device) becomes the CPU; anything else is kept."""
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return _CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return _CPU
    return device


def _cpu_factory(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def factory(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = _on_cpu(kwargs["device"])
        return fn(*args, **kwargs)

    return factory


class _NullStream:
    """Stands in for torch.cuda.Stream/Event: the CPU runs everything in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass

    def wait_event(self, *args: Any) -> None:
        pass

    def record_event(self, *args: Any) -> _NullStream:
        return self

    def record(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _CpuCuda(types.SimpleNamespace):
    """torch.cuda as the listed modules see it on the CPU."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


def _cpu_cuda_namespace() -> _CpuCuda:
    return _CpuCuda(
        current_device=lambda: _CPU,
        device_count=lambda: 1,
        synchronize=lambda *a, **k: None,
        empty_cache=lambda: None,
        # The CPU generator is "the device generator" on the CPU.
        get_rng_state=lambda device=None: torch.get_rng_state(),
        set_rng_state=lambda state, device=None: torch.set_rng_state(state),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        Stream=_NullStream,
        Event=_NullStream,
        current_stream=lambda *a, **k: _NullStream(),
        default_stream=lambda *a, **k: _NullStream(),
        stream=lambda *a, **k: contextlib.nullcontext(),
        FloatTensor=torch.FloatTensor,
        HalfTensor=torch.HalfTensor,
        BFloat16Tensor=torch.BFloat16Tensor,
        # cuda.random.get_rng_state is what the RNG helpers call.
        random=types.SimpleNamespace(
            get_rng_state=lambda device=None: torch.get_rng_state(),
            set_rng_state=lambda state, device=None: torch.set_rng_state(state),
        ),
    )


class _CpuTorch(types.ModuleType):
    """torch as the listed modules see it on the CPU: CUDA factories and torch.cuda redirected."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _cpu_cuda_namespace()
        for name in _FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class _CpuRNGStatesTracker:
    """Mixin for Megatron's CudaRNGStatesTracker that keeps its named streams on the CPU generator.

    Megatron's `fork` warns when the CPU RNG state changes inside a fork, which is exactly what
    happens here on every dropout or weight init, since the forked generator is the CPU's.
    """

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        outer = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(outer)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise KeyError(f"rng state {name} is not added")
        outer = torch.get_rng_state()
        outer_name = self._current_state_name
        torch.set_rng_state(self.states_[name])
        self._current_state_name = name
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)
            self._current_state_name = outer_name


_real_type = torch.Tensor.type


def _type_with_cuda_names(
    self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any
) -> Any:
    if dtype is None and not kwargs and self.device.type == "cpu":
        return _real_type(self).replace("torch.", "torch.cuda.", 1)
    return _real_type(self, dtype, non_blocking, **kwargs)


@contextlib.contextmanager
def _cuda_type_names() -> Iterator[None]:
    """CPU tensors answer `.type()` with 'torch.cuda.FloatTensor' etc. while the block runs."""
    torch.Tensor.type = _type_with_cuda_names
    try:
        yield
    finally:
        torch.Tensor.type = _real_type


def _with_cuda_type_names(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _cuda_type_names():
            return fn(*args, **kwargs)

    wrapper.__cpu_mode__ = True
    return wrapper


_enabled = False


def enabled() -> bool:
    return _enabled


def enable() -> None:
    """Redirect Megatron-Core's CUDA calls to the CPU. Idempotent; call before building anything."""
    global _enabled
    if _enabled:
        return
    proxy = _CpuTorch()
    for name in _MODULES:
        module = importlib.import_module(name)
        if getattr(module, "torch", None) is torch:
            module.torch = proxy

    from megatron.core.optimizer import distrib_optimizer, optimizer
    from megatron.core.tensor_parallel import random

    # 2. The RNG tracker: Megatron's class with CPU add/fork; plus the module-level helpers that
    #    the tracker, activation recompute and checkpointing call.
    random.CudaRNGStatesTracker = type(
        "CpuRNGStatesTracker", (_CpuRNGStatesTracker, random.CudaRNGStatesTracker), {}
    )
    random._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: (
        torch.get_rng_state()
    )
    random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(
        new_state
    )
    random.initialize_rng_tracker(force_reset=True)

    # 3. 'torch.cuda.*Tensor' type checks: parameter grouping of both optimizers and gradient
    #    clipping (optimizer.py calls clip_grad_by_total_norm_fp32 through its own module name).
    for owner, attr in (
        (distrib_optimizer.DistributedOptimizer, "__init__"),
        (optimizer.Float16OptimizerWithFloat16Params, "__init__"),
        (optimizer, "clip_grad_by_total_norm_fp32"),
    ):
        setattr(owner, attr, _with_cuda_type_names(getattr(owner, attr)))
    _enabled = True
