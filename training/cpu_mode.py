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
   (optimizer parameter grouping, gradient clipping) and `tensor.cuda()` calls (tied embeddings,
   the FP16 loss scale): while those few functions run, CPU tensors report their type with the
   '.cuda' the checks expect, and `.cuda()` leaves them where they are (`_as_if_on_cuda`).
   A new call site of this kind (a checkpoint path, say) is one more line in `enable()`.

4. Sequence parallel needs nothing of its own here: the norms that run it are the layer spec's
   (models/norms.py `SequenceParallelTorchNorm`, the same on GPUs), and the SP collectives
   (all_gather_into_tensor, reduce_scatter_tensor, sync and async, FP32 and BF16) are gloo's own
   since torch 2.3 (its reduce_scatter_tensor is an all-reduce and this rank's chunk;
   pytorch#112144, #118911; measured with torch 2.14), so Megatron-Core's SP code path runs as
   is. tests/smoke/test_sp_cpu.py holds it to TP without SP.
5. Output-discarding recompute (`CheckpointWithoutOutput`: the layernorm and moe_act recompute
   modules) asks Transformer Engine whether FP8 is on even when it is not: its `fp8=False` default
   passes its `fp8 is not None` test. Without TE those names are undefined, so on the CPU the
   module gets TE's answers for a run without FP8 (`_NoFP8`: FP8 off, no-op contexts).

6. Megatron-FSDP builds torch DeviceMeshes of device type "cuda" over Megatron's process groups
   (`_CpuDeviceMesh` builds them on the CPU) and moves a shard check's tensor with `.cuda()`;
   the rest is item 1's (its modules use `torch.device(f"cuda:{...}")` too, which the proxy's
   `torch.device` maps to the CPU). tests/smoke/test_fsdp_cpu.py holds it to Megatron DDP.

7. Gated DeltaNet (Qwen3.5, Qwen3-Next) computes its causal convolution, its L2 norm and its
   chunked delta rule with flash-linear-attention's Triton kernels (fla), GPU only and absent
   here: Megatron-Core's GatedDeltaNet refuses to build without it. On the CPU it gets torch
   stand-ins with fla's signatures (`causal_conv1d`, `l2norm` below; the chunked rule is
   Megatron-Core's own torch_chunk_gated_delta_rule, its deterministic-mode path), held to
   transformers' torch implementations in tests/unit/training/test_gdn_cpu.py. Packed rows
   (fla's cu_seqlens) are refused: the checker keeps them off with Gated DeltaNet.

What still needs a GPU (see config/rules/precision.py `cpu`; `--shrink` replaces them, see
recipes/shrink.py `cpu_substitutes`): context parallel, the alltoall and flex MoE dispatchers and
FP8/FP4. Measured here: TP with and without SP, PP (with virtual stages), DP with the distributed
optimizer and EP with the allgather dispatcher train over gloo.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

# Megatron-Core modules whose training paths call CUDA, with the call sites that put each one here.
# (Inference, CUDA-graph, alltoall/DeepEP and context-parallel call sites are left alone: the CPU
# mode does not run those paths.)
_MODULES: dict[str, str] = {
    "megatron.core.tensor_parallel.random": "the RNG tracker and activation recompute: "
    "torch.cuda.get_rng_state / manual_seed",
    "megatron.core.tensor_parallel.layers": "weights and all-gather buffers on current_device()",
    "megatron.core.tensor_parallel.mappings": "gather / reduce-scatter outputs on current_device()",
    "megatron.core.tensor_parallel.utils": "split / gather buffers on current_device()",
    "megatron.core.pipeline_parallel.schedules": 'every schedule: zeros([], device="cuda") token count',
    "megatron.core.pipeline_parallel.p2p_communication": "shape and receive buffers on "
    "current_device(), synchronize() after batched P2P",
    "megatron.core.pipeline_parallel.utils": "torch.cuda.Stream for the schedules' helpers",
    "megatron.core.distributed.param_and_grad_buffer": "param / grad buffers on current_device()",
    "megatron.core.distributed.distributed_data_parallel": "communication streams, synchronize()",
    "megatron.core.optimizer.optimizer": 'found_inf, overflow and scale tensors on "cuda"',
    "megatron.core.optimizer.distrib_optimizer": "parameter-shard buffers on current_device()",
    "megatron.core.optimizer.clip_grads": 'grad-norm accumulators on "cuda"',
    "megatron.core.optimizer.grad_scaler": 'FP16 loss-scale tensors on "cuda"',
    "megatron.core.utils": "global memory buffer on current_device(); the fallback l2 norm of "
    'gradient clipping (no apex / TE) returns its result on "cuda"',
    "megatron.core.transformer.utils": 'causal masks on "cuda" (local DotProductAttention)',
    "megatron.core.transformer.multi_token_prediction": "MTP loss trackers on current_device()",
    "megatron.core.transformer.moe.router": "aux-loss and token-count tensors on current_device()",
    "megatron.core.ssm.gated_delta_net.common": "Gated DeltaNet's conv1d, dt_bias and A_log "
    "built on current_device()",
    "megatron.core.models.common.embeddings.rotary_pos_embedding": "inv_freq moved to "
    "current_device() at the first forward",
    "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding": "YaRN tables (MLA) moved "
    "to current_device()",
    "megatron.core.rerun_state_machine": 'result checks all-reduce flags on "cuda"; its state '
    "(for checkpoints) holds torch.cuda.get_rng_state()",
    # Megatron-FSDP (parallel.use_megatron_fsdp).
    "megatron.core.distributed.fsdp.mcore_fsdp_adapter": "its device: cuda:current_device()",
    "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp": "side streams for the "
    "buffer copies and the parameter gather; the device check",
    "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer": "gather and "
    "reduce-scatter streams and events, synchronize(), buffers on the device",
    "megatron.core.distributed.fsdp.src.megatron_fsdp.utils": "RNG states, buffers on "
    "current_device()",
    "megatron.core.distributed.fsdp.src.megatron_fsdp.mixed_precision": 'the overflow flag on "cuda"',
    # Checkpoints (training/checkpoint/store.py): the synchronous torch_dist save.
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

    def wait(self, *args: Any) -> None:
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


class _CpuDeviceMeta(type):
    """torch.device for the listed modules: "cuda" and "cuda:N" name the CPU; isinstance and
    every other device are torch's."""

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.device:
        if args and isinstance(args[0], str) and args[0].startswith("cuda"):
            return _CPU
        return torch.device(*args, **kwargs)

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, torch.device)


class _CpuDevice(metaclass=_CpuDeviceMeta):
    pass


class _CpuDeviceMesh:
    """DeviceMesh as Megatron-FSDP's adapter sees it on the CPU: its meshes, built over the
    process groups with device_type "cuda", are built with "cpu" (the gloo groups' device)."""

    @staticmethod
    def from_group(*args: Any, **kwargs: Any) -> Any:
        from torch.distributed import DeviceMesh

        return DeviceMesh.from_group(*args, **{**kwargs, "device_type": "cpu"})


class _CpuTorch(types.ModuleType):
    """torch as the listed modules see it on the CPU: CUDA factories and torch.cuda redirected."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _cpu_cuda_namespace()
        self.device = _CpuDevice
        for name in _FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class _CpuRNGStatesTracker:
    """Mixin for Megatron's CudaRNGStatesTracker that keeps its named streams on the CPU generator.

    Megatron's `fork` warns when the CPU RNG state changes inside a fork, which is exactly what
    happens here on every dropout or weight init, since the forked generator is the CPU's.
    """

    # CudaRNGStatesTracker's own state, which this mixin's methods take over.
    _is_initialized: bool
    states_: dict[str, torch.Tensor]
    seeds_: set[int]
    _current_state_name: str

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


def _get_rng_state(
    device: Any = "cuda", clone: bool = False, graph_safe: bool = False
) -> torch.Tensor:
    return torch.get_rng_state()


def _set_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


_real_type = torch.Tensor.type
_real_cuda = torch.Tensor.cuda


def _type_with_cuda_names(
    self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any
) -> Any:
    if dtype is None and not kwargs and self.device.type == "cpu":
        return _real_type(self).replace("torch.", "torch.cuda.", 1)
    return _real_type(self, dtype, non_blocking, **kwargs)


def _cuda_stays_on_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self


@contextlib.contextmanager
def _tensors_as_if_on_cuda() -> Iterator[None]:
    """While the block runs, CPU tensors answer `.type()` with 'torch.cuda.FloatTensor' etc. and
    `.cuda()` with themselves. Scoped to single calls: nothing else sees it."""
    # Patching torch's methods, whose overloads no plain function matches.
    torch.Tensor.type = _type_with_cuda_names  # type: ignore[method-assign, assignment]
    torch.Tensor.cuda = _cuda_stays_on_cpu  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        torch.Tensor.type = _real_type  # type: ignore[method-assign]
        torch.Tensor.cuda = _real_cuda  # type: ignore[method-assign]


def _as_if_on_cuda(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _tensors_as_if_on_cuda():
            return fn(*args, **kwargs)

    return wrapper


_enabled = False


class _NoFP8:
    """Transformer Engine's FP8 state and contexts, as they answer when FP8 is off."""

    @staticmethod
    def is_fp8_enabled() -> bool:
        return False

    @staticmethod
    def get_fp8_recipe() -> None:
        return None

    @staticmethod
    def context(*args: Any, **kwargs: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """fla.modules.convolution.causal_conv1d in torch: a depthwise convolution over the sequence
    of x [batch, seq, channels] with weight [channels, width], each position seeing itself and
    the width - 1 before it, then SiLU. Returns (output, no final state) as fla does."""
    if initial_state is not None or output_final_state or cu_seqlens is not None:
        raise NotImplementedError(
            "the CPU stand-in of causal_conv1d has no cache state and no packed sequences"
        )
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"causal_conv1d activation {activation!r}: silu (swish) or None")
    seq, width = x.size(1), weight.size(-1)
    out = torch.nn.functional.conv1d(
        x.transpose(1, 2).to(weight.dtype),
        weight.unsqueeze(1),
        bias,
        padding=width - 1,
        groups=weight.size(0),
    )[..., :seq]
    if activation is not None:
        out = torch.nn.functional.silu(out)
    return out.transpose(1, 2).to(x.dtype), None


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6, **kwargs: Any) -> torch.Tensor:
    """fla.modules.l2norm.l2norm in torch: x / sqrt(sum(x^2) + eps) along `dim`, in FP32."""
    y = x.float()
    return (y * torch.rsqrt((y * y).sum(dim=dim, keepdim=True) + eps)).to(x.dtype)


def _gated_delta_net_in_torch() -> None:
    """Item 7: Gated DeltaNet's fla kernels replaced by torch for the CPU."""
    from megatron.core.ssm.gated_delta_net import common, gdn

    gdn.causal_conv1d = causal_conv1d
    gdn.chunk_gated_delta_rule = common.torch_chunk_gated_delta_rule
    common.causal_conv1d = causal_conv1d
    common.chunk_gated_delta_rule = common.torch_chunk_gated_delta_rule
    common.l2norm = l2norm
    common.HAVE_FLA = True  # GatedDeltaNet.__init__ refuses to build without fla


def enabled() -> bool:
    return _enabled


def _no_compile(fn: Callable | None = None, *args: Any, **kwargs: Any) -> Any:
    """torch.compile as Megatron-Core's own `noop_decorator`, bare or called with options."""
    return fn if fn is not None else (lambda inner: inner)


def import_megatron_core() -> None:
    """Import Megatron-Core for a CPU run, with its JIT fuser off (megatron/core/jit.py).

    Megatron-Core decorates its fused kernels (bias-GELU, SwiGLU, rotary, ...) with `jit_fuser`,
    which is `torch.compile`: the decoration alone imports TorchDynamo and Inductor, about 2 s of
    CPU per process, paid by every rank of every CPU launch. A CPU run never calls those kernels
    compiled (the fusion flags are off there, and Inductor would need a C++ toolchain). So the
    package is imported with torch.compile standing in as Megatron-Core's no-op decorator, and
    `disable_jit_fuser` keeps it so for the modules imported later. No effect once Megatron-Core
    is imported (a process that imported it for something else keeps what it has).
    """
    import sys

    if "megatron.core" in sys.modules:
        return
    compile_ = torch.compile
    torch.compile = _no_compile  # type: ignore[assignment]
    try:
        import megatron.core
        from megatron.core import jit

        jit.disable_jit_fuser()
    finally:
        torch.compile = compile_
    del megatron


def enable() -> None:
    """Redirect Megatron-Core's CUDA calls to the CPU. Idempotent; call before building anything."""
    global _enabled
    if _enabled:
        return
    import_megatron_core()
    # 1. torch as the listed modules see it.
    proxy = _CpuTorch()
    for name in _MODULES:
        module = importlib.import_module(name)
        if getattr(module, "torch", None) is torch:
            module.torch = proxy  # type: ignore[attr-defined]  # Megatron's module, patched

    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.optimizer import distrib_optimizer, grad_scaler, optimizer
    from megatron.core.tensor_parallel import random

    # 2. The RNG tracker: Megatron's class with CPU add/fork, and the module-level get/set helpers
    #    that the tracker, activation recompute (CheckpointFunction) and checkpointing call.
    random.CudaRNGStatesTracker = type(
        "CpuRNGStatesTracker", (_CpuRNGStatesTracker, random.CudaRNGStatesTracker), {}
    )
    random._get_cuda_rng_state = _get_rng_state
    random._set_cuda_rng_state = _set_rng_state
    random.initialize_rng_tracker(force_reset=True)

    # 3. Calls that compare Tensor.type() with 'torch.cuda.*Tensor' or move tensors with .cuda().
    for owner, attr in (
        (distrib_optimizer.DistributedOptimizer, "__init__"),  # param grouping by type()
        (optimizer.Float16OptimizerWithFloat16Params, "__init__"),  # param grouping by type()
        # asserts grad.type() == 'torch.cuda.FloatTensor'; optimizer.py calls it through its own
        # module attribute, so that is the one to wrap.
        (optimizer, "clip_grad_by_total_norm_fp32"),
        (LanguageModule, "setup_embeddings_and_output_layer"),  # tied embeddings: weight.cuda()
        (grad_scaler.DynamicGradScaler, "load_state_dict"),  # FP16 loss scale: .cuda(device)
    ):
        setattr(owner, attr, _as_if_on_cuda(getattr(owner, attr)))
    # 5. Output-discarding recompute without Transformer Engine.
    if not random.HAVE_TE:
        random.FP8GlobalStateManager = _NoFP8
        random.activation_recompute_forward = random.fp8_autocast = _NoFP8.context
    # 6. Megatron-FSDP: device meshes over the gloo groups, and a .cuda() in a shard check.
    from megatron.core.distributed.fsdp import mcore_fsdp_adapter
    from megatron.core.distributed.fsdp.src.megatron_fsdp import param_and_grad_buffer

    mcore_fsdp_adapter.DeviceMesh = _CpuDeviceMesh
    check = param_and_grad_buffer.validate_uneven_dtensor
    param_and_grad_buffer.validate_uneven_dtensor = _as_if_on_cuda(check)
    # 7. Gated DeltaNet's Triton kernels.
    _gated_delta_net_in_torch()
    _enabled = True
