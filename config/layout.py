"""Pipeline layouts: which layers each (pipeline rank, virtual stage) builds.

Megatron-Core describes an uneven split with a layout string: one chunk per virtual pipeline stage,
separated by "|", in the order vp_stage * PP + pp_rank; "E" is the embedding, "t" a transformer
layer, "m" a multi-token-prediction layer, "L" the output layer and loss. "(tt|)*3" repeats a group.
This module parses and derives such layouts in plain Python, so that the checker needs no torch.
"""

from __future__ import annotations

import re

from config.schema import MAX_LAYERS

_CHARS = {"E", "L", "t", "m"}
# The most characters a layout may expand to: every layer and MTP layer of the largest model the
# schema allows, a "|" after each, and room to spare. "(t|)*99999999999" is refused, not expanded.
_MAX_CHARS = 8 * MAX_LAYERS


def parse(layout: str) -> list[list[str]]:
    """Split a layout string into chunks of layer characters, as Megatron-Core reads it."""
    text = layout.replace(",", "").replace(" ", "")
    budget = _MAX_CHARS - len(text)  # what the repeats may still add

    def repeat(match: re.Match[str]) -> str:
        nonlocal budget
        unit, times = match.group(1), match.group(2).lstrip("0") or "0"
        budget -= len(unit) * int(times) if len(times) < 10 else _MAX_CHARS + 1
        if budget < 0:
            raise ValueError(
                f"expands past {_MAX_CHARS} characters, more than a model of "
                f"model.num_layers <= {MAX_LAYERS} has; check the repeat counts (the '*N')"
            )
        return unit * int(times)

    if budget < 0:
        raise ValueError(f"is longer than {_MAX_CHARS} characters, more than any model has")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", repeat, text)
    text = re.sub(r"(.)\*(\d+)", repeat, text)
    chunks = [list(chunk) for chunk in text.split("|")]
    bad = sorted({c for chunk in chunks for c in chunk} - _CHARS)
    if bad:
        raise ValueError(f"unknown layer characters {bad}; use E, t, m and L")
    return chunks


def render(chunks: list[list[str]]) -> str:
    """The layout string of a chunk list, with runs of equal chunks folded as "(tt|)*29"."""
    parts: list[str] = []
    i = 0
    while i < len(chunks):
        j = i
        while j + 1 < len(chunks) and chunks[j + 1] == chunks[i]:
            j += 1
        body = "".join(chunks[i])
        count = j - i + 1
        last = j == len(chunks) - 1
        if count > 2 and not last:
            parts.append(f"({body}|)*{count}")
        else:
            parts.append("|".join([body] * count) + ("" if last else "|"))
        i = j + 1
    return "".join(parts)


def check(
    chunks: list[list[str]], num_layers: int, mtp_layers: int, pp: int, vpp: int | None
) -> list[str]:
    """Reasons why a layout cannot run with this model and pipeline, or [] when it can."""
    problems = []
    if len(chunks) % pp:
        problems.append(
            f"has {len(chunks)} chunks, not a multiple of pipeline_model_parallel_size={pp}"
        )
    elif vpp is not None and len(chunks) != pp * vpp:
        problems.append(f"has {len(chunks)} chunks but PP x VPP = {pp} x {vpp} = {pp * vpp}")
    flat = [c for chunk in chunks for c in chunk]
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        problems.append("must start with the embedding 'E', exactly once")
    if not flat or flat[-1] != "L" or flat.count("L") != 1:
        problems.append("must end with the loss 'L', exactly once")
    if flat.count("t") != num_layers:
        problems.append(
            f"holds {flat.count('t')} transformer layers 't' but model.num_layers={num_layers}"
        )
    if flat.count("m") != mtp_layers:
        problems.append(
            f"holds {flat.count('m')} MTP layers 'm' but model.mtp_num_layers={mtp_layers}"
        )
    if "m" in flat and len(chunks) % pp == 0:
        problems += _mtp_placement(chunks, pp)
    return problems


def _mtp_placement(chunks: list[list[str]], pp: int) -> list[str]:
    """Where Megatron-Core's PipelineParallelLayerLayout.validate_layer_layout lets MTP layers
    go: after every decoder layer, all in one chunk, and that chunk the last (virtual) stage of
    its pipeline rank."""
    problems = []
    flat = [c for chunk in chunks for c in chunk]
    first = flat.index("m")
    if "t" in flat[first:]:
        problems.append(
            "places an MTP layer 'm' before a transformer layer 't'; the MTP layers follow "
            "every decoder layer: move the 'm's after the last 't'"
        )
    holding = [i for i, chunk in enumerate(chunks) if "m" in chunk]
    if len(holding) > 1:
        problems.append(
            f"spreads the MTP layers 'm' over chunks {holding}; Megatron-Core builds them all in "
            "one chunk: put every 'm' in the same chunk"
        )
    vpp = len(chunks) // pp
    early = [i for i in holding if i // pp < vpp - 1]
    if early:
        problems.append(
            f"puts MTP layers 'm' in chunk {early[0]} (pipeline rank {early[0] % pp}, virtual "
            f"stage {early[0] // pp} of {vpp}); MTP layers must be in the last virtual stage of "
            f"their rank (chunks {(vpp - 1) * pp} to {vpp * pp - 1})"
        )
    return problems


def balanced(num_layers: int, mtp_layers: int, num_chunks: int) -> list[list[str]] | None:
    """An uneven but balanced layout, or None when no balanced one exists.

    The embedding and the loss each cost about one layer, so they take a layer's place: 126 layers
    of Llama 3.1 405B over 64 chunks become "Et|(tt|)*62tL". Balanced means every chunk carries the
    same number of units; anything else would leave one stage the straggler of every step. None
    too when the split would spread two or more MTP layers over chunks, which Megatron-Core refuses.
    """
    units = num_layers + mtp_layers + 2
    if units % num_chunks:
        return None
    per = units // num_chunks
    sequence = ["E"] + ["t"] * num_layers + ["m"] * mtp_layers + ["L"]
    chunks = [sequence[i * per : (i + 1) * per] for i in range(num_chunks)]
    if sum("m" in chunk for chunk in chunks) > 1:
        return None  # Megatron-Core builds every MTP layer in one chunk
    return chunks


def decoder_layers_per_rank(chunks: list[list[str]], pp: int) -> list[int]:
    """Transformer layers (t and m) held by each pipeline rank, over all its virtual stages."""
    per_rank = [0] * pp
    for index, chunk in enumerate(chunks):
        per_rank[index % pp] += chunk.count("t") + chunk.count("m")
    return per_rank


def warmup_forwards(pp: int, vpp: int, rank: int, microbatches: int) -> int:
    """Chunk forwards Megatron's interleaved schedule runs on pipeline rank `rank` before its
    first backward, plus one: (PP - rank - 1) x 2 + (VPP - 1) x PP + 1, at most all of them."""
    return min((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, microbatches * vpp)
