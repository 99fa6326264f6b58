"""What `recipes import` (training/hf/importer.py) and `recipes export` (training/hf/exporter.py) share.

Both stream, holding about one layer's tensors at a time (bench/hf_convert.py measures it), write
into a temporary sibling of their output folder and rename it at the end (a failed or interrupted
run leaves no half folder under the name asked for), and report progress on stderr.
"""

from __future__ import annotations

import importlib
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

from config.hf import family
from config.registry import HF_FAMILIES
from models.hf.safetensors_io import HfWeights

EXTRA = "hf_extra."  # import: Hugging Face tensors the model does not hold
LAYER_KEY = re.compile(r"(.*\blayers)\.(\d+)\.(.*)")


class ConvertError(ValueError):
    """A named problem with the input (exit 2)."""


# --- shared ---------------------------------------------------------------------------------------
def module_of(name: str) -> ModuleType:
    """The mapping module of a registered family (config.registry.HF_FAMILIES)."""
    return importlib.import_module(HF_FAMILIES[name].module)


def family_module(hf: dict[str, Any], folder: Path) -> ModuleType:
    """The mapping module of the family a folder's config.json names."""
    return module_of(family(hf, folder).name)


def progress(label: str, total: int) -> Callable[[int], None]:
    """A one-line progress report on stderr: `label: i/total tensors`."""
    start = time.perf_counter()

    def report(done: int) -> None:
        if done == total or done % max(1, total // 10) == 0:
            took = time.perf_counter() - start
            print(f"{label}: {done}/{total} tensors ({took:.1f} s)", file=sys.stderr, flush=True)

    return report


def fresh_output(out: Path) -> Path:
    """A temporary sibling of `out`, renamed to it at the end: a failed run leaves no half folder."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConvertError(
            f"{out} exists and is not empty; give a new folder (nothing is replaced)"
        )
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def finish(tmp: Path, out: Path) -> None:
    if out.exists():
        out.rmdir()  # empty, checked at the start
    os.replace(tmp, out)


def per_layer_key(key: str) -> tuple[str, int | None]:
    """`...layers.3.x` -> (`...layers.x`, 3), the key of the stacked form; others unchanged."""
    match = LAYER_KEY.fullmatch(key)
    if match is None:
        return key, None
    return f"{match[1]}.{match[3]}", int(match[2])


def iter_tensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a Hugging Face folder (for tests and the benchmark)."""
    weights = HfWeights(folder)
    try:
        for name in sorted(weights.tensors):
            yield name, weights.read(name)
    finally:
        weights.close()
