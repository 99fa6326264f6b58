"""Values that follow from the config and the cluster, derived in one pure step after overrides.

Nothing derived is ever stored in a recipe, so an override can never leave a stale value behind.
`finalize` never raises: a value that cannot be derived (a data-parallel size that is not whole) is
None in its `Partial`, and `config.rules.validate` reports why. Nothing is derived from a number
outside its range (config/schema.py) either: 0 would divide by zero, 2**31 layers would fill the
memory, and None or a string set in Python would not compute; the checker names the number instead.

What runs after the check (the memory estimate, the step-time model, the engine) reads a `Derived`,
every value set, from `config.rules.derive`: the checker's verdict and the values come together.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Any

from config import layout as layouts
from config.hardware import Cluster
from config.precision import PRESETS, PrecisionPreset
from config.schema import TrainingConfig
from config.tree import in_range, out_of_range


@dataclass(frozen=True, slots=True)
class Partial:
    """What `finalize` derives; the checker's rules read it and say why a value is missing."""

    world_size: int
    # None in any field below also means: derived from a number outside its range.
    model_parallel_size: int | None  # TP x PP x CP: the ranks that together hold one model replica
    data_parallel_size: int | None  # None when the world does not divide into whole replicas
    num_microbatches: int | None  # per step and data-parallel rank
    expert_data_parallel_size: int | None
    expert_tensor_parallel_size: int | None
    # One chunk of layer characters per (vp_stage * PP + pp_rank); None when no split exists.
    pipeline_chunks: list[list[str]] | None
    # The string handed to Megatron-Core: None for the even split it derives by itself.
    pipeline_layout: str | None
    # None also when the chunks do not spread evenly over the pipeline ranks.
    decoder_layers_per_rank: list[int] | None
    padded_vocab_size: int | None
    preset: PrecisionPreset | None  # None for an unknown preset name


@dataclass(frozen=True, slots=True)
class Derived(Partial):
    """A `Partial` with every value set (the layout string stays None for Megatron-Core's even
    split): `complete` makes one, and after the check only `config.rules.derive` calls it."""

    model_parallel_size: int
    data_parallel_size: int
    num_microbatches: int
    expert_data_parallel_size: int
    expert_tensor_parallel_size: int
    pipeline_chunks: list[list[str]]
    decoder_layers_per_rank: list[int]  # as many entries as pipeline ranks
    padded_vocab_size: int
    preset: PrecisionPreset


# Every value of a Partial, and those a Derived needs set: all but the layout string, which stays
# None for Megatron-Core's even split.
_VALUES = operator.attrgetter(*(f.name for f in dataclasses.fields(Partial)))
_REQUIRED = tuple(f.name for f in dataclasses.fields(Partial) if f.name != "pipeline_layout")


def missing(partial: Partial) -> list[str]:
    """The values `partial` lacks to be a `Derived`."""
    return [name for name in _REQUIRED if getattr(partial, name) is None]


def complete(partial: Partial) -> Derived | None:
    """`partial` as a `Derived` when every value was derived, else None.

    Whether the config can run is the checker's to say, not this: the planner prices its candidates
    with these values before it checks them; everything after the check takes `config.rules.derive`.
    """
    if any(getattr(partial, name) is None for name in _REQUIRED):
        return None
    return Derived(*_VALUES(partial))


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int) -> int:
    """Megatron pads the vocabulary to a multiple of divisible_by x TP."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def pipeline_chunks(cfg: TrainingConfig) -> tuple[list[list[str]] | None, str | None]:
    """The chunks of the pipeline and the layout string for Megatron-Core (None: its own even split)."""
    par, model = cfg.parallel, cfg.model
    pp = par.pipeline_model_parallel_size
    vpp = par.virtual_pipeline_model_parallel_size
    mtp = model.mtp_num_layers or 0
    if par.pipeline_model_parallel_layout:
        try:
            return layouts.parse(
                par.pipeline_model_parallel_layout
            ), par.pipeline_model_parallel_layout
        except ValueError:
            return None, par.pipeline_model_parallel_layout
    # One list entry per layer: 2**31 layers would take the login node's 16 GiB.
    counts = ("pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size")
    if not (in_range(model, "num_layers", "mtp_num_layers") and in_range(par, *counts)):
        return None, None
    num_chunks = pp * (vpp or 1)
    if model.num_layers % num_chunks == 0:
        per = model.num_layers // num_chunks
        chunks = [["t"] * per for _ in range(num_chunks)]
        chunks[0].insert(0, "E")
        chunks[-1] += ["m"] * mtp + ["L"]
        return chunks, None
    balanced = layouts.balanced(model.num_layers, mtp, num_chunks)
    return balanced, (layouts.render(balanced) if balanced else None)


def _valid(node: Any, name: str) -> Any:
    """A field's value, or None when it lies outside its range."""
    value = getattr(node, name)
    return None if out_of_range(type(node), name, value) else value


def _product(*counts: int | None) -> int | None:
    known = [c for c in counts if c is not None]
    return math.prod(known) if len(known) == len(counts) else None


def _whole(total: int, part: int | None) -> int | None:
    """total / part when that is a whole number of at least 1."""
    return total // part if part and total > 0 and total % part == 0 else None


def finalize(cfg: TrainingConfig, cluster: Cluster) -> Partial:
    """What follows from `cfg` on `cluster`, None where it cannot be derived (never raises)."""
    par, model, train = cfg.parallel, cfg.model, cfg.train
    world = cluster.world_size
    tp = _valid(par, "tensor_model_parallel_size")
    pp = _valid(par, "pipeline_model_parallel_size")
    cp = _valid(par, "context_parallel_size")
    ep = _valid(par, "expert_model_parallel_size")
    model_parallel = _product(tp, pp, cp)
    dp = _whole(world, model_parallel)
    per_step = _product(_valid(train, "micro_batch_size"), dp)
    microbatches = _whole(_valid(train, "global_batch_size") or 0, per_step)

    etp = (
        tp
        if par.expert_tensor_parallel_size is None
        else _valid(par, "expert_tensor_parallel_size")
    )
    # Expert layers regroup the same ranks: EP x ETP x expert-DP x PP = world.
    edp = _whole(world, _product(etp, ep, pp))

    chunks, layout = pipeline_chunks(cfg)
    per_rank = (
        layouts.decoder_layers_per_rank(chunks, pp)
        if chunks and pp and len(chunks) % pp == 0
        else None
    )
    vocab, divisible_by = _valid(model, "vocab_size"), _valid(model, "make_vocab_size_divisible_by")
    padded = (
        None if None in (vocab, divisible_by, tp) else padded_vocab_size(vocab, divisible_by, tp)
    )
    return Partial(
        world_size=world,
        model_parallel_size=model_parallel,
        data_parallel_size=dp,
        num_microbatches=microbatches,
        expert_data_parallel_size=edp,
        expert_tensor_parallel_size=etp,
        pipeline_chunks=chunks,
        pipeline_layout=layout,
        decoder_layers_per_rank=per_rank,
        padded_vocab_size=padded,
        preset=PRESETS.get(cfg.precision),
    )
