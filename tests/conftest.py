"""Shared test setup: no test writes to the user's home or reaches a hub; GPU tests skip without
one; no process a test starts outlives it (tests/support/children.py)."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import tempfile
from collections.abc import Iterator

import psutil
import pytest

from tests.support import children

# Before any test imports NeMo-Run, matplotlib or HF code: their caches go to a throwaway folder,
# and nothing may try a hub download.
_HOME = tempfile.mkdtemp(prefix="recipes-tests-")
for _var in ("NEMORUN_HOME", "HF_HOME", "MPLCONFIGDIR"):
    os.environ[_var] = os.path.join(_HOME, _var.lower())
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to pytest: handled as a Ctrl-C, so that every `finally` (and fixture
    teardown) runs and stops the children, instead of pytest dying with them still running."""


_workers_of_this_controller = False  # pytest-xdist's controller: its children are its workers


def _terminated(signum: int, frame: object) -> None:
    if _workers_of_this_controller:
        # Only the controller got the signal (a batch system's or a CI timeout's SIGTERM): its
        # workers, running the tests, get a Ctrl-C of their own, so that they stop their tests'
        # children before the controller's teardown ends them.
        for worker in psutil.Process().children():
            with contextlib.suppress(psutil.Error):
                worker.send_signal(signal.SIGINT)
    raise Terminated(f"pytest got {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM and SIGHUP end the session as Ctrl-C does (on pytest-xdist's workers too). The
    notices a run keeps out of its ranks' logs (training/quiet.py NOISE) are kept out of the
    warnings summary too, so that what is left there is news (pyproject.toml: the others)."""
    global _workers_of_this_controller
    workers = config.getoption("numprocesses", None)
    _workers_of_this_controller = bool(workers) and not hasattr(config, "workerinput")
    if _workers_of_this_controller:
        from xdist.workermanage import NodeManager

        # pytest-xdist kills a worker that has not ended 10 s after the session was interrupted:
        # in the middle of stopping its tests' children (a grace of children.GRACE_S between
        # SIGTERM and SIGKILL, on a loaded machine), which then run on as orphans.
        NodeManager.EXIT_TIMEOUT = max(NodeManager.EXIT_TIMEOUT, 120)
        # Every process the workers start carries this controller's token too, so that its
        # sweep at the end (pytest_unconfigure) also stops what a worker could not: execnet ends
        # a worker with os._exit 15 s after the controller asks it to, stopping or not.
        children.adopt_descendants()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _terminated)
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        # Started in the background by a non-interactive shell (`make test &`, a CI runner),
        # pytest inherits SIGINT ignored, and would pass that on to every process it starts: a
        # Ctrl-C, and the interrupt the xdist controller forwards to its workers on SIGTERM, would
        # then stop nothing. A handler is not inherited across exec: children get the default.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    from training.quiet import NOISE

    for notice in NOISE:
        if notice.warning is not None:
            line = f"ignore:{notice.pattern}:{notice.warning.__name__}"
            config.addinivalue_line("filterwarnings", line)


def pytest_unconfigure(config: pytest.Config) -> None:
    children.sweep()  # whatever is left, e.g. a daemon that re-parented a job's processes


@pytest.fixture(autouse=True)
def _children_end_with_the_test() -> Iterator[None]:
    """Children a test started and left running stop when it ends (a fixture's stop at its own
    teardown: they were started before this fixture)."""
    before = children.count()
    yield
    children.stop_all(since=before)


@pytest.fixture(autouse=True)
def _process_groups_end_with_the_test() -> Iterator[None]:
    """Process groups a test built in this process (a Trainer's, through Megatron-Core) are
    destroyed when it ends, and with them their threads: otherwise every in-process run adds its
    groups' threads to pytest's own. Those of a module's fixture (built before) stay. A group
    that Megatron-Core has already forgotten lives in a reference cycle (model, optimizer,
    trainer) until the collector runs, so it runs whenever the test left threads behind."""
    before, threads = _process_groups(), _threads()
    yield
    if _process_groups() - before or _model_parallel_initialized():
        from training import distributed

        distributed.destroy(keep=before)
    if _threads() > threads:
        gc.collect()


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _process_groups() -> frozenset:
    """The torch.distributed groups this process holds; none where torch was never imported."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return frozenset()
    return frozenset(dist.distributed_c10d._world.pg_map)


def _model_parallel_initialized() -> bool:
    """Whether Megatron-Core holds groups (which torch does not always list in its own map)."""
    parallel_state = sys.modules.get("megatron.core.parallel_state")
    return parallel_state is not None and parallel_state.model_parallel_is_initialized()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marker: gpu)")
    for item in gpu_items:
        item.add_marker(skip)
