"""The job's size: `job_cluster` sizes the job every command judges and launches (`recipes check`,
`plan`, `run` on every executor, the NeMo-Run entry points): the command line, then the cluster
profile, then the recipe's published run."""

from __future__ import annotations

from dataclasses import dataclass

from config.hardware import Cluster, gpu_kind_problem
from config.tree import ConfigError
from launchers.profile import Profile


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSize:
    """The job's size as a command gives it (`--nodes`, `--gpus-per-node`, `--gpu`,
    `--nvlink-domain`, `recipes run --device`); None is not given."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    gpu: str | None = None  # a GPU kind (config/hardware.py GPUS) or "cpu"
    nvlink_domain: int | None = None  # GPUs joined by NVLink; None: the GPU kind's, else a node
    device: str | None = None  # "cpu": the CPU smoke mode whatever the GPU kind; "cuda": GPUs


CPU_NODES, CPU_PROCESSES = 1, 2  # the CPU mode of a recipe published for GPUs: one node, 2 ranks


def job_cluster(
    published: Cluster | None, profile: Profile | None = None, size: JobSize | None = None
) -> Cluster:
    """The cluster a command judges and launches on: each value from `size` (the command line),
    else the profile's default, else the recipe's `published` run (None for a config outside the
    catalog: then the command or the profile must give it).

    The CPU mode (`device="cpu"`, or the GPU kind resolving to "cpu" without `device="cuda"`) runs
    a recipe published for GPUs on one node of two processes unless the command or the profile
    says otherwise, not on its GPU count. A count of 0 or less is kept, for the checker to refuse
    with the field's name.
    """
    size = size or JobSize()
    unknown = gpu_kind_problem(size.gpu) if size.gpu is not None else None
    if unknown:
        raise ConfigError([("--gpu", unknown)])
    prof = profile or Profile(executor="local")
    kind = size.gpu or prof.gpu or (published.gpu if published else None)
    cpu = size.device == "cpu" or (size.device is None and kind == "cpu")
    cpu_default = cpu and (published is None or published.gpu != "cpu")

    def first(*values: int | None) -> int | None:  # 0 counts as given: the checker refuses it
        return next((v for v in values if v is not None), None)

    nodes = first(
        size.nodes,
        prof.nodes,
        CPU_NODES if cpu_default else None,
        published.num_nodes if published else None,
    )
    per_node = first(
        size.gpus_per_node,
        prof.gpus_per_node,
        CPU_PROCESSES if cpu_default else None,
        published.gpus_per_node if published else None,
    )
    gpu = "cpu" if cpu else kind
    if nodes is None or per_node is None or gpu is None:
        raise ConfigError(
            [
                (key, f"not given: pass {flag}, or set {key} in the cluster profile")
                for key, flag, value in (
                    ("nodes", "--nodes N", nodes),
                    ("gpus_per_node", "--gpus-per-node G", per_node),
                    ("gpu", "--gpu KIND", gpu),
                )
                if value is None
            ]
        )
    return Cluster(
        num_nodes=nodes,
        gpus_per_node=per_node,
        gpu=gpu,
        nvlink_domain=first(
            size.nvlink_domain, prof.nvlink_domain, published.nvlink_domain if published else None
        ),
        # The site's network and NVLink topology, for the GPU kind the profile names (a --gpu of
        # another kind brings that kind's own figure and board).
        network_gb_s=prof.network_gb_s if size.gpu in (None, prof.gpu) else None,
        nvlink_topology=prof.nvlink_topology if size.gpu in (None, prof.gpu) else None,
    )
