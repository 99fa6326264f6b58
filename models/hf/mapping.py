"""How one Megatron-Core tensor is made of Hugging Face tensors, declared as data.

Megatron-Core names its weights by global, layout-independent keys (`sharded_state_dict()`: layer
numbers are global, experts are one tensor with a leading expert axis, the gated MLP's fc1 is
[gate; up]). Each key of a family's map (models/hf/<family>.py) is one of:

- `Rows(parts)`: the rows of Hugging Face tensors (or slices of their rows) one after the other;
  `Pad(n)` adds n zero rows (the vocabulary padded to Megatron's multiple). A plain tensor is
  `Rows((Part(name),))`; QKV with GQA interleaves the row blocks of q, k and v per query group.
- `Stack(items)`: `Rows` stacked along a new first axis (the experts of a MoE layer).
- `Reshaped(rows, shape)`: the same numbers in another shape (CLIP's class token).

`read` computes any box of the Megatron tensor from the Hugging Face files, reading only the rows
the box needs (a TP shard of QKV reads its query groups' rows of q, k and v); `split` cuts a whole
Megatron tensor back into Hugging Face tensors (rows, bit for bit). Both directions come from the
one declaration, so they cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Box = tuple[slice, ...]  # one slice per axis of the Megatron tensor, steps of 1


@dataclass(frozen=True, slots=True)
class Part:
    """Rows [start, stop) of Hugging Face tensor `name` (stop None: to its end)."""

    name: str
    start: int = 0
    stop: int | None = None


@dataclass(frozen=True, slots=True)
class Pad:
    """`rows` zero rows, dropped again on the way back."""

    rows: int


@dataclass(frozen=True, slots=True)
class Rows:
    parts: tuple[Part | Pad, ...]


@dataclass(frozen=True, slots=True)
class Stack:
    items: tuple[Rows, ...]


@dataclass(frozen=True, slots=True)
class Reshaped:
    rows: Rows
    shape: tuple[int, ...]  # the Megatron tensor's shape
    hf_shape: tuple[int, ...]  # the Hugging Face tensor's


Node = Rows | Stack | Reshaped


def tensor(name: str) -> Rows:
    """A Megatron tensor that is one Hugging Face tensor as it is."""
    return Rows((Part(name),))


def hf_names(node: Node) -> list[str]:
    """The Hugging Face tensors a node reads, in order, each once."""
    if isinstance(node, Stack):
        return [n for item in node.items for n in hf_names(item)]
    rows = node.rows if isinstance(node, Reshaped) else node
    seen: dict[str, None] = {}
    for part in rows.parts:
        if isinstance(part, Part):
            seen.setdefault(part.name)
    return list(seen)


# --- Megatron tensor from Hugging Face tensors --------------------------------------------------
Shape = Callable[[str], tuple[int, ...]]  # a Hugging Face tensor's shape
Read = Callable[[str, Box], Any]  # a box of a Hugging Face tensor, as a torch tensor


def _lengths(rows: Rows, shape: Shape) -> list[int]:
    out = []
    for part in rows.parts:
        if isinstance(part, Pad):
            out.append(part.rows)
        else:
            stop = shape(part.name)[0] if part.stop is None else part.stop
            out.append(stop - part.start)
    return out


def shape_of(node: Node, shape: Shape) -> tuple[int, ...]:
    """The Megatron tensor's global shape, from the Hugging Face tensors' shapes."""
    if isinstance(node, Reshaped):
        return node.shape
    if isinstance(node, Stack):
        return (len(node.items), *shape_of(node.items[0], shape))
    first = next(p for p in node.parts if isinstance(p, Part))
    return (sum(_lengths(node, shape)), *shape(first.name)[1:])


def read(node: Node, box: Box, shape: Shape, read_box: Read) -> Any:
    """The box of the Megatron tensor, reading only the Hugging Face rows inside it."""
    import torch

    if isinstance(node, Reshaped):
        whole = read(node.rows, (slice(None),), shape, read_box)
        return whole.reshape(node.shape)[box]
    if isinstance(node, Stack):
        items = range(len(node.items))[box[0]]
        return torch.stack([read(node.items[i], box[1:], shape, read_box) for i in items])
    total = sum(_lengths(node, shape))
    start, stop, _ = box[0].indices(total)
    rest = box[1:]
    pieces, offset, like = [], 0, None
    for part, length in zip(node.parts, _lengths(node, shape), strict=True):
        lo, hi = max(start, offset), min(stop, offset + length)
        if lo < hi and isinstance(part, Part):
            a = part.start + lo - offset
            piece = read_box(part.name, (slice(a, a + hi - lo), *rest))
            pieces.append(piece)
            like = piece
        elif lo < hi:
            pieces.append(hi - lo)  # zero rows, shaped like the real ones once one is read
        offset += length
    if like is None:  # only padding in the box: shape it from the first real tensor
        first = next(p for p in node.parts if isinstance(p, Part))
        like = read_box(first.name, (slice(0, 1), *rest))
    out = [p if not isinstance(p, int) else like.new_zeros((p, *like.shape[1:])) for p in pieces]
    return out[0] if len(out) == 1 else torch.cat(out)


# --- Hugging Face tensors from a Megatron tensor ------------------------------------------------
def split(node: Node, whole: Any) -> Iterator[tuple[str, int, Any]]:
    """(Hugging Face name, first row, rows) pieces of a whole Megatron tensor; padding dropped.

    A part whose length the declaration leaves open (stop None) takes an equal share of the rows
    the other parts leave (fc1's [gate; up] halves, the embedding before its padding).
    """
    if isinstance(node, Reshaped):
        first = next(p for p in node.rows.parts if isinstance(p, Part))
        yield first.name, 0, whole.reshape(node.hf_shape)
        return
    if isinstance(node, Stack):
        for i, item in enumerate(node.items):
            yield from split(item, whole[i])
        return
    known = sum(p.rows for p in node.parts if isinstance(p, Pad)) + sum(
        p.stop - p.start for p in node.parts if isinstance(p, Part) and p.stop is not None
    )
    open_parts = [p for p in node.parts if isinstance(p, Part) and p.stop is None]
    share = (whole.shape[0] - known) // len(open_parts) if open_parts else 0
    offset = 0
    for part in node.parts:
        if isinstance(part, Pad):
            offset += part.rows
            continue
        length = share if part.stop is None else part.stop - part.start
        yield part.name, part.start, whole[offset : offset + length]
        offset += length
    if offset != whole.shape[0]:
        raise ValueError(f"a tensor of {whole.shape[0]} rows does not match its map ({offset})")


class Assembler:
    """Collects `split` pieces until each Hugging Face tensor is whole, then hands it out."""

    def __init__(self) -> None:
        self._pieces: dict[str, list[tuple[int, Any]]] = {}

    def add(self, name: str, start: int, rows: Any) -> None:
        self._pieces.setdefault(name, []).append((start, rows))

    def take(self, name: str) -> Any:
        """The whole tensor from its pieces (in row order), which must tile it without gaps."""
        import torch

        pieces = sorted(self._pieces.pop(name), key=lambda p: p[0])
        row = 0
        for start, rows in pieces:
            if start != row:
                raise ValueError(f"{name}: rows {row}..{start} missing from its pieces")
            row += rows.shape[0]
        tensors = [rows for _, rows in pieces]
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors)

    def names(self) -> list[str]:
        return list(self._pieces)
