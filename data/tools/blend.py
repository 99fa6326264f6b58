"""`recipes data blend`: one blend file (config/blend.py's format) over several tokenized corpora.

A corpus is a folder `recipes data tokenize` wrote (its blend.json) or a blend file. Its shards
keep their share of the corpus by tokens; the corpora are weighted by their tokens (natural
sampling) or by the weights given, one per corpus (0.7,0.3: 70% of the samples from the first).
All corpora must have been tokenized with the same tokenizer. The prefixes are written relative to
the new file's folder, so a blend moves with its data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from config.blend import BLEND_FORMAT, read_blend_file


def _corpus_file(corpus: str) -> str:
    path = Path(corpus)
    return str(path / "blend.json") if path.is_dir() else corpus


def make_blend(
    corpora: list[str], output: str, weights: list[float] | None = None
) -> dict[str, Any]:
    """Write the blend file; its content. ValueError naming the corpus and the fix."""
    if weights is not None and len(weights) != len(corpora):
        raise ValueError(
            f"--weights has {len(weights)} value(s) for {len(corpora)} corpora: give one each"
        )
    if weights is not None and (any(w < 0 for w in weights) or not sum(weights) > 0):
        raise ValueError(f"--weights {weights}: non-negative, not all zero")
    out_dir = os.path.dirname(os.path.abspath(output))
    blends = []
    for corpus in corpora:
        file = _corpus_file(corpus)
        if not os.path.isfile(file):
            raise ValueError(
                f"{corpus}: no blend file ({file}); finish `recipes data tokenize` into it first"
            )
        blends.append((file, read_blend_file(file)))
    digests = {b.get("tokenizer_sha256") for _, b in blends}
    if len(digests) > 1:
        raise ValueError(
            "the corpora were tokenized with different tokenizers ("
            + ", ".join(f"{f}: {str(b.get('tokenizer_sha256'))[:12]}" for f, b in blends)
            + "): tokenize them again with one"
        )
    sources = []
    for i, (file, blend) in enumerate(blends):
        here = os.path.dirname(os.path.abspath(file))
        total = sum(float(s["weight"]) for s in blend["sources"])
        corpus_tokens = sum(int(s.get("tokens", 0)) for s in blend["sources"])
        share = weights[i] if weights is not None else corpus_tokens
        for s in blend["sources"]:
            prefix = os.path.relpath(os.path.join(here, s["prefix"]), out_dir)
            weight = share * float(s["weight"]) / total if total else 0.0
            sources.append({"prefix": prefix, "weight": weight, "tokens": s.get("tokens", 0)})
    result = {
        "format": BLEND_FORMAT,
        "tokenizer_sha256": digests.pop(),
        "vocab_size": max((b.get("vocab_size") or 0) for _, b in blends) or None,
        "sources": sources,
    }
    os.makedirs(out_dir, exist_ok=True)
    tmp = output + ".partial"
    Path(tmp).write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, output)
    return result
