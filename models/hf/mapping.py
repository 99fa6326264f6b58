"""How one Megatron-Core tensor is made of Hugging Face tensors, declared as data.

Megatron-Core names its weights by global, layout-independent keys (`sharded_state_dict()`: layer
numbers are global, experts are one tensor with a leading expert axis, the gated MLP's fc1 is
[gate; up]). Each key of a family's map (models/hf/<family>.py) is one of:

- `Rows(parts)`: the rows of Hugging Face tensors (or slices of their rows) one after the other;
  `Pad(n)` adds n zero rows (the vocabulary padded to Megatron's multiple). A plain tensor is
  `Rows((Part(name),))`; QKV with GQA interleaves the row blocks of q, k and v per query group.
- `Stack(items)`: `Rows` stacked along a new first axis (the experts of a MoE layer).
- `Reshaped(rows, shape)`: the same numbers in another shape (CLIP's class token).
- `Expert(name, e, ...)`: expert e of a tensor that holds every expert with its features last
  (GPT-OSS: [experts, in, out] weights, Megatron's transpose; [experts, out] biases), its gate and
  up features interleaved or not, stored in MXFP4 or not (see `Expert`).

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
class Expert:
    """Expert `expert` of Hugging Face tensor `name`, which holds every expert with the features
    last, as GPT-OSS stores them: a weight [experts, in, out] (Megatron's [out, in] is each
    expert's transpose) or, with `bias`, a bias [experts, out].

    `interleaved`: the out features alternate gate and up ([g0, u0, g1, u1, ...], GPT-OSS's
    gate_up_proj), where Megatron's fc1 holds [gate; up]. `quantized`: the weight is stored in
    MXFP4 as `<name>_blocks` [experts, out, in / 32, 16] and `<name>_scales` [experts, out, in / 32]
    (the published GPT-OSS files) and read dequantized (`dequantize_mxfp4`); an export writes
    `<name>` itself.
    """

    name: str
    expert: int
    bias: bool = False
    interleaved: bool = False
    quantized: bool = False


@dataclass(frozen=True, slots=True)
class Stack:
    items: tuple[Rows | Expert, ...]


@dataclass(frozen=True, slots=True)
class Reshaped:
    rows: Rows
    shape: tuple[int, ...]  # the Megatron tensor's shape
    hf_shape: tuple[int, ...]  # the Hugging Face tensor's


Node = Rows | Stack | Reshaped | Expert

BLOCK = 32  # MXFP4: values per shared scale


def tensor(name: str) -> Rows:
    """A Megatron tensor that is one Hugging Face tensor as it is."""
    return Rows((Part(name),))


def hf_names(node: Node) -> list[str]:
    """The Hugging Face tensors a node reads, in order, each once."""
    if isinstance(node, Stack):
        return list(dict.fromkeys(n for item in node.items for n in hf_names(item)))
    if isinstance(node, Expert):
        return [f"{node.name}_blocks", f"{node.name}_scales"] if node.quantized else [node.name]
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
    if isinstance(node, Expert):
        if node.quantized:
            _, out, groups, half_block = shape(f"{node.name}_blocks")
            return (out, groups * 2 * half_block)
        hf = shape(node.name)
        return (hf[1],) if node.bias else (hf[2], hf[1])
    if isinstance(node, Reshaped):
        return node.shape
    if isinstance(node, Stack):
        return (len(node.items), *shape_of(node.items[0], shape))
    first = next(p for p in node.parts if isinstance(p, Part))
    return (sum(_lengths(node, shape)), *shape(first.name)[1:])


def read(node: Node, box: Box, shape: Shape, read_box: Read) -> Any:
    """The box of the Megatron tensor, reading only the Hugging Face rows inside it."""
    import torch

    if isinstance(node, Expert):
        return _read_expert(node, box, shape, read_box)
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


def dtype_of(node: Node, dtype: Callable[[str], Any]) -> Any:
    """The Megatron tensor's dtype, from the Hugging Face tensors' (`dtype(name)`): an MXFP4
    expert is read in BF16, as transformers dequantizes it."""
    import torch

    if isinstance(node, Stack):
        node = node.items[0]
    if isinstance(node, Expert) and node.quantized:
        return torch.bfloat16
    return dtype(hf_names(node)[0])


def dequantize_mxfp4(blocks: Any, scales: Any) -> Any:
    """MXFP4 -> BF16: [..., groups, 16] uint8 blocks (two E2M1 values a byte, the low nibble
    first) and [..., groups] E8M0 scales (a power of two, biased by 127) -> [..., groups * 32].

    E2M1 is a sign bit, 2 exponent bits and 1 mantissa bit: the 16 codes are +-{0, 0.5, 1, 1.5, 2,
    3, 4, 6}. Computed in FP32, where value x 2^(scale - 127) is exact, then rounded to BF16 (also
    exact: 3 significant bits and BF16's FP32 exponent range).
    """
    import torch

    codes = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    lut = torch.cat([codes, -codes])
    low, high = lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]
    values = torch.stack([low, high], dim=-1).flatten(-2)  # [..., groups, 32]
    exponent = scales.to(torch.int32) - 127
    values = torch.ldexp(values, exponent.unsqueeze(-1).to(torch.float32))
    return values.flatten(-2).to(torch.bfloat16)


def _segments(rows: slice, out: int, interleaved: bool) -> list[tuple[int, int, int]]:
    """Megatron rows [start, stop) of an expert's out features as (first Hugging Face feature,
    count, step): one run, or with interleaved gate/up up to two runs with step 2."""
    start, stop, _ = rows.indices(out)
    if not interleaved:
        return [(start, stop - start, 1)] if stop > start else []
    half, runs = out // 2, []
    for lo, hi, first in ((start, min(stop, half), 0), (max(start, half), stop, 1)):
        if hi > lo:
            j = lo - (half if first else 0)
            runs.append((2 * j + first, hi - lo, 2))
    return runs


def _read_expert(node: Expert, box: Box, shape: Shape, read_box: Read) -> Any:
    import torch

    e = slice(node.expert, node.expert + 1)
    out = shape_of(node, shape)[0]
    pieces = []
    for first, count, step in _segments(box[0], out, node.interleaved):
        features = slice(first, first + step * (count - 1) + 1)  # contiguous; every step-th kept
        if node.bias:
            pieces.append(read_box(node.name, (e, features))[0, ::step])
            continue
        cols = box[1] if len(box) > 1 else slice(None)
        c0, c1, _ = cols.indices(shape_of(node, shape)[1])
        if node.quantized:
            groups = slice(c0 // BLOCK, -(-c1 // BLOCK))
            blocks = read_box(f"{node.name}_blocks", (e, features, groups, slice(None)))
            scales = read_box(f"{node.name}_scales", (e, features, groups))
            skip = groups.start * BLOCK
            value = dequantize_mxfp4(blocks, scales)[0, ::step, c0 - skip : c1 - skip]
        else:  # [in, out] -> Megatron's [out, in]
            value = read_box(node.name, (e, slice(c0, c1), features))[0, :, ::step].T
        pieces.append(value)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _interleave(whole: Any) -> Any:
    """Megatron's [gate; up] rows as [g0, u0, g1, u1, ...]."""
    half = whole.shape[0] // 2
    return whole.reshape(2, half, *whole.shape[1:]).transpose(0, 1).reshape(whole.shape)


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
    if isinstance(node, Expert):  # one expert's row of the [experts, ...] tensor
        value = _interleave(whole) if node.interleaved else whole
        yield node.name, node.expert, (value if node.bias else value.T).contiguous().unsqueeze(0)
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
