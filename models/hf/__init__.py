"""The Hugging Face bridge: one mapping module per family (config.registry.HF_FAMILIES).

Each module declares, without torch, `to_model`, `to_hf`, `matches` and `weights` (see
config.registry.HfFamily); models/hf/mapping.py turns a declaration into reads and splits of
tensors, models/hf/safetensors_io.py reads and writes the files.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

from config.hf import family
from config.registry import HF_FAMILIES
from config.schema import ModelConfig
from models.hf.mapping import hf_names

# Tensors any family's folder may hold that no map reads: buffers transformers computes from
# config.json, which older versions saved with the weights (RoPE's inverse frequencies, the
# position ids 0..n-1 of learned position embeddings).
BUFFERS = re.compile(r".*\.(rotary_emb\.inv_freq|embeddings\.position_ids)")


def module_of(name: str) -> ModuleType:
    """The mapping module of a registered family (config.registry.HF_FAMILIES)."""
    return importlib.import_module(HF_FAMILIES[name].module)


def family_module(hf: dict[str, Any], folder: Path) -> ModuleType:
    """The mapping module of the family a folder's config.json names."""
    return module_of(family(hf, folder).name)


def unread_tensors(
    hf: dict[str, Any], folder: Path, model: ModelConfig, names: set[str]
) -> list[str]:
    """The folder's tensors that its family's map (for `model`, the architecture the folder
    describes) neither reads nor knows to skip, sorted: weights an import, a run or an export
    would otherwise drop without a word (a Qwen2 folder labelled Llama: its q/k/v biases).

    Known skips: `BUFFERS`, and what a family module's optional `skipped(model, name)` says it
    leaves out on purpose (CLIP's layers after LLaVA's feature layer, DeepSeek-V3's copies of the
    embedding in its MTP layers)."""
    module = family_module(hf, folder)
    read = {
        n
        for node in module.weights(model, model.vocab_size, names).values()
        for n in hf_names(node)
    }
    skipped = getattr(module, "skipped", None)
    return sorted(
        n
        for n in names - read
        if not BUFFERS.fullmatch(n) and not (skipped is not None and skipped(model, n))
    )
