"""In-process restart (resilience.inprocess_restart): `pretrain` under nvidia-resiliency-ext's
`inprocess.Wrapper`.

When a rank raises, the Wrapper aborts every rank's process groups and calls `pretrain` again in
the same processes: no new job, no new interpreter, no re-import of torch and Megatron-Core. Each
attempt builds its process groups and its Trainer anew and resumes from the newest complete
checkpoint, as a requeued job would. It covers exceptions (a NCCL error, a failed step); a rank
that dies is left to torchrun, ft_launcher or the Slurm requeue.

Two stores, apart from torchrun's (MASTER_PORT): the Wrapper's own (MASTER_PORT + 2: its
barriers, heartbeats and rank assignment) and one for the process groups (MASTER_PORT + 1), under
a fresh prefix per attempt so that no attempt reads the rendezvous keys of the one before.

Tested on 2 CPU ranks (gloo) with nvidia-resiliency-ext 0.6.0, not on GPUs. A failed attempt's
`pretrain` releases its model, optimizer and process groups before the Wrapper restarts it
(training/entry.py): ten attempts leave as many threads as one
(tests/smoke/test_pretrain_releases.py). That the previous attempt's GPU memory is freed as well
follows, but has not been measured.
"""

# No `from __future__ import annotations` here: the Wrapper hands its CallWrapper to the parameter
# annotated with that class, and compares the annotation as an object, not as a string.

import importlib
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import ModuleType
from typing import TYPE_CHECKING

from config.schema import TrainingConfig
from config.tree import ConfigError

if TYPE_CHECKING:
    from training.engine import Hook

# What the ranks need: the in-process package, importable beside megatron-core
# (nvidia-resiliency-ext 0.4.1, the newest wheel for Debian 12's glibc, breaks megatron-core's
# import; 0.6.0 and NGC containers' builds work).
INPROCESS_IMPORT = "import nvidia_resiliency_ext.inprocess, megatron.core"  # in this order
INPROCESS_FIX = (
    "install nvidia-resiliency-ext (>= 0.6) where the ranks run (pip install .[resiliency]), "
    "run in an NGC container that carries it, or set resilience.inprocess_restart=false"
)


def import_inprocess() -> ModuleType:
    """nvidia_resiliency_ext.inprocess, or a ConfigError naming the field and the fix."""
    try:
        from nvidia_resiliency_ext import inprocess

        # Second: a missing package fails at once. nvidia-resiliency-ext 0.4.1 breaks this import.
        importlib.import_module("megatron.core")
    except Exception as err:  # ImportError, or 0.4.1's AttributeError inside megatron.core
        raise ConfigError(
            [
                (
                    "resilience.inprocess_restart",
                    "is true, but nvidia_resiliency_ext.inprocess does not import with "
                    f"megatron-core here ({type(err).__name__}: {err}); " + INPROCESS_FIX,
                )
            ]
        ) from err
    return inprocess


# On the CPU: how long a rank waits in a collective before it errors. A rank that raises leaves its
# peers blocked in the step's next collective; NCCL's abort (the Wrapper's) unblocks them, gloo has
# none that does (torch 2.14: ProcessGroupGloo.abort leaves a pending collective waiting), so the
# peers return when this timeout ends, well within the Wrapper's 60 s soft timeout.
CPU_COLLECTIVE_TIMEOUT = timedelta(seconds=30)


def pretrain_restartable(
    pretrain: Callable[..., None], config: TrainingConfig, hooks: Sequence["Hook"] = ()
) -> None:
    """`pretrain(config, hooks)`, called again in this process (up to
    resilience.inprocess_max_restarts times) when any rank raises. `pretrain` is the entry point's
    (training/entry.py), handed in: the entry point calls this module, never the other way."""
    import torch.distributed as dist

    from training import distributed
    from training.ranks import launch_from_env

    inprocess = import_inprocess()
    launch = launch_from_env()
    on_cpu = distributed.resolve_device(config.train.device) == "cpu"
    if "MASTER_ADDR" not in os.environ:  # plain `python`: a world of one on a free port
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(distributed.free_port())
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    groups_store = dist.TCPStore(
        host_name=host,
        port=port + 1,
        world_size=launch.world_size,
        is_master=launch.rank == 0,
        timeout=timedelta(seconds=300),
        wait_for_workers=True,
    )

    # The package's classes, imported at run time (import_inprocess): untyped to mypy.
    def attempt(call_wrapper: inprocess.CallWrapper = None) -> None:  # type: ignore[name-defined]
        store = dist.PrefixStore(f"attempt{call_wrapper.iteration}", groups_store)
        timeout = CPU_COLLECTIVE_TIMEOUT if on_cpu else None
        pretrain(config, hooks, store=store, collective_timeout=timeout)

    class TearDown(inprocess.finalize.Finalize):  # type: ignore[name-defined]
        """Megatron-Core's groups and the default group, whatever the aborted attempt left."""

        def __call__(self, state):
            distributed.destroy()
            return state

    wrapper = inprocess.Wrapper(
        store_kwargs={"port": port + 2, "timeout": timedelta(seconds=300)},
        # max_iterations counts the first call: restarts + 1 calls in all.
        initialize=inprocess.initialize.RetryController(
            max_iterations=config.resilience.inprocess_max_restarts + 1
        ),
        abort=inprocess.abort.AbortTorchDistributed(),
        finalize=TearDown(),
    )
    if on_cpu:
        # The Wrapper adds GPU, NVLink and NIC health checks before each restart; they need NVML,
        # which a host without a GPU lacks (NVMLError_LibraryNotFound would end the run).
        wrapper.restart_health_check = None
    wrapper(attempt)()
