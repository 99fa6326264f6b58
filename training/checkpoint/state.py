"""What a checkpoint holds, and how it maps onto Megatron-Core's dist_checkpointing.

- Model chunks: each bare GPT module's `sharded_state_dict`, keyed as Megatron-LM keys them
  (`model`, or `model0`, `model1` ... with virtual pipeline stages), so that its tools can read ours.
- Optimizer: `optimizer.sharded_state_dict(model_state, metadata=...)`; the distributed optimizer
  in `checkpoint.dist_optimizer_sharding` format (`dp_reshardable`, the one that loads on the CPU,
  reshards over data parallelism only: the layout config/layout.py names must stay the same
  across a resume).
- `train_state.json` (written by rank 0): step, consumed samples (the data position), the LR
  schedule's state, the config's name and hash, the parallel layout, the sharding type; a LoRA
  run's record of its base's files (training/checkpoint/lora_base.py).
- `rng/rank_XXXXX.pt`: each rank's RNG states (python, numpy, torch, CUDA, Megatron's tracker),
  as tensors, ints and strings only.
- `data/rank_XXXXX.pt`: each rank's batch source (its `state_dict()`): for Energon its savable
  loader's state, which differs between data-parallel ranks and knows what was prefetched.
- `manifest.json` (training/checkpoint/dirs.py): the size and SHA-256 of every other file.

Loading never runs code from the checkpoint (training/checkpoint/safe_load.py `safe_loading`):
every `torch.load`, ours and those inside torch's distributed checkpoint reader, is weights-only
(tensors and plain containers), and the reader's pickled `.metadata` is unpickled first with only
the classes torch writes there.

The named states come from `Trainer.checkpoint_states()` (see `STATES`): the step counter ("train")
and the LR schedule go into train_state.json, the RNG and the batch source into the per-rank files.

Megatron-Core 0.19 with torch's Adam (no Transformer Engine or Apex: the CPU, and GPUs without TE)
needs two corrections on load, see `_allocate_optimizer_state` and `_restore_adam_steps`.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from config.hf import is_hf_folder
from config.layout import layout_problems, resume_layout
from config.lora import is_adapter
from config.schema import TrainingConfig
from config.tree import ConfigError, to_dict
from training.checkpoint import lora_base
from training.checkpoint.dirs import FSDP_SHARDING
from training.checkpoint.safe_load import safe_loading

FORMAT_VERSION = 2  # 2: manifest.json, RNG files without numpy objects
# The named states a checkpoint holds besides the model and the optimizer.
STATES = ("train", "scheduler", "rng", "data")


def config_hash(cfg: TrainingConfig) -> str:
    text = json.dumps(to_dict(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def layout(cfg: TrainingConfig) -> dict[str, Any]:
    """train_state.json's "layout" record: what the optimizer state's shards depend on
    (config/layout.py LAYOUT_FIELDS), by short name as the record has always keyed it."""
    return {field.rsplit(".", 1)[-1]: value for field, value in resume_layout(cfg).items()}


def train_state(
    cfg: TrainingConfig, states: dict[str, Any], base: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON part of a checkpoint, from the `state_dict()` of each of `STATES`; `base`: a LoRA
    run's record of its base (training/checkpoint/lora_base.py)."""
    return {
        "format_version": FORMAT_VERSION,
        "step": states["train"]["step"],
        "consumed_samples": states["data"]["consumed_samples"],
        "scheduler": states["scheduler"],
        "config_name": cfg.name,
        "config_hash": config_hash(cfg),
        "layout": layout(cfg),
        "world_size": dist.get_world_size(),
        "dist_optimizer_sharding": (
            FSDP_SHARDING
            if cfg.parallel.use_megatron_fsdp
            else cfg.checkpoint.dist_optimizer_sharding
        ),
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # What `recipes export` needs to write a Hugging Face folder: the architecture, the
        # tokenizer's files, and the Hugging Face folder the run started from (its config.json).
        "model": to_dict(cfg.model),
        "tokenizer": _absolute(cfg.data.tokenizer),
        "hf_origin": hf_origin(cfg),
        # A LoRA run's checkpoint holds adapters only: their settings, for `recipes export`.
        "peft": to_dict(cfg.peft) if cfg.peft.scheme != "none" else None,
        # ... and the files of the base they were trained on: a resume on another is refused.
        lora_base.RECORD: base,
        # The whole config: a resume names what changed (launchers/resume.py, the engine).
        "config": to_dict(cfg),
    }


def _absolute(path: str | None) -> str | None:
    """A path as `recipes export` finds it from another working directory."""
    return str(Path(path).resolve()) if path and Path(path).exists() else path


def hf_origin(cfg: TrainingConfig) -> str | None:
    """The Hugging Face folder a run's weights came from (directly, or through `recipes import`)."""
    folder = cfg.checkpoint.pretrained_dir
    if not folder:
        return None
    if is_hf_folder(folder):
        return str(Path(folder).resolve())
    from training.checkpoint import dirs

    path = Path(folder) if dirs.is_complete(Path(folder)) else dirs.latest_checkpoint(Path(folder))
    if path is None:
        return None
    try:
        return dirs.read_state(path).get("hf_origin")
    except (OSError, ValueError):
        return None


def check_compatible(cfg: TrainingConfig, folder: Path, saved: dict[str, Any]) -> None:
    """Refuse, with the fix, a checkpoint that cannot load into this run's layout: the answer
    launchers/resume.py gives before launch (config/layout.py `layout_problems`)."""
    if saved.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{folder}: checkpoint format {saved.get('format_version')}, expected {FORMAT_VERSION}"
        )
    problems = layout_problems(saved, cfg, str(folder))
    if problems:
        raise ConfigError([(p.field, p.message) for p in problems])


def model_chunks(model: list[Any]) -> dict[str, Any]:
    """The bare GPT modules (no DDP / Float16Module wrappers) by checkpoint key: Megatron-Core's
    modules, whose methods (sharded_state_dict) torch.nn.Module does not declare."""
    from megatron.core.utils import unwrap_model  # here: `recipes export` reads without it

    chunks = unwrap_model([_unsharded(chunk) for chunk in model])
    if len(chunks) == 1:
        return {"model": chunks[0]}
    return {f"model{i}": chunk for i, chunk in enumerate(chunks)}


def _unsharded(chunk: Any) -> Any:
    """A Megatron-FSDP chunk's module inside MegatronFSDP, which unwrap_model does not know."""
    if getattr(getattr(chunk, "ddp_config", None), "use_megatron_fsdp", False):
        return chunk.module.module
    return chunk


def fsdp_state_dict(model: list[Any], optimizer: Any, is_loading: bool) -> dict[str, Any]:
    """What a Megatron-FSDP run saves, in Megatron-LM's fsdp_dtensor format: each chunk's
    `state_dict()` (its DTensor shards, under the same keys as `model_chunks`) and the optimizer's
    state by parameter name. torch's distributed checkpoint writes and reads it directly, and
    reshards DTensors over another data-parallel size by itself."""
    if is_loading:
        _allocate_optimizer_state(optimizer)
    _state_for_empty_shards(optimizer)
    (chunk,) = model  # the checker keeps Megatron-FSDP to one chunk (no pipeline parallelism)
    state = {"model": chunk.module.state_dict()}  # MegatronFSDP's, as Megatron-LM saves it
    state["optimizer"] = optimizer.sharded_state_dict(
        state, is_loading=is_loading, metadata={"distrib_optim_sharding_type": FSDP_SHARDING}
    )
    return state


def _state_for_empty_shards(optimizer: Any) -> None:
    """Optimizer state, of no elements, for the parameters whose shard on this rank is empty.

    Megatron-FSDP splits each bucket of parameters evenly over the ranks, so a small one (a norm)
    can lie wholly on another rank, and the optimizer never steps its empty shard here: it has no
    state. Every rank must still name every tensor to DCP, in the same order, since preparing an
    unevenly sharded one is a collective over its group (measured: without this, the save hangs).
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        template = next((s for s in inner.state.values() if s), None)
        if template is None:
            continue
        for group in inner.param_groups:
            for param in group["params"]:
                if inner.state.get(param):
                    continue
                inner.state[param] = {
                    key: torch.zeros_like(param, dtype=value.dtype)
                    if isinstance(value, torch.Tensor) and value.dim() > 0
                    else (value.clone() if isinstance(value, torch.Tensor) else value)
                    for key, value in template.items()
                }


def _for_dcp(state: dict[str, Any], chunk: Any) -> dict[str, Any]:
    """`fsdp_state_dict` as Megatron-LM hands it to torch's DCP (its
    `preprocess_fsdp_dtensor_state_dict`, with Megatron-Core's own handlers): TE's FP8 extra
    state as bytes, SwiGLU's fused FC1 split into its two halves (so TP shards them alike), and
    the chunk layout of unevenly sharded DTensors. (Its handler of MoE experts is left out: the
    checker refuses MoE with Megatron-FSDP.)"""
    from megatron.core.distributed.fsdp.src.megatron_fsdp.uneven_dtensor import (
        preprocess_state_dict_for_uneven_dtensor,
    )
    from megatron.core.transformer import fsdp_dtensor_checkpoint as handlers

    state = dict(state)
    handlers.handle_fp8_extra_state_case(state["model"])
    config = chunk.config
    if config.gated_linear_unit:
        state["model"], state["optimizer"] = handlers.handle_swiglu_in_state_dict(
            chunk, state["model"], state["optimizer"]
        )
    preprocess_state_dict_for_uneven_dtensor(state)
    return state


def save_fsdp(model: list[Any], optimizer: Any, folder: Path) -> None:
    from torch.distributed import checkpoint as dcp

    state = fsdp_state_dict(model, optimizer, False)
    dcp.save(_for_dcp(state, model[0].module), checkpoint_id=str(folder))


def load_fsdp(model: list[Any], optimizer: Any, folder: Path) -> None:
    """A Megatron-FSDP checkpoint into the chunk's shards and the optimizer, in place: DCP fills
    the preprocessed tensors, views of the chunk's and the optimizer's own."""
    from torch.distributed import checkpoint as dcp

    raw = fsdp_state_dict(model, optimizer, True)
    with safe_loading(folder):
        dcp.load(_for_dcp(raw, model[0].module), checkpoint_id=str(folder))
    model[0].load_state_dict(raw["model"])
    optimizer.load_state_dict(raw["optimizer"])
    _restore_adam_steps(optimizer)


def adapted(model: list[Any]) -> bool:
    """Whether the model carries LoRA adapters (peft.scheme=lora): then checkpoints hold them
    alone, and the frozen base weights come from checkpoint.pretrained_dir."""
    return any(is_adapter(name) for chunk in model for name, _ in chunk.named_parameters())


def _split(state: dict[str, Any], adapters: bool) -> dict[str, Any]:
    """The adapter entries of a chunk's flat sharded state dict, or the others."""
    return {k: v for k, v in state.items() if is_adapter(k) == adapters}


def sharded_state_dict(
    model: list[Any], optimizer: Any, sharding: str, is_loading: bool
) -> dict[str, Any]:
    metadata = {"distrib_optim_sharding_type": sharding, "chained_optim_avoid_prefix": True}
    state = {key: c.sharded_state_dict(metadata=metadata) for key, c in model_chunks(model).items()}
    if adapted(model):  # the frozen base is not saved: it is the pretrained folder's
        state = {key: _split(chunk_state, True) for key, chunk_state in state.items()}
    state["optimizer"] = optimizer.sharded_state_dict(
        state, is_loading=is_loading, metadata=metadata
    )
    return state


def sync_params_for_save(model: list[Any]) -> None:
    """Make every rank's copy of the weights current before they are written.

    With overlap_param_gather the distributed optimizer's updated shards are all-gathered lazily,
    in the next forward; without this, a rank would write weights one update old.
    """
    for chunk in model:
        if getattr(chunk, "use_forward_hook", False):
            chunk.disable_forward_pre_hook(param_sync=True)
            chunk.enable_forward_pre_hook()


def load_model_and_optimizer(model: list[Any], optimizer: Any, folder: Path, sharding: str) -> None:
    """Model weights and optimizer state from `folder`, in place (every rank calls this)."""
    _allocate_optimizer_state(optimizer)
    state = sharded_state_dict(model, optimizer, sharding, True)
    with safe_loading(folder):
        loaded = _megatron_load(state, folder)
    frozen_base = adapted(model)
    for key, chunk in model_chunks(model).items():
        result = chunk.load_state_dict(loaded[key], strict=not frozen_base)
        missing = [k for k in result.missing_keys if is_adapter(k)]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"{folder}: missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}"
            )
    # No autograd while the saved state is copied in place: with FP32 weights the distributed
    # optimizer's main parameters are views of the model's, leaves that require grad, and Megatron-
    # Core's dp_reshardable load (load_parameter_state_from_dp_reshardable, unlike its
    # fs_model_space sibling) runs its copy_ without torch.no_grad(), which autograd refuses.
    with torch.no_grad():
        optimizer.load_state_dict(loaded["optimizer"])
    _restore_adam_steps(optimizer)


def load_model_weights(model: list[Any], optimizer: Any, folder: Path) -> None:
    """Only the model weights from `folder` (fine-tuning), then the optimizer's copies of them.

    dist_checkpointing stores global tensors, so the weights load into any TP/PP layout. The
    optimizer built its FP32 main weights from the random initialisation: reload them, or the
    first step would write those back over the pretrained weights.
    """
    state = {  # the weights, not a LoRA run's adapters: those start fresh
        key: _tensors_only(_split(chunk.sharded_state_dict(), False))
        for key, chunk in model_chunks(model).items()
    }
    with safe_loading(folder):
        _use_stored_names(state, folder)
        loaded = _megatron_load(state, folder)
    for key, chunk in model_chunks(model).items():
        result = chunk.load_state_dict(loaded[key], strict=False)
        missing = [
            k for k in result.missing_keys if not k.endswith("_extra_state") and not is_adapter(k)
        ]
        if missing or result.unexpected_keys:
            raise ValueError(
                f"{folder}: missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}"
            )
    optimizer.reload_model_params()


def _use_stored_names(state: dict[str, Any], folder: Path) -> None:
    """Ask for each tensor under the name the checkpoint stores it by.

    Megatron-Core keys a few norms differently with Transformer Engine (fused into the next
    linear layer: `mlp.linear_fc1.layer_norm_weight`) and without it (`pre_mlp_layernorm.weight`)
    for MoE and MLA layers; `recipes import` writes TE's names. A tensor the checkpoint lacks under
    this run's name is asked for under its other one (models/hf/gpt.py ALIASES), so weights saved
    on GPUs start a CPU run and the other way round.
    """
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from torch.distributed.checkpoint import FileSystemReader

    from models.hf.gpt import aliases

    stored = set(FileSystemReader(str(folder)).read_metadata().state_dict_metadata)
    for item in nested_values(state):
        key = getattr(item, "key", None)
        if key is not None and key not in stored:
            item.key = next((other for other in aliases(key) if other in stored), key)


def _tensors_only(state: Any) -> Any:
    """A sharded state dict without its `_extra_state` objects: fine-tuning takes the weights,
    not a layer's runtime extras (Transformer Engine's FP8 scaling history), which a checkpoint
    made by `recipes import` does not have."""
    if isinstance(state, dict):
        return {
            k: _tensors_only(v) for k, v in state.items() if not str(k).endswith("_extra_state")
        }
    return state


def rng_file(folder: Path, rank: int) -> Path:
    return folder / "rng" / f"rank_{rank:05d}.pt"


def save_rng(folder: Path, rank: int, rng: dict[str, Any]) -> None:
    """numpy's state as a tensor, so that the file loads weights-only (no numpy class in it)."""
    path = rng_file(folder, rank)
    path.parent.mkdir(exist_ok=True)
    kind, keys, pos, has_gauss, gauss = rng["numpy"]
    torch.save(
        rng | {"numpy": (kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, gauss)}, path
    )


def load_rng(folder: Path, rank: int) -> dict[str, Any]:
    state = torch.load(rng_file(folder, rank), weights_only=True)
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    return state | {"numpy": (kind, keys.numpy().astype("uint32"), pos, has_gauss, gauss)}


def data_file(folder: Path, rank: int) -> Path:
    return folder / "data" / f"rank_{rank:05d}.pt"


def save_data(folder: Path, rank: int, data: dict[str, Any]) -> None:
    path = data_file(folder, rank)
    path.parent.mkdir(exist_ok=True)
    torch.save(data, path)


def load_data(folder: Path, rank: int) -> dict[str, Any]:
    return torch.load(data_file(folder, rank), weights_only=True)  # ints and a uint8 tensor


def _allocate_optimizer_state(optimizer: Any) -> None:
    """Give a fresh distributed optimizer its Adam state before a load.

    Megatron builds the loading state dict from the optimizer's own, which with torch's Adam must
    already hold a per-parameter 'step'. One zero-gradient step allocates it (Megatron-FSDP's
    loader does the same); the load then overwrites every value that step touched.
    """
    from megatron.core.optimizer import distrib_optimizer

    if distrib_optimizer.HAVE_APEX_OR_TE:
        return
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        if isinstance(opt, distrib_optimizer.DistributedOptimizer) and not opt.optimizer.state:
            opt._init_optimizer_states_with_dummy_values()


def _restore_adam_steps(optimizer: Any) -> None:
    """Each parameter's Adam 'step' from the loaded param groups, as its own tensor.

    Megatron saves torch Adam's step in the param groups, but its `dp_reshardable` load then copies
    the pre-load (dummy) step back over it, and hands every parameter the same tensor, which torch
    increments in place once per parameter. Either breaks the bias correction of a resumed run
    (measured: the loss differs from the second step after a resume).
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None:
            continue
        for group in getattr(inner, "param_groups", []):
            if "step" not in group:
                continue
            for param in group["params"]:
                old = inner.state.get(param, {}).get("step")
                if isinstance(old, torch.Tensor):
                    inner.state[param]["step"] = torch.tensor(
                        float(group["step"]), dtype=old.dtype, device=old.device
                    )


def _megatron_load(state: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Megatron-Core's dist_checkpointing load, imported when first used: this module also serves
    `recipes import` / `export`, which need torch's checkpoint format but not Megatron-Core
    (2.6 s of imports on this machine)."""
    from megatron.core import dist_checkpointing

    return dist_checkpointing.load(state, str(folder))
