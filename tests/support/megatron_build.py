"""Megatron-Core's own constructors as the checker's oracle: the model a run builds, on one machine.

`build(cfg, cluster)` builds the model chunks of every pipeline stage, one stage at a time: for
stage s it sets up Megatron-Core's process groups for the config's layout on torch's fake process
group, at the config's world size (`finalize(cfg, cluster).world_size`), as a rank of stage s (no
peer exists, no collective runs), then builds that rank's chunks the way the engine does
(training/distributed.py `init_model_parallel`, training/build.py: `transformer_config`, the
architecture's builder, LoRA's adapters) under the meta device, so that no weight is allocated and
a 70B-shaped config builds in milliseconds. What only a later stage builds is seen too: the output
layer and the loss, MTP layers, the decoder layers of an explicit pipeline layout. What
Megatron-Core refuses at that point (its TransformerConfig, `initialize_model_parallel`, its layer
specs, every module's constructor) is its answer; what it asserts only in the first forward step
is not seen here.

On worlds of more than BIG_WORLD ranks, only stages 0, 1 and the last are built: in an even split
every middle stage builds what stage 1 builds (an explicit layout's other middle stages go unbuilt
there). Megatron-Core's `initialize_model_parallel` creates every group of the world whichever
rank asks: measured on the fake process group on a 2-core machine, an init (and its teardown) of
1024 ranks takes 0.13-0.23 s (up to 0.3 s with the machine loaded), of 256 ranks ~30 ms, against a
few milliseconds for a small meta build, so a 16-stage pipeline of 1024 ranks would take seconds
per config.

The model is the one a GPU run builds wherever the two builds agree: on a GPU, Transformer
Engine's spec replaces Megatron-Core's local one for full training (models/specs.py
`choose_backend`), and Transformer Engine does not import on this machine; LoRA and machines
without Transformer Engine build the local spec on GPUs too.

Megatron-Core's gloo groups are not made: gloo cannot connect over the fake store, and nothing
built here uses them.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from unittest import mock

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from torch.testing._internal.distributed.fake_pg import FakeStore

from config.finalize import complete, finalize, missing
from config.hardware import Cluster
from config.precision import TORCH_DTYPES
from config.registry import MODEL_ARCHS, load
from config.schema import TrainingConfig
from models.gpt import chunks_per_rank, transformer_config
from training.distributed import init_model_parallel

# What Megatron-Core raises when it refuses a config or a module: its asserts, and the errors its
# constructors raise by hand.
REFUSALS = (AssertionError, ValueError, RuntimeError, TypeError, NotImplementedError)
# Above this many ranks, `build` builds stages 0, 1 and the last only (see the module docstring).
BIG_WORLD = 256


class OracleError(Exception):
    """The oracle's own mistake (not one of REFUSALS, so that `refuses` never takes it for
    Megatron-Core's answer)."""


def stage_rank(cfg: TrainingConfig, cluster: Cluster, stage: int) -> int:
    """The first global rank of pipeline stage `stage`: with Megatron-Core's default order
    "tp-cp-ep-dp-pp" the pipeline rank is the outermost (`fake_world` checks it)."""
    world = finalize(cfg, cluster).world_size
    return stage * (world // max(1, cfg.parallel.pipeline_model_parallel_size))


@contextlib.contextmanager
def fake_world(cfg: TrainingConfig, cluster: Cluster, rank: int = 0) -> Iterator[None]:
    """Megatron-Core's parallel state for `cfg`'s layout on `cluster`, on all its ranks, as global
    rank `rank`, set up as the engine sets it up; whatever `initialize_model_parallel` raises
    propagates."""
    partial = finalize(cfg, cluster)
    derived = complete(partial)
    # A config the checker refuses may derive no chunks: its VPP as given then (none without a
    # pipeline, as chunks_per_rank counts), so that Megatron-Core says what it makes of the rest.
    par = cfg.parallel
    vpp = (
        (par.virtual_pipeline_model_parallel_size or 1)
        if par.pipeline_model_parallel_size > 1
        else 1
    )
    num_chunks = chunks_per_rank(cfg, derived) if derived is not None else vpp
    # torch chains a rank-prefixing hook onto sys.excepthook at every init: put it back.
    hook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=partial.world_size)
    try:
        init_model_parallel(cfg, partial, num_chunks, gloo=False)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        sys.excepthook = hook


@contextlib.contextmanager
def _as_if_on_a_gpu() -> Iterator[None]:
    """What constructors ask of CUDA, answered without one: the device (MLA's rotary embedding
    puts its tables there: the meta device here), streams (the alltoall dispatcher's) and moves
    to the GPU (the copy of the tied or MTP embedding on a later stage, before its all-reduce
    with the first stage's: left on the meta device)."""
    with (
        mock.patch.object(torch.cuda, "current_device", lambda: torch.device("meta")),
        mock.patch.object(torch.Tensor, "cuda", lambda self, *args, **kwargs: self),
        mock.patch.object(torch.cuda, "Stream", mock.MagicMock),
        mock.patch.object(torch.cuda, "Event", mock.MagicMock),
    ):
        yield


def stages(cfg: TrainingConfig, cluster: Cluster) -> list[int]:
    """The pipeline stages `build` builds: every one, or 0, 1 and the last on a world of more
    than BIG_WORLD ranks."""
    pp = max(1, cfg.parallel.pipeline_model_parallel_size)  # below 1: Megatron-Core refuses it
    if finalize(cfg, cluster).world_size <= BIG_WORLD:
        return list(range(pp))
    return sorted({0, min(1, pp - 1), pp - 1})


def build_stage(cfg: TrainingConfig, cluster: Cluster, stage: int) -> list[torch.nn.Module]:
    """The model chunks of one rank of pipeline stage `stage`, built by Megatron-Core on the meta
    device (see the module docstring); whatever Megatron-Core raises propagates."""
    rank = stage_rank(cfg, cluster, stage)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fake_world(cfg, cluster, rank):
            if (got := parallel_state.get_pipeline_model_parallel_rank()) != stage:
                raise OracleError(f"global rank {rank} is in pipeline stage {got}, not {stage}")
            partial = finalize(cfg, cluster)
            derived = complete(partial)
            if derived is None:
                raise ValueError(f"derives no {', '.join(missing(partial))}")
            dtype = getattr(torch, TORCH_DTYPES[derived.preset.params_dtype])
            builder = load(MODEL_ARCHS[cfg.model.arch].builder)
            # "cpu": weights made on the host (use_cpu_initialization), here on the meta device.
            config = transformer_config(cfg, derived, "cpu", dtype)
            with torch.device("meta"), _as_if_on_a_gpu():
                chunks = builder(cfg, derived, config, "cpu")
                if cfg.peft.scheme == "lora":
                    from training.lora import adapt

                    adapt(chunks, cfg)
    return chunks


def build(cfg: TrainingConfig, cluster: Cluster) -> dict[int, list[torch.nn.Module]]:
    """Each built pipeline stage's model chunks (`stages`), by stage; whatever Megatron-Core
    raises for any of them propagates."""
    return {stage: build_stage(cfg, cluster, stage) for stage in stages(cfg, cluster)}


def refuses(cfg: TrainingConfig, cluster: Cluster) -> str | None:
    """Why Megatron-Core refuses to build `cfg` on some pipeline stage (its exception), or None
    when every stage builds, or when a module needs a package that GPU containers have and this
    machine lacks (DeepEP, HybridEP, Transformer Engine: ImportError), which says nothing of the
    config."""
    try:
        build(cfg, cluster)
    except ImportError:
        return None
    except REFUSALS as err:
        return f"{type(err).__name__}: {err}"
    return None
