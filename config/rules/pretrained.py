"""checkpoint.pretrained_dir against the model section, when it is a Hugging Face folder.

A Hugging Face folder fixes the architecture: its config.json and the shapes of its tensors. A
recipe whose model section disagrees with it (another width, vocabulary, number of layers, no QK
norm...) would fail on the ranks at load time, after the queue, or worse load a subset of the
weights into the wrong places. This rule refuses it on the login node instead, in milliseconds
and without torch (config/hf.py reads config.json and the safetensors headers only): one problem
per differing field, naming it, both values and the fix.

What this rule leaves to others:
- A path that does not exist here is not a problem of this rule: the ranks may see it at another
  place (a container mount, a compute node's filesystem). The launcher's input check
  (launchers/inputs.py) knows those places and refuses a missing path before launch; it also runs
  `pretrained_problems` on the folder at its host path. A hub id ("Qwen/Qwen3-8B") is never
  downloaded: it is a relative path that does not exist.
- A folder without config.json is a Megatron checkpoint (the engine checks it when it loads it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from config import hf
from config.finalize import Partial
from config.hardware import Cluster
from config.problems import Problem
from config.schema import ModelConfig, TrainingConfig

FIELD = "checkpoint.pretrained_dir"
TORCH_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def pretrained(cfg: TrainingConfig, cluster: Cluster, d: Partial) -> list[Problem]:
    given = cfg.checkpoint.pretrained_dir
    if not given:
        return []
    return pretrained_problems(cfg.model, Path(os.path.expanduser(given)), given)


def pretrained_problems(model: ModelConfig, folder: Path, given: str) -> list[Problem]:
    """Why `model` cannot take the weights of the Hugging Face folder at `folder` (the path this
    machine sees for `given`, the value of checkpoint.pretrained_dir); [] when it can, and when
    `folder` is no Hugging Face folder (missing, or a Megatron checkpoint)."""
    if not (folder / hf.CONFIG_FILE).is_file():
        return []
    if not hf.is_hf_folder(folder):
        if any((folder / name).is_file() for name in TORCH_WEIGHTS):
            return [
                Problem(
                    FIELD,
                    f"{given} holds its weights as pytorch_model.bin, which is not read here: "
                    f"only safetensors ({hf.SINGLE_FILE} or {hf.INDEX_FILE}). Convert them, e.g. "
                    "save_pretrained(..., safe_serialization=True) in transformers",
                )
            ]
        return []  # config.json beside a Megatron checkpoint: the engine reads the checkpoint
    try:
        found = hf.differences(model, folder)
    except hf.UnknownArchitecture as err:  # its message lists the supported families
        return [Problem(FIELD, f"{err}. {FIELD} takes a Megatron checkpoint or such a folder")]
    except hf.READ_ERRORS as err:
        return [
            Problem(
                FIELD,
                f"{hf.read_error(err, folder)}. checkpoint.pretrained_dir takes a Megatron "
                "checkpoint or a Hugging Face folder of a supported architecture "
                f"({', '.join(hf.HF_FAMILIES)})",
            )
        ]
    return [_mismatch(name, ours, theirs, given) for name, ours, theirs in found]


def _mismatch(name: str, ours: Any, theirs: Any, given: str) -> Problem:
    whole = f"take the folder's whole architecture with the override model={given}"
    if name == "model.vision":
        has = {True: "has a vision section", False: "has no vision section"}
        return Problem(
            name,
            f"the model {has[ours]} but {FIELD}={given} (a {_arch(theirs)} model) "
            f"{'does' if theirs else 'does not'} hold a vision encoder: {whole}",
        )
    if name == "model.seq_length":  # the folder's bound, not its value (config/hf.py)
        return Problem(
            name,
            f"{name}={ours}, but {FIELD}={given} attends within a sliding window of {theirs} "
            f"tokens (its {hf.CONFIG_FILE} sliding_window), which the layers here do not model "
            f"(they attend over the whole sequence); up to {theirs} tokens the two compute the "
            f"same: set {name} to {theirs} or less (e.g. {_round_length(theirs)})",
        )
    return Problem(
        name,
        f"{name}={_value(ours)}, but {FIELD}={given} has {_value(theirs)} (its "
        f"{hf.CONFIG_FILE}): set {name}={_value(theirs)}, or {whole}",
    )


def _round_length(n: int) -> int:
    """The largest multiple of 128 up to n (n itself when shorter): a length that TP with
    sequence parallel and 2 x CP divide at any size the rules allow."""
    return n // 128 * 128 or n


def _arch(has_vision: bool) -> str:
    return "vision-language" if has_vision else "text-only"


def _value(value: Any) -> str:
    """A value as an override writes it (None, true/false, numbers, names)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
