"""A checker finding, and the small helpers its messages use to list valid choices."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    field: str  # the dotted config path to change, e.g. parallel.tensor_model_parallel_size
    message: str  # what is wrong, with the values involved and a fix


def divisors(n: int) -> list[int]:
    """The divisors of n, smallest first, in sqrt(n) steps (n is a world size or a layer count)."""
    if n < 1:
        return []
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def choices(values: list[int], limit: int = 8) -> str:
    """'1, 2, 4, ...': the first few valid values for a message."""
    return ", ".join(str(v) for v in values[:limit]) + (", ..." if len(values) > limit else "")
