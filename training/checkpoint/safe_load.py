"""Loading a checkpoint without running code from it: `.metadata` (torch's distributed checkpoint
reader's pickle) is unpickled first with only the classes torch writes there, and every
`torch.load` meanwhile, ours and the reader's, is weights-only (tensors and plain containers).
training/checkpoint/state.py, the Hugging Face exporters and the LoRA export load through
`safe_loading`."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

# What torch's distributed checkpoint writes into `.metadata`, as exact (module, name) pairs: its
# own dataclasses and enums, torch.Size, the layout helper and the dtypes. Unpickling anything else
# could run code (pickle calls what the file names), and a dotted name would walk attributes from an
# allowed module to anywhere (`torch.ctypes.util.subprocess.Popen`): only these pairs resolve.
_DCP = "torch.distributed.checkpoint."
_METADATA_GLOBALS = {
    *(
        (_DCP + "metadata", name)
        for name in (
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    *(
        (_DCP + "planner", name)
        for name in (
            "BytesIOWriteData",
            "LoadItemType",
            "LoadPlan",
            "ReadItem",
            "SavePlan",
            "TensorWriteData",
            "WriteItem",
            "WriteItemType",
        )
    ),
    *((_DCP + "filesystem", name) for name in ("_StorageInfo", "_StoragePrefix")),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    # torch's own DCP writer (Megatron-FSDP checkpoints) records the folder it wrote, as a path.
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    *(("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_GLOBALS:  # no name in it has a dot: one lookup, no walk
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def check_metadata(folder: Path) -> None:
    """ValueError, naming the file, when `.metadata` holds anything but torch's own metadata."""
    path = folder / ".metadata"
    try:
        _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except FileNotFoundError:
        raise ValueError(f"{path} is missing") from None
    except Exception as err:  # a damaged or foreign file: pickle raises many kinds of error
        raise ValueError(f"{path} is not safe to load ({type(err).__name__}: {err})") from None


@contextlib.contextmanager
def safe_loading(folder: Path) -> Iterator[None]:
    """Load from `folder` without running code from it: `.metadata` checked, and every torch.load
    meanwhile weights-only (torch's reader asks for full unpickling of its byte items)."""
    check_metadata(folder)
    key = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
    before = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
