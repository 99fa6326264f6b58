"""Process groups and seeds: torchrun's environment -> torch.distributed -> Megatron-Core's groups.

NCCL on GPUs (one process per GPU, bound to LOCAL_RANK); gloo on the CPU, where
`training.cpu_mode` first redirects Megatron-Core's CUDA calls. Started without torchrun (plain
`python`), the run is a single process on a free local port.
"""

from __future__ import annotations

import os
import random
import socket
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from config.finalize import Partial
from config.schema import TrainingConfig
from training.ranks import Launch


def resolve_device(requested: str) -> str:
    """train.device "auto" is CUDA when a GPU is visible, else the CPU."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def free_port() -> int:
    """A TCP port free on this host now (for a one-process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_process_group(
    launch: Launch, device: str, timeout_minutes: int = 30, store: dist.Store | None = None
) -> bool:
    """torch.distributed from torchrun's MASTER_ADDR/PORT (a local one for a single process), or
    from `store` (training/inprocess.py: one fresh prefix per attempt).

    Returns False when a default group already exists (a caller that runs several trainings in one
    process group, or a test): it is used as it is, and whoever created it destroys it.
    """
    if device == "cpu":
        from training import cpu_mode

        cpu_mode.enable()  # idempotent
    if dist.is_initialized():
        return False
    if "MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(free_port())
    if device == "cuda":
        torch.cuda.set_device(launch.local_rank)
        dist.init_process_group(
            backend="nccl",
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=timedelta(minutes=timeout_minutes),
            device_id=torch.device("cuda", launch.local_rank),
            store=store,
        )
    else:
        dist.init_process_group(
            backend="gloo",
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=timedelta(minutes=timeout_minutes),
            store=store,
        )
    return True


def set_collective_timeout(timeout: timedelta) -> None:
    """Every process group's timeout for the collectives it starts from now on."""
    for group in list(dist.distributed_c10d._world.pg_names):
        group.set_timeout(timeout)


def init_model_parallel(
    cfg: TrainingConfig, derived: Partial, num_chunks: int, *, gloo: bool = True
) -> None:
    """Megatron-Core's TP / PP (with virtual stages) / CP / EP / ETP / DP groups.

    A `Partial` will do (a `Derived` is one): only its expert_tensor_parallel_size is read.

    `gloo`: Megatron-Core's gloo copies of the data-parallel groups too. Without them for torch's
    fake process group (which gloo cannot connect over), where a model is built and never run."""
    from megatron.core import parallel_state

    par = cfg.parallel
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=par.tensor_model_parallel_size,
        pipeline_model_parallel_size=par.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=num_chunks if num_chunks > 1 else None,
        context_parallel_size=par.context_parallel_size,
        expert_model_parallel_size=par.expert_model_parallel_size,
        expert_tensor_parallel_size=derived.expert_tensor_parallel_size,
        create_gloo_process_groups=gloo,
    )


def replica_rank() -> int:
    """Which data-parallel replica this rank's samples are: its TP, PP and CP peers read the same
    ones (a CP rank then computes its part of each sequence: models/gpt.py on_this_cp_rank).
    Megatron-Core's data-parallel rank, without context parallel."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_rank()


def set_seeds(seed: int) -> None:
    """Python, NumPy and torch seeds, plus Megatron-Core's tracked streams.

    As in Megatron-LM, every pipeline stage gets its own default seed (+100 x PP rank); the
    tracker then gives TP ranks different streams for TP-split dropout and init, and the same
    stream across data-parallel replicas.
    """
    from megatron.core import parallel_state, tensor_parallel

    seed = seed + 100 * parallel_state.get_pipeline_model_parallel_rank()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def process_groups() -> frozenset[dist.ProcessGroup]:
    """The torch.distributed process groups this process holds now, the default one included."""
    if not dist.is_initialized():
        return frozenset()
    return frozenset(dist.distributed_c10d._world.pg_map)


def destroy(keep: frozenset[dist.ProcessGroup] = frozenset()) -> None:
    """Tear down Megatron-Core's groups and every process group not in `keep` (safe to call twice).

    `keep`: what existed before the caller built its own (`process_groups()` then), e.g. the
    default group of a process that trains several runs in a row. Megatron-Core's
    destroy_model_parallel only forgets its groups: torch keeps each one registered, and a gloo
    group holds its worker and transport threads (NCCL its communicators and watchdog) until it
    is destroyed here and no object refers to it any more (training/entry.py `pretrain` sees to
    that), so every run in the same process would add its ~20 groups to the last run's.
    """
    from megatron.core import parallel_state

    _forget_device_meshes()
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    # The data-parallel-with-CP groups under a second name, which destroy_model_parallel leaves
    # set: they would keep the last run's two groups, and their threads, alive.
    parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP = None
    parallel_state._INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP_GLOO = None
    if not dist.is_initialized():
        return
    if dist.group.WORLD not in keep:  # the default group goes, and every group with it
        dist.destroy_process_group()
        return
    created = [group for group in dist.distributed_c10d._world.pg_map if group not in keep]
    # Newest first, on every rank in the same order (NCCL's abort was collective in some versions).
    for group in reversed(created):
        dist.destroy_process_group(group)


def _forget_device_meshes() -> None:
    """Empty DTensor's caches, which hold every DeviceMesh they have seen (Megatron-FSDP's), and
    through its `_pg_registry` the mesh's process groups and their threads.

    They key on the mesh, and a DeviceMesh compares equal to another over the same ranks and
    layout whatever its process groups: the next run's DTensors would get this run's mesh back
    from them, with groups that no longer exist ("Could not resolve the process group registered
    under the name N" in the checkpoint's save).
    """
    from torch.distributed.tensor import DTensor, _collective_utils, _redistribute
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    _redistribute._gen_transform_infos.cache_clear()
    _collective_utils.MeshTopoInfo.build_from_mesh.cache_clear()
