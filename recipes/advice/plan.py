"""`recipes plan`: the layouts of a recipe on a cluster, ranked by predicted step time.

A layout is TP, CP, PP with its virtual stages (Megatron-Core's even split, the balanced uneven
layout that gives the embedding and the loss a layer's place, or the one that gives the loss the
embedding's place too: config/layout.py loss_heavy), EP and ETP for MoE models. For each
layout and micro batch size the planner takes the least recompute that fits (none, selective of
the attention kernel, selective of the light modules (MLA's up projections, the norms, the experts'
activation), selective of those and the MLPs, full recompute of the first n layers of every chunk,
then of every layer): recompute only costs time, so more of it than fits needs is never faster.
At PP 1 it also tries CPU activation offloading instead (the fewest layers that fit: each copy
adds time or none) and keeps whichever is faster.
The distributed optimizer stays on unless pinned off: a reduce-scatter plus an all-gather move an
all-reduce's bytes, so a plan without it is neither faster nor smaller. At PP 1 each layout is
also tried with Megatron-FSDP (parallel.use_megatron_fsdp), which shards weights and gradients too
at the price of gathering them every microbatch. Fields given on the command line are pinned; the
rest is searched (recipes/advice/space.py lists the candidates). The planner keeps the fastest
plan of each TP, PP, CP, EP and ETP, and lists under it its ties: the other virtual-stage splits
of that group that the published runs cannot order against it (config/cost/constants.py
TIE_RANGE).

Search is best-first: every layout and micro batch is bounded by its step without recompute (as
recompute only adds time), and that bound by its slowest pipeline rank's layers alone, which costs
next to nothing: a bound is priced only when its floor comes first, and only the cheapest bounds
are then sized for memory and checked with the rules of `recipes check`, until the next bound
cannot beat the K-th plan found; a recompute is sized only where its floor, or a costlier one's,
could beat the plan to beat. Nothing here imports torch: `plan` answers on a login node
(bench/cli_latency.py times the commands, bench/plan_speed.py the search).
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from config.backend import te_layers
from config.cost.constants import TIE_RANGE, VALUES
from config.cost.memory import (
    GIB,
    MEMORY_MARGIN,
    OVERHEAD_GIB,
    MemoryEstimate,
    ParamCount,
    bytes_per_parameter,
    count_parameters,
    estimate_memory,
    fits,
    fits_memory,
    memory_limit_gib,
    rank_params,
    shard_params,
)
from config.cost.steptime import (
    LayerCosts,
    StepTime,
    layer_costs,
    predict,
    rank_seconds,
    selective_terms,
)
from config.finalize import Derived, finalize
from config.hardware import Cluster
from config.rules import validate
from config.rules.fsdp import fsdp as fsdp_rule
from config.schema import TrainingConfig, selective_modules
from recipes.advice.space import (
    NO_PINS,
    PAR,
    RECOMPUTE_KEYS,
    FastDerived,
    Pins,
    Shape,
    apply,
    least_recompute,
    offload_choices,
    recompute_choices,
    shapes,
)

# The fields the planner chooses, and so the fields a command-line override pins.
LAYOUT_FIELDS = (
    PAR + "tensor_model_parallel_size",
    PAR + "context_parallel_size",
    PAR + "pipeline_model_parallel_size",
    PAR + "virtual_pipeline_model_parallel_size",
    PAR + "pipeline_model_parallel_layout",
    PAR + "expert_model_parallel_size",
    PAR + "expert_tensor_parallel_size",
    PAR + "sequence_parallel",
    "train.micro_batch_size",
    *RECOMPUTE_KEYS,
    "optimizer.use_distributed_optimizer",
    PAR + "use_megatron_fsdp",
    PAR + "overlap_moe_expert_parallel_comm",
    PAR + "cp_comm_type",
)
FSDP = PAR + "use_megatron_fsdp"
A2A = PAR + "overlap_moe_expert_parallel_comm"
EXCHANGE = PAR + "cp_comm_type"
MICRO_BATCHES = (1, 2, 4)  # 8 and more: seldom faster at 4k+ tokens, always more memory


@dataclass(frozen=True, slots=True)
class Plan:
    shape: Shape
    overrides: list[str]  # a dotlist that `recipes check` and `recipes run` accept
    step: StepTime
    memory: MemoryEstimate
    # The same TP, PP, CP, EP and ETP with other virtual stages (or pipeline layout) that would be
    # as fast somewhere in stage_overhead_s's range (config/cost/constants.py TIE_RANGE): the
    # model cannot order them against this plan. Fastest first; each fits and passes `check`.
    ties: tuple[Plan, ...] = ()

    def describe(self) -> str:
        """The layout, and "FSDP" where Megatron-FSDP replaces Megatron DDP."""
        return self.shape.describe() + ("  FSDP" if f"{FSDP}=true" in self.overrides else "")

    def field(self, path: str) -> str:
        """A planner field's value in `overrides`, as written there ("None" for unset)."""
        return next(o.split("=", 1)[1] for o in self.overrides if o.split("=", 1)[0] == path)

    def changes(self, cfg: TrainingConfig) -> list[str]:
        """The plan's overrides that differ from `cfg`: what turns `cfg` into this plan."""
        current = overrides(cfg)
        return [o for o in self.overrides if o not in current]

    def to_json(self) -> dict:
        name, share = self.step.bottleneck
        return {
            "overrides": self.overrides,
            "layout": self.describe(),
            "tokens_per_s_per_gpu": round(self.step.tokens_per_s_per_gpu, 1),
            "tflops_per_gpu": round(self.step.tflops_per_gpu, 1),
            "mfu": round(self.step.mfu, 4),
            "step_s": round(self.step.seconds, 4),
            "memory_gib_per_gpu": round(self.memory.total_gib, 2),
            "bottleneck": name,
            "bottleneck_share": round(share, 4),
            "terms_s": {term: round(value, 4) for term, value in self.step.terms.items()},
            "ties": [t.to_json() for t in self.ties],
        }


def overrides(work: TrainingConfig) -> list[str]:
    """The planner's fields of `work` as a dotlist (None for unset)."""
    out = []
    for path in LAYOUT_FIELDS:
        node, name = path.rsplit(".", 1)
        value = getattr(getattr(work, node), name)
        out.append(f"{path}={str(value).lower() if isinstance(value, bool) else value}")
    return out


def plan(
    cfg: TrainingConfig,
    cluster: Cluster,
    *,
    top: int = 5,
    pinned: dict | None = None,
    margin: float = MEMORY_MARGIN,
    inside: str | None = None,
) -> tuple[list[Plan], int]:
    """The `top` fastest layouts that `check` accepts and predicts to fit, and how many layouts
    (with micro batch sizes) were searched (each one's layers priced, its whole step only where
    its floor could beat the plans). `inside`: a field config/rules/topology.py warns about
    (TP, CP for TP x CP, EP for ETP x EP): only layouts that keep its group in an NVLink domain."""
    pinned = pinned or {}
    work = copy.deepcopy(cfg)
    if "optimizer.use_distributed_optimizer" not in pinned:  # Megatron-Core's shards Adam only
        work.optimizer.use_distributed_optimizer = cfg.optimizer.optimizer != "sgd"
    costs_cache: dict[tuple, LayerCosts] = {}
    counts: dict[int, ParamCount] = {}

    def costs(derived: Derived) -> LayerCosts:
        """`work`'s layer costs, which only its TP, CP, EP, ETP, micro batch size, MoE alltoall
        overlap and CP exchange set."""
        par = work.parallel
        key = (
            par.tensor_model_parallel_size,
            par.context_parallel_size,
            par.expert_model_parallel_size,
            par.expert_tensor_parallel_size,
            work.train.micro_batch_size,
            par.overlap_moe_expert_parallel_comm,
            par.cp_comm_type,
        )
        if key not in costs_cache:
            if key[0] not in counts:  # the vocabulary pads to a multiple of TP
                counts[key[0]] = count_parameters(work)
            costs_cache[key] = layer_costs(work, cluster, derived, count=counts[key[0]])
        return costs_cache[key]

    mbs_choices = [pinned["train.micro_batch_size"]] if "train.micro_batch_size" in pinned else None
    limit = memory_limit_gib(cluster.spec.memory_gib, margin)
    fast, static = FastDerived(work, cluster), _StaticMemory(work, cluster, limit)
    fsdp_runs = _fsdp_runs(work, cluster)
    pins = Pins(
        pinned.get(PAR + "sequence_parallel"),
        (cfg.parallel.overlap_moe_expert_parallel_comm, A2A in pinned),
        pinned.get(EXCHANGE),
    )
    # CPU activation offloading is Transformer Engine's (config/rules/model.py `_offloading`).
    transformer_engine = te_layers(cfg, cluster)
    recompute = least_recompute(cfg, pinned)  # the bound's: recompute only adds time
    floors: dict[tuple, float] = {}  # per layer costs, rank loads and selective modules
    exact: dict[int, float] = {}  # the bounds priced, by candidate

    def floor(derived: Derived, loads: tuple) -> float:
        """What `work`'s step is never under: its microbatches on its slowest rank's layers alone
        (nearly free, where the step costs a whole prediction)."""
        c, modules = costs(derived), selective_modules(work.model)
        if (key := (id(c), loads, tuple(modules))) not in floors:
            floors[key] = max(rank_seconds(c, loads, selective_terms(c, modules)).values())
        return derived.num_microbatches * floors[key]

    def tried(ladder: list[tuple], shape: Shape, mbs: int, fsdp: bool, beat: float) -> int:
        """How many of a recompute `ladder` can beat `beat`: none from the first on whose floor and
        every later one's is `beat` or over (with a rounding's room: floors add up otherwise)."""
        count = len(ladder)
        for index in range(len(ladder) - 1, -1, -1):
            apply(work, shape, mbs, ladder[index], pins, fsdp)
            derived, loads = fast(shape, mbs, ladder[index])
            if derived is not None and floor(derived, loads) < beat * (1 + 1e-9):
                break
            count = index
        return count

    def bound(index: int) -> float:
        """Candidate `index`'s step seconds with the least recompute."""
        if index not in exact:
            shape, mbs = candidates[index]
            apply(work, shape, mbs, recompute, pins, _shardings(shape, pinned, fsdp_runs)[0])
            derived, loads = fast(shape, mbs, recompute)
            d = cast(Derived, derived)  # a candidate's, never None
            step = predict(work, cluster, d, costs=costs(d), loads=loads, detail=False)
            exact[index] = cast(StepTime, step).seconds
        return exact[index]

    candidates: list[tuple[Shape, int]] = []
    queue: list[tuple[float, int, bool]] = []  # (a floor, or the bound, candidate, bound?): a heap
    for shape in shapes(cfg, cluster, pinned, inside):
        shardings = _shardings(shape, pinned, fsdp_runs)
        for mbs in mbs_choices or MICRO_BATCHES:
            apply(work, shape, mbs, recompute, pins, shardings[0])
            derived, loads = fast(shape, mbs, recompute)
            if derived is None:
                continue
            if static(shape, derived, loads, fsdp=shardings[-1]):
                break  # weights and optimizer alone overflow: no micro batch or recompute helps
            if cluster.spec.bf16_tflops:  # predict() prices nothing without a peak (the CPU)
                queue.append((floor(derived, loads), len(candidates), False))
                candidates.append((shape, mbs))
    heapq.heapify(queue)
    found: dict[tuple, Plan] = {}  # the fastest plan of each (TP, PP, CP, EP, ETP)
    spread: dict[tuple, tuple[float, float]] = {}  # its seconds at the ends of TIE_RANGE
    kth = float("inf")  # the step time of the top-th plan found so far
    while queue:  # the candidates by bound, each bound priced once its floor comes first
        value, index, priced = heapq.heappop(queue)
        if value >= kth:
            break  # no plan left can beat the top ones: recompute only adds time
        if not priced:
            heapq.heappush(queue, (bound(index), index, True))
            continue
        shape, mbs = candidates[index]
        group = _group(shape)
        recomputes = recompute_choices(cfg, shape, pinned)
        offloads = offload_choices(cfg, shape, pinned, transformer_engine)
        # DDP, then Megatron-FSDP; each with recompute, then with offloading instead.
        for fsdp, savers in itertools.product(
            _shardings(shape, pinned, fsdp_runs), (recomputes, offloads)
        ):
            beat = min(kth, found[group].step.seconds if group in found else kth)
            ordered = savers is offloads  # (their floors are one: offloading is not in it)
            count = len(savers) if ordered else tried(savers, shape, mbs, fsdp, beat)
            fitting = _fitting(fast, shape, mbs, savers, margin, pins, fsdp, ordered, count)
            for derived, memory in fitting:
                step = predict(work, cluster, derived, costs=costs(derived))
                if step is None or step.seconds >= beat:
                    break  # more recompute is only slower (None: no GPU, never a candidate)
                if validate(work, cluster, derived):
                    continue  # a rule refuses this recompute (or the layout: then all of them)
                found[group] = Plan(shape, overrides(work), step, memory)
                spread[group] = _spread(work, cluster, derived, costs(derived))
                times = sorted(p.step.seconds for p in found.values())
                kth = times[top - 1] if len(times) >= top else kth
                break

    def ties(p: Plan) -> tuple[Plan, ...]:
        """`p`'s group's other pipelines (virtual stages, layout) that beat it at either end of
        stage_overhead_s's range (the step time is linear in it), each with the least recompute
        that fits, as the search above would have chosen it."""
        s = p.shape
        if s.pp == 1:
            return ()
        lo, hi = spread[_group(s)]
        out: dict[tuple, Plan] = {}
        for shape, mbs in groups.get(_group(s), ()):
            pipeline = (shape.vpp, shape.layout)
            if pipeline == (s.vpp, s.layout) or pipeline in out:
                continue
            recomputes = recompute_choices(cfg, shape, pinned)
            fsdp = _shardings(shape, pinned, fsdp_runs)[0]
            apply(work, shape, mbs, recomputes[0], pins, fsdp)
            derived, loads = fast(shape, mbs, recomputes[0])
            if derived is None or not _beats(
                _spread(work, cluster, derived, costs(derived), loads), lo, hi
            ):
                continue  # not even without recompute
            for derived, memory in _fitting(fast, shape, mbs, recomputes, margin, pins, fsdp):
                if not _beats(_spread(work, cluster, derived, costs(derived)), lo, hi):
                    break  # more recompute is only slower
                if validate(work, cluster, derived):
                    continue
                step = cast(StepTime, predict(work, cluster, derived, costs=costs(derived)))
                out[pipeline] = Plan(shape, overrides(work), step, memory)
                break
        return tuple(sorted(out.values(), key=lambda t: t.step.seconds))

    ranked = sorted(found.values(), key=lambda p: p.step.seconds)[:top]
    groups: dict[tuple, list[tuple[Shape, int]]] = {_group(p.shape): [] for p in ranked}
    ours = [i for i, (shape, _) in enumerate(candidates) if _group(shape) in groups]
    for index in sorted(ours, key=lambda i: (bound(i), i)):  # cheapest bound first
        groups[_group(candidates[index][0])].append(candidates[index])
    return [dataclasses.replace(p, ties=ties(p)) for p in ranked], len(candidates)


def _group(shape: Shape) -> tuple[int, int, int, int, int | None]:
    """What the planner keeps one plan of: the layout but its pipeline split."""
    return (shape.tp, shape.pp, shape.cp, shape.ep, shape.etp)


def _spread(
    work: TrainingConfig,
    cluster: Cluster,
    derived: Derived,
    costs: LayerCosts,
    loads: tuple | None = None,
) -> tuple[float, float]:
    """`work`'s step seconds with stage_overhead_s at the low and the high end of TIE_RANGE."""
    out = []
    for value in TIE_RANGE["stage_overhead_s"]:
        k = {**VALUES, "stage_overhead_s": value}
        step = predict(work, cluster, derived, k, costs=costs, loads=loads, detail=False)
        out.append(cast(StepTime, step).seconds)
    return out[0], out[1]


def _beats(times: tuple[float, float], lo: float, hi: float) -> bool:
    """Whether step times at the ends of TIE_RANGE beat (lo, hi) at either end: both are linear
    in stage_overhead_s, so if they beat it anywhere in the range they do at an end."""
    return times[0] <= lo or times[1] <= hi


def _fsdp_runs(work: TrainingConfig, cluster: Cluster) -> bool:
    """Whether Megatron-FSDP can run this config at all (config/rules/fsdp.py, at PP 1)."""
    trial = copy.deepcopy(work)
    trial.parallel.use_megatron_fsdp, trial.parallel.pipeline_model_parallel_size = True, 1
    return not fsdp_rule(trial, cluster, finalize(trial, cluster))


def _shardings(shape: Shape, pinned: dict, fsdp_runs: bool) -> list[bool]:
    """parallel.use_megatron_fsdp choices for a layout: Megatron DDP, and Megatron-FSDP where it
    runs (PP 1), unless pinned."""
    if FSDP in pinned:
        return [bool(pinned[FSDP])]
    return [False, True] if fsdp_runs and shape.pp == 1 else [False]


def _fitting(
    fast: FastDerived,
    shape: Shape,
    mbs: int,
    recomputes: list[tuple],
    margin: float,
    pins: Pins = NO_PINS,
    fsdp: bool = False,
    ordered: bool = False,
    count: int | None = None,
) -> Iterator[tuple[Derived, MemoryEstimate]]:
    """Leave `fast.work` at each recompute that fits, from the cheapest, with its derived values
    (`fast`'s) and memory (fitting as `recipes check` judges it, keeping `margin` of it free).

    The last of `recomputes` saves the most GPU memory, so when it does not fit the GPU nothing
    does; the others are tried in order (selective and block recompute do not save memory in a
    fixed order). `ordered`: each saves more GPU memory than the one before and pins more host
    memory (offloading more layers), so the first that fits the GPU is found by bisection, and
    the host's limit ends the list where it is passed. `count`: try only the first `count` (the
    planner knows that none after them can beat the plans it has)."""

    work, cluster = fast.work, fast.cluster

    def fitting(index: int, on_gpu: bool = False) -> tuple[Derived, MemoryEstimate] | None:
        """The recompute's derived values and memory if it fits (`on_gpu`: the GPU alone)."""
        apply(work, shape, mbs, recomputes[index], pins, fsdp)
        derived = fast(shape, mbs, recomputes[index])[0]
        if derived is None:
            return None
        memory = estimate_memory(work, cluster, derived)
        if on_gpu:
            ok = fits(memory.total_gib, cluster.spec.memory_gib, margin)
        else:
            ok = fits_memory(memory, cluster.spec, margin)
        return (derived, memory) if ok else None

    count = len(recomputes) if count is None else count
    if not count or fitting(len(recomputes) - 1, on_gpu=ordered) is None:
        return
    first, last = 0, len(recomputes) - 1  # the first that fits the GPU is in [first, last]
    while ordered and first < last:
        middle = (first + last) // 2
        first, last = (first, middle) if fitting(middle, on_gpu=True) else (middle + 1, last)
    for index in range(first, count):
        chosen = fitting(index)
        if chosen:
            yield chosen
        elif ordered:
            return  # what fits the GPU from here on overflows the host's pinned memory


class _StaticMemory:
    """Whether a layout's weights, gradients and optimizer state alone overflow the GPU: a lower
    bound of config/cost/memory.py's total (no activations), priced in microseconds."""

    def __init__(self, work: TrainingConfig, cluster: Cluster, limit_gib: float) -> None:
        self.count, self.work = count_parameters(work), work
        self.limit = (limit_gib - OVERHEAD_GIB) * GIB
        preset = finalize(work, cluster).preset
        weight, fp8, self.grad, self.opt = bytes_per_parameter(work, preset, cluster.spec)
        self.weight = weight + fp8
        if work.peft.scheme == "lora":  # a frozen base holds weights only (adapters left out)
            self.grad = self.opt = 0

    def __call__(self, shape: Shape, derived: Derived, loads: tuple, fsdp: bool = False) -> bool:
        params = shard_params(self.count, shape.tp, shape.ep * (shape.etp or shape.tp))
        sharded = self.work.optimizer.use_distributed_optimizer
        dense_group = derived.data_parallel_size * shape.cp if sharded else 1
        expert_group = derived.expert_data_parallel_size if sharded else 1
        for load in set(loads):
            dense, experts = rank_params(params, load)
            shard = dense / dense_group + experts / expert_group
            held = (self.weight + self.grad) * (shard if fsdp else dense + experts)
            if held + self.opt * shard > self.limit:
                return True
        return False


def pinned(cfg: TrainingConfig, user_overrides: list[str]) -> dict[str, object]:
    """The planner's fields that the command line set, with their resolved values."""
    out: dict[str, object] = {}
    for item in user_overrides:
        path = item.split("=", 1)[0].strip()
        if path in LAYOUT_FIELDS:
            node, name = path.rsplit(".", 1)
            out[path] = getattr(getattr(cfg, node), name)
    return out
