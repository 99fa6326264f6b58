"""Megatron-Core's own constructors as the checker's oracle: the model a run builds, on one machine.

`builds(cfg, cluster)` sets up Megatron-Core's process groups for the config's layout on torch's
fake process group (rank 0 of the whole world: no peer exists, no collective runs), then builds
rank 0's model chunks the way the engine does (training/build.py: `transformer_config`, the
architecture's builder, LoRA's adapters) under the meta device, so that no weight is allocated
and a 70B-shaped config builds in milliseconds. What Megatron-Core refuses at that point (its
TransformerConfig, `initialize_model_parallel`, its layer specs, every module's constructor) is
its answer; what it asserts only in the first forward step is not seen here.

The model is the one a GPU run builds wherever the two builds agree: on a GPU, Transformer
Engine's spec replaces Megatron-Core's local one for full training (models/specs.py
`choose_backend`), and Transformer Engine does not import on this machine; LoRA and machines
without Transformer Engine build the local spec on GPUs too.

Megatron-Core's gloo groups are not made (create_gloo_process_groups=False): gloo cannot connect
over the fake store, and nothing built here uses them.
"""

from __future__ import annotations

import contextlib
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
from models.gpt import transformer_config

# What Megatron-Core raises when it refuses a config or a module: its asserts, and the errors its
# constructors raise by hand.
REFUSALS = (AssertionError, ValueError, RuntimeError, TypeError, NotImplementedError)


@contextlib.contextmanager
def fake_world(cfg: TrainingConfig, cluster: Cluster) -> Iterator[None]:
    """Megatron-Core's parallel state for `cfg`'s layout on `cluster`, as its rank 0; whatever
    `initialize_model_parallel` raises propagates."""
    par, partial = cfg.parallel, finalize(cfg, cluster)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=partial.world_size)
    try:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=par.tensor_model_parallel_size,
            pipeline_model_parallel_size=par.pipeline_model_parallel_size,
            virtual_pipeline_model_parallel_size=par.virtual_pipeline_model_parallel_size,
            context_parallel_size=par.context_parallel_size,
            expert_model_parallel_size=par.expert_model_parallel_size,
            expert_tensor_parallel_size=partial.expert_tensor_parallel_size,
            create_gloo_process_groups=False,
        )
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@contextlib.contextmanager
def _as_if_on_a_gpu() -> Iterator[None]:
    """What constructors ask of CUDA, answered without one: the device (MLA's rotary embedding
    puts its tables there: the meta device here) and streams (the alltoall dispatcher's)."""
    with (
        mock.patch.object(torch.cuda, "current_device", lambda: torch.device("meta")),
        mock.patch.object(torch.cuda, "Stream", mock.MagicMock),
        mock.patch.object(torch.cuda, "Event", mock.MagicMock),
    ):
        yield


def build(cfg: TrainingConfig, cluster: Cluster) -> list[torch.nn.Module]:
    """Rank 0's model chunks, built by Megatron-Core on the meta device (see the module
    docstring); whatever Megatron-Core raises propagates."""
    partial = finalize(cfg, cluster)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with fake_world(cfg, cluster):
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


def refuses(cfg: TrainingConfig, cluster: Cluster) -> str | None:
    """Why Megatron-Core refuses to build `cfg` (its exception), or None when it builds, or when
    a module needs a package that GPU containers have and this machine lacks (DeepEP, HybridEP,
    Transformer Engine: ImportError), which says nothing of the config."""
    try:
        build(cfg, cluster)
    except ImportError:
        return None
    except REFUSALS as err:
        return f"{type(err).__name__}: {err}"
    return None
