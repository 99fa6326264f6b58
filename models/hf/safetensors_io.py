"""Reading and writing the safetensors files of a Hugging Face folder, a slice or a tensor at a time.

Reading goes through the `safetensors` library: `get_slice(name)[box]` reads only the bytes of the
rows asked for (a TP rank reads its own shard of each tensor, never the whole file).

Writing is done here, by hand, because `safetensors.torch.save_file` takes every tensor of a file
at once: an exported 8B model would sit in memory in full. The format is small (an 8-byte
little-endian header length, a JSON header of names, dtypes, shapes and byte offsets, then the raw
little-endian bytes), and every shape is known before the first tensor is converted, so
`ShardWriter` writes each file's header first and then the tensors as they come, holding one at a
time. Files are laid out as `save_pretrained` lays them out (model-0000i-of-0000n.safetensors and
model.safetensors.index.json, or one model.safetensors) and read back with the library in tests.
"""

from __future__ import annotations

import contextlib
import json
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from config.hf import safetensors_tensors

_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
DTYPE_NAMES = {name: dtype for dtype, name in _DTYPES.items()}
INDEX = "model.safetensors.index.json"


class HfWeights:
    """The tensors of a Hugging Face folder by name: shapes and dtypes from the headers, boxes
    read on demand. Open files are kept until `close`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tensors = safetensors_tensors(folder)  # name -> (file, dtype, shape)
        self._open: dict[str, Any] = {}

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name)[2]

    def dtype(self, name: str) -> torch.dtype:
        return DTYPE_NAMES[self._entry(name)[1]]

    def _entry(self, name: str) -> tuple[str, str, tuple[int, ...]]:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(
                f"{self.folder} has no tensor {name!r}; the folder does not match the "
                "architecture its config.json names"
            ) from None

    def read(self, name: str, box: tuple[slice, ...] = ()) -> torch.Tensor:
        file = self._entry(name)[0]
        if file not in self._open:
            self._open[file] = safe_open(str(self.folder / file), framework="pt", device="cpu")
        part = self._open[file].get_slice(name)
        shape = self.shape(name)
        if not shape:
            return part[:]
        box = tuple(box) + (slice(None),) * (len(shape) - len(box))
        return part[box]

    def close(self) -> None:
        self._open.clear()


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count * torch.empty((), dtype=dtype).element_size()


class ShardWriter:
    """Writes named tensors, in the order planned, into safetensors files of at most
    `max_shard_bytes` each (a tensor larger than that gets a file of its own)."""

    def __init__(
        self,
        folder: Path,
        plan: list[tuple[str, torch.dtype, tuple[int, ...]]],
        max_shard_bytes: int = 5 * 2**30,
    ) -> None:
        self.folder = folder
        shards: list[list[tuple[str, torch.dtype, tuple[int, ...]]]] = [[]]
        size = 0
        for entry in plan:
            nbytes = _nbytes(entry[1], entry[2])
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(entry)
            size += nbytes
        n = len(shards)
        self._files = (
            ["model.safetensors"]
            if n == 1
            else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        )
        self._shards = shards
        self._order = [name for shard in shards for name, _, _ in shard]
        self._expected = {name: (dtype, shape) for name, dtype, shape in plan}
        self._next = 0  # index into _order
        self._file_index = -1
        self._handle: Any = None
        self._left_in_file = 0
        self.total_bytes = sum(_nbytes(d, s) for _, d, s in plan)

    @property
    def order(self) -> list[str]:
        """The order `write` must be called in."""
        return list(self._order)

    def _open_next_file(self) -> None:
        self._file_index += 1
        shard = self._shards[self._file_index]
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype, shape in shard:
            nbytes = _nbytes(dtype, shape)
            header[name] = {
                "dtype": _DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
        self._handle = open(self.folder / self._files[self._file_index], "wb")  # noqa: SIM115
        self._handle.write(struct.pack("<Q", len(text)))
        self._handle.write(text)
        self._left_in_file = len(shard)

    def write(self, name: str, value: torch.Tensor) -> None:
        expected = self._order[self._next] if self._next < len(self._order) else None
        if name != expected:
            raise ValueError(f"tensor {name!r} written out of order (expected {expected!r})")
        dtype, shape = self._expected[name]
        if value.dtype != dtype or tuple(value.shape) != shape:
            raise ValueError(
                f"{name}: got {value.dtype} {tuple(value.shape)}, planned {dtype} {shape}"
            )
        if self._left_in_file == 0:
            self._open_next_file()
        data = value.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        self._handle.write(memoryview(data))
        self._left_in_file -= 1
        self._next += 1
        if self._left_in_file == 0:
            self._handle.close()
            self._handle = None

    def close(self) -> None:
        """Finish: every planned tensor must have been written; the index when sharded."""
        if self._next != len(self._order):
            raise ValueError(f"{len(self._order) - self._next} planned tensors were not written")
        if len(self._files) > 1:
            weight_map = {
                name: self._files[i] for i, shard in enumerate(self._shards) for name, _, _ in shard
            }
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")

    def abort(self) -> None:
        """Close the file a failure left open. Closing flushes it, which fails again on a full
        disk: that error is the failure's own, already on its way."""
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                handle.close()
