"""The two strings of the data section that carry structure: data.path's blend, data.split's weights.

Plain Python, shared by the checker, the launcher's input check and the datasets on the ranks, so
that all three read them the same way.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import posixpath
from pathlib import Path

# The blend files `recipes data tokenize` and `recipes data blend` write (data.path=<file>.json):
#   {"format": BLEND_FORMAT, "tokenizer_sha256": ..., "vocab_size": N,
#    "sources": [{"prefix": "shards/x", "weight": 1.0, "tokens": 123}, ...]}
# A relative prefix is relative to the file's folder.
BLEND_FORMAT = "megatron-recipes-blend-1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def is_blend_file(path: str) -> bool:
    return path.endswith(".json") and len(path.split()) == 1


def read_blend_file(path: str) -> dict:
    """The blend file's content, checked for its form; ValueError naming data.path and why."""
    try:
        with open(path, encoding="utf-8") as f:
            blend = json.load(f)
    except FileNotFoundError:
        raise ValueError(f"data.path={path!r}: the blend file does not exist") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"data.path={path!r}: cannot read the blend file ({err})") from None
    sources = blend.get("sources") if isinstance(blend, dict) else None
    if blend.get("format") != BLEND_FORMAT or not isinstance(sources, list) or not sources:
        raise ValueError(
            f"data.path={path!r} is not a blend file of `recipes data tokenize` or `recipes "
            f"data blend` (format {BLEND_FORMAT!r} with a non-empty list of sources)"
        )
    for i, s in enumerate(sources):
        if not (
            isinstance(s, dict) and isinstance(s.get("prefix"), str) and _number(s.get("weight"))
        ):
            raise ValueError(f"data.path={path!r}: sources[{i}] needs a prefix and a weight")
    return blend


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def tokenizer_digest(path: str | Path) -> str:
    """A digest of the files that decide a tokenizer's ids (a tokenizer.json, or a folder's
    tokenizer files): the same digest, the same ids. A blend records the one it was made with."""
    p = Path(path).expanduser()
    files = [p] if p.is_file() else [p / n for n in TOKENIZER_FILES if (p / n).is_file()]
    if not files:
        raise FileNotFoundError(f"{path}: no tokenizer file ({', '.join(TOKENIZER_FILES)})")
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def parse_blend(path: str) -> tuple[list[str], list[float] | None]:
    """data.path -> Megatron blend: "prefix", "p1 p2 ...", "w1 p1 w2 p2 ..." (weights first),
    or a blend file (.json, read_blend_file)."""
    if is_blend_file(path):
        blend = read_blend_file(path)
        here = os.path.dirname(os.path.abspath(path))
        files = [os.path.join(here, s["prefix"]) for s in blend["sources"]]
        given = [float(s["weight"]) for s in blend["sources"]]
        if not _weights(given):
            raise ValueError(
                f"data.path={path!r}: blend weights must be finite and non-negative, not all zero"
            )
        return files, given
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
