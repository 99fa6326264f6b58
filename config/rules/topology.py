"""Warnings, not errors: a communication group that spans NVLink domains.

The first failure mode of distributed training in the course material: tensor parallelism laid
across nodes, its all-reduces and all-gathers (every layer, forward and backward) over the
inter-node network instead of NVLink, and MFU collapses. Such a run is valid (Megatron-Core runs
it), so `recipes check` keeps its exit code and lists these under `warnings`.

Megatron-Core orders ranks tp-cp-ep-dp-pp (its default `order`): a TP group is TP consecutive
ranks, TP x CP consecutive ranks hold a TP group's context-parallel peers, and for the experts
ETP x EP consecutive ranks hold an alltoall group. With Slurm's block placement, consecutive ranks
fill a node (or an NVL72 rack) before the next, so a group stays inside an NVLink domain exactly
when its block of consecutive ranks divides the domain (Cluster.crosses; `group_block` names the
block of each warning). Each warning gives what the step-time model (config/cost/steptime.py) predicts the
group's traffic costs per step. A layout that keeps the group inside is the planner's to find, at
the recipes floor (recipes/advice/): `recipes check` adds the fastest one to the warning.
"""

from __future__ import annotations

from config.cost.collectives import members
from config.cost.steptime import StepTime, predict
from config.finalize import Derived
from config.hardware import SWITCH, Cluster
from config.problems import Problem
from config.schema import TrainingConfig

TP = "parallel.tensor_model_parallel_size"
CP = "parallel.context_parallel_size"
EP = "parallel.expert_model_parallel_size"
GROUPS = {TP: "TP", CP: "TP x CP", EP: "ETP x EP"}  # the field each warning names: its group
TERMS = {TP: "tp", CP: "cp", EP: "ep"}  # its group's traffic, a term of StepTime


def group_block(field: str, tp: int, cp: int, ep: int, etp: int) -> int:
    """The consecutive ranks the group a warning names spans: TP, TP x CP or ETP x EP."""
    return {TP: tp, CP: tp * cp, EP: etp * ep}[field]


def topology(cfg: TrainingConfig, cluster: Cluster, d: Derived) -> list[Problem]:
    """One warning per group (TP, CP, the expert alltoall) that leaves its NVLink domain, for a
    config the checker accepts (`config.rules.derive`)."""
    par, domain, world = cfg.parallel, cluster.domain, cluster.world_size
    tp, cp = par.tensor_model_parallel_size, par.context_parallel_size
    etp = d.expert_tensor_parallel_size
    ep = par.expert_model_parallel_size
    where = f"NVLink domains of {domain} GPUs ({cluster.gpu}, {world} GPUs)"
    step = predict(cfg, cluster, d)
    out = []
    if cluster.crosses(group_block(TP, tp, cp, ep, etp)):
        out.append(
            Problem(
                TP,
                f"TP={tp} spans {where}: every layer's TP all-reduce/all-gather, forward and "
                f"backward, crosses the inter-node network{_slower(cluster, tp, members(cluster, tp, 1))}"
                f"{_cost(step, TERMS[TP])}.",
            )
        )
    elif cp > 1 and cluster.crosses(group_block(CP, tp, cp, ep, etp)):
        out.append(
            Problem(
                CP,
                f"TP x CP = {tp} x {cp} spans {where}: the context-parallel exchange of keys and "
                f"values, every layer, crosses the inter-node network{_slower(cluster, 2)}"
                f"{_cost(step, TERMS[CP])}. Published runs do this at long context (Llama 3.1 405B: "
                "TP 8 x CP 2 over two nodes), where the ring exchange hides behind attention's "
                "compute.",
            )
        )
    if cfg.model.num_moe_experts and ep > 1 and cluster.crosses(group_block(EP, tp, cp, ep, etp)):
        out.append(
            Problem(
                EP,
                f"ETP x EP = {etp} x {ep} spans {where}: the MoE token alltoall, twice per MoE "
                f"layer forward and backward, crosses the inter-node network{_slower(cluster, ep)}"
                f"{_cost(step, TERMS[EP])}. Published runs accept this for very wide models "
                "(DeepSeek-V3: EP 64 over InfiniBand) with the flex dispatcher, which sends a "
                "token once per node (model.moe_token_dispatcher_type=flex, DeepEP or HybridEP "
                "installed), and the alltoall overlapped "
                "(parallel.overlap_moe_expert_parallel_comm=true).",
            )
        )
    return out


def _slower(cluster: Cluster, group: int, nics: int = 1) -> str:
    """The network against what NVLink gives a group of `group` GPUs inside a domain
    (Cluster.nvlink, the figure the step-time model prices the group with); a ring (TP's) leaves
    each domain through the `nics` NICs of its members there (collectives.ring)."""
    net = cluster.network * nics
    if not net:
        return ""
    nvl = cluster.nvlink(group)
    links = round(nvl / cluster.nvlink(2))  # of each GPU's direct pair links, in a mesh
    mesh = f" ({links} pair link{'s' * (links > 1)} per GPU, no NVSwitch)"
    mesh = "" if cluster.topology == SWITCH else mesh
    through = f" through the {nics} NICs of its members in each domain" if nics > 1 else ""
    less = f"{nvl / net:.0f}x less" if nvl >= 1.5 * net else "about as much"
    return f"; the network carries {net:g} GB/s per GPU{through} against NVLink's {nvl:g}{mesh}, {less}"


def _cost(step: StepTime | None, term: str) -> str:
    if step is None:
        return ""
    seconds = step.terms[term]
    return (
        f" (predicted: {seconds:.2f} s of a {step.seconds:.2f} s step exposed, "
        f"{seconds / step.seconds:.0%}; config/cost/steptime.py)"
    )
