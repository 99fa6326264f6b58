"""The job itself: a known GPU kind, at least one node and one GPU per node, and no more GPUs than
any cluster has (the parallel rules list the divisors of the world size)."""

from __future__ import annotations

from config.bounds import MAX_GPUS
from config.finalize import Partial
from config.hardware import MESH, NVLINK_TOPOLOGIES, SWITCH, Cluster, gpu_kind_problem
from config.problems import Problem
from config.schema import TrainingConfig


def cluster_size(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    out = []
    unknown = gpu_kind_problem(cluster.gpu)
    if unknown:
        out.append(Problem("cluster.gpu", unknown))
    if cluster.nvlink_topology not in (None, *NVLINK_TOPOLOGIES):
        out.append(
            Problem(
                "cluster.nvlink_topology",
                f"{cluster.nvlink_topology!r} is not an NVLink topology; give the profile's "
                f"nvlink_topology as one of {', '.join(NVLINK_TOPOLOGIES)} ({SWITCH}: NVSwitch, "
                f"any group gets all of a GPU's links; {MESH}: each GPU pair linked directly)",
            )
        )
    if cluster.num_nodes < 1 or cluster.gpus_per_node < 1:
        out.append(
            Problem(
                "cluster",
                f"needs at least one node and one GPU per node, got {cluster.num_nodes} x "
                f"{cluster.gpus_per_node}; give --nodes and --gpus-per-node (or the profile's "
                "nodes and gpus_per_node) as 1 or more",
            )
        )
    elif cluster.nvlink_domain is not None and not 1 <= cluster.nvlink_domain <= MAX_GPUS:
        out.append(
            Problem(
                "cluster.nvlink_domain",
                f"{cluster.nvlink_domain} GPUs per NVLink domain; give --nvlink-domain (or the "
                "profile's nvlink_domain) as 1 or more: a node's GPU count, or 72 for GB200 NVL72",
            )
        )
    elif cluster.world_size > MAX_GPUS:
        out.append(
            Problem(
                "cluster",
                f"{cluster.num_nodes} node(s) x {cluster.gpus_per_node} GPUs = "
                f"{cluster.world_size} GPUs is more than any cluster has (at most {MAX_GPUS}); "
                "check --nodes and --gpus-per-node",
            )
        )
    return out
