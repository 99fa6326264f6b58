"""Ring collectives across a cluster: the rate and the latency the step-time model
(config/cost/steptime.py) prices a data-parallel reduce-scatter, all-gather or all-reduce at.
Plain Python, for the login node."""

from __future__ import annotations

from config.hardware import Cluster


def ring(cluster: Cluster, group: int, stride: int, k: dict[str, float]) -> float:
    """Bytes/s per GPU of a ring collective (all-reduce, reduce-scatter, all-gather) among
    `group` ranks `stride` apart (the data-parallel ranks: TP x CP apart), priced as
    (group - 1) / group of the bytes over this rate. Inside a domain, NVLink's. Across domains
    NCCL lays one ring channel per NIC (src/graph/search.cc), so a ring leaves each domain through
    the NICs of all its members there: n members move it at n NICs' rate, up to NVLink's. Two
    DGX H100s (8 members each, 8 NICs of 50 GB/s) measure ~360-400 GB/s all-reduce bus
    bandwidth in nccl-tests, an NVLink-class figure, where one NIC would give 45."""
    nvl = cluster.nvlink(group) * 1e9 * k["nvlink"]
    if not cluster.crosses(group * stride):
        return nvl
    return min(nvl, members(cluster, group, stride) * cluster.network * 1e9 * k["network"])


def ring_latency(cluster: Cluster, group: int, stride: int, k: dict[str, float]) -> float:
    """Seconds a ring reduce-scatter or all-gather among `group` ranks `stride` apart takes
    beyond its bytes, as NCCL's tuning model prices it (src/graph/tuning.cc): a base latency and
    one per step of the ring, group - 1 steps, those that leave an NVLink domain at the
    network's latency."""
    domains = -(-group // members(cluster, group, stride))
    return (
        k["ring_base_s"]
        + (group - domains) * k["ring_step_nvlink_s"]
        + (domains - 1) * k["ring_step_network_s"]
    )


def members(cluster: Cluster, group: int, stride: int) -> int:
    """How many of `group` ranks `stride` apart share one NVLink domain: all of them unless
    their block leaves it."""
    if not cluster.crosses(group * stride):
        return group
    return max(1, min(group, cluster.domain // stride))
