"""The two strings of the data section that carry structure: data.path's blend, data.split's weights.

Plain Python, shared by the checker, the launcher's input check and the datasets on the ranks, so
that all three read them the same way.
"""

from __future__ import annotations

import hashlib
import math
import posixpath


def parse_blend(path: str) -> tuple[list[str], list[float] | None]:
    """data.path -> Megatron blend: "prefix", "p1 p2 ..." or "w1 p1 w2 p2 ..." (weights first)."""
    parts = path.split()
    if not parts:
        raise ValueError("data.path is empty; give a dataset prefix or 'w1 prefix1 w2 prefix2 ...'")

    def is_number(s: str) -> bool:
        try:
            float(s)
        except ValueError:
            return False
        return True

    if not any(is_number(p) for p in parts):
        return parts, None  # prefixes only: Megatron weighs them by their size
    weights, prefixes = parts[0::2], parts[1::2]
    if len(parts) % 2 or not all(map(is_number, weights)) or any(map(is_number, prefixes)):
        raise ValueError(
            f"data.path={path!r} is not a blend: write 'prefix' or 'weight prefix weight prefix ...' "
            "(e.g. '0.7 /data/web 0.3 /data/code')"
        )
    w = [float(x) for x in weights]
    if not _weights(w):
        raise ValueError(
            f"data.path={path!r}: blend weights must be finite and non-negative, not all zero"
        )
    return prefixes, w


def index_cache_base(prefixes: list[str], cache_dir: str | None) -> str | None:
    """Where Megatron's index caches go: data.index_cache_dir, else `<first local prefix>/cache`
    beside the data (None: object storage only, Megatron's own default)."""
    local = [p for p in prefixes if "://" not in p]
    return cache_dir or (f"{local[0]}/cache" if local else None)


def staged_prefix(prefix: str, stage_dir: str) -> str:
    """Where data.stage_dir holds a copy of a local prefix: its name, after a hash of its whole
    path (two folders' "train" prefixes stay apart); object storage is read in place."""
    if "://" in prefix:
        return prefix
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:10]
    return posixpath.join(stage_dir, f"{digest}-{posixpath.basename(prefix)}")


def split_weights(split: str) -> list[float]:
    """data.split ("969,30,1", or with "/") as [train, validation, test] weights, missing ones 0.

    ValueError for anything but one to three finite, non-negative numbers with a positive sum."""
    weights = [float(w) for w in split.replace("/", ",").split(",")]
    if not 1 <= len(weights) <= 3 or not _weights(weights):
        raise ValueError(f"data.split={split!r}: not 1 to 3 finite, non-negative weights")
    return weights + [0.0] * (3 - len(weights))


def _weights(weights: list[float]) -> bool:
    """Finite, non-negative, with a finite positive sum: what can be normalised into fractions."""
    total = sum(weights)
    return all(w >= 0 for w in weights) and 0 < total < math.inf
