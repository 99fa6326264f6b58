"""Values that follow from the config and the cluster, derived in one pure step after overrides.

Nothing derived is ever stored in a recipe, so an override can never leave a stale value behind.
`finalize` never raises: a value that cannot be derived (a data-parallel size that is not whole) is
None here, and `config.rules.validate` reports why.
"""

from __future__ import annotations

from dataclasses import dataclass

from config import layout as layouts
from config.hardware import Cluster
from config.precision import PRESETS, PrecisionPreset
from config.schema import TrainingConfig


@dataclass(frozen=True, slots=True)
class Derived:
    world_size: int
    model_parallel_size: int  # TP x PP x CP: the ranks that together hold one model replica
    data_parallel_size: int | None  # None when the world does not divide into whole replicas
    num_microbatches: int | None  # per step and data-parallel rank
    expert_data_parallel_size: int | None
    expert_tensor_parallel_size: int
    # One chunk of layer characters per (vp_stage * PP + pp_rank); None when no split exists.
    pipeline_chunks: list[list[str]] | None
    # The string handed to Megatron-Core: None for the even split it derives by itself.
    pipeline_layout: str | None
    decoder_layers_per_rank: list[int] | None
    padded_vocab_size: int
    preset: PrecisionPreset | None  # None for an unknown preset name


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
    if pp < 1 or (vpp is not None and vpp < 1):
        return None, None
    num_chunks = pp * (vpp or 1)
    if model.num_layers % num_chunks == 0:
        per = model.num_layers // num_chunks
        chunks = [["t"] * per for _ in range(num_chunks)]
        chunks[0].insert(0, "E")
        chunks[-1] += ["m"] * mtp + ["L"]
        return chunks, None
    chunks = layouts.balanced(model.num_layers, mtp, num_chunks)
    return chunks, (layouts.render(chunks) if chunks else None)


def finalize(cfg: TrainingConfig, cluster: Cluster) -> Derived:
    par = cfg.parallel
    world = cluster.world_size
    tp, pp, cp = (
        par.tensor_model_parallel_size,
        par.pipeline_model_parallel_size,
        par.context_parallel_size,
    )
    model_parallel = tp * pp * cp
    dp = (
        world // model_parallel
        if model_parallel > 0 and world > 0 and world % model_parallel == 0
        else None
    )

    microbatches = None
    per_step = cfg.train.micro_batch_size * dp if dp else 0
    if per_step > 0 and cfg.train.global_batch_size % per_step == 0:
        microbatches = cfg.train.global_batch_size // per_step

    etp = par.expert_tensor_parallel_size or tp
    # Expert layers regroup the same ranks: EP x ETP x expert-DP x PP = world.
    expert_group = etp * par.expert_model_parallel_size * pp
    edp = (
        world // expert_group
        if expert_group > 0 and world > 0 and world % expert_group == 0
        else None
    )

    chunks, layout = pipeline_chunks(cfg)
    per_rank = (
        layouts.decoder_layers_per_rank(chunks, pp) if chunks and len(chunks) % pp == 0 else None
    )
    return Derived(
        world_size=world,
        model_parallel_size=model_parallel,
        data_parallel_size=dp,
        num_microbatches=microbatches,
        expert_data_parallel_size=edp,
        expert_tensor_parallel_size=etp,
        pipeline_chunks=chunks,
        pipeline_layout=layout,
        decoder_layers_per_rank=per_rank,
        padded_vocab_size=padded_vocab_size(
            cfg.model.vocab_size, cfg.model.make_vocab_size_divisible_by, tp
        ),
        preset=PRESETS.get(cfg.precision),
    )
