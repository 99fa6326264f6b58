"""`recipes export`: a Megatron dist checkpoint of any layout -> a Hugging Face folder, streaming.

A checkpoint holds global tensors (dist_checkpointing), under per-layer keys, or stacked keys with
a leading layer axis for a homogeneous block. For each layer of the family's map (models/hf/),
torch's checkpoint reader fills the layer's boxes, reading only the saved chunks inside them
(`_BoxPlanner`); they are split back into Hugging Face tensors (models/hf/mapping.py `split`) and
written into safetensors files whose headers were planned up front (models/hf/safetensors_io.py).
The checkpoint's `.metadata` is checked and read once for the whole export (`_CachedReader`).
config.json comes from the folder the run started from when there is one (every field kept), else
from the family's `to_hf`; the tokenizer files from the run's tokenizer or that origin.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from config.hf import CONFIG_FILE, family, is_hf_folder, read_config
from config.precision import PRESETS, TORCH_DTYPES
from config.registry import HF_FAMILIES
from config.schema import ModelConfig
from config.tree import from_dict
from models.hf import module_of
from models.hf.gpt import aliases
from models.hf.mapping import Assembler, Node, hf_names, split
from models.hf.safetensors_io import HfWeights, ShardWriter
from training.checkpoint import dirs
from training.checkpoint.safe_load import safe_loading
from training.hf.convert import (
    EXTRA,
    LAYER_KEY,
    ConvertError,
    copy_foreign,
    foreign_file,
    per_layer_key,
    progress,
    writing,
)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
)


class _CachedReader(FileSystemReader):
    """torch's file reader with the checkpoint's `.metadata` read once: each layer's load would
    otherwise unpickle it again (tens of MB for a large model's many chunks)."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self._metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            self._metadata = super().read_metadata(*args, **kwargs)
        return self._metadata


def _model_of(path: Path, state: dict[str, Any]) -> ModelConfig:
    """The model section a checkpoint was saved with: train_state.json, else the run's config."""
    if "model" in state:
        return from_dict(ModelConfig, state["model"], "model")
    import yaml

    for config in (path.parent.parent / "config.yaml", path.parent / "config.yaml"):
        if config.is_file():
            return from_dict(ModelConfig, yaml.safe_load(config.read_text())["model"], "model")
    raise ConvertError(
        f"{path} does not say which model it holds (no 'model' in {dirs.STATE_FILE}, no "
        "config.yaml of its run beside it)"
    )


def _family_for(model: ModelConfig, origin: Path | None, name: str | None) -> str:
    if name is not None:
        if name not in HF_FAMILIES:
            raise ConvertError(f"--family {name!r}: the families are {', '.join(HF_FAMILIES)}")
        return name
    if origin is not None:
        return family(read_config(origin), origin).name
    for candidate in HF_FAMILIES:
        if module_of(candidate).matches(model):
            return candidate
    raise ConvertError("no Hugging Face family matches this model; name one with --family")


def _checkpoint_keys(reader: _CachedReader) -> dict[str, Any]:
    """Key -> torch's TensorStorageMetadata of every tensor in a dist checkpoint."""
    metadata = reader.read_metadata()
    return {
        k: v
        for k, v in metadata.state_dict_metadata.items()
        if isinstance(v, TensorStorageMetadata)
    }


# A Megatron-FSDP checkpoint (fsdp_dtensor, training/checkpoint/state.py) keys the model's
# tensors under this prefix, each layer on its own, holds them as the FP32 main weights, and
# stores a SwiGLU FC1 as its two halves (Megatron-Core's handle_swiglu_in_state_dict).
FSDP_PREFIX = "model.module."
HALVES = ("_w", "_v")


def _fsdp_view(
    stored: dict[str, Any], dtype: torch.dtype
) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
    """A Megatron-FSDP checkpoint's model tensors under Megatron DDP's names, in the run's
    weight dtype (what a Megatron DDP checkpoint holds), and the stored tensors each is read
    from: itself, or its halves, joined along the first axis."""
    view: dict[str, Any] = {}
    sources: dict[str, tuple[str, ...]] = {}
    for key, meta in stored.items():
        if not key.startswith(FSDP_PREFIX) or key.endswith(HALVES[1]):
            continue
        name = key[len(FSDP_PREFIX) :]
        parts: tuple[str, ...] = (key,)
        halves = tuple(key[: -len(HALVES[0])] + h for h in HALVES)
        if name.endswith(HALVES[0]) and halves[1] in stored:
            name, parts = name[: -len(HALVES[0])], halves
        size = torch.Size((sum(stored[p].size[0] for p in parts), *meta.size[1:]))
        properties = dataclasses.replace(meta.properties, dtype=dtype)
        view[name], sources[name] = TensorStorageMetadata(properties, size, []), parts
    return view, sources


def _where(key: str, stored: dict[str, Any]) -> tuple[str, int | None] | None:
    """Where a map key's tensor is in the checkpoint: (stored key, layer index in a stacked key)."""
    for name in (key, *aliases(key)):
        if name in stored:
            return name, None
        stacked, layer = per_layer_key(name)
        if layer is not None and stacked in stored:
            return stacked, layer
    return None


class _BoxPlanner(DefaultLoadPlanner):
    """torch's default load planner, asked for boxes of stored tensors instead of whole ones.

    A planner of our own: Megatron-Core's load strategy cannot ask one process for a box of a
    tensor (its grid of shards assumes other ranks hold the rest), and torch's default planner
    loads whole tensors (all layers of a stacked key at once).
    """

    def __init__(
        self,
        targets: dict[tuple[str, tuple[int, ...]], torch.Tensor],
        chunks: dict[str, list[ChunkStorageMetadata]],
    ) -> None:
        super().__init__()
        self.targets, self.chunks = targets, chunks

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None  # given to set_up_planner, before any plan
        items = []
        for name, boxes in self.chunks.items():
            # Boxes are asked of tensors only (never of the checkpoint's bytes entries).
            meta = cast(TensorStorageMetadata, self.metadata.state_dict_metadata[name])
            items += create_read_items_for_chunk_list(name, meta, boxes)
        return LoadPlan(items)

    def resolve_tensor(self, read_item: Any) -> torch.Tensor:
        index = read_item.dest_index
        target = self.targets[(index.fqn, tuple(index.offset))]
        for axis, (start, length) in enumerate(
            zip(read_item.dest_offsets, read_item.lengths, strict=True)
        ):
            target = target.narrow(axis, start, length)
        return target

    def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
        pass  # written in place into the target's view


def _load_boxes(
    reader: _CachedReader,
    wanted: list[tuple[str, str, int | None]],
    stored: dict[str, Any],
    sources: dict[str, tuple[str, ...]] | None = None,
) -> dict[str, torch.Tensor]:
    """{map key: tensor} for (map key, stored key, layer) triples: the whole stored tensor, or one
    layer of a stacked one. torch's reader reads only the saved chunks inside each box. A name
    in `sources` (`_fsdp_view`) is read from its stored parts, joined, in its view's dtype."""
    if not sources:
        return _read_boxes(reader, wanted, stored)
    parts = [p for _, name, _ in wanted for p in sources[name]]
    read = _read_boxes(reader, [(p, p, None) for p in parts], stored)
    return {
        key: torch.cat([read[p] for p in sources[name]]).to(stored[name].properties.dtype)
        for key, name, _ in wanted
    }


def _read_boxes(
    reader: _CachedReader, wanted: list[tuple[str, str, int | None]], stored: dict[str, Any]
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    targets: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
    chunks: dict[str, list[ChunkStorageMetadata]] = {}
    for key, name, layer in wanted:
        meta = stored[name]
        shape = tuple(meta.size)
        offsets = (0,) * len(shape) if layer is None else (layer, *(0,) * (len(shape) - 1))
        sizes = shape if layer is None else (1, *shape[1:])
        target = torch.empty(sizes, dtype=meta.properties.dtype)
        targets[(name, offsets)] = target
        chunks.setdefault(name, []).append(
            ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes))
        )
        out[key] = target if layer is None else target[0]
    with warnings.catch_warnings():
        # no_dist=True says this process reads alone; torch warns that it assumes so all the same.
        warnings.filterwarnings(
            "ignore", message=r"torch\.distributed is disabled", category=UserWarning
        )
        dcp.load({}, storage_reader=reader, planner=_BoxPlanner(targets, chunks), no_dist=True)
    return out


def _plan_entries(entries: list[tuple[Node, tuple[int, ...], torch.dtype]]) -> list[Any]:
    """The Hugging Face (name, dtype, shape) entries that map entries produce, split on the meta
    device. A Hugging Face tensor may be made of several map entries (Gated DeltaNet's
    in_proj_qkv is the query, key and value parts of Megatron-Core's in_proj): its rows run to
    the end of its last piece."""
    rows: dict[str, tuple[int, tuple[int, ...], torch.dtype]] = {}
    for node, shape, dtype in entries:
        for name, start, piece in split(node, torch.empty(shape, dtype=dtype, device="meta")):
            end = start + piece.shape[0] if piece.dim() else 0
            seen = rows.get(name)
            rows[name] = (max(end, seen[0] if seen else 0), tuple(piece.shape), dtype)
    return [
        (name, dtype, (end, *shape[1:]) if shape else shape)
        for name, (end, shape, dtype) in rows.items()
    ]


def export_hf(
    checkpoint: Path,
    out: Path,
    *,
    family_name: str | None = None,
    max_shard_bytes: int = 5 * 2**30,
) -> Path:
    """Write the Hugging Face folder of a checkpoint (a run's checkpoints folder or one
    iter_XXXXXXX in it) into `out`, which must not exist or be empty. Returns `out`."""
    path = checkpoint if dirs.is_complete(checkpoint) else dirs.latest_checkpoint(checkpoint)
    if path is None:
        raise ConvertError(
            f"{checkpoint} is not a complete checkpoint (an iter_XXXXXXX folder with "
            f"{dirs.STATE_FILE}) and holds none"
        )
    files = dirs.read_manifest(path)
    problems = dirs.verify_files(path, files, sorted(files))
    if problems:
        raise ConvertError(f"{path} is damaged: {problems[0]}")
    state = dirs.read_state(path)
    model = _model_of(path, state)
    origin = Path(state["hf_origin"]) if state.get("hf_origin") else None
    if origin is not None and not is_hf_folder(origin):
        origin = None  # moved away: config.json from the map, extras not available
    module = module_of(_family_for(model, origin, family_name))
    origin_weights = HfWeights(origin) if origin is not None else None
    reader = _CachedReader(path)
    # `.metadata` checked once; every torch.load of the export weights-only.
    with safe_loading(path):
        try:
            _export(path, out, reader, state, model, module, origin_weights, max_shard_bytes)
        finally:
            if origin_weights is not None:
                origin_weights.close()
    return out


def _export(
    path: Path,
    out: Path,
    reader: _CachedReader,
    state: dict[str, Any],
    model: ModelConfig,
    module: ModuleType,
    origin: HfWeights | None,
    max_shard_bytes: int,
) -> None:
    stored, sources = _checkpoint_keys(reader), None
    if state.get("dist_optimizer_sharding") == dirs.FSDP_SHARDING:
        precision = state.get("config", {}).get("precision", "bf16_mixed")
        dtype = (
            TORCH_DTYPES[PRESETS[precision].params_dtype] if precision in PRESETS else "bfloat16"
        )
        view, sources = _fsdp_view(stored, getattr(torch, dtype))
        stored = {**stored, **view}  # the parts are read under their own names
    embedding = _where("embedding.word_embeddings.weight", stored) or _where(
        "language_model.embedding.word_embeddings.weight", stored
    )
    if embedding is None:
        raise ConvertError(f"{path} holds no embedding: not a model checkpoint of this project")
    padded = int(stored[embedding[0]].size[0])
    # The origin's tensor names pick the spelling of a family that has several (llava-hf).
    weights = module.weights(model, padded, set(origin.tensors) if origin is not None else None)

    located: dict[str, tuple[str, int | None]] = {}
    for key in weights:
        where = _where(key, stored)
        if where is None:
            raise ConvertError(f"{path} has no tensor for {key} (nor its stacked form)")
        located[key] = where
    entries = []
    for key, node in weights.items():
        name, layer = located[key]
        shape = tuple(stored[name].size)[1 if layer is not None else 0 :]
        entries.append((node, shape, stored[name].properties.dtype))
    plan = _plan_entries(entries)
    # Tensors the model does not hold: kept by `recipes import`, else the origin folder's.
    extras = sorted(k for k in stored if k.startswith(EXTRA))
    extra_names: list[str] = []
    if origin is not None and not extras:
        produced = {n for node in weights.values() for n in hf_names(node)}
        extra_names = sorted(set(origin.tensors) - produced)
        plan += [(n, origin.dtype(n), origin.shape(n)) for n in extra_names]
        for file in sorted({origin.tensors[n][0] for n in extra_names}):
            foreign_file(origin.folder, file)  # their tensors are copied out as they are
    plan += [(k[len(EXTRA) :], stored[k].properties.dtype, tuple(stored[k].size)) for k in extras]

    # One read per layer: the map's entries grouped by the layer they belong to.
    by_layer: dict[Any, list[str]] = {}
    for key in weights:
        match = LAYER_KEY.fullmatch(key)
        by_layer.setdefault((match[1], int(match[2])) if match else key, []).append(key)

    report = progress(f"export {path.name}", len(plan))
    with writing(out) as tmp:
        writer = ShardWriter(tmp, plan, max_shard_bytes)
        order = writer.order  # the plan's: map entries as the layers come, then the extras
        done = 0
        try:
            assembler = Assembler()
            for group in by_layer.values():
                loaded = _load_boxes(reader, [(k, *located[k]) for k in group], stored, sources)
                for key in group:
                    for hf_name, start, rows in split(weights[key], loaded.pop(key)):
                        # A view: the loaded tensor lives until its last piece is written.
                        assembler.add(hf_name, start, rows)
                while done < len(order) and order[done] in assembler.names():
                    writer.write(order[done], assembler.take(order[done]))
                    done += 1
                    report(done)
            if origin is not None:  # extra_names are the origin's
                for n in extra_names:
                    writer.write(n, origin.read(n))
                    done += 1
                    report(done)
            for k in extras:
                loaded = _load_boxes(reader, [(k, k, None)], stored)
                writer.write(k[len(EXTRA) :], loaded[k])
                done += 1
                report(done)
            writer.close()
        finally:
            writer.abort()  # the file a failure left open; nothing once every file is written
        _write_config(tmp, model, module, origin.folder if origin else None, plan)
        _copy_tokenizer(tmp, state, origin.folder if origin else None)


def _write_config(
    folder: Path, model: ModelConfig, module: ModuleType, origin: Path | None, plan: list[Any]
) -> None:
    dtypes = {d for _, d, _ in plan}
    dtype = str(next(iter(dtypes))).removeprefix("torch.") if len(dtypes) == 1 else None
    if origin is not None:
        foreign_file(origin, CONFIG_FILE)  # its fields are written out: the same check as a copy
    config = read_config(origin) if origin is not None else module.to_hf(model)
    quantized = config.get("quantization_config")
    if origin is not None and isinstance(quantized, dict):
        if quantized.get("quant_method") in family(config, origin).dequantizes:
            # The import read these weights dequantized and they are written so (GPT-OSS's MXFP4
            # experts in BF16): transformers would look for the quantized tensors otherwise.
            del config["quantization_config"]
    if dtype is not None:
        config["torch_dtype"] = dtype
        config.pop("dtype", None)
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    name = "generation_config.json"
    if origin is None or not copy_foreign(origin, name, folder / name):
        generation = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
        (folder / name).write_text(json.dumps(generation, indent=2) + "\n")


def _tokenizer_json(path: Path) -> Path:
    return path if path.is_file() else path / "tokenizer.json"


def _copy_tokenizer(folder: Path, state: dict[str, Any], origin: Path | None) -> None:
    """The files of the run's tokenizer (data.tokenizer: a tokenizer.json or a folder), then those
    of the origin folder when the run had none or used the origin's own tokenizer.json."""
    sources = []
    tokenizer = Path(state["tokenizer"]) if state.get("tokenizer") else None
    if tokenizer is not None and tokenizer.exists():
        sources.append(tokenizer if tokenizer.is_dir() else tokenizer.parent)
        if tokenizer.is_file():
            copy_foreign(tokenizer.parent, tokenizer.name, folder / "tokenizer.json")
    if origin is not None:
        theirs = origin / "tokenizer.json"
        ours = _tokenizer_json(tokenizer) if tokenizer is not None else None
        same = ours is None or (
            ours.is_file() and theirs.is_file() and ours.read_bytes() == theirs.read_bytes()
        )
        if same:
            sources.append(origin)
    for source in sources:
        for name in TOKENIZER_FILES:
            copy_foreign(source, name, folder / name)
