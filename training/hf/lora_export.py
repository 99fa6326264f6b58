"""`recipes export` of a LoRA checkpoint: the adapter in Hugging Face PEFT's layout, or the merged
model.

A LoRA checkpoint holds the adapter factors of each adapted Megatron-Core layer (training/lora.py)
under the layer's key: `...linear_qkv.lora_A` [rank, in] and `.lora_B` [out, rank], whole tensors
in the checkpoint whatever the TP layout. peft adapts the Hugging Face modules one by one, so a
fused Megatron layer becomes several PEFT adapters that share A: the rows of B are cut exactly as
the layer's weight rows are (the family's map, models/hf/: q, k and v rows interleaved per query
group for linear_qkv, [gate; up] for linear_fc1), and each Hugging Face module gets A with its
rows of B. The update is the same matrix: (alpha / rank) B A, row block by row block.

- `--adapter`: adapter_config.json and adapter_model.safetensors with peft's names
  (`base_model.model.<module>.lora_A.weight`), which `PeftModel.from_pretrained(base, folder)`
  loads on the Hugging Face folder the run started from.
- merged: that folder's weights with every update added (W + (alpha / rank) B A, computed in FP32),
  written shard by shard under the same file names, with its config and tokenizer files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from config.hf import CONFIG_FILE, is_hf_folder
from config.lora import ADAPTER_NAMES
from models.hf import module_of
from models.hf.mapping import Assembler, split
from training.checkpoint import dirs, lora_base
from training.checkpoint.safe_load import safe_loading
from training.hf.convert import ConvertError, copy_foreign, foreign_file, writing
from training.hf.exporter import (
    _CachedReader,
    _checkpoint_keys,
    _copy_tokenizer,
    _family_for,
    _load_boxes,
    _model_of,
    _where,
)

PEFT_PREFIX = "base_model.model."


def holds_adapters(checkpoint: Path) -> bool:
    """Whether a checkpoint (or the latest of a checkpoints folder) was saved by a LoRA run."""
    path = checkpoint if dirs.is_complete(checkpoint) else dirs.latest_checkpoint(checkpoint)
    return path is not None and bool(dirs.read_state(path).get("peft"))


def export_lora(checkpoint: Path, out: Path, *, adapter: bool, family_name: str | None) -> Path:
    """Write the adapter (PEFT layout) or the merged model of a LoRA checkpoint into `out`."""
    path = checkpoint if dirs.is_complete(checkpoint) else dirs.latest_checkpoint(checkpoint)
    if path is None:
        raise ConvertError(f"{checkpoint} is not a complete checkpoint and holds none")
    files = dirs.read_manifest(path)
    problems = dirs.verify_files(path, files, sorted(files))
    if problems:
        raise ConvertError(f"{path} is damaged: {problems[0]}")
    state = dirs.read_state(path)
    peft = state.get("peft")
    if not peft:
        raise ConvertError(
            f"{path} holds a full model, not LoRA adapters: export it without --adapter"
        )
    origin = Path(state["hf_origin"]) if state.get("hf_origin") else None
    if origin is not None and not is_hf_folder(origin):
        origin = None
    if origin is None and not adapter:
        raise ConvertError(
            f"{path} holds LoRA adapters whose run did not start from a Hugging Face folder (or "
            "it moved): the merged model needs that folder's weights; export the adapter alone "
            "with --adapter"
        )
    if origin is not None and not adapter:
        _check_base(path, state, origin)
    model = _model_of(path, state)
    module = module_of(_family_for(model, origin, family_name))
    with safe_loading(path):
        factors = adapter_factors(path, model, module, origin)
    with writing(out) as tmp:
        if origin is not None and not adapter:  # a merged model needs its origin (refused above)
            _write_merged(tmp, factors, peft, origin, state)
        else:
            _write_adapter(tmp, factors, peft, origin)
    return out


def adapter_factors(
    path: Path, model: Any, module: Any, origin: Path | None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{Hugging Face module name: (A, B)} of every adapted layer in the checkpoint."""
    reader = _CachedReader(path)
    stored = _checkpoint_keys(reader)
    embedding = _where("embedding.word_embeddings.weight", stored)
    padded = int(stored[embedding[0]].size[0]) if embedding else model.vocab_size
    names = None
    if origin is not None:
        from models.hf.safetensors_io import HfWeights

        weights_file = HfWeights(origin)
        names = set(weights_file.tensors)
        weights_file.close()
    weights = module.weights(model, padded, names)
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, node in weights.items():
        if not key.endswith(".weight"):
            continue
        layer = key.removesuffix(".weight")
        located = [w for n in ADAPTER_NAMES if (w := _where(f"{layer}.{n}", stored)) is not None]
        if len(located) < len(ADAPTER_NAMES):
            continue  # not an adapted layer
        wanted = [(n, *where) for n, where in zip(ADAPTER_NAMES, located, strict=True)]
        loaded = _load_boxes(reader, wanted, stored)
        a, b = loaded["lora_A"], loaded["lora_B"]
        pieces = Assembler()
        for hf_name, start, rows in split(node, b):
            pieces.add(hf_name, start, rows)
        for hf_name in pieces.names():
            out[hf_name.removesuffix(".weight")] = (a.clone(), pieces.take(hf_name).clone())
    if not out:
        raise ConvertError(f"{path} holds no adapter of a layer the family's map knows")
    return out


def _adapter_config(peft: dict[str, Any], factors: dict, origin: Path | None) -> dict[str, Any]:
    leaves = sorted({name.rsplit(".", 1)[-1] for name in factors})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(origin) if origin else None,
        "r": peft["rank"],
        "lora_alpha": peft["alpha"],
        "lora_dropout": peft["dropout"],
        "target_modules": leaves,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }


def _write_adapter(tmp: Path, factors: dict, peft: dict[str, Any], origin: Path | None) -> None:
    tensors = {}
    for name, (a, b) in factors.items():
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = a.contiguous()
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = b.contiguous()
    save_file(tensors, str(tmp / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = _adapter_config(peft, factors, origin)
    (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _check_base(path: Path, state: dict[str, Any], origin: Path) -> None:
    """ConvertError when the folder the merge adds the updates to is not the base the adapters
    were trained on (training/checkpoint/lora_base.py: the run recorded each of its files' size
    and SHA-256; a base changed in place would merge without a word). One streamed read of the
    base, as a resume does. A run whose base was a Megatron checkpoint recorded that checkpoint,
    not this folder: nothing here to compare."""
    saved = state.get(lora_base.RECORD)
    if not saved or Path(saved["folder"]) != origin.resolve():
        return
    now = lora_base.describe(origin, lora_base.base_files(origin), whole=True)
    found = lora_base.problem(saved, origin, now, path)
    if found is not None:
        raise ConvertError(
            f"{found[1]}. The merged export adds the updates to {origin}, the folder the run "
            "started from; restore it there, or export the adapters alone with --adapter"
        )


def _write_merged(
    tmp: Path, factors: dict, peft: dict[str, Any], origin: Path, state: dict[str, Any]
) -> None:
    """The origin's safetensors files, each tensor with its update added, under the same names."""
    scale = peft["alpha"] / peft["rank"]
    shards = sorted(origin.glob("*.safetensors"))
    left = {f"{name}.weight" for name in factors}
    for shard in shards:
        tensors: dict[str, torch.Tensor] = {}
        source = cast(Path, foreign_file(origin, shard.name))  # its tensors are copied out
        with safe_open(str(source), framework="pt") as f:
            metadata = f.metadata()
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                weight = f.get_tensor(name)
                module = name.removesuffix(".weight")
                if name in left:
                    a, b = factors[module]
                    delta = scale * (b.float() @ a.float())
                    weight = (weight.float() + delta).to(weight.dtype)
                    left.discard(name)
                tensors[name] = weight
        save_file(tensors, str(tmp / shard.name), metadata=metadata or {"format": "pt"})
    if left:
        raise ConvertError(f"{origin} has no tensor {sorted(left)[0]} for its adapter")
    for name in (CONFIG_FILE, "generation_config.json", "model.safetensors.index.json"):
        copy_foreign(origin, name, tmp / name)  # config.json always: a Hugging Face folder
    _copy_tokenizer(tmp, state, origin)
