"""`recipes import` and `recipes export`: Hugging Face folders <-> Megatron dist checkpoints, streaming.

Both directions hold about one layer's tensors at a time, so memory does not grow with the model
(bench/hf_convert.py measures it), and run in one process on the CPU.

Export (`export_hf`): a checkpoint of any layout holds global tensors (dist_checkpointing), under
per-layer keys, or stacked keys with a leading layer axis for a homogeneous block. For each layer
of the family's map (models/hf/), torch's checkpoint reader fills the layer's boxes, reading only
the saved chunks inside them (`_BoxPlanner`); they are split back into Hugging Face tensors
(models/hf/mapping.py `split`) and written into safetensors files whose headers were planned up
front (models/hf/safetensors_io.py). config.json comes from the folder the run started from when
there is one (every field kept), else from the family's `to_hf`; the tokenizer files from the
run's tokenizer or that origin.

Import (`import_hf`): writes `OUT/iter_0000000` in torch's distributed checkpoint format, keyed as
Megatron-Core keys the model (stacked layers for a dense block, per-layer keys with MoE, see
`_stacked`), one chunk per layer. The writer asks the planner for each chunk's data only when it
writes that chunk (`_write_dcp`), and the planner reads it from the Hugging Face files then (torch's
sharded tensors, which describe the chunks, need a process group: a one-rank gloo group). Tensors
the model does not hold (CLIP's unused last layer, its post-layernorm) are kept under
`hf_extra.<name>` so that an export gives back every tensor bit for bit.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from config.finalize import padded_vocab_size
from config.hf import CONFIG_FILE, family, is_hf_folder, model_from_hf, read_config
from config.registry import HF_FAMILIES
from config.schema import ModelConfig
from config.tree import from_dict, to_dict
from models.hf.gpt import alias
from models.hf.mapping import Assembler, Node, hf_names, read, shape_of, split
from models.hf.safetensors_io import HfWeights, ShardWriter
from training import checkpoint_dirs as dirs
from training.checkpoint_state import FORMAT_VERSION, safe_loading

EXTRA = "hf_extra."  # import: Hugging Face tensors the model does not hold
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
_LAYER = re.compile(r"(.*\blayers)\.(\d+)\.(.*)")


class ConvertError(ValueError):
    """A named problem with the input (exit 2)."""


# --- shared ---------------------------------------------------------------------------------------
def _module(name: str) -> ModuleType:
    return importlib.import_module(HF_FAMILIES[name].module)


def _progress(label: str, total: int) -> Callable[[int], None]:
    """A one-line progress report on stderr: `label: i/total tensors`."""
    start = time.perf_counter()

    def report(done: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            took = time.perf_counter() - start
            print(f"{label}: {done}/{total} tensors ({took:.1f} s)", file=sys.stderr, flush=True)

    return report


def _one_rank() -> Callable[[], None]:
    """A one-process gloo group unless one exists; returns what tears it down again."""
    import torch.distributed as dist

    if dist.is_initialized():
        return lambda: None
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    return dist.destroy_process_group


def _fresh_output(out: Path) -> Path:
    """A temporary sibling of `out`, renamed to it at the end: a failed run leaves no half folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertError(
            f"{out} exists and is not empty; give a new folder (nothing is replaced)"
        )
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def _finish(tmp: Path, out: Path) -> None:
    if out.exists():
        out.rmdir()  # empty, checked at the start
    os.replace(tmp, out)


def per_layer_key(key: str) -> tuple[str, int | None]:
    """`...layers.3.x` -> (`...layers.x`, 3), the key of the stacked form; others unchanged."""
    match = _LAYER.fullmatch(key)
    if match is None:
        return key, None
    return f"{match[1]}.{match[3]}", int(match[2])


# --- export ---------------------------------------------------------------------------------------
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
        if _module(candidate).matches(model):
            return candidate
    raise ConvertError("no Hugging Face family matches this model; name one with --family")


def _checkpoint_keys(path: Path) -> dict[str, Any]:
    """Key -> torch's TensorStorageMetadata of every tensor in a dist checkpoint."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    with safe_loading(path):
        metadata = FileSystemReader(str(path)).read_metadata()
    return {
        k: v
        for k, v in metadata.state_dict_metadata.items()
        if isinstance(v, TensorStorageMetadata)
    }


def _where(key: str, stored: dict[str, Any]) -> tuple[str, int | None] | None:
    """Where a map key's tensor is in the checkpoint: (stored key, layer index in a stacked key)."""
    for name in (key, alias(key)):
        if name is None:
            continue
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
        items = []
        for name, boxes in self.chunks.items():
            items += create_read_items_for_chunk_list(
                name, self.metadata.state_dict_metadata[name], boxes
            )
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
    path: Path, wanted: list[tuple[str, str, int | None]], stored: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """{map key: tensor} for (map key, stored key, layer) triples: the whole stored tensor, or one
    layer of a stacked one. torch's reader reads only the saved chunks inside each box."""
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
    with safe_loading(path):
        reader = dcp.FileSystemReader(str(path))
        dcp.load({}, storage_reader=reader, planner=_BoxPlanner(targets, chunks), no_dist=True)
    return out


def _plan_entry(node: Node, shape: tuple[int, ...], dtype: torch.dtype) -> list[Any]:
    """The Hugging Face (name, dtype, shape) entries a map entry produces, split on the meta device."""
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for name, _, piece in split(node, torch.empty(shape, dtype=dtype, device="meta")):
        shapes.setdefault(name, []).append(tuple(piece.shape))
    out = []
    for name, parts in shapes.items():
        full = parts[0] if len(parts) == 1 else (sum(p[0] for p in parts), *parts[0][1:])
        out.append((name, dtype, full))
    return out


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
    problems = dirs.verify_files(path, dirs.read_manifest(path), sorted(dirs.read_manifest(path)))
    if problems:
        raise ConvertError(f"{path} is damaged: {problems[0]}")
    state = dirs.read_state(path)
    model = _model_of(path, state)
    origin = Path(state["hf_origin"]) if state.get("hf_origin") else None
    if origin is not None and not is_hf_folder(origin):
        origin = None  # moved away: config.json from the map, extras not available
    name = _family_for(model, origin, family_name)
    module = _module(name)
    stored = _checkpoint_keys(path)
    embedding = _where("embedding.word_embeddings.weight", stored) or _where(
        "language_model.embedding.word_embeddings.weight", stored
    )
    if embedding is None:
        raise ConvertError(f"{path} holds no embedding: not a model checkpoint of this project")
    padded = int(stored[embedding[0]].size[0])
    # The origin's tensor names pick the spelling of a family that has several (llava-hf).
    names = set(HfWeights(origin).tensors) if origin is not None else None
    weights = module.weights(model, padded, names)

    located: dict[str, tuple[str, int | None]] = {}
    for key in weights:
        where = _where(key, stored)
        if where is None:
            raise ConvertError(f"{path} has no tensor for {key} (nor its stacked form)")
        located[key] = where
    plan = []
    for key, node in weights.items():
        name_, layer = located[key]
        shape = tuple(stored[name_].size)[1 if layer is not None else 0 :]
        plan += _plan_entry(node, shape, stored[name_].properties.dtype)
    extras = sorted(k for k in stored if k.startswith(EXTRA))
    origin_weights = HfWeights(origin) if origin is not None and not extras else None
    if origin_weights is not None:
        produced = {n for node in weights.values() for n in hf_names(node)}
        extra_names = sorted(set(origin_weights.tensors) - produced)
        plan += [(n, origin_weights.dtype(n), origin_weights.shape(n)) for n in extra_names]
    else:
        extra_names = []
    plan += [(k[len(EXTRA) :], stored[k].properties.dtype, tuple(stored[k].size)) for k in extras]

    # One read per layer: the map's entries grouped by the layer they belong to.
    by_layer: dict[Any, list[str]] = {}
    for key in weights:
        match = _LAYER.fullmatch(key)
        by_layer.setdefault((match[1], int(match[2])) if match else key, []).append(key)
    groups = list(by_layer.values())

    tmp = _fresh_output(out)
    writer = ShardWriter(tmp, plan, max_shard_bytes)
    order = writer.order  # the plan's: map entries as the layers come, then the extras
    report = _progress(f"export {path.name}", len(plan))
    done = 0
    try:
        assembler = Assembler()
        for group in groups:
            loaded = _load_boxes(path, [(k, *located[k]) for k in group], stored)
            for key in group:
                for hf_name, start, rows in split(weights[key], loaded.pop(key)):
                    # A view: the loaded tensor lives until its last piece is written.
                    assembler.add(hf_name, start, rows)
            while done < len(order) and order[done] in assembler.names():
                writer.write(order[done], assembler.take(order[done]))
                done += 1
                report(done)
        for n in extra_names:
            writer.write(n, origin_weights.read(n))
            done += 1
            report(done)
        for k in extras:
            loaded = _load_boxes(path, [(k, k, None)], stored)
            writer.write(k[len(EXTRA) :], loaded[k])
            done += 1
            report(done)
        writer.close()
        _write_config(tmp, model, module, origin, plan)
        _copy_tokenizer(tmp, state, origin)
    except BaseException:
        writer.abort()
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if origin_weights is not None:
            origin_weights.close()
    _finish(tmp, out)
    return out


def _write_config(
    folder: Path, model: ModelConfig, module: ModuleType, origin: Path | None, plan: list[Any]
) -> None:
    dtypes = {d for _, d, _ in plan}
    dtype = str(next(iter(dtypes))).removeprefix("torch.") if len(dtypes) == 1 else None
    config = read_config(origin) if origin is not None else module.to_hf(model)
    if dtype is not None:
        config["torch_dtype"] = dtype
        config.pop("dtype", None)
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if origin is not None and (origin / "generation_config.json").is_file():
        shutil.copyfile(origin / "generation_config.json", folder / "generation_config.json")
    else:
        generation = {k: config[k] for k in ("bos_token_id", "eos_token_id") if k in config}
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


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
            shutil.copyfile(tokenizer, folder / "tokenizer.json")
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
            if (source / name).is_file() and not (folder / name).exists():
                shutil.copyfile(source / name, folder / name)


# --- import ---------------------------------------------------------------------------------------
def _stacked(model: ModelConfig) -> bool:
    """Whether Megatron-Core keys this model's decoder layers stacked (one key, a layer axis).

    TransformerBlock.sharded_state_dict keeps a key per layer when the block is not homogeneous,
    which it decides from `moe_layer_freq` being a list, and models/gpt.py always gives MoE
    models a list (dense first layers or not). The ViT of LLaVA is a dense block: stacked.
    """
    return not model.num_moe_experts


def import_hf(folder: Path, out: Path) -> Path:
    """Write the Megatron dist checkpoint of a Hugging Face folder into `out` (a checkpoints
    folder: out/iter_0000000 and out/latest), streaming one layer's chunk at a time."""
    if not is_hf_folder(folder):
        raise ConvertError(
            f"{folder} is not a Hugging Face model folder ({CONFIG_FILE} and safetensors weights)"
        )
    model = model_from_hf(folder)
    hf = read_config(folder)
    module = importlib.import_module(family(hf, folder).module)
    padded = padded_vocab_size(model.vocab_size, model.make_vocab_size_divisible_by, 1)
    source = HfWeights(folder)
    weights = module.weights(model, padded, set(source.tensors))
    try:
        entries = _import_entries(model, weights, source)
    except (KeyError, ValueError) as err:
        raise ConvertError(str(err)) from None
    tmp_root = _fresh_output(out)
    iter_dir = tmp_root / dirs.iter_name(0)
    iter_dir.mkdir()
    done_rank = _one_rank()
    try:
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
    except BaseException:
        shutil.rmtree(tmp_root, ignore_errors=True)
        raise
    finally:
        done_rank()
        source.close()
    _finish(tmp_root, out)
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
        dtype = source.dtype(hf_names(node)[0])
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
        dtype = source.dtype(hf_names(layers[0][2])[0])
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
    report = _progress("import", len(producers))
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
        metadata allowlist (training/checkpoint_state.py) refuses, as Megatron's saves have none."""

        def storage_meta(self) -> None:
            return None

    writer = Writer(str(folder), single_file_per_rank=True, thread_count=1)
    dcp.save(state, storage_writer=writer, planner=LazyPlanner())


def iter_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a Hugging Face folder (for tests and the benchmark)."""
    weights = HfWeights(folder)
    try:
        for name in sorted(weights.tensors):
            yield name, weights.read(name)
    finally:
        weights.close()
