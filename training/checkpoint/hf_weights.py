"""A Hugging Face folder's weights into this rank's model chunks, each rank reading only its slices.

`checkpoint.pretrained_dir=<Hugging Face folder>`: every rank asks its own chunks for their
`sharded_state_dict()`. Megatron-Core describes there each local tensor as a box of a global,
layout-independent tensor (TP and EP shards, the pipeline stage's global layer numbers, the
virtual stage's chunk, the fused [gate; up] halves as two boxes), whatever the TP / PP / VPP / EP /
ETP layout. The family's map (models/hf/) says how each global tensor is made of Hugging Face
tensors; `models.hf.mapping.read` reads just the box, with safetensors slicing. The values are
written in place into the parameters (the boxes are views of them).

Every parameter must be written: they are first filled with NaN, and any NaN left afterwards is
named. The optimizer then reloads its FP32 main weights from the model.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories
from megatron.core.transformer.module import MegatronModule

from config.hf import differences, read_config
from config.lora import is_adapter
from config.schema import ModelConfig
from models.hf import family_module
from models.hf.gpt import aliases
from models.hf.mapping import Node, read, shape_of
from models.hf.safetensors_io import HfWeights
from training.checkpoint.state import model_chunks

# A key of stacked layers: "<prefix>layers.<name>" with no layer number after "layers."
STACKED = re.compile(r"(.*\blayers)\.(\D.*)")


def mismatch_message(
    model: ModelConfig, folder: Path, where: str, names: set[str] | None = None
) -> str | None:
    """Why `model` cannot take the folder's weights (each differing field, both values), or None."""
    found = differences(model, folder, names)
    if not found:
        return None
    listed = "; ".join(
        f"{name}={ours!r} but the folder has {theirs!r}" for name, ours, theirs in found
    )
    return (
        f"{where}: the model section does not match {folder / 'config.json'}: {listed}. Set those "
        f"fields, or take the whole architecture from the folder with the override model={folder}"
    )


def node_for(weights: dict[str, Node], key: str) -> Node | None:
    """The map's entry for a Megatron key, under its own name or its other one (TE or not)."""
    for name in (key, *aliases(key)):
        if name in weights:
            return weights[name]
    return None


def local_tensors(chunk: MegatronModule) -> list[ShardedTensor]:
    """The chunk's tensors as boxes of global tensors (factories applied: views of the params)."""
    state = chunk.sharded_state_dict()
    apply_factories(state)
    return [t for t in nested_values(state) if isinstance(t, ShardedTensor)]


def box_of(sh: ShardedTensor) -> tuple[slice, ...]:
    local = (1,) * sh.prepend_axis_num + tuple(sh.local_shape)
    return tuple(slice(o, o + n) for o, n in zip(sh.global_offset, local, strict=True))


def per_layer(
    key: str, box: tuple[slice, ...], shape: tuple[int, ...]
) -> tuple[str, tuple[slice, ...], tuple[int, ...]]:
    """A box of a stacked key as a box of one layer's key.

    Megatron-Core stacks the layers of a homogeneous block under one key with a leading layer
    axis (`decoder.layers.mlp.linear_fc2.weight`, [layers, ...]); heterogeneous blocks (dense and
    MoE layers mixed) keep a key per layer (`decoder.layers.3.mlp...`). The maps are declared per
    layer; a box of a stacked key (one layer along the first axis) becomes a box of that layer.
    """
    match = STACKED.fullmatch(key)
    if match is None:
        return key, box, shape
    layer = box[0].start
    if box[0].stop != layer + 1:
        raise ValueError(f"{key}: a box over several layers ({box[0]})")
    return f"{match[1]}.{layer}.{match[2]}", box[1:], shape[1:]


@torch.no_grad()
def load_hf_weights(model: list[Any], cfg: Any, padded_vocab: int, folder: Path) -> None:
    """The folder's weights into this rank's chunks, in place (every rank calls this)."""
    hf = read_config(folder)
    where = f"checkpoint.pretrained_dir={str(folder)!r}"
    source = HfWeights(folder)  # the headers, read once for the check and the map
    names = set(source.tensors)
    problem = mismatch_message(cfg.model, folder, where, names)
    if problem:
        raise ValueError(problem)
    weights = family_module(hf, folder).weights(cfg.model, padded_vocab, names)
    chunks = model_chunks(model)
    try:
        for chunk in chunks.values():
            for name, param in chunk.named_parameters():
                if not is_adapter(name):  # a LoRA run's adapters keep their initialisation
                    param.fill_(math.nan)
            for sh in local_tensors(chunk):
                if is_adapter(sh.key):
                    continue
                if sh.flattened_range is not None:
                    raise ValueError(f"{sh.key}: a flattened model tensor cannot be loaded")
                key, box, global_shape = per_layer(sh.key, box_of(sh), tuple(sh.global_shape))
                node = node_for(weights, key)
                if node is None:
                    raise ValueError(
                        f"{where}: the model has {key}, which the "
                        f"{hf['architectures'][0]} map does not make"
                    )
                whole = shape_of(node, source.shape)
                if whole != global_shape:
                    raise ValueError(
                        f"{where}: {key} is {global_shape} in the model but "
                        f"{whole} from the folder's tensors"
                    )
                value = read(node, box, source.shape, source.read)
                sh.data.copy_(value.reshape(sh.data.shape))
    finally:
        source.close()
    for key, chunk in chunks.items():
        unset = [
            n for n, p in chunk.named_parameters() if not is_adapter(n) and torch.isnan(p).any()
        ]
        if unset:
            raise ValueError(
                f"{where}: {len(unset)} parameters of {key} got no weights from the folder "
                f"(first: {unset[0]})"
            )
