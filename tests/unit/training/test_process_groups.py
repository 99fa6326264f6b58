"""training/distributed.py `destroy(keep=...)`: the process groups that existed before stay, every
one built since goes, and with it (once nothing refers to it) the threads it held: neither
Megatron-Core's globals nor DTensor's caches keep one. One process, gloo; the ten-run version
under torchrun is tests/smoke/test_pretrain_releases.py.

The counts run in a fresh interpreter: pytest's own process carries threads of earlier tests that
end on their own schedule, which would move the count either way."""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import pytest

from tests.support import children
from tests.unit.training.test_engine import one_rank  # noqa: F401  (the module's one-rank process group)

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]


def native_threads() -> int:
    """This process's threads once those that are ending have ended (unchanged for a second)."""
    last, steady, deadline = -1, 0, time.monotonic() + 60
    while steady < 10 and time.monotonic() < deadline:
        count = len(os.listdir("/proc/self/task"))
        steady = steady + 1 if count == last else 0
        last = count
        time.sleep(0.1)
    return last


def destroy_keeps_the_groups_before_and_frees_the_threads_of_the_rest() -> None:
    import torch.distributed as dist

    from training import distributed
    from training.ranks import Launch

    assert distributed.init_process_group(Launch(0, 1, 0, 1), "cpu")
    before, threads = distributed.process_groups(), native_threads()
    groups = [dist.new_group([0], backend="gloo") for _ in range(4)]
    assert native_threads() > threads  # each gloo group runs threads of its own
    assert distributed.process_groups() == before | set(groups)
    distributed.destroy(keep=before)
    assert distributed.process_groups() == before
    assert dist.is_initialized()
    del groups
    gc.collect()
    assert native_threads() == threads
    distributed.destroy()
    assert distributed.process_groups() == frozenset()


def destroy_leaves_megatron_core_holding_no_group() -> None:
    """Megatron-Core's destroy_model_parallel forgets all its groups but the two it also keeps
    under a second name: a group still named there would keep its threads after destroy."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    from training import distributed
    from training.ranks import Launch

    assert distributed.init_process_group(Launch(0, 1, 0, 1), "cpu")
    before, threads = distributed.process_groups(), native_threads()
    parallel_state.initialize_model_parallel()
    assert native_threads() > threads
    distributed.destroy(keep=before)
    gc.collect()
    held = [k for k, v in vars(parallel_state).items() if isinstance(v, dist.ProcessGroup)]
    assert held == []
    assert native_threads() == threads
    distributed.destroy()


FRESH = {
    "groups": destroy_keeps_the_groups_before_and_frees_the_threads_of_the_rest,
    "megatron": destroy_leaves_megatron_core_holding_no_group,
}


def in_a_fresh_interpreter(check: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    done = children.run(
        [sys.executable, "-m", "tests.unit.training.test_process_groups", check],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_destroy_keeps_the_groups_before_and_frees_the_threads_of_the_rest() -> None:
    in_a_fresh_interpreter("groups")


def test_destroy_leaves_megatron_core_holding_no_group() -> None:
    in_a_fresh_interpreter("megatron")


@pytest.mark.usefixtures("one_rank")
def test_destroy_leaves_dtensor_no_mesh_over_the_groups_it_destroyed() -> None:
    """DTensor's caches key on DeviceMesh, which compares equal to any mesh over the same ranks:
    kept, they would hold the destroyed group (and its threads), and hand the next mesh's DTensors
    the destroyed one back, whose group no longer resolves."""
    import weakref

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from training import distributed

    def doubled(mesh: DeviceMesh) -> DeviceMesh:
        return (distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]) * 2).device_mesh

    before = distributed.process_groups()
    first = DeviceMesh.from_group(dist.new_group([0], backend="gloo"), "cpu")
    assert doubled(first) is first
    gone = weakref.ref(first)
    del first
    distributed.destroy(keep=before)
    gc.collect()
    assert gone() is None
    second = DeviceMesh.from_group(dist.new_group([0], backend="gloo"), "cpu")
    assert doubled(second) is second


if __name__ == "__main__":
    FRESH[sys.argv[1]]()
