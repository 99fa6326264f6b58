"""The planner's search space: every parallel layout of a model on a cluster (TP, CP, PP with its
virtual stages and pipeline layout, EP, ETP), and the recompute choices of each, from the
cheapest to the most memory-saving, and at PP 1 the CPU activation offloading ones; `apply` sets
a config to one of them, and `FastDerived` gives a candidate finalize()'s values from caches.
recipes/advice/plan.py prices them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from config import layout as layouts
from config.cost import layers
from config.finalize import Derived, finalize, padded_vocab_size, pipeline_chunks
from config.hardware import Cluster
from config.rules.model import cp_exchanges
from config.rules.moe_overlap import layout_obstacles
from config.rules.topology import group_block
from config.schema import TrainingConfig

# The recompute fields and CPU activation offloading's, in the order of the planner's recompute
# tuples: what a layout trades time for memory with.
RECOMPUTE_KEYS = (
    "model.recompute_granularity",
    "model.recompute_method",
    "model.recompute_num_layers",
    "model.recompute_modules",
    "model.cpu_offloading_num_layers",
)
PAR = "parallel."


@dataclass(frozen=True, slots=True)
class Shape:
    """A parallel layout, before the micro batch and recompute are chosen."""

    tp: int
    cp: int
    pp: int
    vpp: int | None
    layout: str | None  # an explicit (balanced, uneven) layout string, else Megatron's even split
    ep: int
    etp: int | None

    def describe(self) -> str:
        parts = [f"TP {self.tp}", f"PP {self.pp}", f"VPP {self.vpp or '-'}", f"CP {self.cp}"]
        if self.ep > 1 or self.etp is not None:
            parts += [f"EP {self.ep}", f"ETP {self.etp or self.tp}"]
        return "  ".join(parts) + ("  uneven" if self.layout else "")


@dataclass(frozen=True, slots=True)
class Pins:
    """What the command line fixed of the fields `apply` otherwise sets for each layout."""

    sp: bool | None = None  # sequence parallel; None: on wherever TP > 1
    a2a: tuple[bool, bool] = (False, False)  # the MoE alltoall overlap: (wanted, pinned)
    exchange: str | None = None  # parallel.cp_comm_type; None: the first the model runs with


NO_PINS = Pins()


def apply(
    work: TrainingConfig,
    shape: Shape,
    mbs: int,
    recompute: tuple,
    pins: Pins = NO_PINS,
    fsdp: bool = False,
) -> None:
    """Set `work` to a candidate: sequence parallel with TP > 1, the MoE alltoall overlap wherever
    Megatron-Core runs it (if wanted), the first CP exchange Transformer Engine runs the model
    with (config/rules/model.py `cp_exchanges`: the ring where it can), each unless pinned."""
    par, m = work.parallel, work.model
    par.use_megatron_fsdp = fsdp
    par.tensor_model_parallel_size, par.context_parallel_size = shape.tp, shape.cp
    par.pipeline_model_parallel_size = shape.pp
    par.virtual_pipeline_model_parallel_size = shape.vpp
    par.pipeline_model_parallel_layout = shape.layout
    par.expert_model_parallel_size, par.expert_tensor_parallel_size = shape.ep, shape.etp
    par.sequence_parallel = shape.tp > 1 if pins.sp is None else pins.sp and shape.tp > 1
    work.train.micro_batch_size = mbs
    m.recompute_granularity, m.recompute_method, m.recompute_num_layers = recompute[:3]
    m.recompute_modules, m.cpu_offloading_num_layers = recompute[3:]
    overlap, pinned_a2a = pins.a2a
    if overlap and not pinned_a2a:
        overlap = not layout_obstacles(m, shape.ep, shape.pp, shape.vpp or 1)
    par.overlap_moe_expert_parallel_comm = overlap
    runs = cp_exchanges(m, shape.tp, shape.cp) or ["p2p"]  # none: the checker names why
    par.cp_comm_type = pins.exchange or runs[0]  # type: ignore[assignment]


def _powers(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def _pipelines(cfg: TrainingConfig, pp: int) -> list[tuple[int | None, str | None]]:
    """(VPP, layout string) choices for PP ranks: the even split, the balanced layout and the
    one that gives the loss the embedding's place too (config/layout.py loss_heavy). The
    balanced layout counts the embedding and the loss as units beside the layers, so it can have
    more chunks than layers: Megatron-Bridge runs Llama 3.1 405B's 126 layers over 16 x 8 chunks,
    "E|(t|)*126L"."""
    m = cfg.model
    mtp = m.mtp_num_layers or 0
    out: list[tuple[int | None, str | None]] = []
    units = m.num_layers + mtp + 2  # layouts.balanced's: the embedding and the loss a place each
    for chunks in range(pp, units + 1, pp):
        vpp = chunks // pp if chunks > pp else None
        if vpp is not None and pp < 2:
            break
        even = m.num_layers % chunks == 0
        if even:
            out.append((vpp, None))
        if pp < 2:
            continue
        for uneven in (layouts.balanced, layouts.loss_heavy):
            chunks_ = uneven(m.num_layers, mtp, chunks)
            if chunks_:
                out.append((vpp, layouts.render(chunks_)))
    return out


def shapes(
    cfg: TrainingConfig, cluster: Cluster, pinned: dict[str, object], inside: str | None = None
) -> Iterator[Shape]:
    """Every layout that divides the cluster and the model, within the pinned fields; with
    `inside` (a field config/rules/topology.py warns about), only those whose group stays inside
    an NVLink domain."""
    m, world = cfg.model, cluster.world_size
    heads, groups = m.num_attention_heads, m.num_query_groups or m.num_attention_heads

    def choices(name: str, values: list) -> list:
        return [pinned[PAR + name]] if PAR + name in pinned else values

    def leaves(shape: Shape) -> bool:
        """Whether the group `inside` names leaves its NVLink domain in `shape`."""
        if inside is None:
            return False
        block = group_block(inside, shape.tp, shape.cp, shape.ep, shape.etp or shape.tp)
        return cluster.crosses(block)

    # TP stays inside an NVLink domain: across domains it is what `check` warns about.
    tps = [
        t
        for t in _powers(min(world, 64))
        if not cluster.crosses(t) and heads % t == 0 and (groups % t == 0 or t % groups == 0)
    ]
    cps = [c for c in _powers(min(world, 16)) if m.seq_length % (2 * c) == 0 or c == 1]
    experts = m.num_moe_experts or 0
    for tp in choices("tensor_model_parallel_size", tps):
        for cp in choices("context_parallel_size", cps):
            if world % (tp * cp):
                continue
            for pp in choices(
                "pipeline_model_parallel_size", _divisors(world // (tp * cp), m.num_layers)
            ):
                if pp < 1 or (world // (tp * cp)) % pp:
                    continue  # a pinned PP that does not divide the ranks left
                pipelines = _pipelines(cfg, pp)
                if PAR + "pipeline_model_parallel_layout" in pinned:
                    # The schema's types: a layout string, a virtual stage count (None: unset).
                    layout = cast(str | None, pinned[PAR + "pipeline_model_parallel_layout"])
                    vpp = cast(int | None, pinned.get(PAR + "virtual_pipeline_model_parallel_size"))
                    pipelines = [(vpp, layout)]
                elif PAR + "virtual_pipeline_model_parallel_size" in pinned:
                    wanted = pinned[PAR + "virtual_pipeline_model_parallel_size"]
                    pipelines = [p for p in pipelines if p[0] == wanted]
                for vpp, layout in pipelines:
                    if not experts:
                        shape = Shape(tp, cp, pp, vpp, layout, 1, None)
                        if not (inside and leaves(shape)):
                            yield shape
                        continue
                    for etp in choices("expert_tensor_parallel_size", sorted({1, tp})):
                        per_stage = world // pp
                        eps = [
                            e for e in _divisors(experts, per_stage) if per_stage % (e * etp) == 0
                        ]
                        for ep in choices("expert_model_parallel_size", eps):
                            shape = Shape(tp, cp, pp, vpp, layout, ep, etp)
                            if not (inside and leaves(shape)):
                                yield shape


def _recompute_pinned(pinned: dict) -> bool:
    """Whether the command line set a recompute or offloading field (then it is the only choice)."""
    return any(key in pinned for key in RECOMPUTE_KEYS)


def least_recompute(cfg: TrainingConfig, pinned: dict) -> tuple:
    """recompute_choices' first, whatever the layout: what the command line pinned, else none."""
    if _recompute_pinned(pinned):
        return tuple(pinned.get(k, getattr(cfg.model, k.split(".")[1])) for k in RECOMPUTE_KEYS)
    return (None, None, None, None, 0)


def recompute_choices(cfg: TrainingConfig, shape: Shape, pinned: dict) -> list[tuple]:
    """(granularity, method, layers, modules, offloaded layers) from the cheapest to the most
    memory-saving, least_recompute first."""
    if _recompute_pinned(pinned):
        return [least_recompute(cfg, pinned)]
    m = cfg.model
    chunks = shape.pp * (shape.vpp or 1)
    per_chunk = -(-m.num_layers // chunks)
    blocks = sorted({n for n in (1, per_chunk // 4, per_chunk // 2, 3 * per_chunk // 4) if n > 0})
    full = [("full", "block", n, None) for n in blocks if n < per_chunk]
    # Output-discarding modules first (a little forward work again), then the MLPs too.
    # (The norms only where they stand alone: TE fuses a dense layer's into its next GEMM.)
    light = ["mla_up_proj"] if m.multi_latent_attention else []
    light += ["layernorm"] if m.multi_latent_attention or m.num_moe_experts else []
    light += ["moe_act"] if m.num_moe_experts and m.moe_grouped_gemm else []
    dense = not m.num_moe_experts or m.moe_first_k_dense_layers > 0
    mlps = (["mlp"] if dense else []) + (
        ["shared_experts"] if m.moe_shared_expert_intermediate_size else []
    )
    selective = [("selective", None, None, ",".join(light))] if light else []
    if mlps:
        selective.append(("selective", None, None, ",".join(light + mlps)))
    choices = [
        ("selective", None, None, None),
        *selective,
        *full,
        ("full", "uniform", 1, None),
    ]
    return [least_recompute(cfg, pinned), *((*choice, 0) for choice in choices)]


def offload_choices(
    cfg: TrainingConfig, shape: Shape, pinned: dict, transformer_engine: bool
) -> list[tuple]:
    """CPU activation offloading of the first 1 to num_layers - 1 layers, without recompute, from
    the fewest (the cheapest: each layer's copies add time or none): Megatron-Core offloads only
    at PP 1, with Transformer Engine's layers. None where the command line pins the recompute or
    the offloading (recompute_choices gives that one choice)."""
    if shape.pp > 1 or not transformer_engine or _recompute_pinned(pinned):
        return []
    return [(None, None, None, None, n) for n in range(1, cfg.model.num_layers)]


class FastDerived:
    """finalize()'s values for the planner's candidates, from caches: pricing a candidate must
    take microseconds (finalize re-checks every field's range, for a config nobody has checked).
    None where finalize derives no complete `Derived` either."""

    def __init__(self, work: TrainingConfig, cluster: Cluster) -> None:
        self.work, self.cluster, self.base = work, cluster, finalize(work, cluster)
        # Per (PP, VPP, layout): the chunks and the decoder layers of each pipeline rank.
        self.chunks: dict[tuple, tuple[list[list[str]], list[int]] | None] = {}
        self.loads: dict[tuple, tuple] = {}

    def _split(self, shape: Shape) -> tuple[list[list[str]], list[int]] | None:
        """The chunks of `work`'s pipeline and the decoder layers of each rank, as finalize()."""
        chunks = pipeline_chunks(self.work)[0]
        if not chunks or len(chunks) % shape.pp:
            return None
        return chunks, layouts.decoder_layers_per_rank(chunks, shape.pp)

    def __call__(self, shape: Shape, mbs: int, recompute: tuple) -> tuple[Derived | None, tuple]:
        m, world = self.work.model, self.cluster.world_size
        where = (shape.pp, shape.vpp, shape.layout)
        if where not in self.chunks:
            self.chunks[where] = self._split(shape)
        split = self.chunks[where]
        dp = world // (shape.tp * shape.pp * shape.cp)
        gbs = self.work.train.global_batch_size
        if split is None or gbs % (dp * mbs):
            return None, ()
        chunks, per_rank = split
        etp = shape.etp or shape.tp
        if world % (etp * shape.ep * shape.pp):  # expert layers cannot regroup these ranks
            return None, ()
        key = (*where, recompute[:3])  # the loads depend on the recompute fields alone
        if key not in self.loads:
            self.loads[key] = layers.model_rank_loads(m, chunks, shape.pp, recompute[:3])
        if self.base.preset is None:  # as complete(): no Derived without the precision's preset
            return None, ()
        derived = Derived(  # every value set here: complete()'s check of each field is not needed
            world_size=world,
            model_parallel_size=shape.tp * shape.pp * shape.cp,
            data_parallel_size=dp,
            num_microbatches=gbs // (dp * mbs),
            expert_data_parallel_size=world // (etp * shape.ep * shape.pp),
            expert_tensor_parallel_size=etp,
            pipeline_chunks=chunks,
            pipeline_layout=shape.layout,
            decoder_layers_per_rank=per_rank,
            preset=self.base.preset,
            padded_vocab_size=padded_vocab_size(
                m.vocab_size, m.make_vocab_size_divisible_by, shape.tp
            ),
        )
        return derived, self.loads[key]
