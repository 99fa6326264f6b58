"""A pytest plugin: the CPU time of each test, its own and its children's, and its wall time.

    CPULOG=cpu.log .venv/bin/python -m pytest -q -n 2 --dist loadfile -p bench.cputime

Each test appends one line to $CPULOG: its process's CPU seconds, its children's (those waited
for: torchrun and its ranks, a launched CLI), its wall seconds, and its node id, tab-separated.
Under pytest-xdist the workers write (the controller runs no test). A test's children count only
once they have ended and been waited for, which every test does before it ends.
"""

from __future__ import annotations

import os
import resource
import time

import pytest

_started: dict[str, tuple[float, float, float]] = {}


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def _runs_tests(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput") or not config.getoption("numprocesses", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    if not _runs_tests(item.config):
        yield
        return
    own, children = _cpu()
    began = time.monotonic()
    yield
    own_after, children_after = _cpu()
    line = (
        f"{own_after - own:.1f}\t{children_after - children:.1f}\t"
        f"{time.monotonic() - began:.1f}\t{item.nodeid}\n"
    )
    with open(os.environ.get("CPULOG", "cpu.log"), "a", encoding="utf-8") as log:
        log.write(line)
