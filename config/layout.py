"""Pipeline layouts: which layers each (pipeline rank, virtual stage) builds.

Megatron-Core describes an uneven split with a layout string: one chunk per virtual pipeline stage,
separated by "|", in the order vp_stage * PP + pp_rank; "E" is the embedding, "t" a transformer
layer, "m" a multi-token-prediction layer, "L" the output layer and loss. "(tt|)*3" repeats a group.
This module parses and derives such layouts in plain Python, so that the checker needs no torch.

It also says which parallel layout a checkpoint can resume into (`layout_problems`), for the
launcher's check before launch and for every rank's resume alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from config.bounds import MAX_LAYERS
from config.problems import Problem

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


def loss_heavy(num_layers: int, mtp_layers: int, num_chunks: int) -> list[list[str]] | None:
    """`balanced` with the embedding's place given to the loss: the first chunk holds the
    embedding and a full chunk's layers, the last one layer fewer beside its MTP layers and the
    loss. Megatron-Bridge lays out DeepSeek-V3 so ("Et*4|(t*4|)*14tmL" over 16 chunks, its
    balanced layout "Ettt|(tttt|)*14ttmL"): the embedding is a lookup, the output layer one BF16
    GEMM larger than any of a layer's. None where `balanced` is None or no layer is left to move."""
    chunks = balanced(num_layers, mtp_layers, num_chunks)
    if chunks is None or num_chunks < 2 or "t" not in chunks[-1]:
        return None
    per = len(chunks[0])  # every chunk's places, the same
    flat = [c for chunk in chunks for c in chunk if c != "E"]
    out = [flat[i * per : (i + 1) * per] for i in range(num_chunks)]
    out[0].insert(0, "E")
    return out


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


def ddp_bucket_size(data_parallel_size: int) -> int:
    """Parameters per gradient bucket of Megatron DDP on the first pipeline stage's first chunk,
    when it overlaps its reduction (Megatron-Core's default, distributed_data_parallel.py: larger
    data-parallel groups need larger buckets to keep NCCL near its bandwidth). Every other chunk
    reduces in one bucket: it finishes its backward early. The engine builds with it
    (training/build.py) and the step-time model prices the last bucket's reduction, which no
    backward is left to hide (config/cost/steptime.py)."""
    return max(40_000_000, 1_000_000 * data_parallel_size)


# --- the layout a checkpoint can resume into ------------------------------------------------------
# Megatron-Core's name of a Megatron-FSDP checkpoint's sharding (train_state.json's
# dist_optimizer_sharding): torch DCP's fsdp_dtensor format.
FSDP_SHARDING = "fsdp_dtensor"
# The sharding that reloads into any layout (Megatron DDP's distributed optimizer only).
FULLY_RESHARDABLE = "fully_reshardable"
# What a checkpoint's optimizer state is split by besides data parallelism: a dp_reshardable
# (or fsdp_dtensor) checkpoint reloads only into the same values of these.
RESHARDED_BY = tuple(
    f"parallel.{name}"
    for name in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size",
        "pipeline_model_parallel_layout",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
    )
) + ("optimizer.use_distributed_optimizer",)
# Megatron-FSDP's checkpoints (torch DCP, fsdp_dtensor) and Megatron DDP's (torch_dist) are
# different formats: no sharding reloads across this one.
FORMAT_FIELD = "parallel.use_megatron_fsdp"
LAYOUT_FIELDS = (*RESHARDED_BY, FORMAT_FIELD)


def _value(tree: Any, field: str) -> Any:
    """A dotted field of a config or of a config saved as a dict; absent fields are None."""
    for name in field.split("."):
        tree = tree.get(name) if isinstance(tree, Mapping) else getattr(tree, name, None)
    return tree


def resume_layout(cfg: Any) -> dict[str, Any]:
    """The layout fields of a config (or of a config saved as a dict), by dotted name, as given:
    a field set to what its default derives (ETP = TP) still counts as a change, so that each
    message names the one field to set back."""
    return {field: _value(cfg, field) for field in LAYOUT_FIELDS}


def saved_layout(state: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's layout from its train_state.json: from the whole config it saved, else from
    its "layout" record, which older checkpoints keep by short name and without every field (those
    it lacks are left out, so they are not compared)."""
    if state.get("config") is not None:
        return resume_layout(state["config"])
    record = state.get("layout") or {}
    short = {field.rsplit(".", 1)[-1]: field for field in LAYOUT_FIELDS}
    return {short[k]: v for k, v in record.items() if k in short}


def layout_changes(state: Mapping[str, Any], cfg: Any) -> dict[str, tuple[Any, Any]]:
    """field -> (checkpoint's value, cfg's) of every layout field that differs."""
    now = resume_layout(cfg)
    return {f: (old, now[f]) for f, old in saved_layout(state).items() if old != now[f]}


def resume_sharding(state: Mapping[str, Any], cfg: Any) -> str:
    """How the checkpoint's optimizer state is sharded (the config's setting when it says not)."""
    return state.get("dist_optimizer_sharding") or cfg.checkpoint.dist_optimizer_sharding


def layout_problems(state: Mapping[str, Any], cfg: Any, checkpoint: str) -> list[Problem]:
    """Why the checkpoint `checkpoint`, whose train_state.json is `state`, cannot be resumed in
    cfg's layout: one problem per changed field that its sharding cannot reload across. The
    launcher's check (launchers/resume.py) and every rank's resume (training/checkpoint/store.py)
    ask this."""
    sharding = resume_sharding(state, cfg)
    out = []
    for field, (old, new) in layout_changes(state, cfg).items():
        if field == FORMAT_FIELD:
            why = (
                "Megatron-FSDP's checkpoints (torch DCP, fsdp_dtensor) and Megatron DDP's "
                "(torch_dist) are different formats"
            )
            # pretrained_dir takes a torch_dist checkpoint's weights, not an fsdp_dtensor one's
            other = (
                ""
                if sharding == FSDP_SHARDING
                else f" with checkpoint.pretrained_dir={checkpoint} to take its weights"
            )
            fix = f"start afresh in a new logging.run_dir (or checkpoint.save_dir){other}"
        elif sharding != FULLY_RESHARDABLE:
            why = (
                f"its optimizer state ({sharding}) reshards over data parallelism only: TP, PP, "
                "VPP, the pipeline layout, CP, EP, ETP and the distributed optimizer must stay"
            )
            fix = "start afresh in a new logging.run_dir (or checkpoint.save_dir)" + (
                ""
                if sharding == FSDP_SHARDING
                else "; a run saved with checkpoint.dist_optimizer_sharding=fully_reshardable "
                "(Megatron DDP) can change its layout on resume"
            )
        else:
            continue
        out.append(
            Problem(
                field,
                f"is {new!r} but the checkpoint {checkpoint} was saved with {old!r}, and it cannot "
                f"change on resume ({why}); keep {field}={old!r}, or {fix}",
            )
        )
    return out
