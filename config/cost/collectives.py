"""Ring collectives across a cluster: the rate and the latency the step-time model
(config/cost/steptime.py) prices a data-parallel reduce-scatter, all-gather or all-reduce at, and
how far the slowest of the GPUs that synchronize lags. Plain Python, for the login node."""

from __future__ import annotations

import math
from functools import lru_cache

from config.hardware import Cluster, GpuSpec


def ring(cluster: Cluster, group: int, stride: int, k: dict[str, float]) -> float:
    """Bytes/s per GPU of a ring collective (all-reduce, reduce-scatter, all-gather) among
    `group` ranks `stride` apart (the data-parallel ranks: TP x CP apart), priced as
    (group - 1) / group of the bytes over this rate. Inside a domain, NVLink's. Across domains
    NCCL lays one ring channel per NIC (src/graph/search.cc), so a ring leaves each domain through
    the NICs of all its members there: n members move it at n NICs' rate, up to NVLink's. Two
    DGX H100s (8 members each, 8 NICs of 50 GB/s) measure ~360-400 GB/s all-reduce bus
    bandwidth in nccl-tests, an NVLink-class figure, where one NIC would give 45."""
    return _ring(cluster, cluster.spec, group, stride, k["nvlink"], k["network"])


@lru_cache(maxsize=4096)
def _ring(
    cluster: Cluster, spec: GpuSpec, group: int, stride: int, nvlink: float, network: float
) -> float:
    """ring() at the constants' two efficiencies, cached: the planner asks for a few groups
    thousands of times. `spec`, the GPU kind's figures, is only part of the key (a test may
    give a kind's name other figures)."""
    nvl = cluster.nvlink(group) * 1e9 * nvlink
    if not cluster.crosses(group * stride):
        return nvl
    return min(nvl, members(cluster, group, stride) * cluster.network * 1e9 * network)


def ring_latency(cluster: Cluster, group: int, stride: int, k: dict[str, float]) -> float:
    """Seconds a ring reduce-scatter or all-gather among `group` ranks `stride` apart takes
    beyond its bytes, as NCCL's tuning model prices it (src/graph/tuning.cc): a base latency and
    one per step of the ring, group - 1 steps, those that leave an NVLink domain at the
    network's latency."""
    domains = _domains(cluster, cluster.spec, group, stride)
    return (
        k["ring_base_s"]
        + (group - domains) * k["ring_step_nvlink_s"]
        + (domains - 1) * k["ring_step_network_s"]
    )


@lru_cache(maxsize=4096)
def _domains(cluster: Cluster, spec: GpuSpec, group: int, stride: int) -> int:
    """The NVLink domains `group` ranks `stride` apart span; cached as `_ring`."""
    return -(-group // members(cluster, group, stride))


def members(cluster: Cluster, group: int, stride: int) -> int:
    """How many of `group` ranks `stride` apart share one NVLink domain: all of them unless
    their block leaves it."""
    if not cluster.crosses(group * stride):
        return group
    return max(1, min(group, cluster.domain // stride))


@lru_cache(maxsize=256)
def slowest_of(n: int) -> float:
    """The expected maximum of `n` independent standard normal draws: how many standard
    deviations of one GPU's speed the slowest of `n` GPUs lies below the mean, which every
    synchronous step waits for (0 for one GPU; 1.42 for 8, 3.44 for 2,048). Integrated
    numerically: E[max] = integral over x >= 0 of (1 - F(x)^n), less that over x < 0 of F(x)^n,
    F the normal distribution function (a trapezoid rule, 1e-3 wide, over -9 to 9)."""
    if n <= 1:
        return 0.0
    step, total = 1e-3, 0.0
    for i in range(-9000, 9001):
        x = i * step
        below = (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** n
        weight = 0.5 if i in (-9000, 0, 9000) else 1.0
        total += weight * step * ((1 - below) if x >= 0 else -below)
    return total
