"""`recipes import`: a Hugging Face folder -> a Megatron dist checkpoint, streaming.

Writes `OUT/iter_0000000` in torch's distributed checkpoint format, keyed as Megatron-Core keys the
model (stacked layers for a dense block, per-layer keys with MoE, see `_stacked`), one chunk per
layer. The writer asks the planner for each chunk's data only when it writes that chunk
(`_write_dcp`), and the planner reads it from the Hugging Face files then (torch's sharded
tensors, which describe the chunks, need a process group: a one-rank gloo group). Tensors the
model does not hold (CLIP's unused last layer, its post-layernorm) are kept under
`hf_extra.<name>` so that an export gives back every tensor bit for bit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from config.finalize import padded_vocab_size
from config.hf import CONFIG_FILE, is_hf_folder, model_from_hf, read_config
from config.schema import ModelConfig
from config.tree import to_dict
from models.hf import family_module
from models.hf.mapping import Node, dtype_of, hf_names, read, shape_of
from models.hf.safetensors_io import HfWeights
from training.checkpoint import dirs
from training.checkpoint.state import FORMAT_VERSION
from training.hf.convert import (
    EXTRA,
    ConvertError,
    per_layer_key,
    progress,
    writing,
)


def _one_rank() -> Callable[[], None]:
    """A one-process gloo group unless one exists; returns what tears it down again."""
    import torch.distributed as dist

    from training.distributed import free_port

    if dist.is_initialized():
        return lambda: None
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    return dist.destroy_process_group


def _stacked(model: ModelConfig) -> bool:
    """Whether Megatron-Core keys this model's decoder layers stacked (one key, a layer axis).

    TransformerBlock.sharded_state_dict keeps a key per layer when the block is not homogeneous,
    which it decides from `moe_layer_freq` being a list, and models/gpt.py always gives MoE
    models a list (dense first layers or not), and from `linear_attention_freq` (Gated DeltaNet
    layers among attention layers). The ViT of LLaVA is a dense block: stacked.
    """
    return not model.num_moe_experts and model.experimental_attention_variant is None


def import_hf(folder: Path, out: Path) -> Path:
    """Write the Megatron dist checkpoint of a Hugging Face folder into `out` (a checkpoints
    folder: out/iter_0000000 and out/latest), streaming one layer's chunk at a time."""
    if not is_hf_folder(folder):
        raise ConvertError(
            f"{folder} is not a Hugging Face model folder ({CONFIG_FILE} and safetensors weights)"
        )
    model = model_from_hf(folder)
    hf = read_config(folder)
    module = family_module(hf, folder)
    padded = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, 1)
    source = HfWeights(folder)
    weights = module.weights(model, padded, set(source.tensors))
    try:
        entries = _import_entries(model, weights, source)
    except (KeyError, ValueError) as err:
        raise ConvertError(str(err)) from None
    done_rank = _one_rank()
    try:
        with writing(out) as tmp_root:
            iter_dir = tmp_root / dirs.iter_name(0)
            iter_dir.mkdir()
            _write_dcp(iter_dir, entries, source)
            (iter_dir / "metadata.json").write_text(
                json.dumps({"sharded_backend": "torch_dist", "sharded_backend_version": 1}) + "\n"
            )
            torch.save({}, iter_dir / "common.pt")
            dirs.write_state(
                iter_dir,
                {
                    "format_version": FORMAT_VERSION,
                    "step": 0,
                    "consumed_samples": 0,
                    "scheduler": {},
                    "config_name": f"import of {folder.name}",
                    "config_hash": "",
                    "layout": {},
                    "world_size": 1,
                    "dist_optimizer_sharding": "dp_reshardable",
                    "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                    "model": to_dict(model),
                    "hf_origin": str(folder.resolve()),
                    "imported": True,
                },
            )
            names = dirs.checkpoint_files(iter_dir)
            dirs.write_manifest(iter_dir, dirs.file_digests(iter_dir, names))
            dirs.atomic_write_text(tmp_root / "latest", dirs.iter_name(0) + "\n")
    finally:
        done_rank()
        source.close()
    return out


def _import_entries(
    model: ModelConfig, weights: dict[str, Node], source: HfWeights
) -> list[
    tuple[str, tuple[int, ...], torch.dtype, list[tuple[tuple[int, ...], Callable[[], Any]]]]
]:
    """(stored key, global shape, dtype, [(chunk offset, chunk producer)]) per checkpoint tensor."""
    stacked: dict[str, list[tuple[int, str, Node]]] = {}
    entries = []
    for key, node in weights.items():
        shape = shape_of(node, source.shape)
        dtype = dtype_of(node, source.dtype)
        name, layer = per_layer_key(key)
        in_block = ".mtp." not in f".{key}"  # MTP layers keep a key each
        if layer is not None and in_block and _stacked_block(model, key):
            stacked.setdefault(name, []).append((layer, key, node))
            continue
        produce = _producer(node, source, shape)
        entries.append((key, shape, dtype, [((0,) * len(shape), produce)]))
    for name, layers in stacked.items():
        layers.sort(key=lambda entry: entry[0])
        shape = shape_of(layers[0][2], source.shape)
        dtype = dtype_of(layers[0][2], source.dtype)
        chunks = [
            ((layer, *(0,) * len(shape)), _producer(node, source, shape, stack=True))
            for layer, _, node in layers
        ]
        entries.append((name, (len(layers), *shape), dtype, chunks))
    produced = {n for node in weights.values() for n in hf_names(node)}
    for extra in sorted(set(source.tensors) - produced):
        shape = source.shape(extra)
        entries.append(
            (
                EXTRA + extra,
                shape,
                source.dtype(extra),
                [((0,) * len(shape), lambda n=extra: source.read(n))],
            )
        )
    return entries


def _stacked_block(model: ModelConfig, key: str) -> bool:
    """The vision encoder's block is dense; the language model's follows `_stacked`."""
    return key.startswith("vision_model.") or _stacked(model)


def _producer(node: Node, source: HfWeights, shape: tuple[int, ...], stack: bool = False):
    def produce() -> torch.Tensor:
        value = read(node, tuple(slice(0, n) for n in shape), source.shape, source.read)
        return value.unsqueeze(0) if stack else value

    return produce


def _write_dcp(folder: Path, entries: list[Any], source: HfWeights) -> None:
    """torch's distributed checkpoint of `entries`, each chunk made when it is written."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata
    from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

    state: dict[str, Any] = {}
    producers: dict[tuple[str, tuple[int, ...]], Callable[[], Any]] = {}
    for key, shape, dtype, chunks in entries:
        shards = []
        for offset, produce in chunks:
            size = list(shape) if len(chunks) == 1 else [1, *shape[1:]]  # stacked: one layer
            # The data comes from `produce` when the chunk is written: a meta tensor stands in.
            placeholder = torch.empty(size, dtype=dtype, device="meta")
            meta = ShardMetadata(list(offset), size, "rank:0/meta")
            shards.append(Shard(placeholder, meta))
            producers[(key, tuple(offset))] = produce
        global_meta = ShardedTensorMetadata(
            [s.metadata for s in shards], torch.Size(shape), TensorProperties(dtype=dtype)
        )
        state[key] = ShardedTensor._init_from_local_shards_and_global_metadata(  # noqa: SLF001
            shards, global_meta
        )
    report = progress("import", len(producers))
    written = [0]

    class LazyPlanner(dcp.DefaultSavePlanner):
        """Makes each chunk's data when the writer asks for it, from the Hugging Face files."""

        def resolve_data(self, write_item: Any) -> Any:
            index = write_item.index
            produce = producers[(index.fqn, tuple(index.offset))]
            value = produce().contiguous()
            written[0] += 1
            report(written[0])
            return value

    class Writer(dcp.FileSystemWriter):
        """No storage record in `.metadata`: it would pickle a pathlib.Path, which the loader's
        metadata allowlist (training/checkpoint/state.py) refuses, as Megatron's saves have none."""

        def storage_meta(self) -> None:
            return None

    writer = Writer(str(folder), single_file_per_rank=True, thread_count=1)
    dcp.save(state, storage_writer=writer, planner=LazyPlanner())
